"""A teacher's rulings are the broker's, not the student's to rename, ignore or undo (issue 44), and what the broker
made survives its restart: a real root broker, Jupyter servers run as real Unix users, their kernels, and clients
of the broker's socket run as the students themselves.

The card is the broker's simulated 10 GiB one; each kernel reserves 2 GiB + 512 MiB of context, so four fit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error

import pytest
from multiuser import ALICE, BOB, SIMULATED, needs_root, run_as, running_host
from servers import wait_until

from jupyter_gpushare.broker import BrokerLedger
from jupyter_gpushare.cli.status import format_status
from jupyter_gpushare.host.cgroups import KernelCgroups
from jupyter_gpushare.ledger import notices

pytestmark = needs_root

# A client of the broker's socket that ignores every notice: it asks for its kernel's place (or lease) twice a
# second, as a server's line does, and writes each answer as a line of JSON.
IGNORES_NOTICES = """
import json, socket, sys, time
path, kernel_id, wait, out = sys.argv[1], sys.argv[2], sys.argv[3] == "wait", sys.argv[4]
s = socket.socket(socket.AF_UNIX)
s.connect(path)
replies = s.makefile("rb")
while True:
    s.sendall(json.dumps({"op": "reserve", "args": {"kernel_id": kernel_id, "mib": 2048, "wait": wait}}).encode() + b"\\n")
    with open(out, "a") as f:
        f.write(replies.readline().decode())
    time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def host():
    gpu = {**SIMULATED, "on_full": "queue", "queue_timeout": "600"}
    with running_host("gpushare-rulings-", staff=False, gpu=gpu, limits={}) as got:
        yield got


@pytest.fixture
def full_card(host):
    """Bob's four kernels fill the card; all gone afterwards."""
    broker, servers = host
    bob = servers[BOB]
    kernels = [bob.start_kernel() for _ in range(4)]
    wait_until(lambda: all(bob.kernel(k)["state"] == "running" for k in kernels), timeout=120, what="bob's kernels")
    yield kernels
    for server in servers.values():
        for session in server.call("GET", "api/sessions"):
            server.call("DELETE", f"api/sessions/{session['id']}")
        for k in server.call("GET", "api/kernels"):
            server.call("DELETE", f"api/kernels/{k['id']}")


def _open(server, name: str) -> str:
    """A notebook's kernel, with its session (a kernel in line that no session or client wants steps out of it)."""
    body = {"path": f"{name}.ipynb", "type": "notebook", "name": name, "kernel": {"name": "python3"}}
    return server.call("POST", "api/sessions", body)["kernel"]["id"]


def _teacher(broker) -> BrokerLedger:
    return BrokerLedger(broker.socket)  # root: an admin of the broker


def _answers(path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def _hostile(host, tmp_path, kernel_id: str, wait: bool) -> tuple[subprocess.Popen, object]:
    broker, servers = host
    alice = servers[ALICE]
    out = alice.home / f"{kernel_id}.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", IGNORES_NOTICES, broker.socket, kernel_id, "wait" if wait else "now", str(out)],
        **run_as(alice.user, alice.home),
    )
    wait_until(lambda: _answers(out), what="the hostile client's first answer")
    return proc, out


def test_a_take_out_ends_the_wait_at_the_broker_and_no_client_undoes_it(host, full_card, tmp_path):
    """The teacher takes two of Alice's kernels out of the line: one of her real server, one of a client that
    ignores notices. Both leave the line at once, at the broker. The client's next asks are refused with the
    teacher's words (code taken-out) for the stated time, and her server's *Join again* says the same. Before, the
    broker only left a notice: a client that ignored it kept its place (and was granted when room came), and *Join
    again* put the kernel back at #1 in 0.0 s."""
    broker, servers = host
    alice = servers[ALICE]
    teacher = _teacher(broker)
    kid = _open(alice, "takeout")
    wait_until(lambda: alice.kernel(kid)["state"] == "queued", what="alice's kernel in line")
    hostile, out = _hostile(host, tmp_path, "hostile-wait", wait=True)
    try:
        assert "waiting" in _answers(out)[-1]["result"]
        for k in (kid, "hostile-wait"):
            said = teacher.act(k, "remove", "root", "the lab is closed")
            assert said.outcome == "done" and said.user == ALICE
        assert {w.kernel_id for w in teacher.waiters()}.isdisjoint({kid, "hostile-wait"})  # at once, at the broker
        # her server heard it as the broker said it (its watch), not at its next reconcile
        wait_until(lambda: alice.kernel(kid)["state"] == "cpu", timeout=10, what="alice's wait to end")
        assert "the lab is closed" in alice.kernel(kid)["reason"]
        with pytest.raises(urllib.error.HTTPError) as e:
            alice.call("POST", f"api/gpushare/kernels/{kid}/join")
        message = json.loads(e.value.read())["message"]
        assert "root took this kernel out of the GPU line: the lab is closed" in message, message
        assert "may join the line again in 10 min" in message
        # the client that ignores notices is refused at each ask, and never back in line
        seen = len(_answers(out))
        wait_until(lambda: len(_answers(out)) >= seen + 3, what="three more asks")
        refused = _answers(out)[seen:]
        assert all(a.get("code") == "taken-out" for a in refused), refused
        assert refused[-1]["params"]["why"] == "the lab is closed" and refused[-1]["params"]["by"] == "root"
        assert "hostile-wait" not in {w.kernel_id for w in teacher.waiters()}
        # the admin sees each ruling and its outcome
        rulings = {r["kernel_id"]: r for r in broker.admin_view()["rulings"]}
        assert rulings[kid]["outcome"] == "done" and rulings[kid]["action"] == "remove"
    finally:
        hostile.kill()
        hostile.wait()
        teacher.close()


