"""A hostile student against a root broker: real Unix users, their real Jupyter servers and real kernels.

Each test is one class of attack that once broke the promise (the card overbooked, a quota escaped, a
limit bypassed, the broker starved), tried the way a student would: from their own processes, from
code in their own kernel, with every byte of the request theirs. What must hold after each: the
reservations on the card add up to at most the card, nobody's lease changed but by its own server,
and the student was told what was refused and why. Needs root (useradd, servers as other users).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
from pathlib import Path

import pytest
from multiuser import (
    ALICE,
    BOB,
    Broker,
    as_user,
    needs_root,
    reserved,
    run_as,
    run_in_kernel,
    running_host,
)
from servers import wait_until

CAP = 8  # connections per user (GpuShareBroker.max_connections_per_user) on this test's broker


@pytest.fixture(scope="module")
def host():
    extra = f"c.GpuShareBroker.max_connections_per_user = {CAP}"
    with running_host("gpushare-attacks-", staff=False, limits={"max_total": "5GiB"}, extra=extra) as got:
        yield got


def lease_of(broker: Broker, kernel_id: str) -> dict | None:
    return next((k for k in broker.admin_view()["kernels"] if k["kernel_id"] == kernel_id), None)


@needs_root
def test_crafted_sizes_sent_to_the_broker_socket_are_refused_and_book_nothing(host):
    broker, servers = host
    bob = servers[BOB]
    before = reserved(broker)
    got = as_user(
        bob.user,
        bob.home,
        f"""
        import json, socket
        lines = [
            '{{"op": "reserve", "args": {{"kernel_id": "neg", "percent": -5}}}}',
            '{{"op": "reserve", "args": {{"kernel_id": "bool", "mib": true}}}}',
            '{{"op": "reserve", "args": {{"kernel_id": "inf", "mib": 1e999}}}}',
            '{{"op": "reserve", "args": {{"kernel_id": "nan", "percent": NaN}}}}',
            '{{"op": "reserve", "args": {{"kernel_id": "big", "mib": 1{"0" * 5000}}}}}',
            '{{"op": "reserve", "args": {{"kernel_id": "zero", "mib": 0}}}}',
            '{{"op": "reserve", "args": {{"kernel_id": "tiny", "percent": 0.000001}}}}',
        ]
        s = socket.socket(socket.AF_UNIX); s.connect({broker.socket!r}); f = s.makefile()
        out = []
        for line in lines:
            s.sendall(line.encode() + b"\\n")
            out.append(json.loads(f.readline()))
        print(json.dumps(out))
        """,
    )
    assert [r["ok"] for r in got] == [False] * 7
    assert all(r["message"] for r in got)
    assert "-5% is not a size" in got[0]["message"] and "'mib' must be a whole number; got True" in got[1]["message"]
    assert "at least 256 MiB" in got[5]["message"] and "at least 256 MiB" in got[6]["message"]
    assert reserved(broker) == before
    assert "Traceback" not in broker.output()


@needs_root
def test_code_in_a_kernel_cannot_release_or_rebind_its_own_reservation(host):
    broker, servers = host
    alice = servers[ALICE]
    kid = alice.start_kernel()
    lease = lease_of(broker, kid)
    assert lease is not None and lease["kernel_pid"]
    printed = run_in_kernel(
        alice,
        kid,
        f"""
        import json, os, socket
        s = socket.socket(socket.AF_UNIX); s.connect({broker.socket!r}); f = s.makefile()
        for op, args in (("release", {{}}), ("attach", {{"pid": os.getpid()}}), ("cancel_wait", {{}})):
            s.sendall(json.dumps({{"op": op, "args": {{"kernel_id": os.environ["GPUSHARE_KERNEL_ID"], **args}}}}).encode() + b"\\n")
            print(json.dumps(json.loads(f.readline())))
        """,
    )
    replies = [json.loads(line) for line in printed.splitlines()]
    assert [r["ok"] for r in replies[:2]] == [False, False]
    assert all("Only the Jupyter server that holds kernel" in r["message"] for r in replies[:2])
    after = lease_of(broker, kid)
    assert after is not None and {**after, "age_s": 0} == {**lease, "age_s": 0}  # untouched, still attached
    assert alice.kernel(kid)["state"] == "running"
    alice.call("DELETE", f"api/kernels/{kid}")  # its own server may
    wait_until(lambda: lease_of(broker, kid) is None, what="the server's own release")


@needs_root
def test_one_student_holding_many_connections_does_not_starve_the_others(host):
    broker, servers = host
    alice, bob = servers[ALICE], servers[BOB]
    log_before = len(broker.output())
    flood = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import json, socket, sys, time
            held, refused = [], []
            for i in range(40):
                s = socket.socket(socket.AF_UNIX); s.connect({broker.socket!r})
                try:
                    s.sendall(b'{{"op": "hello"}}\\n' * 50)  # and a burst of requests on each
                except BrokenPipeError:
                    pass  # refused and closed while the burst was sent: its refusal is still there to read
                reply = json.loads(s.makefile().readline())
                (held if reply["ok"] else refused).append(reply)
                if reply["ok"]:
                    held[-1] = s
            print(json.dumps({{"held": len(held), "refused": [r["message"] for r in refused]}}), flush=True)
            time.sleep(120)
        """)],
        stdout=subprocess.PIPE, text=True, **run_as(bob.user, bob.home),
    )  # fmt: skip
    try:
        result = json.loads(flood.stdout.readline())
        # bob's own server holds a connection too: the flood gets the rest of his share, no more
        assert CAP - 2 <= result["held"] < CAP and len(result["refused"]) == 40 - result["held"]
        assert f"Too many connections to the GPU broker from {bob.user.pw_uid} ({CAP} are open" in result["refused"][0]
        t0 = time.monotonic()
        kid = alice.start_kernel()  # another student's kernel starts as usual, on the GPU
        assert alice.kernel(kid)["state"] == "running" and time.monotonic() - t0 < 30
        alice.call("DELETE", f"api/kernels/{kid}")
    finally:
        flood.kill()
        flood.wait()
    grown = len(broker.output()) - log_before
    assert grown < 20_000, broker.output()[-3000:]  # refusals are logged at a bounded rate


