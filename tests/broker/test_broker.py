"""Many users on one host: a real broker process and real Jupyter servers running as three Unix users.

What must hold: admission is host-wide across the servers; a student cannot pass their per-user
limit, release or read another user's reservation, or pass for someone else; a killed server's
leases are reclaimed; a broker restart loses nothing that is still alive, and while it is down
kernels start without a GPU and say why. Needs root (useradd, servers as other users).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from multiuser import (
    ALICE,
    BOB,
    KERNEL,
    RUN,
    STAFF,
    Broker,
    as_user,
    ensure_user,
    needs_root,
    remove_user,
    reserved,
    running_host,
    shared_scratch,
    stop_all_kernels,
)
from servers import wait_until

from jupyter_gpushare.broker import BrokerLedger, Caller, GpuShareBroker
from jupyter_gpushare.core.policy import Policy, PolicyError, Size, UserLimits
from jupyter_gpushare.core.words import limits_words
from jupyter_gpushare.host.cgroups import KernelCgroups
from jupyter_gpushare.host.gpu import Card
from jupyter_gpushare.ledger.ledger import Lease, LedgerError, ProcessRef, Request, Waiter
from jupyter_gpushare.ledger.view import view_for

# -- the host: broker + three users' servers ----------------------------------------------------------


@pytest.fixture(scope="module")
def host():
    with running_host("gpushare-broker-") as got:
        yield got


# -- tests (in order: the last ones restart the broker and kill a server) ------------------------------


@needs_root
def test_admission_is_host_wide_and_per_user_limits_hold(host):
    broker, servers = host
    alice, bob, carol = servers[ALICE], servers[BOB], servers[STAFF]
    a1, a2 = alice.start_kernel(), alice.start_kernel()
    code, message = alice.refused()  # a third 2 GiB kernel passes alice's 4 GiB total
    assert code == 400
    assert "at most 4 GiB of GPU memory in all kernels together" in message and "already hold 4 GiB" in message
    b1 = bob.start_kernel()
    c1 = carol.start_kernel()  # staff: no total limit, but the card is now full (4 x 2.5 GiB)
    assert reserved(broker) == 4 * KERNEL
    code, message = carol.refused()
    assert code == 503 and "No GPU has room" in message
    view = broker.admin_view()
    assert view["cards"][0]["reserved_mib"] <= view["cards"][0]["usable_mib"]
    assert {(k["user"], k["kernel_id"]) for k in view["kernels"]} == {
        (ALICE, a1),
        (ALICE, a2),
        (BOB, b1),
        (STAFF, c1),
    }
    for kid in (a1, a2):  # every server reports the kernel's card and its own user
        assert alice.kernel(kid)["state"] == "running"
    bob.call("DELETE", f"api/kernels/{b1}")
    wait_until(lambda: reserved(broker) == 3 * KERNEL, what="bob's release")
    c2 = carol.start_kernel()  # room again: host-wide
    assert carol.kernel(c2)["state"] == "running"
    carol.call("DELETE", f"api/kernels/{c2}")
    wait_until(lambda: reserved(broker) == 3 * KERNEL, what="carol's release")


@needs_root
def test_student_cannot_release_read_or_forge(host):
    broker, servers = host
    alice, bob = servers[ALICE], servers[BOB]
    alice_ids = [k["kernel_id"] for k in broker.admin_view()["kernels"] if k["user"] == ALICE]
    alice_pid = alice.kernel(alice_ids[0])["pid"]
    assert len(alice_ids) == 2 and alice_pid
    got = as_user(
        bob.user,
        bob.home,
        f"""
        import json, socket
        from jupyter_gpushare.broker import BrokerLedger
        from jupyter_gpushare.ledger.ledger import LedgerError, ProcessRef, Request
        from jupyter_gpushare.core.policy import parse_size
        b = BrokerLedger({broker.socket!r})
        out = {{}}
        for name, call in (("release", lambda: b.release({alice_ids[0]!r})),
                           ("attach_other_lease", lambda: b.attach({alice_ids[0]!r}, None))):
            try:
                call(); out[name] = "accepted"
            except LedgerError as e:
                out[name] = str(e)
        out["get"] = repr(b.get({alice_ids[0]!r}))
        out["leases"] = [(l.kernel_id, l.user, l.kernel_name) for l in b.leases()]
        out["view"] = json.dumps(b.view())
        lease = b.reserve(Request("forged-1", parse_size("1GiB"), user={ALICE!r}), None, [], False)
        out["forged_user"] = lease.user
        s = socket.socket(socket.AF_UNIX); s.connect({broker.socket!r})
        s.sendall(json.dumps({{"op": "reserve", "args": {{"kernel_id": "forged-2", "mib": 512, "user": {ALICE!r},
                                "uid": 0, "pid": 1}}}}).encode() + b"\\n")
        out["raw"] = json.loads(s.makefile().readline())
        for name, call in (("steal", lambda: b.reserve(Request({alice_ids[1]!r}, parse_size("1GiB")), None, [], False)),
                           ("attach_other_pid", lambda: b.attach("forged-1", ProcessRef.of({alice_pid})))):
            try:
                call(); out[name] = "accepted"
            except LedgerError as e:
                out[name] = str(e)
        out["released_own"] = [b.release("forged-1").user, b.release("forged-2").user]
        for mode in ("rb", "ab"):
            try:
                open({broker.ledger!r}, mode).close()
                out["ledger_" + mode] = "opened"
            except PermissionError:
                out["ledger_" + mode] = "denied"
        print(json.dumps(out))
        """,
    )
    assert "is another user's; you may not release it" in got["release"] and got["get"] == "None"
    assert "is another user's" in got["attach_other_lease"]
    view = broker.admin_view()
    assert set(alice_ids) <= {k["kernel_id"] for k in view["kernels"]}  # alice's reservations are untouched
    assert all(k["kernel_pid"] for k in view["kernels"] if k["kernel_id"] in alice_ids)  # and still attached
    assert got["forged_user"] == BOB  # the name in the request is ignored
    assert got["raw"]["ok"] and got["raw"]["result"]["lease"]["user"] == BOB
    assert got["raw"]["result"]["lease"]["owner"]["pid"] != 1
    assert "in use by another user's kernel" in got["steal"]
    assert "is not yours" in got["attach_other_pid"]
    assert got["released_own"] == [BOB, BOB]
    assert got["ledger_rb"] == got["ledger_ab"] == "denied"  # the file itself: neither readable nor writable
    assert stat.S_IMODE(os.stat(broker.ledger).st_mode) == 0o600
    # what bob may see: his own kernels; others only as anonymous per-card totals
    for text in (json.dumps(got["leases"]), got["view"]):
        assert ALICE not in text and STAFF not in text
        assert not any(kid in text for kid in alice_ids)
    bob_view = json.loads(got["view"])
    assert bob_view["admin"] is False and bob_view["cards"][0]["others_reserved_mib"] > 0


@needs_root
def test_student_and_admin_views_through_servers_and_cli(host):
    broker, servers = host
    bob = servers[BOB]
    b1 = bob.start_kernel()
    others = [k["kernel_id"] for k in broker.admin_view()["kernels"] if k["user"] != BOB]
    assert others
    # bob's own server: its API shows the host's reservations, but no other user's kernel or name
    for path in ("api/gpushare/cards", "api/gpushare/kernels", "api/gpushare/queue"):
        text = json.dumps(bob.call("GET", path))
        assert not any(kid in text for kid in others) and ALICE not in text and STAFF not in text, path
    assert bob.call("GET", "api/gpushare/cards")["cards"][0]["reserved_mib"] == reserved(broker)
    student = as_user(
        bob.user, bob.home,
        f"import subprocess, sys, json; out = subprocess.run([sys.executable, '-m', 'jupyter_gpushare.cli.main', 'status', '--json', "
        f"'--socket', {broker.socket!r}], capture_output=True, text=True); print(json.dumps({{'rc': out.returncode, 'out': out.stdout}}))",
    )  # fmt: skip
    assert student["rc"] == 0
    text = student["out"]
    assert b1 in text and not any(kid in text for kid in others) and ALICE not in text
    table = subprocess.run(
        [sys.executable, "-m", "jupyter_gpushare.cli.main", "status", "--socket", broker.socket],
        capture_output=True,
        text=True,
    )
    assert table.returncode == 0 and "USERS" in table.stdout  # root is an admin: every user and kernel
    assert all(kid in table.stdout for kid in others + [b1]) and ALICE in table.stdout
    # root's doctor says what the users' kernels get, not what root's own kernels would: their servers run as
    # themselves and cannot make cgroups here, so the broker makes them (broker/groups.py)
    doctor = subprocess.run(
        [sys.executable, "-m", "jupyter_gpushare.cli.main", "doctor", "--json", "--socket", broker.socket],
        capture_output=True, text=True,
    )  # fmt: skip
    (users_kernels,) = [f for f in json.loads(doctor.stdout) if f["check"] == "tier: users' kernels"]
    if KernelCgroups().level.tracking == "cgroup":  # the broker (root, here) may make cgroups: it makes theirs
        assert users_kernels["status"] == "ok" and "at 'cgroup' (" in users_kernels["detail"], users_kernels
    else:  # no one may here: each is tracked by its process tree only
        assert users_kernels["status"] == "warn" and "at 'watchdog' (" in users_kernels["detail"], users_kernels
    assert f"{BOB}'s {b1[:8]}" in users_kernels["detail"]
    bob.call("DELETE", f"api/kernels/{b1}")


@needs_root
def test_broker_restart_loses_nothing_alive_and_outage_falls_back_to_cpu(host):
    broker, servers = host
    alice, bob = servers[ALICE], servers[BOB]
    before = {k["kernel_id"]: k for k in broker.admin_view()["kernels"]}
    gone = next(kid for kid, k in before.items() if k["user"] == ALICE)
    broker.stop()
    kid = bob.start_kernel()  # the broker is down: the kernel starts, without a GPU, and says why
    rec = bob.kernel(kid)
    assert rec["state"] == "cpu" and "broker" in rec["reason"] and "not reachable" in rec["reason"]
    assert "not reachable" in (bob.call("GET", "api/gpushare/cards")["ledger"]["error"] or "")
    alice.call("DELETE", f"api/kernels/{gone}")  # released while down: sent once the broker is back
    broker.start()
    after = {k["kernel_id"]: k for k in broker.admin_view()["kernels"]}
    assert set(before) - {gone} <= set(after)
    for k, lease in before.items():
        if k != gone:
            assert after[k]["kernel_pid"] == lease["kernel_pid"] and after[k]["quota_mib"] == lease["quota_mib"]
    wait_until(
        lambda: gone not in {k["kernel_id"] for k in broker.admin_view()["kernels"]},
        what="the release made during the outage",
    )
    wait_until(
        lambda: bob.call("GET", "api/gpushare/cards")["ledger"]["error"] is None,
        what="bob's server to see the broker again",
    )
    bob.call("DELETE", f"api/kernels/{kid}")
    k2 = bob.start_kernel()
    assert bob.kernel(k2)["state"] == "running"
    bob.call("DELETE", f"api/kernels/{k2}")


@needs_root
def test_killing_a_server_reclaims_its_leases(host):
    broker, servers = host
    carol = servers[STAFF]
    mine = [k["kernel_id"] for k in broker.admin_view()["kernels"] if k["user"] == STAFF]
    assert mine
    carol.proc.send_signal(signal.SIGKILL)
    carol.proc.wait(10)
    wait_until(
        lambda: not {k["kernel_id"] for k in broker.admin_view()["kernels"]} & set(mine),
        timeout=60,
        what="carol's leases to be reclaimed",
    )
    assert "Reclaimed" in broker.output()
    stop_all_kernels({k: v for k, v in servers.items() if k != STAFF})
    wait_until(lambda: reserved(broker) == 0, what="every reservation released")


# -- in-process checks of the broker's rules (no sockets) -----------------------------------------------


def _lease(kid: str, user: str, quota: int = 2048, card: str = "GPU-0") -> Lease:
    return Lease(kid, card, 0, quota, 512, user, "python3", ProcessRef(10, 1.0), ProcessRef(11, 2.0), 0.0)


def test_view_for_a_student_names_no_one_else():
    leases = [_lease("k-alice", "alice"), _lease("k-bob", "bob")]
    waiters = [
        Waiter(1, "k-alice-2", Size(mib=2048), "alice", "python3", ProcessRef(10, 1.0), 0.0),
        Waiter(2, "k-bob-2", Size(mib=1024), "bob", "python3", ProcessRef(12, 1.0), 0.0),
    ]
    cards = [Card(0, "GPU-0", "H200", 10240)]
    view = view_for(
        Caller("bob", 1001), leases, waiters, cards, Policy(context_reserve_mib=512, headroom=Policy().headroom)
    )
    text = json.dumps(view)
    assert "alice" not in text
    assert [k["kernel_id"] for k in view["kernels"]] == ["k-bob"]
    assert view["cards"][0]["others_reserved_mib"] == 2560 and view["cards"][0]["mine_reserved_mib"] == 2560
    assert [(q["position"], q["mine"], q["kernel_id"], q["quota_mib"], q["need_mib"]) for q in view["queue"]] == [
        (1, False, None, None, None),
        (2, True, "k-bob-2", 1024, 1536),  # typed sizes: the need is what the banner says, quota + context reserve
    ]
    admin = view_for(Caller("root", 0, admin=True), leases, waiters, cards, Policy())
    assert {k["user"] for k in admin["kernels"]} == {"alice", "bob"} and len(admin["users"]) == 2


def test_the_host_view_judges_how_much_of_their_limits_a_user_holds():
    """The server decides "limit reached" (the sidebar and the CLI only word it): the sum of the user's quotas,
    not the context reserve, against max_total (a share read against the largest card), and their kernels."""
    leases = [_lease("k-me", "me", 2048), _lease("k-alice", "alice", 6144)]
    cards = [Card(0, "GPU-0", "H200", 10240), Card(1, "GPU-1", "H200", 20480)]
    limits = UserLimits(max_total=Size(percent=25), max_kernels=2)
    use = view_for(Caller("me", 1001), leases, [], cards, Policy(), limits)["limits_use"]
    assert use == {"quota_mib": 2048, "max_total_mib": 5120, "max_kernel_mib": None, "kernels": 1,
                   "max_kernels": 2, "full": False}  # fmt: skip
    assert limits_words(use) == "You hold 2 GiB of 5 GiB and 1 of 2 GPU kernels."
    # an admin's view lists every user: only their own row counts
    admin = view_for(Caller("me", 0, admin=True), leases, [], cards, Policy(), UserLimits(max_total=Size(mib=2048)))
    assert admin["limits_use"]["quota_mib"] == 2048 and admin["limits_use"]["full"] is True
    full = view_for(Caller("alice", 1002), leases, [], cards, Policy(), UserLimits(max_kernels=1))["limits_use"]
    assert full["full"] is True and limits_words(full) == "You hold 1 of 1 GPU kernel."
    assert view_for(Caller("me", 1001), leases, [], cards, Policy())["limits_use"] is None


def test_limits_hook_and_groups():
    broker = GpuShareBroker()
    broker.default_limits = {"max_total": "8GiB", "max_kernels": 3}
    broker.group_limits = {"ta": {"max_total": "24GiB"}, "lab": {"max_total": "16GiB", "max_kernel": "8GiB"}}
    broker.user_limits = {"prof": {"max_total": None}}
    broker.user_limits_hook = lambda user, groups, limits: {"max_kernels": 1} if user == "late" else None
    broker.rules = __import__("jupyter_gpushare.core.policy", fromlist=["LimitRules"]).LimitRules.parse(
        broker.default_limits, broker.user_limits, broker.group_limits
    )
    broker._biggest = 81920
    limits = broker.limits_for(Caller("x", 1, ("ta", "lab")))
    assert limits.max_total.mib == 24 * 1024 and limits.max_kernel.mib == 8192 and limits.max_kernels == 3
    assert broker.limits_for(Caller("prof", 2, ("lab",))).max_total is None
    assert broker.limits_for(Caller("late", 3)).max_kernels == 1
    with pytest.raises(PolicyError, match="at most 1 GPU kernel"):
        UserLimits(max_kernels=1).check("late", 1024, 81920, [1024])


def test_queue_and_cancel_across_users(inproc):
    from jupyter_gpushare.broker import BrokerRefused

    broker, who = inproc
    for i in range(4):
        assert "lease" in broker.handle(who["alice"], "reserve", {"kernel_id": f"a{i}", "mib": 2048})
    waiting = broker.handle(who["bob"], "reserve", {"kernel_id": "b0", "mib": 2048, "wait": True})
    assert waiting["waiting"]["position"] == 1
    for op in ("cancel_wait", "release"):  # not alice's: refused, and bob keeps his place
        with pytest.raises(BrokerRefused, match="another user's"):
            broker.handle(who["alice"], op, {"kernel_id": "b0"})
    queue = broker.handle(who["alice"], "view", {})["queue"]
    assert queue == [
        {
            "position": 1,
            "mine": False,
            "kernel_id": None,
            "kernel_name": None,
            "notebook": None,
            "user": None,
            "quota_mib": None,
            "need_mib": None,
            "waited_s": queue[0]["waited_s"],
        }
    ]
    assert [w["kernel_id"] for w in broker.handle(who["alice"], "waiters", {})] == [""]
    assert broker.handle(who["admin"], "release", {"kernel_id": "a0"})["user"] == "alice"  # admins may release anyone's
    assert "lease" in broker.handle(who["bob"], "reserve", {"kernel_id": "b0", "mib": 2048, "wait": True})
    with pytest.raises(PolicyError, match="largest a kernel may have|does not fit"):
        broker.handle(who["bob"], "reserve", {"kernel_id": "b1", "mib": 20480})


def test_a_failing_limits_hook_is_answered_not_dropped(inproc):
    broker, who = inproc

    def hook(user, groups, limits):
        raise RuntimeError("roster unavailable")

    broker.user_limits_hook = hook
    with pytest.raises(RuntimeError):
        broker.handle(who["bob"], "reserve", {"kernel_id": "b9", "mib": 1024})


def test_host_view_of_an_embedded_ledger_is_all_of_it(tmp_path):
    from jupyter_gpushare.core.policy import parse_size
    from jupyter_gpushare.ledger.ledger import Ledger
    from jupyter_gpushare.ledger.view import host_view

    cards = [Card(0, "GPU-0", "H200", 10240)]
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.reserve(Request("k1", parse_size("2GiB"), "me", "python3"), Policy(), cards, wait=False)
    view = host_view(ledger, "me", cards, Policy())
    assert [k["kernel_id"] for k in view["kernels"]] == ["k1"] and view["cards"][0]["mine_reserved_mib"] == 2048 + 640
    assert host_view(None, "me", cards, Policy()) is None


def test_a_token_identified_server_owns_through_its_session(inproc):
    """Servers in containers (test_hub.py runs them for real): no pids to trust, a session instead,
    and placement only on the cards the server can see."""
    from jupyter_gpushare.broker import BrokerRefused
    from jupyter_gpushare.ledger.ledger import SessionRef

    broker, who = inproc
    broker.cards = [Card(0, "GPU-0", "H200", 10240), Card(1, "GPU-1", "H200", 10240)]
    container = Caller("dana", -1, session=SessionRef("hub:dana:abc"))
    got = broker.handle(container, "reserve", {"kernel_id": "d1", "mib": 1024, "cards": ["GPU-1"]})
    assert got["lease"]["card_uuid"] == "GPU-1" and got["lease"]["owner"] == {"session": "hub:dana:abc"}
    broker.handle(container, "attach", {"kernel_id": "d1", "pid": os.getpid()})  # a pid of another namespace
    assert broker._ledger.get("d1").kernel is None
    with pytest.raises(BrokerRefused, match="None of the cards this server sees"):
        broker.handle(container, "reserve", {"kernel_id": "d2", "mib": 1024, "cards": ["GPU-elsewhere"]})
    assert broker.handle(container, "release_owned_except", {"keep": []})[0]["kernel_id"] == "d1"
    with pytest.raises(BrokerRefused, match="tcp://"):  # neither a process nor a session: say how to connect
        broker.handle(Caller("eve", 5005), "reserve", {"kernel_id": "e1", "mib": 1024})


def test_tcp_settings_are_checked():
    from traitlets.config import Config

    from jupyter_gpushare.config.settings import settings_from

    c = Config()
    c.GpuShareApp.gpu_backend, c.GpuShareApp.simulated_cards = "simulated", "10GiB"
    c.GpuShareBroker.tcp_address = "0.0.0.0:8765"
    c.GpuShareBroker.hub_api_url = ""
    with pytest.raises(PolicyError, match="needs GpuShareBroker.hub_api_url"):
        GpuShareBroker(config=c).setup()
    c.GpuShareBroker.tcp_address = "8765"
    with pytest.raises(PolicyError, match="is not host:port"):
        GpuShareBroker(config=c).setup()
    with pytest.raises(PolicyError, match=r"GpuShareApp.broker_socket = 'tcp://broker' is not host:port"):
        settings_from(Config({"GpuShareApp": {"broker_socket": "tcp://broker"}}))


def test_bad_tcp_callers_get_reasons(inproc, monkeypatch):
    """No token to send, a malformed instance id, a Hub that cannot be reached: each says what is wrong."""
    from servers import free_port

    from jupyter_gpushare.broker import BrokerRefused
    from jupyter_gpushare.broker.protocol import decode_request
    from jupyter_gpushare.host.hub import HubClient
    from jupyter_gpushare.ledger.ledger import LedgerError

    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    with pytest.raises(LedgerError, match=r"no JupyterHub API token \(\$JUPYTERHUB_API_TOKEN\)"):
        BrokerLedger(f"tcp://127.0.0.1:{free_port()}").view()
    broker, _ = inproc
    with pytest.raises(BrokerRefused, match="no JupyterHub configured"):
        broker.authenticate("some-token", "abc")
    broker.hub = HubClient(f"http://127.0.0.1:{free_port()}/hub/api", timeout=2)  # nothing listens there
    with pytest.raises(BrokerRefused, match="'instance' must be text matching"):  # checked where requests are read
        decode_request({"op": "auth", "args": {"token": "some-token", "instance": "../../etc"}})
    with pytest.raises(
        BrokerRefused, match="could not identify this server by its JupyterHub token: the Hub at .* cannot be reached"
    ):
        broker.authenticate("some-token", "abc")
    broker.hub.token = "broker-token"  # a Unix-socket caller while the Hub is down: no Hub groups, not refused
    assert broker.hub.user("alice") is None and broker.identify(os.getpid(), os.getuid()).user


def test_tcp_listener_plain_and_tls_end_to_end(tmp_path):
    """A real broker on TCP, plain and with TLS: a request crosses each (the Hub it asks is down, so the
    answer is that reason); a wrong scheme or an untrusted certificate is named, with what to do."""
    from servers import free_port
    from tls import make_certificates

    from jupyter_gpushare.cli.doctor import diagnose
    from jupyter_gpushare.ledger.ledger import LedgerError

    tls = make_certificates(tmp_path)
    hub = f"http://127.0.0.1:{free_port()}/hub/api"  # nothing listens there
    hub_down = "could not identify this server by its JupyterHub token: the Hub at .* cannot be reached"
    for name, certificate in (("plain", ""), ("tls", f"c.GpuShareBroker.tcp_certfile = {str(tls['cert'])!r}")):
        base, port = tmp_path / name, free_port()
        base.mkdir()
        broker = Broker(base, extra=f"""
            c.GpuShareBroker.tcp_address = "127.0.0.1:{port}"
            c.GpuShareBroker.hub_api_url = {hub!r}
            c.GpuShareBroker.tcp_keyfile = {str(tls['key']) if certificate else ''!r}
            {certificate}
        """).start()  # fmt: skip
        try:
            good, wrong = ("tls", "tcp") if certificate else ("tcp", "tls")
            with pytest.raises(LedgerError, match=hub_down):
                BrokerLedger(f"{good}://127.0.0.1:{port}", token="a-token", ca_file=str(tls["ca"])).view()
            with pytest.raises(LedgerError, match=f"use {good}://"):
                BrokerLedger(f"{wrong}://127.0.0.1:{port}", token="a-token", ca_file=str(tls["ca"]), timeout=3).view()
            if certificate:
                with pytest.raises(LedgerError, match="does not trust the GPU broker's certificate .*broker_ca_file"):
                    BrokerLedger(f"tls://127.0.0.1:{port}", token="a-token").view()
                with pytest.raises(LedgerError, match="must name 'localhost'"):  # the certificate names 127.0.0.1
                    BrokerLedger(f"tls://localhost:{port}", token="a-token", ca_file=str(tls["ca"])).view()
                said = f"TLS 127.0.0.1:{port}"
            else:
                said = "is plain TCP: servers' JupyterHub tokens cross it unencrypted"
            # waited for, not read once: in one loaded full run the log file read back empty here (cause not found)
            wait_until(
                lambda said=said, broker=broker: said in broker.output(), timeout=10, what=f"the broker to log {said!r}"
            )
            assert ("plain TCP" in broker.output()) is not bool(certificate)
            findings = [
                (f.status, f.detail) for f in diagnose(socket_path=f"{good}://127.0.0.1:{port}") if f.check == "broker"
            ]
            plain = ("warn", "This server's JupyterHub token crosses plain TCP to the broker.")
            assert findings[0][0] == "error" and findings[1:] == ([] if certificate else [plain])
        finally:
            broker.stop()


def test_tls_settings_are_checked(tmp_path):
    from traitlets.config import Config

    from jupyter_gpushare.config.settings import settings_from

    c = Config()
    c.GpuShareApp.gpu_backend, c.GpuShareApp.simulated_cards = "simulated", "10GiB"
    c.GpuShareBroker.hub_api_url = "http://127.0.0.1:8081/hub/api"
    c.GpuShareBroker.tcp_certfile = str(tmp_path / "missing.pem")
    with pytest.raises(PolicyError, match="tcp_certfile is for the TCP listener: set tcp_address too"):
        GpuShareBroker(config=c).setup()
    c.GpuShareBroker.tcp_address = "127.0.0.1:8765"
    with pytest.raises(
        PolicyError, match=r"tcp_certfile '.*missing.pem' / tcp_keyfile '' cannot be used \(.*No such file"
    ):
        GpuShareBroker(config=c).setup()
    c.GpuShareBroker.tcp_certfile, c.GpuShareBroker.tcp_keyfile = "", str(tmp_path / "key.pem")
    with pytest.raises(PolicyError, match="tcp_keyfile is set but tcp_certfile is not"):
        GpuShareBroker(config=c).setup()
    with pytest.raises(PolicyError, match="broker_ca_file = '.*missing.pem' is not a file this server can read"):
        settings_from(
            Config(
                {"GpuShareApp": {"broker_socket": "tls://broker:8765", "broker_ca_file": str(tmp_path / "missing.pem")}}
            )
        )


NEWROOT = str(Path(__file__).parent.parent / "newroot.py")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare (namespaces)")
@pytest.mark.parametrize(
    "where, wrap, refused",
    [
        # its own PID namespace, as in most containers
        ("pid-namespace", lambda root: ["unshare", "--pid", "--fork"], "is in a PID namespace of its own"),
        # the host's PIDs but its own root filesystem: docker run --pid=host, Apptainer
        (
            "own-root",
            lambda root: ["unshare", "--mount", "--fork", sys.executable, NEWROOT, root],
            "sees another root filesystem, tmpfs newroot, than the broker's",
        ),
        # a mount namespace over the host's root, as a systemd sandbox (ProtectHome=tmpfs): not a container
        (
            "sandbox",
            lambda root: [
                "unshare",
                "--mount",
                "--fork",
                "sh",
                "-c",
                f'mount -t tmpfs sandbox {root} && exec "$@"',
                "-",
            ],
            None,
        ),
    ],
    ids=["pid-namespace", "own-root", "sandbox"],
)
def test_a_server_in_a_container_on_the_unix_socket_is_refused_and_told_to_use_tcp(tmp_path, where, wrap, refused):
    """A container that mounts the socket: its uid names nobody for sure (and, in its own PID namespace, its
    pids mean nothing here). allow_container_callers lets it in; a systemd-style sandbox is never refused."""
    from jupyter_gpushare.broker import container_reason

    assert container_reason(os.getpid()) is None
    user = pwd.getpwuid(os.getuid()).pw_name
    for allow in (False, True):
        base = tmp_path / str(allow)
        (base / "root").mkdir(parents=True)
        broker = Broker(base, extra=f"c.GpuShareBroker.allow_container_callers = {allow}").start()
        code = (
            "import json; from jupyter_gpushare.broker import BrokerLedger\n"
            "from jupyter_gpushare.ledger.ledger import LedgerError\n"
            f"try: print(json.dumps(BrokerLedger({broker.socket!r}).hello()['user']))\n"
            "except LedgerError as e: print(json.dumps(str(e)))\n"
        )
        try:
            out = subprocess.run(
                [*wrap(str(base / "root")), sys.executable, "-c", code], capture_output=True, text=True, timeout=60
            )
        finally:
            broker.stop()
        said = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else out.stderr
        if allow or not refused:
            assert said == user, (where, said)
        else:
            assert "runs in a container (process" in said and refused in said, said
            assert "GpuShareApp.broker_socket = 'tls://host:port'" in said and "allow_container_callers" in said


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"),
    reason="needs root, unshare, setpriv",
)
def test_a_broker_that_cannot_see_other_users_processes_says_why(tmp_path):
    """/proc mounted with hidepid=2 hides other users' processes from a broker that runs as its own user:
    it could not tell when a server exits, so it says so at start and refuses servers with what to do,
    instead of taking them for containers; a lease of a process it cannot see is never reclaimed as gone."""
    name = f"gsp{RUN}"
    user = ensure_user(name)
    with shared_scratch("gpushare-hidepid-") as base:
        for sub in ("run", "lib"):
            (base / sub).mkdir(mode=0o755)
            os.chown(base / sub, user.pw_uid, user.pw_gid)
        as_user = f"setpriv --reuid={user.pw_uid} --regid={user.pw_gid} --clear-groups"
        # (HOME: its own, not root's: jupyter_core's first-run migration would read root's ~/.ipython)
        hide = f'mount -t proc -o hidepid=2 proc /proc && exec {as_user} env HOME={base} "$@"'
        prefix = ("unshare", "--mount", "--fork", "sh", "-c", hide, "-")
        broker = Broker(base, prefix=prefix).start()
        # Leases of processes /proc hides (this one, root's) are not taken for gone; a gone one is.
        gone = subprocess.Popen(["true"])
        gone.wait()
        me = ProcessRef.me()
        alive = subprocess.run(
            [*prefix, sys.executable, "-c", "import sys; from jupyter_gpushare.ledger.ledger import ProcessRef as P; "
             f"print(P.of({me.pid}), P({me.pid}, {me.start}).alive(), P({gone.pid}, {me.start}).alive())"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        try:
            client = BrokerLedger(broker.socket, broker_uids=frozenset({user.pw_uid}))  # (GpuShareApp.broker_users)
            with pytest.raises(LedgerError) as refused:
                client.hello()
            client.close()
        finally:
            log = broker.output()
            broker.stop()
            remove_user(name)
        assert alive.stdout.split() == ["None", "True", "False"], alive.stderr
        said = str(refused.value)
        assert f"cannot see this server's process {os.getpid()} (user root)" in said, said
        assert f"so the broker's user {name} cannot see other users' processes" in said  # hidepid=2 or =invisible
        assert "mount -o remount,hidepid=2,gid=gpushare /proc" in said and "container" not in said
        assert "/proc is mounted with hidepid=" in log and "Servers on this host are refused until then" in log


def test_the_broker_measures_memory_used_outside_reservations(inproc):
    """The broker reads the driver itself (servers send nothing it must trust): a script's memory, in no
    lease's kernel tree, is taken when placing, and the waiting answer says how much it is."""
    broker, who = inproc
    script = subprocess.Popen(["sleep", "60"])
    try:
        broker.backend.fake.add_process(script.pid, 6144)
        got = broker.handle(who["alice"], "reserve", {"kernel_id": "k1", "mib": 4096})
        assert got["waiting"]["outside_mib"] == 6144 and got["waiting"]["free_mib"] == 10240 - 6144
        assert "lease" in broker.handle(who["alice"], "reserve", {"kernel_id": "k1", "mib": 3072})
    finally:
        script.kill()