def test_a_release_is_the_brokers_when_the_server_ignores_it_or_is_stopped(host, full_card, tmp_path):
    """Three of the kernels holding the card are released by the teacher. Bob's own server carries its release out
    within seconds (its kernel parked). Alice's server is stopped (SIGSTOP), and a client of hers ignores notices:
    at the deadline (notices.RELEASE_WITHIN_S) the broker releases both leases itself, and the admin's view says how
    each ended. Before, the lease stayed for as long as the student liked (30 s and more)."""
    broker, servers = host
    alice, bob = servers[ALICE], servers[BOB]
    teacher = _teacher(broker)
    bobs = full_card
    bob.call("DELETE", f"api/kernels/{bobs[0]}")  # room for alice's kernel
    bob.call("DELETE", f"api/kernels/{bobs[1]}")  # and for the client's
    kid = alice.start_kernel()
    wait_until(lambda: alice.kernel(kid)["state"] == "running", what="alice's kernel")
    hostile, out = _hostile(host, tmp_path, "hostile-lease", wait=False)
    os.kill(alice.proc.pid, signal.SIGSTOP)
    try:
        assert "lease" in _answers(out)[-1]["result"]
        t0 = time.monotonic()
        for k in (bobs[2], kid, "hostile-lease"):
            said = teacher.act(k, "release", "root", "exam starts")
            assert said.deadline is not None and said.outcome == ""
        wait_until(
            lambda: bob.kernel(bobs[2])["state"] == "parked", timeout=notices.RELEASE_WITHIN_S, what="bob's park"
        )

        def outcomes() -> dict:
            return {r["kernel_id"]: r["outcome"] for r in broker.admin_view()["rulings"] if r["action"] == "release"}

        assert outcomes()[bobs[2]] == notices.BY_SERVER
        assert time.monotonic() - t0 < notices.RELEASE_WITHIN_S  # his server did it before the deadline
        wait_until(
            lambda: outcomes()[kid] == outcomes()["hostile-lease"] == notices.BY_BROKER,
            timeout=notices.RELEASE_WITHIN_S + 10,
            what="the broker to release both at the deadline",
        )
        assert time.monotonic() - t0 >= notices.RELEASE_WITHIN_S - 0.5
        held = {k["kernel_id"] for k in broker.admin_view()["kernels"]}
        assert kid not in held and bobs[2] not in held
        log = broker.output()
        assert f"{ALICE}'s kernel {kid}: released at the deadline of root's release (exam starts)" in log
        status = format_status({"source": "broker", **broker.admin_view()})  # `jupyter gpushare status`, as root
        assert "RULINGS" in status and "released at the deadline" in status and "released by its server" in status
    finally:
        os.kill(alice.proc.pid, signal.SIGCONT)
        hostile.kill()
        hostile.wait()
        teacher.close()
    # awake again, her server takes the notice and tells her (it was written for that server, and no one else)
    wait_until(
        lambda: any(e["kind"] == "teacher-release" for e in alice.call("GET", "api/gpushare/events")["events"]),
        timeout=30,
        what="alice's server to say the release",
    )


