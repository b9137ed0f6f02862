"""`jupyter gpushare status`: what this user may see of the host's reservations, and the memory in use now."""

from __future__ import annotations

import getpass
import os
import re
import time
from collections.abc import Sequence
from typing import Any

from ..broker.client import BrokerLedger
from ..broker.identity import Caller
from ..config.settings import GpuShareApp
from ..core.addresses import BrokerAt
from ..core.history import newest
from ..core.policy import format_mib
from ..core.words import format_duration, limits_words
from ..host.procs import describe, tree_pids
from ..ledger.ledger import read_ledger, read_notebooks
from ..ledger.view import view_for


def add_use(view: dict[str, Any], backend) -> dict[str, Any]:
    """Add what the driver measures now: memory used per card, and per kernel (its process tree). An admin's
    view also gets ``outside``: the GPU processes in no listed kernel's tree (a script in a terminal, a
    program started outside Jupyter, a kernel of a server in a container), with their user and command."""
    for card in view["cards"]:
        card["used_mib"] = None
    for kernel in view["kernels"]:
        kernel["used_mib"] = None
    try:
        samples = {s.card.uuid: s for s in backend.sample()}
    except Exception:
        return view
    for card in view["cards"]:
        sample = samples.get(card["uuid"])
        card["used_mib"] = sample.used_mib if sample else None
    in_kernels: set[int] = set()
    for kernel in view["kernels"]:
        sample, pid = samples.get(kernel["card_uuid"]), kernel.get("kernel_pid")
        if sample is None or not pid:
            continue
        tree = tree_pids(pid)
        if not tree:
            continue
        in_kernels |= tree
        figures = [p.used_mib for p in sample.processes if p.pid in tree]
        kernel["used_mib"] = None if any(f is None for f in figures) else sum(figures)
    # Who runs what: for an admin of the broker, or root (a student's view names no other user's process, and
    # reading one's own ledger file makes one "admin" of that file only).
    if view.get("admin") and (view.get("source", "").startswith("broker") or os.geteuid() == 0):
        labels = {c["uuid"]: c["label"] for c in view["cards"]}
        view["outside"] = [
            {"card_label": labels.get(uuid, sample.card.label), "pid": p.pid, "used_mib": p.used_mib, **describe(p.pid)}
            for uuid, sample in samples.items()
            for p in sample.processes
            if p.pid not in in_kernels
        ]
    return view