def test_room_given_back_is_granted_from_a_reading_taken_after_it(inproc):
    """A kernel used its lease's 8 GiB and ended, and its lease was given back. The broker's last reading of the card
    still lists its process, in no lease now, as use outside reservations. The kernel in line is granted from a
    reading taken after the release, not from that one, which the broker keeps up to SAMPLE_TTL_S (a class's
    hand-off waited for it on the server's own path: 0.67 s median on an H200)."""
    broker, who = inproc
    kernel = subprocess.Popen(["sleep", "60"])
    try:
        assert "lease" in broker.handle(who["alice"], "reserve", {"kernel_id": "a1", "mib": 8192})
        broker.handle(who["admin"], "attach", {"kernel_id": "a1", "pid": kernel.pid})
        broker.backend.fake.add_process(kernel.pid, 8192)
        broker.reading.stale()  # (read now, with a1's process in it)
        assert "waiting" in broker.handle(who["bob"], "reserve", {"kernel_id": "b1", "mib": 4096, "wait": True})
        broker.reading.ttl_s = 3600.0  # that reading kept for an hour, however slow this machine is
        kernel.kill()
        kernel.wait()
        broker.backend.fake.remove_process(kernel.pid)
        assert broker.handle(who["alice"], "release", {"kernel_id": "a1"})["kernel_id"] == "a1"
        got = broker.handle(who["bob"], "reserve", {"kernel_id": "b1", "mib": 4096, "wait": True})
        assert "lease" in got, got
    finally:
        kernel.kill()