def test_a_kernel_waiting_across_a_broker_restart_gets_its_card(host, full_card):
    """The broker restarts while Alice's kernel waits in a cgroup the broker made; then room comes. The restarted
    broker finds its groups on the cgroup tree and opens the card to hers. Before, it kept them in memory only: the
    granted kernel got "could not be given its GPU after its wait" (2 of 2 runs) and read running with a lease it
    could not use."""
    broker, servers = host
    alice, bob = servers[ALICE], servers[BOB]
    kid = _open(alice, "restart")
    wait_until(lambda: alice.kernel(kid)["state"] == "queued", what="alice's kernel in line")
    held = alice.kernel(kid)["held"]
    if held["tracking"] != "cgroup":
        pytest.skip(f"the broker makes no kernel cgroups here: {held}")

    def in_its_group() -> bool:  # (the kernel process runs, in the group the broker made: not still starting)
        return any(kid in open(f"/proc/{p.pid}/cgroup").read() for p in alice.kernel_processes())

    wait_until(in_its_group, what="alice's kernel in its cgroup")
    broker.stop()
    broker.start()
    bob.call("DELETE", f"api/kernels/{full_card[0]}")
    wait_until(lambda: alice.kernel(kid)["state"] == "running", timeout=60, what="alice's kernel granted")
    time.sleep(1)
    assert "could not be given its GPU after its wait" not in alice.output()
    assert "has no reservation or no cgroup of the broker's" not in alice.output()


def test_groups_left_by_a_killed_server_are_removed(host):
    """Alice's server is killed (SIGKILL), and its kernel with it: the broker removes the kernel's empty cgroup at
    its next sweep. Before, empty groups stayed behind for good."""
    broker, servers = host
    alice = servers[ALICE]
    kid = alice.start_kernel()
    wait_until(lambda: alice.kernel(kid)["state"] == "running", what="alice's kernel")
    if alice.kernel(kid)["held"]["tracking"] != "cgroup":
        pytest.skip("the broker makes no kernel cgroups here")
    bases = KernelCgroups().bases  # the broker's groups are under its own cgroup: the same as this test's here
    # (its state reads running from its grant on; its process enters the group as it starts)
    dirs = wait_until(
        lambda: [os.path.join(b, kid) for b in bases if os.path.isdir(os.path.join(b, kid))], what="its groups"
    )
    (kernel,) = wait_until(alice.kernel_processes, what="its process")
    alice.proc.kill()
    alice.proc.wait()
    kernel.kill()
    try:
        wait_until(lambda: not any(os.path.isdir(d) for d in dirs), timeout=30, what="the empty groups to go")
    finally:
        alice.start().wait_ready()


def test_a_restarted_broker_judges_only_the_groups_it_made(host):
    """Two kernels' groups the broker never made sit on its cgroup tree: an empty one (a root server's own kernel
    between the two processes of its restart) and one holding processes of two users. The broker restarts, serves,
    and leaves both as they are. Before, it judged every group on the tree: it removed the empty one (in CI, where
    test brokers and servers share one tree, a kernel restarting beside a broker's restart could not enter its group,
    "[Errno 2] No such file or directory", and died at start) and died on the other (StopIteration)."""
    broker, servers = host
    alice = servers[ALICE]
    bases = [b for b in KernelCgroups().bases if os.access(b, os.W_OK)]
    if not bases:
        pytest.skip("no cgroup tree this test may write")
    empty, shared = (os.path.join(bases[0], f"rt-not-the-brokers-{name}") for name in ("empty", "two-users"))
    os.mkdir(empty)
    os.mkdir(shared)
    sleepers = [
        subprocess.Popen(["sleep", "120"]),
        subprocess.Popen(["sleep", "120"], **run_as(alice.user, alice.home)),
    ]
    try:
        for p in sleepers:
            with open(os.path.join(shared, "cgroup.procs"), "w") as f:
                f.write(str(p.pid))
        broker.stop()
        broker.start()  # (waits until it answers: it fails if the broker exits)
        assert BrokerLedger(broker.socket).hello()["user"]
        time.sleep(1.5)  # (its sweeps too: every 0.5 s here)
        assert os.path.isdir(empty) and os.path.isdir(shared)
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
        wait_until(lambda: not open(os.path.join(shared, "cgroup.procs")).read().strip(), what="the group empty")
        for group in (empty, shared):
            if os.path.isdir(group):
                os.rmdir(group)


# Alice's "server" reserves a kernel and its stand-in enters the kernel's group; the kernel then restarts: its
# process is gone and the server ends the group keeping it (empty) for the next one.
ENTER_THEN_RESTART = """
import json, os, socket, sys, time
path, kid = sys.argv[1], sys.argv[2]
def call(op, **args):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(json.dumps({"op": op, "args": args}).encode() + b"\\n")
        return json.loads(s.makefile("rb").readline())
server = socket.socket(socket.AF_UNIX)
server.connect(path)
replies = server.makefile("rb")
def as_server(op, **args):
    server.sendall(json.dumps({"op": op, "args": args}).encode() + b"\\n")
    return json.loads(replies.readline())
assert as_server("reserve", kernel_id=kid, mib=2048)["ok"]
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.write(w, json.dumps(call("enter_group", kernel_id=kid)).encode())
    time.sleep(60)
    os._exit(0)
entered = json.loads(os.read(r, 65536))
os.kill(child, 9)
os.waitpid(child, 0)
ended = as_server("end_group", kernel_id=kid, keep=True)
print(json.dumps({"entered": entered, "ended": ended}), flush=True)
time.sleep(30)
"""