@needs_root
def test_a_quota_past_the_users_limit_is_refused_when_asked_not_at_the_restart(host):
    broker, servers = host
    bob = servers[BOB]
    k1, k2 = bob.start_kernel(), bob.start_kernel()  # 2 GiB each; bob may hold 5 GiB in all
    with pytest.raises(urllib.error.HTTPError) as e:
        bob.call("PATCH", f"api/gpushare/kernels/{k1}", {"quota": "4GiB"})
    message = json.loads(e.value.read())["message"]
    assert e.value.code == 400 and "at most 5 GiB of GPU memory in all kernels together" in message
    assert bob.kernel(k1)["pending_quota_mib"] is None
    assert bob.call("PATCH", f"api/gpushare/kernels/{k1}", {"quota": "3GiB"})["pending_quota_mib"] == 3072
    # through the broker, bob's server counts only bob's kernels on the card, never the others' total
    assert bob.call("GET", "api/gpushare/cards")["cards"][0]["kernels"] == 2
    for kid in (k1, k2):
        bob.call("DELETE", f"api/kernels/{kid}")


FAKE_BROKER = r"""
import json, socket, sys
path, said = sys.argv[1], sys.argv[2]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(8)
open(said + ".up", "w").close()  # (it listens: the socket's file exists from bind(), before connect() can succeed)
got = b""
while True:
    conn, _ = server.accept()
    conn.settimeout(2)
    try:
        got += conn.recv(65536)
        conn.sendall(json.dumps({"ok": True, "result": {"GPUSHARE_QUOTA_MIB": "999999"}}).encode() + b"\n")
    except OSError:
        pass
    conn.close()
    open(said, "w").write(str(len(got)))
"""


