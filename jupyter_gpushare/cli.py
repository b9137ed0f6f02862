"""`jupyter gpushare <command>`: broker, status, doctor, k8s-profiles.

status and doctor read the same configuration a Jupyter server of this user would (the Jupyter
config path, or --config FILE), so they report what the server will do.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .broker import DEFAULT_SOCKET, BrokerLedger, Caller
from .k8s import HAMI_SCHEDULER
from .ledger import LedgerError, check_ledger, read_ledger
from .ledger_file import SETTLE_S
from .policy import PolicyError, format_mib
from .views import view_for

MIN_CGROUP_DRIVER = 615  # driver branch with per-cgroup GPU memory limits (nvmlDeviceSetMemoryLimits_v1)


# -- configuration ------------------------------------------------------------------------------------


def load_server_config(extra: str | None = None):
    """The traitlets config a Jupyter server of this user loads (jupyter_config, jupyter_server_config)."""
    from jupyter_core.paths import jupyter_config_path
    from traitlets.config import Config
    from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

    config = Config()
    for directory in reversed(jupyter_config_path()):  # lowest priority first
        for base in ("jupyter_config", "jupyter_server_config"):
            for loader, ext in ((JSONFileConfigLoader, ".json"), (PyFileConfigLoader, ".py")):
                if os.path.isfile(os.path.join(directory, base + ext)):
                    config.merge(loader(base + ext, path=directory).load_config())
    if extra:
        directory, name = os.path.split(os.path.abspath(extra))
        loader = PyFileConfigLoader if name.endswith(".py") else JSONFileConfigLoader
        config.merge(loader(name, path=directory).load_config())
    return config


def _app(config_file: str | None):
    from .app import GpuShareApp

    return GpuShareApp(config=load_server_config(config_file))


# -- status ---------------------------------------------------------------------------------------------


def add_use(view: dict[str, Any], backend) -> dict[str, Any]:
    """Add what the driver measures now: memory used per card, and per kernel (its process tree). An admin's
    view also gets ``outside``: the GPU processes in no listed kernel's tree (a script in a terminal, a
    program started outside Jupyter, a kernel of a server in a container), with their user and command."""
    import psutil

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
        try:
            tree = {pid} | {child.pid for child in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            continue
        in_kernels |= tree
        figures = [p.used_mib for p in sample.processes if p.pid in tree]
        kernel["used_mib"] = None if any(f is None for f in figures) else sum(figures)
    # Who runs what: for an admin of the broker, or root (a student's view names no other user's process, and
    # reading one's own ledger file makes one "admin" of that file only).
    if view.get("admin") and (view.get("source", "").startswith("broker") or os.geteuid() == 0):
        labels = {c["uuid"]: _label(c, "index") for c in view["cards"]}
        view["outside"] = [
            {"card_label": labels.get(uuid, sample.card.label), "pid": p.pid, "used_mib": p.used_mib, **_process(p.pid)}
            for uuid, sample in samples.items()
            for p in sample.processes
            if p.pid not in in_kernels
        ]
    return view


def _label(row: dict[str, Any], index_key: str, label_key: str = "label") -> str:
    """A card's label ("GPU 0", "GPU 0 MIG 3"); "GPU <index>" from a broker older than labels."""
    return row.get(label_key) or f"GPU {row[index_key]}"