ENTER = """
import json, socket, sys
with socket.socket(socket.AF_UNIX) as s:
    s.connect(sys.argv[1])
    s.sendall(json.dumps({"op": "enter_group", "args": {"kernel_id": sys.argv[2]}}).encode() + b"\\n")
    print(json.dumps(json.loads(s.makefile("rb").readline())))
"""


def test_a_kernels_empty_group_is_not_another_users_to_enter(host):
    """Between a kernel's two processes (a restart) its group is empty. Another student, who read the kernel's id in
    /proc, may not enter it: the group is its kernel's user's from its making, whatever it holds. Before, she could,
    and her process then counted as the other student's kernel (found by an independent red team)."""
    broker, servers = host
    alice, bob = servers[ALICE], servers[BOB]
    kid = "rt-empty-group-1"
    restarting = subprocess.Popen(
        [sys.executable, "-c", ENTER_THEN_RESTART, broker.socket, kid], stdout=subprocess.PIPE, text=True,
        **run_as(alice.user, alice.home),
    )  # fmt: skip
    try:
        said = json.loads(restarting.stdout.readline())
        if not said["entered"]["ok"]:
            pytest.skip(f"the broker makes no kernel cgroups here: {said['entered']}")
        assert said["ended"]["ok"], said
        out = subprocess.run(
            [sys.executable, "-c", ENTER, broker.socket, kid], capture_output=True, text=True, timeout=60,
            **run_as(bob.user, bob.home),
        )  # fmt: skip
        got = json.loads(out.stdout)
        assert not got["ok"] and "is not yours" in got["message"], got
    finally:
        restarting.kill()
        restarting.wait()


def test_a_notice_reaches_only_the_kernel_it_was_written_for(inproc):
    """A teacher's note to Alice's kernel ("see me after class"), which she shut down before her server took it; Bob
    then reserves the same kernel id. He gets nothing: the note was bound to her server and her lease, and the
    ruling's outcome says the kernel went. Before, Bob took Alice's note."""
    broker, who = inproc
    assert "lease" in broker.handle(who["alice"], "reserve", {"kernel_id": "k1", "mib": 2048})
    broker.handle(who["admin"], "act", {"kernel_id": "k1", "action": "release", "why": "see me after class"})
    broker.handle(who["alice"], "release", {"kernel_id": "k1"})
    assert "lease" in broker.handle(who["bob"], "reserve", {"kernel_id": "k1", "mib": 2048})
    assert broker.handle(who["bob"], "take_notices", {"kernel_ids": ["k1"]}) == []
    (ruling,) = broker.handle(who["admin"], "view", {})["rulings"]
    assert ruling["outcome"] == notices.BY_SERVER and ruling["user"] == "alice"
    # dropped with the kernel it was written for: the id now names another lease
    assert broker.handle(who["alice"], "take_notices", {"kernel_ids": ["k1"]}) == []


def test_one_budget_for_parked_state_on_the_whole_host(inproc):
    """Each server used to allow park_host_budget for its own parked kernels, so three servers could park 150% of the
    host's memory. With a broker, every park is admitted against the broker's one budget, whatever a server's own
    setting says; a park that does not fit is refused with the figures, and one that ends gives its room back."""
    from jupyter_gpushare.core.policy import PolicyError

    broker, who = inproc
    broker.park_budget_mib = 4096
    for caller, kid in (("alice", "a1"), ("bob", "b1")):
        assert "lease" in broker.handle(who[caller], "reserve", {"kernel_id": kid, "mib": 2048})
    broker.handle(who["alice"], "park", {"kernel_id": "a1", "mib": 3000})
    with pytest.raises(PolicyError) as refused:
        broker.handle(who["bob"], "park", {"kernel_id": "b1", "mib": 2000})
    assert refused.value.code == "park-budget" and refused.value.params == {
        "parked_mib": 2000, "held_mib": 3000, "budget_mib": 4096,
    }  # fmt: skip
    with pytest.raises(Exception, match="another user's"):
        broker.handle(who["bob"], "unpark", {"kernel_id": "a1"})  # not his to give back
    broker.handle(who["alice"], "unpark", {"kernel_id": "a1"})
    broker.handle(who["bob"], "park", {"kernel_id": "b1", "mib": 2000})
    assert broker._ledger.parked()["b1"][2] == 2000
    # a parked kernel's lease goes to the line: its id, readable in /proc by anyone, is still hers. Another user can
    # neither reserve it nor park "it" for 0 MiB to wipe her row from the budget (found by an independent red team)
    broker.handle(who["alice"], "park", {"kernel_id": "a1", "mib": 2000})
    broker.handle(who["alice"], "release", {"kernel_id": "a1"})
    with pytest.raises(Exception, match="in use by another user's kernel"):
        broker.handle(who["bob"], "reserve", {"kernel_id": "a1", "mib": 2048})
    assert broker._ledger.parked()["a1"][2] == 2000