@needs_root
@pytest.mark.parametrize("where", ["sticky", "her own"])
def test_a_socket_another_user_serves_is_not_taken_for_the_broker(tmp_path, where):
    """Another student listens where a server looks for the broker: in a directory anyone may write (an admin's
    mistake, the broker not running), or in a 0755 directory of her own (the socket a server of another student was
    pointed at, or that she talked him into). The server sends nothing to it and says why: a peer is believed by its
    credentials (root, the server's own user, GpuShareApp.broker_users), never by the directory it sits in. Before,
    the second passed as 'the owner of a directory only it may write', and the server handed her its leases,
    waiters and peaks, and took her quotas (GPUSHARE_QUOTA_MIB=999999 in his kernel)."""
    import os
    import tempfile
    from pathlib import Path

    from multiuser import ensure_user, root_traversable

    from jupyter_gpushare.broker import BrokerLedger
    from jupyter_gpushare.ledger.ledger import LedgerError

    mallory = ensure_user(BOB)
    shared = Path(tempfile.mkdtemp(prefix="gpushare-shared-", dir="/tmp"))
    os.chmod(shared, 0o1777 if where == "sticky" else 0o755)
    if where == "her own":
        os.chown(shared, mallory.pw_uid, mallory.pw_gid)
    socket_path, said = shared / "broker.sock", shared / "said"
    home = shared / "home"
    home.mkdir()
    os.chown(home, mallory.pw_uid, mallory.pw_gid)
    with root_traversable():
        fake = subprocess.Popen(
            [sys.executable, "-c", FAKE_BROKER, str(socket_path), str(said)], **run_as(mallory, home)
        )
        try:
            wait_until((shared / "said.up").exists, what="the fake broker to listen")
            with pytest.raises(LedgerError, match="is served by uid .* It is not the GPU broker, and nothing was sent"):
                BrokerLedger(str(socket_path)).view()
            time.sleep(0.5)
            assert not said.exists() or said.read_text() == "0"  # it received nothing
            # the admin's word makes a dedicated broker user believed, and no one else
            answered = BrokerLedger(str(socket_path), broker_uids=frozenset({mallory.pw_uid}), timeout=5.0)
            assert answered.view() == {"GPUSHARE_QUOTA_MIB": "999999"}  # (the control: this check can pass her)
            wait_until(lambda: said.exists() and said.read_text() != "0", what="the request to reach the named user")
        finally:
            fake.kill()
            fake.wait()
            shutil.rmtree(shared, ignore_errors=True)


# A kernel's code tries to leave its cgroup the ways a delegated subtree allowed (issue 33, #4): a sub-group of
# its own, and its own group's parent (where its server's processes are); prints the daemon's pid and what
# each try got.
LEAVE_GROUP = """
import json, os, time
path = next(line.split(":", 2)[2] for line in open("/proc/self/cgroup").read().splitlines() if line.startswith("0::"))
# (a hybrid host mounts the unified hierarchy apart; the groups' directories are root's, not for it to look into)
mount = "/sys/fs/cgroup/unified" if os.path.ismount("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        time.sleep(300)
        os._exit(0)
    os._exit(0)
daemon = int(os.read(r, 20))
tries = {}
for name, action in (
    ("sub-group", lambda: os.mkdir(mount + path + "/hideout")),
    ("parent", lambda: open(mount + os.path.dirname(path) + "/cgroup.procs", "w").write(str(daemon))),
):
    try:
        action()
        tries[name] = "done"
    except OSError as e:
        tries[name] = e.strerror
import socket
with socket.socket(socket.AF_UNIX) as s:  # and asks the broker to move it to a group of another kernel id
    s.connect(BROKER)
    s.sendall(json.dumps({"op": "enter_group", "args": {"kernel_id": "elsewhere-1"}}).encode() + b"\\n")
    tries["through the broker"] = json.loads(s.makefile().readline()).get("message")
print(json.dumps({"daemon": daemon, "group": path, "tries": tries}))
"""