def _process(pid: int) -> dict[str, str | None]:
    """The user and command line of a process (None where this host does not show them)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return {"user": proc.username(), "command": " ".join(proc.cmdline())[:120] or proc.name()}
    except (psutil.Error, KeyError):  # gone, another namespace's pid, or a uid without a name
        return {"user": None, "command": None}


def gather_status(socket_path: str | None, ledger_path: str | None, config_file: str | None) -> dict[str, Any]:
    """The view this user may see: from the broker when one is configured (or found), else the ledger
    file; with the memory in use now, as this host's driver reports it."""
    from .gpu import Card, open_backend

    app = _app(config_file)
    backend = open_backend(app.gpu_backend, app.simulated_cards)
    if ledger_path is None and socket_path is None:
        socket_path = app.broker_socket or (DEFAULT_SOCKET if os.path.exists(DEFAULT_SOCKET) else None)
    if socket_path and ledger_path is None:
        client = BrokerLedger(socket_path, ca_file=app.broker_ca_file)
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
    leases, waiters = read_ledger(path)
    known = {c.uuid for c in cards}
    for lease in leases:  # a card the ledger names but this process cannot see
        if lease.card_uuid not in known:
            known.add(lease.card_uuid)
            cards.append(Card(lease.card_index, lease.card_uuid, "(not visible here)", 0))
    caller = Caller(getpass.getuser(), os.getuid(), admin=True)  # a ledger file you can read is yours
    return add_use({"source": f"ledger {path}", **view_for(caller, leases, waiters, cards, policy)}, backend)


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(h) for h in header]] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def format_status(view: dict[str, Any]) -> str:
    mib = lambda v: "-" if v is None else format_mib(v)  # noqa: E731
    role = "admin: every user's kernels" if view.get("admin") else "your kernels; other users as totals"
    out = [f"Source: {view['source']}  (user {view['user']}, {role})"]
    limits = view.get("limits")
    if limits:
        out.append("Your limits: " + ", ".join(f"{k} {'none' if v is None else v}" for k, v in limits.items()))
    out += ["", "CARDS"]
    out.append(
        _table(
            [
                (_label(c, "index"), c["name"] + (" [simulated]" if c.get("simulated") else ""), mib(c["total_mib"]), mib(c["usable_mib"]),
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
                [(k["user"], k["kernel_id"], k["kernel_name"], _label(k, "card_index", "card_label"), mib(k["quota_mib"]), mib(k["reserved_mib"]),
                  mib(k.get("used_mib")), k["kernel_pid"], f"{k['age_s']:.0f} s")
                 for k in view["kernels"]],
                ("USER", "KERNEL ID", "KERNELSPEC", "CARD", "QUOTA", "RESERVED", "IN USE", "PID", "AGE"),
            )
        )  # fmt: skip
    else:
        out.append("(none)")
    if view.get("outside"):
        out += ["", "GPU PROCESSES WITHOUT A RESERVATION (new kernels count their memory as taken)"]
        out.append(
            _table(
                [(p["card_label"], p["pid"], p["user"], mib(p["used_mib"]), p["command"]) for p in view["outside"]],
                ("CARD", "PID", "USER", "IN USE", "COMMAND"),
            )
        )
    out += ["", "QUEUE"]
    if view["queue"]:
        out.append(
            _table(
                [(q["position"], "yes" if q["mine"] else "", q["user"], q["kernel_id"], q["quota"], f"{q['waited_s']:.0f} s") for q in view["queue"]],
                ("POS", "MINE", "USER", "KERNEL ID", "QUOTA", "WAITED"),
            )
        )  # fmt: skip
    else:
        out.append("(empty)")
    return "\n".join(out)


def cmd_status(args: argparse.Namespace) -> int:
    try:
        view = gather_status(args.socket, args.ledger, args.config)
    except (LedgerError, PolicyError) as e:
        print(f"jupyter gpushare status: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a config file that does not load, a traitlets type error
        print(
            f"jupyter gpushare status: the configuration cannot be used: {e} (jupyter gpushare doctor says more)",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(view, indent=2) if args.json else format_status(view))
    return 0


# -- doctor -----------------------------------------------------------------------------------------------


@dataclass
class Finding:
    check: str
    status: str  # ok | info | warn | error
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "status": self.status, "detail": self.detail, "fix": self.fix}


def _nvml() -> tuple[str | None, int | None, str | None]:
    """(driver version, device count, error)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:
        return None, None, f"NVML cannot be initialised ({e})"
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        return driver, pynvml.nvmlDeviceGetCount(), None
    except Exception as e:
        return None, None, f"NVML answered with an error ({e})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def diagnose(config_file: str | None = None, socket_path: str | None = None) -> list[Finding]:
    """Every check of `jupyter gpushare doctor`, each with what to do."""
    findings: list[Finding] = []
    add = lambda *a: findings.append(Finding(*a))  # noqa: E731

    # configuration
    app = None
    try:
        app = _app(config_file)
        policy = app.build_policy()
        add(
            "config",
            "ok",
            f"GpuShareApp settings are valid (default quota {policy.default_quota}, on_full {policy.on_full}).",
        )
    except PolicyError as e:
        add(
            "config",
            "error",
            str(e),
            "Fix this setting in your jupyter_server_config.py/.json; the server refuses to start with it.",
        )
    except Exception as e:  # a config file that does not load, a traitlets type error
        add("config", "error", f"The Jupyter configuration cannot be loaded: {e}", "Fix the named file or setting.")
    backend_mode = getattr(app, "gpu_backend", "auto")
    simulated = bool(getattr(app, "simulated_cards", ""))

    # driver and NVML
    driver, count, nvml_error = _nvml()
    if nvml_error:
        broken = backend_mode == "nvml" or (backend_mode == "auto" and not simulated)
        add("driver", "error" if broken else "info", nvml_error + ("" if broken else "; simulated cards are configured."),
            "Install the NVIDIA driver (nvidia-smi must work) and nvidia-ml-py; kernels start without a GPU until then."
            if broken else "")  # fmt: skip
    else:
        add("driver", "ok", f"NVIDIA driver {driver}, NVML sees {count} device(s).")

    # cards
    if app is not None:
        from .gpu import open_backend
        from .gpu.pod import pod_limit_mib

        try:
            backend = open_backend(app.gpu_backend, app.simulated_cards)
            cards = backend.cards()
            if cards:
                text = ", ".join(f"{c.index}: {c.name} {format_mib(c.total_mib)}" for c in cards)
                if any(pod_limit_mib(c.index) is not None for c in cards):  # (the sizes above are already the shares)
                    text += " (HAMi's share of the GPU for this pod)"
                add("cards", "warn" if backend.simulated else "ok", text + (" [simulated: no real memory]" if backend.simulated else ""),
                    "Set GpuShareApp.gpu_backend = 'nvml' on a GPU host." if backend.simulated else "")  # fmt: skip
            else:
                add("cards", "error", f"No card: {backend.reason}", "Check the driver (above) and GpuShareApp.cards.")
        except Exception as e:
            add(
                "cards",
                "error",
                f"The card list cannot be read: {e}",
                "Run nvidia-smi; a lost card needs a reset or reboot.",
            )

    # broker / ledger
    socket_path = socket_path or getattr(app, "broker_socket", "") or None
    if socket_path:
        client = BrokerLedger(socket_path, timeout=5.0, ca_file=getattr(app, "broker_ca_file", ""))
        try:
            hello = client.hello()
            add("broker", "ok", f"The broker at {socket_path} answers: you are {hello['user']!r}"
                f"{' (admin)' if hello['admin'] else ''}, {len(hello['cards'])} card(s), your limits {hello['limits']}.")  # fmt: skip
        except (LedgerError, PolicyError) as e:
            down = "not reachable" in str(e)
            add("broker", "error", str(e), "Start it: systemctl start jupyter-gpushare-broker (docs/multi-user.md)." if down
                else "See the message; docs/multi-user.md describes the broker's settings.")  # fmt: skip
        finally:
            client.close()
        if socket_path.startswith("tcp://"):
            add("broker", "warn", "This server's JupyterHub token crosses plain TCP to the broker.",
                "Unless that network is private to the servers, give the broker a certificate "
                "(GpuShareBroker.tcp_certfile) and use tls:// (docs/multi-user.md).")  # fmt: skip
    else:
        if os.path.exists(DEFAULT_SOCKET):
            add("broker", "warn", f"A broker socket exists at {DEFAULT_SOCKET}, but this server does not use it.",
                f"Set c.GpuShareApp.broker_socket = '{DEFAULT_SOCKET}' so this host's users share one ledger.")  # fmt: skip
        else:
            add("broker", "info", "No broker configured: this user's servers share their own ledger file.",
                "On a host with several users, run a broker (docs/multi-user.md).")  # fmt: skip
        if app is not None:
            findings.append(_ledger_finding(app.ledger_path))

    # enforcement tiers
    add("tier: framework caps", "ok", "TensorFlow, PyTorch, JAX and CuPy are capped inside each kernel (cooperative).")
    if nvml_error:
        add(
            "tier: NVML watchdog",
            "warn",
            "Not available without NVML: bypassing the framework caps goes unnoticed.",
            "Install the NVIDIA driver and nvidia-ml-py.",
        )
    else:
        add(
            "tier: NVML watchdog",
            "ok",
            "Available: per-process GPU memory is measured and over-quota kernels are acted on.",
        )
    mps = shutil.which("nvidia-cuda-mps-control")
    add("tier: MPS", "info", f"nvidia-cuda-mps-control {'found at ' + mps if mps else 'not found'}; MPS is opt-in only "
        "(a crashed client can take the card from everyone).")  # fmt: skip
    findings.append(_ptrace_finding(shared=bool(socket_path)))
    cgroup2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    try:
        major = int((driver or "0").split(".")[0])
    except ValueError:
        major = 0
    missing = [why for ok, why in ((major >= MIN_CGROUP_DRIVER, f"driver r{MIN_CGROUP_DRIVER}+ (have {driver or 'none'})"),
                                   (cgroup2, "cgroup v2"), (os.geteuid() == 0, "root")) if not ok]  # fmt: skip
    if missing:
        add("tier: driver cgroup limits", "info", "Hard per-cgroup GPU memory limits are not available here: needs " + ", ".join(missing) + ".",
            "Upgrade the driver and use cgroup v2 to get hard limits (docs/admin-guide.md).")  # fmt: skip
    else:
        add(
            "tier: driver cgroup limits",
            "ok",
            f"Driver {driver}, cgroup v2 and root: hard per-cgroup GPU memory limits can be set.",
        )
    return findings


def _ptrace_finding(shared: bool, path: str = "/proc/sys/kernel/yama/ptrace_scope") -> Finding:
    """Whether a kernel may attach a debugger to its own Jupyter server (same uid) and act as it."""
    try:
        scope = int(Path(path).read_text().strip())
    except (OSError, ValueError):
        scope = None
    if scope is None or scope == 0:
        what = "Yama is not enabled" if scope is None else "kernel.yama.ptrace_scope is 0"
        return Finding(
            "ptrace",
            "warn" if shared else "info",
            f"{what}: a kernel can attach a debugger to its own Jupyter server (same user) and act as it, e.g. "
            "release its reservations through the broker.",
            "On hosts shared by several users: sysctl -w kernel.yama.ptrace_scope=1 (and in /etc/sysctl.d/).",
        )
    return Finding("ptrace", "ok", f"kernel.yama.ptrace_scope is {scope}: a kernel cannot attach to its server.")


def _ledger_finding(path: str) -> Finding:
    p = Path(path)
    if not p.exists():
        return Finding("ledger", "ok", f"No ledger yet at {path}; the first GPU kernel creates it.")
    try:
        health = check_ledger(path)
    except LedgerError as e:
        return Finding("ledger", "error", str(e), f"Stop this user's servers, then mv {path} {path}.bad.")
    if health["integrity"] != "ok":
        return Finding(
            "ledger",
            "error",
            f"{path} is damaged: {health['integrity']}",
            f"Stop this user's servers, then mv {path} {path}.bad.",
        )
    mode = p.stat().st_mode & 0o777
    if mode & 0o022:
        return Finding("ledger", "warn", f"{path} is writable by other users (mode {mode:o}).", f"chmod 600 {path}")
    if health["recreated_until"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(health["recreated_until"] - SETTLE_S))
        return Finding(
            "ledger",
            "warn",
            f"{path} was re-created at {when}: its files were removed or replaced while servers used it. The servers "
            f"entered again the reservations they knew; it holds {health['leases']} now.",
            "Find out who removed it (only its owner can); check that `jupyter gpushare status` lists every running "
            "kernel.",
        )
    return Finding(
        "ledger",
        "ok",
        f"{path}: integrity ok, schema {health['schema']}, {health['leases']} reservation(s), {health['waiters']} waiting.",
    )


SYMBOL = {"ok": "ok   ", "info": "info ", "warn": "WARN ", "error": "ERROR"}


def cmd_doctor(args: argparse.Namespace) -> int:
    findings = diagnose(args.config, args.socket)
    if args.json:
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    else:
        for f in findings:
            print(f"[{SYMBOL[f.status]}] {f.check}: {f.detail}")
            if f.fix and f.status in ("warn", "error"):
                print(f"        what to do: {f.fix}")
    return 1 if any(f.status == "error" for f in findings) else 0


# -- k8s-profiles -------------------------------------------------------------------------------------------


def cmd_k8s(args: argparse.Namespace) -> int:
    from .k8s import dump, z2jh_values

    try:
        values = z2jh_values(
            whole_gpu=args.whole_gpu, mig=args.mig, hami_gpumem=args.hami_gpumem, hami_gpucores=args.hami_gpucores,
            cpu_profile=not args.no_cpu, default_quota=args.default_quota, card_headroom=args.card_headroom,
            whole_gpu_product=args.whole_gpu_product, mig_product=args.mig_product, hami_scheduler=args.hami_scheduler,
        )  # fmt: skip
    except PolicyError as e:
        print(f"jupyter gpushare k8s-profiles: {e}", file=sys.stderr)
        return 2
    print(dump(values, args.format), end="" if args.format == "yaml" else "\n")
    return 0


# -- entry point ---------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jupyter gpushare", description="GPU memory quotas for Jupyter kernels: tools.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "broker", help="run the host-wide broker (options: jupyter gpushare broker --help-all)", add_help=False
    )
    s = sub.add_parser("status", help="cards, users, kernels, quotas, queue")
    s.add_argument("--json", action="store_true", help="print JSON instead of tables")
    s.add_argument(
        "--socket", help="ask this broker (default: GpuShareApp.broker_socket, or the host's broker if running)"
    )
    s.add_argument("--ledger", help="read this ledger file instead (default: GpuShareApp.ledger_path)")
    s.add_argument("--config", help="an extra config file to load after the Jupyter config path")
    d = sub.add_parser("doctor", help="check driver, cards, config, ledger, broker and enforcement tiers")
    d.add_argument("--json", action="store_true")
    d.add_argument("--socket", help="check this broker")
    d.add_argument("--config", help="an extra config file to load after the Jupyter config path")
    k = sub.add_parser("k8s-profiles", help="Zero-to-JupyterHub singleuser values for GPU profiles")
    k.add_argument("--whole-gpu", action="store_true", help="a profile with one whole GPU")
    k.add_argument(
        "--mig", action="append", default=[], metavar="PROFILE", help="a MIG profile, e.g. 1g.10gb (repeatable)"
    )
    k.add_argument(
        "--hami-gpumem", action="append", type=int, default=[], metavar="MIB", help="a HAMi slice of MIB (repeatable)"
    )
    k.add_argument("--hami-gpucores", type=int, default=None, metavar="PCT", help="SM share of HAMi slices, percent")
    k.add_argument(
        "--whole-gpu-product", metavar="NAME", help="pin whole-GPU pods to nodes of this nvidia.com/gpu.product"
    )
    k.add_argument("--mig-product", metavar="NAME", help="pin MIG pods to nodes of this GPU (checks the MIG profiles)")
    k.add_argument("--hami-scheduler", default=HAMI_SCHEDULER, help=f"HAMi's scheduler name (default {HAMI_SCHEDULER})")
    k.add_argument("--no-cpu", action="store_true", help="no CPU-only profile")
    k.add_argument("--default-quota", default="25%", help="each kernel's share of the pod's slice (default 25%%)")
    k.add_argument("--card-headroom", default="256MiB", help="kept free in the slice (default 256MiB)")
    k.add_argument("--format", choices=("yaml", "json"), default="yaml")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.getLogger("jupyter_gpushare").addHandler(logging.NullHandler())  # errors are printed once, below
    if argv and argv[0] == "broker":
        from .broker import GpuShareBroker

        GpuShareBroker.launch_instance(argv[1:])
        return 0
    args = parser().parse_args(argv)
    return {"status": cmd_status, "doctor": cmd_doctor, "k8s-profiles": cmd_k8s}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