def test_the_parking_budget_of_one_users_servers_is_shared_through_their_ledger_file(tmp_path):
    """Without a broker, the servers of one user share their ledger file: its lock admits every park against one
    budget, so two servers do not each park the budget."""
    from jupyter_gpushare.core.policy import PolicyError
    from jupyter_gpushare.ledger.ledger import Ledger

    path = tmp_path / "ledger.sqlite"
    script = textwrap.dedent(
        f"""
        from jupyter_gpushare.ledger.ledger import Ledger
        from jupyter_gpushare.core.policy import PolicyError
        try:
            Ledger({str(path)!r}).park("k2", 3000, 4096)
            print("parked")
        except PolicyError as e:
            print(e.code)
        """
    )
    first = Ledger(path)
    first.park("k1", 3000, 4096)
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() == "park-budget", other.stderr
    first.unpark("k1")
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() == "parked", other.stderr
    first.park("k1", 3000, 4096)  # the other server is gone, and its parked state with it
    with pytest.raises(PolicyError):
        first.park("k3", 2000, 4096)
    first.close()


def test_a_teacher_sees_each_kernels_notebook_as_its_own_server_names_it(inproc):
    """The teacher's line used to name another server's kernel by its id only ("bob's python3 kernel 1a2b3c4d"):
    the broker knew no notebook. Each server now says its kernel's notebook with its reserve; an admin's view names
    every kernel and place in line by it, a student's view no other user's, and a path the protocol would not
    carry (control characters, too long) is refused with why. A kernel that is gone takes its name with it."""
    from jupyter_gpushare.broker import BrokerRefused

    broker, who = inproc
    broker.handle(who["alice"], "reserve", {"kernel_id": "a1", "mib": 6000, "path": "week3/lab.ipynb"})
    broker.handle(who["bob"], "reserve", {"kernel_id": "b1", "mib": 6000, "path": "hw/demo.ipynb", "wait": True})
    broker.handle(who["bob"], "reserve", {"kernel_id": "b2", "mib": 1024})  # (an older server: says none)
    admin = broker.handle(who["admin"], "view", {})
    assert {k["kernel_id"]: k["notebook"] for k in admin["kernels"]} == {"a1": "week3/lab.ipynb", "b2": None}
    assert [(q["kernel_id"], q["notebook"]) for q in admin["queue"]] == [("b1", "hw/demo.ipynb")]
    assert broker.handle(who["admin"], "kernel_notebooks", {}) == {"a1": "week3/lab.ipynb", "b1": "hw/demo.ipynb"}
    student = broker.handle(who["alice"], "view", {})
    assert "hw/demo.ipynb" not in json.dumps(student) and "week3/lab.ipynb" not in json.dumps(student)
    assert broker.handle(who["alice"], "kernel_notebooks", {}) == {}
    for bad in ("a\x1bb.ipynb", "x" * 1025):
        with pytest.raises(BrokerRefused, match="'path' must be text"):
            broker.handle(who["bob"], "reserve", {"kernel_id": "b3", "mib": 1024, "path": bad})
    broker.handle(who["alice"], "release", {"kernel_id": "a1"})
    broker.handle(who["admin"], "view", {})
    assert broker.handle(who["admin"], "kernel_notebooks", {}) == {"b1": "hw/demo.ipynb"}
    # a student who reserves and releases under new ids, with no admin looking, fills no memory: past the bound,
    # the names of kernels gone are dropped at once
    broker.notebooks.KEPT_MAX = 3
    for i in range(20):
        broker.handle(who["alice"], "reserve", {"kernel_id": f"x{i}", "mib": 1024, "path": "x" * 1024})
        broker.handle(who["alice"], "release", {"kernel_id": f"x{i}"})
    assert len(broker.notebooks._paths) <= 4