@needs_root
def test_a_students_kernel_is_held_in_a_cgroup_the_broker_owns_and_cannot_leave_it(host):
    """A student's server (no cgroup of its own: nothing is delegated to her) holds its kernels in groups the
    root broker makes: what a kernel starts stays in its group, it can neither make a sub-group nor move a process
    out, and what is left in the group is ended with the kernel."""
    from jupyter_gpushare.host.cgroups import KernelCgroups, kernel_of

    if KernelCgroups().level.tracking != "cgroup":  # the broker runs as root beside this test: it could make none
        pytest.skip(f"no cgroups can be made here: {KernelCgroups().level.reason}")
    broker, servers = host
    alice = servers[ALICE]
    kid = alice.start_kernel()
    held = alice.kernel(kid)["held"]
    assert (held["tracking"], held["escapable"]) == ("cgroup", False), held
    code = f"BROKER = {broker.socket!r}\n" + LEAVE_GROUP
    got = json.loads(run_in_kernel(alice, kid, code).strip().splitlines()[-1])
    assert got["group"].endswith(f"/gpushare-kernels/{kid}")
    assert got["tries"] == {
        "sub-group": "Permission denied",
        "parent": "Permission denied",
        "through the broker": f"This process is kernel {kid}'s: it stays in that kernel's cgroup.",
    }, got
    daemon = got["daemon"]
    assert kernel_of(daemon) == kid  # out of the kernel's process tree, not out of its group
    bob = servers[BOB]  # another student may neither enter alice's kernel's group nor end it
    answers = as_user(
        bob.user,
        bob.home,
        f"""
        import json, socket
        out = []
        for op in ("enter_group", "end_group", "group_cards"):
            s = socket.socket(socket.AF_UNIX); s.connect({broker.socket!r})
            s.sendall(json.dumps({{"op": op, "args": {{"kernel_id": {kid!r}}}}}).encode() + b"\\n")
            out.append(json.loads(s.makefile().readline()))
        print(json.dumps(out))
        """,
    )
    assert [a["ok"] for a in answers] == [False, False, False], answers
    assert "is not yours" in answers[0]["message"] and "not yours" in answers[1]["message"]
    assert kernel_of(daemon) == kid and psutil_running(daemon)
    alice.call("DELETE", f"api/kernels/{kid}")
    wait_until(lambda: not psutil_running(daemon), what="the kernel's daemon ended with it")
    wait_until(lambda: kernel_of(daemon) is None, what="its group gone")


def psutil_running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@needs_root
def test_a_kernels_stand_in_enters_no_group_on_the_word_of_a_broker_that_is_not_root():
    """A socket at the broker's path served by someone else (an admin's mistake, a broker that is not running):
    the kernel's stand-in checks the peer's credentials and refuses to start the kernel on its answer."""
    import pwd

    from jupyter_gpushare.launch.held import standin_command

    nobody = pwd.getpwnam("nobody")
    where = Path(tempfile.mkdtemp(prefix="gpushare-fake-broker-"))  # (pytest's tmp_path: root's, closed to nobody)
    os.chmod(where, 0o777)
    sock = where / "fake.sock"
    fake = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import socket
            s = socket.socket(socket.AF_UNIX); s.bind({str(sock)!r}); s.listen(4)
            import os; os.chmod({str(sock)!r}, 0o777)
            print("ready", flush=True)
            while True:
                c, _ = s.accept(); c.makefile().readline()
                c.sendall(b'{{"ok": true, "result": {{"procs": []}}}}\\n'); c.close()
        """)],
        stdout=subprocess.PIPE, text=True, user=nobody.pw_uid, group=nobody.pw_gid,
    )  # fmt: skip
    try:
        assert fake.stdout.readline().strip() == "ready"
        ran = subprocess.run(
            standin_command([], [sys.executable, "-c", "print('the kernel ran')"], (str(sock), "k1")),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert ran.returncode == 126 and "the kernel ran" not in ran.stdout
        assert f"runs as uid {nobody.pw_uid}, not root: it is not the host's broker" in ran.stderr
    finally:
        fake.kill()
        fake.wait()
        shutil.rmtree(where, ignore_errors=True)


@needs_root
def test_kernels_ended_at_once_end_their_groups_one_request_at_a_time(host):
    """Two kernels shut down at the same moment: the server ends their groups through the broker from two work
    threads, on one connection. Each request waits for the other's answer (before, the two crossed on the socket:
    a KeyError in one clean-up and a thread that waited for an answer the other had read, which held the server's
    exit for 20 s)."""
    from concurrent.futures import ThreadPoolExecutor

    broker, servers = host
    alice = servers[ALICE]
    kids = [alice.start_kernel() for _ in range(2)]
    for kid in kids:
        assert run_in_kernel(alice, kid, "print(6 * 7)").strip() == "42"  # started, and answering
    before = len(alice.output())
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda kid: alice.call("DELETE", f"api/kernels/{kid}"), kids))
    wait_until(lambda: not any(lease_of(broker, kid) for kid in kids), what="both leases given back")
    said = alice.output()[before:]
    assert "Traceback" not in said and "KeyError" not in said, said[-3000:]
    assert said.count("is ended once the broker answers") == 0, said[-3000:]