def test_a_kernels_quota_is_resized_on_its_own_lease_by_its_own_server_only(inproc):
    """resize keeps the lease and its card: smaller always, larger only from what the card has unreserved; another
    user's kernel is refused, and the per-user limits count the new quota."""
    from jupyter_gpushare.broker import BrokerRefused

    broker, who = inproc
    broker.rules = broker.rules.__class__.parse({"max_kernel": "6GiB"}, {}, {})
    first = broker.handle(who["alice"], "reserve", {"kernel_id": "a0", "mib": 4096})["lease"]
    broker.handle(who["bob"], "reserve", {"kernel_id": "b0", "mib": 4096})  # 9 GiB of 10 reserved
    with pytest.raises(BrokerRefused, match="another user's"):
        broker.handle(who["bob"], "resize", {"kernel_id": "a0", "quota_mib": 1024})
    with pytest.raises(PolicyError) as e:
        broker.handle(who["alice"], "resize", {"kernel_id": "a0", "quota_mib": 6144})
    assert e.value.code == "grow-no-room" and e.value.params["free_mib"] == 1024
    smaller = broker.handle(who["alice"], "resize", {"kernel_id": "a0", "quota_mib": 2048})
    assert (smaller["card_uuid"], smaller["created"], smaller["quota_mib"]) == (
        first["card_uuid"],
        first["created"],
        2048,
    )
    assert broker.handle(who["alice"], "resize", {"kernel_id": "a0", "quota_mib": 5120})["quota_mib"] == 5120
    broker.handle(who["bob"], "release", {"kernel_id": "b0"})
    with pytest.raises(PolicyError) as e:  # room enough now, but past alice's per-user max_kernel
        broker.handle(who["alice"], "resize", {"kernel_id": "a0", "quota_mib": 7168})
    assert e.value.code in ("user-max-kernel", "quota-above-max")
    with pytest.raises(BrokerRefused, match="quota_mib"):
        broker.handle(who["alice"], "resize", {"kernel_id": "a0", "quota_mib": -1})