def gather_status(app: GpuShareApp, socket_path: str | None = None, ledger_path: str | None = None) -> dict[str, Any]:
    """The view this user may see: from the broker when one is configured (or found), else the ledger
    file; with the memory in use now, as this host's driver reports it."""
    from ..host.gpu import Card, open_backend

    backend = open_backend(app.gpu_backend, app.simulated_cards)
    if ledger_path is None and socket_path is None:
        socket_path = app.broker_socket or None  # (the default socket when it exists: GpuShareApp.broker_socket)
    if socket_path and ledger_path is None:
        client = BrokerLedger.at(app.broker(socket_path) or BrokerAt(socket_path))
        try:
            return add_use({"source": f"broker {socket_path}", **client.view()}, backend)
        finally:
            client.close()

    path = ledger_path or app.ledger_path
    policy = app.build_policy()
    try:
        cards = backend.cards()
    except Exception:
        cards = []
    leases, waiters = read_ledger(path) if os.path.exists(path) else ([], [])  # none yet: nothing reserved
    known = {c.uuid for c in cards}
    for lease in leases:  # a card the ledger names but this process cannot see
        if lease.card_uuid not in known:
            known.add(lease.card_uuid)
            cards.append(Card(lease.card_index, lease.card_uuid, "(not visible here)", 0))
    caller = Caller(getpass.getuser(), os.getuid(), admin=True)  # a ledger file you can read is yours
    view = {"source": f"ledger {path}", **view_for(caller, leases, waiters, cards, policy)}
    found = read_notebooks(path, app.build_history()) if os.path.exists(path) else []
    view["notebooks"], view["notebooks_total"] = newest(found), len(found)
    return add_use(view, backend)


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _printable(value: Any) -> str:
    """A cell as text a terminal shows as it is: control characters (ANSI escapes, NUL), line separators and
    bidirectional overrides are written as escapes (\\x1b), whoever put them in a name, path or command line."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group(0))[1:-1], "-" if value is None else str(value))


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(h) for h in header]] + [[_printable(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def format_status(view: dict[str, Any]) -> str:
    mib = lambda v: "-" if v is None else format_mib(v)  # noqa: E731
    role = "admin: every user's kernels" if view.get("admin") else "your kernels; other users as totals"
    out = [f"Source: {view['source']}  (user {view['user']}, {role})"]
    limits = view.get("limits")
    if limits:
        held = limits_words(view.get("limits_use"))
        out.append("Your limits: " + ", ".join(f"{k} {'none' if v is None else v}" for k, v in limits.items()))
        out += (
            [f"  {held}{' A limit is reached: the next kernel is refused.' if view['limits_use']['full'] else ''}"]
            if held
            else []
        )
    out += ["", "CARDS"]
    out.append(
        _table(
            [
                (c["label"], c["name"] + (" [simulated]" if c.get("simulated") else ""), mib(c["total_mib"]), mib(c["usable_mib"]),
                 mib(c["reserved_mib"]), mib(c["mine_reserved_mib"]), mib(c["others_reserved_mib"]), mib(c["unreserved_mib"]),
                 mib(c.get("used_mib")))
                for c in view["cards"]
            ],
            ("CARD", "NAME", "TOTAL", "USABLE", "RESERVED", "YOURS", "OTHERS", "UNRESERVED", "IN USE"),
        )
    )  # fmt: skip
    if view.get("admin") and view["users"]:
        out += ["", "USERS"]
        out.append(
            _table(
                [(u["user"], u["kernels"], mib(u["quota_mib"]), mib(u["reserved_mib"])) for u in view["users"]],
                ("USER", "KERNELS", "QUOTAS", "RESERVED"),
            )
        )
    out += ["", "KERNELS"]
    if view["kernels"]:
        out.append(
            _table(
                [(k["user"], k["kernel_id"], k["kernel_name"], k["card_label"], mib(k["quota_mib"]), mib(k["reserved_mib"]),
                  mib(k.get("used_mib")), k["kernel_pid"], format_duration(k["age_s"]))
                 for k in view["kernels"]],
                ("USER", "KERNEL ID", "KERNELSPEC", "CARD", "QUOTA", "RESERVED", "IN USE", "PID", "AGE"),
            )
        )  # fmt: skip
    else:
        out.append("(none)")
    if view.get("unleased") is not None:  # the broker's own reading and what its policy does about each
        out += [
            "",
            "GPU PROCESSES WITHOUT A RESERVATION (new kernels count their memory as taken; the broker's policy)",
        ]
        if view["unleased"]:
            doing = {
                "leased": "given a lease",
                "judged": "ended after the grace",
                "listed": "listed",
                "stopped": "ended",
            }
            out.append(
                _table(
                    [(f"GPU {p['card_index']}", p["pid"], p["user"], mib(p["used_mib"]), mib(p["stolen_mib"]),
                      doing.get(p["status"], p["status"]) + (f": {p['why']}" if p.get("why") else ""),
                      p["kernel_id"] or "", p["command"]) for p in view["unleased"]],
                    ("CARD", "PID", "USER", "IN USE", "OF RESERVED", "POLICY", "JUPYTER KERNEL", "COMMAND"),
                )
            )  # fmt: skip
        else:
            out.append("(none)")
    elif view.get("outside"):
        out += ["", "GPU PROCESSES WITHOUT A RESERVATION (new kernels count their memory as taken)"]
        out.append(
            _table(
                [(p["card_label"], p["pid"], p["user"], mib(p["used_mib"]), p["command"]) for p in view["outside"]],
                ("CARD", "PID", "USER", "IN USE", "COMMAND"),
            )
        )
    out += ["", "NOTEBOOKS WITH RECORDED RUNS (what each teaches its user's next kernel)"]
    if view.get("notebooks"):
        out.append(
            _table(
                [(n["user"], n["kernel_name"], n["path"] or "(no notebook)", n["runs"], mib(n["peak_mib"]),
                  mib(n["quota_mib"]), "yes" if n["failed"] else "", time.strftime("%Y-%m-%d %H:%M", time.localtime(n["last"])))
                 for n in view["notebooks"]],
                ("USER", "KERNELSPEC", "NOTEBOOK", "RUNS", "PEAK (NVML)", "LEARNED QUOTA", "RAN OUT", "LAST RUN"),
            )
        )  # fmt: skip
        more = view.get("notebooks_total", 0) - len(view["notebooks"])
        if more > 0:
            out.append(
                f"({more} notebooks run less recently are not listed: the {len(view['notebooks'])} most recent are.)"
            )
    else:
        out.append("(none)")
    out += ["", "QUEUE"]
    if view["queue"]:
        out.append(
            _table(
                [(q["position"], "yes" if q["mine"] else "", q["user"], q["kernel_id"], format_mib(q["need_mib"]) if q.get("need_mib") is not None else "", format_duration(q["waited_s"])) for q in view["queue"]],
                ("POS", "MINE", "USER", "KERNEL ID", "NEEDS", "WAITED"),
            )
        )  # fmt: skip
    else:
        out.append("(empty)")
    if view.get("rulings") is not None:  # an admin's: the teachers' rulings, and what became of each
        out += ["", "RULINGS (the last day's)"]
        clock = lambda t: "-" if t is None else time.strftime("%H:%M:%S", time.localtime(t))  # noqa: E731
        out.append(
            _table(
                [(clock(r["at"]), r["by"], r["action"], r["user"], r["kernel_id"], r["why"], clock(r["deadline"]),
                  r["outcome"] or "pending", clock(r["done"])) for r in view["rulings"]],
                ("AT", "BY", "ACTION", "USER", "KERNEL ID", "WHY", "DEADLINE", "OUTCOME", "DONE"),
            )
            if view["rulings"]
            else "(none)"
        )  # fmt: skip
    return "\n".join(out)