def test_an_admins_view_of_a_host_with_many_history_rows_is_read_whole(tmp_path):
    """A student filled the history (thousands of notebooks' runs): the admin's view through the broker is some
    MB on one line, and is read whole (it used to be cut at 64 KiB and said 'not reachable'); its notebooks are
    bounded to the most recently run."""
    import sqlite3

    broker = Broker(tmp_path).start()
    try:
        db = sqlite3.connect(broker.ledger, timeout=30)
        now = time.time()
        rows = [
            (f"k{i}", "r", "mallory", "python3", f"flood/{'x' * 200}-{i}.ipynb", 512, 1024, now - i)
            for i in range(3000)
        ]
        db.executemany(
            "INSERT INTO peaks (kernel_id, run, user, kernel_name, path, peak_mib, reserved_mib, recorded)"
            " VALUES (?,?,?,?,?,?,?,?)",
            rows,
        )
        db.commit()
        db.close()
        view = BrokerLedger(broker.socket).view()
        # bounded: the 500 most recently run of the 3,000, and how many there are
        assert view["admin"] and len(view["notebooks"]) == 500 and view["notebooks_total"] == 3000
        assert {n["path"] for n in view["notebooks"]} == {r[4] for r in rows[:500]}
        assert len(json.dumps(view)) > 64 << 10
    finally:
        broker.stop()


def test_guessing_notebook_paths_costs_the_same_whether_a_guess_hits(inproc):
    """Another user's runs answer for a path the student chooses: each notebook not the student's own counts
    against the hourly budget, a miss too, so a student cannot probe for a teacher's path for free."""
    from dataclasses import replace

    broker, who = inproc
    broker._taught.per_hour = 5
    broker.history = replace(broker.history, teachers=frozenset({"bob"}))  # bob's runs teach the class
    assert "lease" in broker.handle(who["bob"], "reserve", {"kernel_id": "t0", "mib": 2048, "kernel_name": "python3"})
    assert broker.handle(who["bob"], "record_peak", {"kernel_id": "t0", "path": "exam/final.ipynb", "peak_mib": 3072})
    ask = {"kernel_name": "python3", "path": "exam/final.ipynb"}
    assert broker.handle(who["admin"], "learned_peak", ask) is not None  # (control: others' runs do answer here)
    for i in range(5):  # five misses: the budget is spent
        assert (
            broker.handle(who["alice"], "learned_peak", {"kernel_name": "python3", "path": f"exam/guess{i}.ipynb"})
            is None
        )
    assert broker.handle(who["alice"], "learned_peak", ask) is None  # the real path, asked once the budget is spent


def test_group_requests_with_ids_no_cgroup_can_have_are_refused_with_why(inproc):
    from jupyter_gpushare.broker.protocol import BrokerRefused

    """Kernel ids the wire takes (``:`` is allowed there) but a cgroup's name cannot: each group request says why,
    and malformed arguments are refused by the protocol (another user's group: test_attacks.py)."""
    broker, who = inproc
    for op in ("enter_group", "end_group"):
        with pytest.raises(BrokerRefused) as e:
            broker.handle(who["alice"], op, {"kernel_id": "a:b"})
        assert "cannot name a cgroup" in str(e.value) or "makes no cgroups" in str(e.value), (op, e.value)
    for bad in ({"kernel_id": ""}, {"kernel_id": 7}, {"kernel_id": "k1", "keep": "yes"}):
        with pytest.raises(BrokerRefused, match="Bad 'end_group' request"):
            broker.handle(who["alice"], "end_group", bad)


def test_a_teachers_actions_are_the_admins_and_reach_only_the_kernels_user(inproc):
    """A student can neither act on another's kernel nor on their own through the broker; an admin moves a kernel
    to the front, takes one out of line or has a reservation given back; the notices go to the kernel's own user,
    once, and a reason that is not one printable line is refused."""
    from jupyter_gpushare.broker.protocol import BrokerRefused

    broker, who = inproc
    card = broker.cards[0].total_mib
    assert "lease" in broker.handle(who["alice"], "reserve", {"kernel_id": "a1", "mib": card - 2048})
    for kid in ("b1", "b2"):  # bob's two wait
        assert "waiting" in broker.handle(who["bob"], "reserve", {"kernel_id": kid, "mib": 4096, "wait": True})
    for caller in ("alice", "bob"):
        with pytest.raises(BrokerRefused, match="Only an admin"):
            broker.handle(who[caller], "act", {"kernel_id": "b2", "action": "front", "why": "me first"})
    for bad in ({"kernel_id": "b2", "action": "evict", "why": ""}, {"kernel_id": "b2", "action": "front", "why": "a\nb"},
                {"kernel_id": "b2", "action": "front", "why": "x" * 201}):  # fmt: skip
        with pytest.raises(BrokerRefused, match="Bad 'act' request"):
            broker.handle(who["admin"], "act", bad)
    with pytest.raises(BrokerRefused, match="not in line"):
        broker.handle(who["admin"], "act", {"kernel_id": "a1", "action": "remove", "why": ""})
    said = broker.handle(who["admin"], "act", {"kernel_id": "b2", "action": "front", "why": "her lab is due"})
    assert said["by"] == "root" and said["why"] == "her lab is due"
    assert [w["kernel_id"] for w in broker.handle(who["admin"], "waiters", {})] == ["b2", "b1"]
    broker.handle(who["admin"], "act", {"kernel_id": "a1", "action": "release", "why": "idle for an hour"})
    assert broker.handle(who["bob"], "take_notices", {"kernel_ids": ["a1"]}) == []  # not bob's kernel
    assert [n["action"] for n in broker.handle(who["bob"], "take_notices", {"kernel_ids": ["b1", "b2"]})] == ["front"]
    assert broker.handle(who["bob"], "take_notices", {"kernel_ids": ["b2"]}) == []  # given once
    (release,) = broker.handle(who["alice"], "take_notices", {"kernel_ids": ["a1"]})
    assert release["action"] == "release" and release["why"] == "idle for an hour"
    for bad in ({"kernel_ids": "a1"}, {"kernel_ids": [7]}, {"kernel_ids": ["a:b\n"]}, {"kernel_ids": ["k"] * 1001}):
        with pytest.raises(BrokerRefused, match="Bad 'take_notices' request"):
            broker.handle(who["alice"], "take_notices", bad)
