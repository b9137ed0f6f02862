"""Every GPU process on the host is someone's (broker/unleased.py): a broker that reads its cards finds the processes
that use them without a lease, tells whose they are (user, command, the Jupyter kernel a process is), counts their
memory as taken, and applies the admin's policy to them, whatever the student's own config says.

The students' escapes are real processes run as real Unix users: a `python` in a terminal; a kernel of her own
kernelspec that names `local-provisioner`; a kernel of a Jupyter server whose extension she turned off in her own
config. The card is the broker's simulated one, whose NVML lists those processes with the memory we give them."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import broker_in_process
from multiuser import ALICE, BOB, ensure_user, needs_root, remove_user, run_as, shared_scratch
from servers import ServerProcess, running, wait_until

from jupyter_gpushare.broker import Caller
from jupyter_gpushare.broker.unleased import UnleasedPolicy
from jupyter_gpushare.core.policy import LimitRules
from jupyter_gpushare.ledger.ledger import ProcessRef

SLEEPER = "import time; print('ready', flush=True); time.sleep(300)"
pytestmark = needs_root


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def students():
    with shared_scratch("gpushare-unleased-") as base:
        users = {name: ensure_user(name) for name in (ALICE, BOB)}
        homes = {}
        for name, user in users.items():
            home = base / name
            for sub in ("", "data", "runtime", "config", "root"):
                (home / sub).mkdir(exist_ok=True)
                os.chown(home / sub, user.pw_uid, user.pw_gid)
            homes[name] = home
        yield users, homes
        for name in users:
            remove_user(name)


def _broker(tmp_path, action: str, grace: float = 30.0, limits: dict | None = None):
    broker = broker_in_process(tmp_path)
    broker.unleased = UnleasedPolicy(
        action, grace, [], logging.getLogger("test"), broker._adopt, clock=Clock(), barred=broker._barred
    )
    if limits is not None:
        broker.rules = LimitRules.parse(limits, {}, {})
    return broker


def _sweep(broker):
    broker.reading.stale()
    broker.watch_once(broker.reading.latest())
    return {u["pid"]: u for u in broker.unleased.current}


def _what_was_seen(found: dict, **pids: int) -> str:
    """What a sweep found, and what each process of the test was then (its user and command line), for a failure."""
    lines = [f"found: {found}"]
    for role, pid in pids.items():
        try:
            proc = psutil.Process(pid)
            lines.append(f"{role} {pid}: {proc.username()} {proc.status()} {proc.cmdline()}")
        except psutil.Error as e:
            lines.append(f"{role} {pid}: {e!r}")
    return "\n".join(lines)


def _terminal_python(user, home) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True, **run_as(user, home))
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _own_kernelspec_kernel(user, home) -> tuple[subprocess.Popen, int, str]:
    """A kernel of the student's own kernelspec, which names local-provisioner: `jupyter kernel` starts it with no
    lease, whatever the host's default provisioner is."""
    spec = home / "data" / "kernels" / "mine"
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    meta = {"kernel_provisioner": {"provisioner_name": "local-provisioner"}}
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "mine", "language": "python", "metadata": meta})
    )
    for path in (spec.parent.parent, spec.parent, spec, spec / "kernel.json"):
        os.chown(path, user.pw_uid, user.pw_gid)
    app = subprocess.Popen(
        [sys.executable, "-c", "from jupyter_client.kernelapp import main; main()", "--kernel=mine"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **run_as(user, home),
    )  # fmt: skip
    kernel = wait_until(lambda: _kernel_child(app.pid), timeout=60, what="the student's own kernel")
    return app, kernel[0], kernel[1]


def _kernel_child(pid: int):
    try:
        for child in psutil.Process(pid).children(recursive=True):
            cmd = child.cmdline()
            if "ipykernel_launcher" in " ".join(cmd):
                connection = cmd[cmd.index("-f") + 1]
                return child.pid, connection.rsplit("kernel-", 1)[1].removesuffix(".json")
    except (psutil.Error, ValueError, IndexError):
        return None
    return None


def _server_without_extension(user, home) -> tuple[ServerProcess, int, str]:
    """A Jupyter server of the student's, whose extension she turned off in her own config, and a kernel of it."""
    (home / "config" / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_gpushare": False}}})
    )
    server = ServerProcess()
    server.name = f"own-{user.pw_name}"
    server.launch(home, [f"--ServerApp.root_dir={home / 'root'}"], {}, **run_as(user, home))
    server.wait_ready()
    kernel_id = server.call("POST", "api/kernels", {"name": "python3"})["id"]
    (kernel,) = wait_until(lambda: server.kernel_processes(), timeout=60, what="its kernel")
    return server, kernel.pid, kernel_id


def test_every_escape_is_found_counted_and_named(tmp_path, students):
    (users, homes), broker = students, _broker(tmp_path, "notify")
    alice, bob = users[ALICE], users[BOB]
    terminal = _terminal_python(bob, homes[BOB])
    app, own_pid, own_id = _own_kernelspec_kernel(alice, homes[ALICE])
    server, off_pid, off_id = _server_without_extension(bob, homes[BOB])
    try:
        fake = broker.backend.fake
        for pid, mib in ((terminal.pid, 3000), (own_pid, 2000), (off_pid, 2500)):
            fake.add_process(pid, mib)
        found = _sweep(broker)
        seen = _what_was_seen(found, terminal=terminal.pid, own=own_pid, off=off_pid)  # (CI's one failure said no more)
        assert found[terminal.pid]["user"] == BOB and "time.sleep(300)" in found[terminal.pid]["command"], seen
        assert found[terminal.pid]["kernel_id"] is None, seen
        assert (found[own_pid]["user"], found[own_pid]["kernel_id"]) == (ALICE, own_id), seen
        assert (found[off_pid]["user"], found[off_pid]["kernel_id"]) == (BOB, off_id), seen
        assert {u["status"] for u in found.values()} == {"listed"}, seen
        # counted as taken: 7,500 of the 10 GiB card are used without a lease, so a 4 GiB kernel (4.5) does not fit
        who = Caller(ALICE, alice.pw_uid, process=ProcessRef.me())
        got = broker.handle(who, "reserve", {"kernel_id": "k1", "mib": 4096})
        assert "waiting" in got and got["waiting"]["outside_mib"] == 7500, (got, seen)
        # shown to admins, with the broker's judgment; a student sees nothing of them
        admin = Caller("root", 0, admin=True, process=ProcessRef.me())
        assert {u["pid"] for u in broker.handle(admin, "view", {})["unleased"]} == {terminal.pid, own_pid, off_pid}
        assert "unleased" not in broker.handle(who, "view", {})
        assert all(running(pid) for pid in (terminal.pid, own_pid, off_pid))  # notify only lists them
    finally:
        terminal.kill()
        app.send_signal(signal.SIGTERM)
        server.stop()
        app.wait(20)


def test_stop_ends_it_after_the_grace_or_at_once_when_it_takes_reserved_memory(tmp_path, students, caplog):
    (users, homes), broker = students, _broker(tmp_path, "stop", grace=30.0)
    bob = users[BOB]
    fake, clock = broker.backend.fake, broker.unleased.clock
    slow = _terminal_python(bob, homes[BOB])
    try:
        fake.add_process(slow.pid, 1000)  # fits the unreserved room: keeps its grace
        for _ in range(30):
            assert running(slow.pid) and _sweep(broker)[slow.pid]["status"] == "judged"
            clock.now += 1
        with caplog.at_level(logging.WARNING):
            _sweep(broker)
        assert slow.wait(5) == -signal.SIGKILL
        assert f"process {slow.pid} of {BOB}" in caplog.text and "without a reservation for 30 s" in caplog.text
        fake.remove_process(slow.pid)
        # alice reserves 8 GiB of the 10; bob's script then takes 4 GiB: 2 of them hers
        alice = Caller(ALICE, users[ALICE].pw_uid, process=ProcessRef.me())
        assert "lease" in broker.handle(alice, "reserve", {"kernel_id": "k1", "mib": 8192 - 512})
        thief = _terminal_python(bob, homes[BOB])
        fake.add_process(thief.pid, 4096)
        found = _sweep(broker)  # the first reading that sees it
        assert found[thief.pid]["stolen_mib"] == 2048
        assert thief.wait(5) == -signal.SIGKILL
    finally:
        for p in (slow, locals().get("thief")):
            if p is not None and p.poll() is None:
                p.kill()


def test_lease_gives_it_a_lease_from_its_users_limits_or_ends_it(tmp_path, students):
    from jupyter_gpushare.broker.protocol import BrokerRefused

    (users, homes), broker = students, _broker(tmp_path, "lease", limits={"max_total": "4GiB"})
    bob = users[BOB]
    fake, clock = broker.backend.fake, broker.unleased.clock
    script = _terminal_python(bob, homes[BOB])
    big = _terminal_python(bob, homes[BOB])
    try:
        fake.add_process(script.pid, 1000)
        found = _sweep(broker)
        assert found[script.pid]["status"] == "leased"
        (lease,) = [x for x in broker._ledger.leases() if x.kernel is not None and x.kernel.pid == script.pid]
        assert (lease.user, lease.adopted, lease.reserved_mib) == (BOB, True, 1280)
        # the process owns its adopted lease, and may not point it at another process of its user's
        itself = Caller(BOB, bob.pw_uid, process=ProcessRef.of(script.pid))
        with pytest.raises(BrokerRefused, match="the broker's lease of one process"):
            broker.handle(itself, "attach", {"kernel_id": lease.kernel_id, "pid": big.pid})
        assert not _sweep(broker).get(script.pid)  # a lease's process now: judged as a kernel
        # bob's limit is 4 GiB in all: a second script of 3.5 GiB gets no lease, and is ended after the grace
        fake.add_process(big.pid, 3500)
        assert _sweep(broker)[big.pid]["status"] == "judged"
        for _ in range(31):
            clock.now += 1
            _sweep(broker)
        assert big.wait(5) == -signal.SIGKILL
        assert running(script.pid)
        # its lease goes when it ends
        script.kill()
        script.wait()
        fake.remove_process(script.pid)
        broker._ledger.reap()
        assert not [x for x in broker._ledger.leases() if x.adopted]
    finally:
        for p in (script, big):
            if p.poll() is None:
                p.kill()


def test_an_unknown_policy_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unleased_action 'ignore': one of notify, stop, lease"):
        UnleasedPolicy("ignore", 30, [], logging.getLogger("test"), lambda u: None)


# -- Hardening, round four (issue 44): the broker's names and rulings are its own ------------------------------------


def _key(pid: int) -> str:
    return f"process-{pid}-{int(psutil.Process(pid).create_time() * 100)}"


def test_a_lease_named_like_her_process_shields_nothing(tmp_path, students, caplog):
    """The attack: her kernel reserves 256 MiB under the name the broker gives an adopted process (computed from
    /proc), then that process takes 8 GiB while others hold 6 GiB of reservations on the 10 GiB card. The broker
    refuses the name; and a lease of that name that a client made (an older broker let her) covers nothing of the
    process: it is judged as a thief and ended at the first reading. Before, adoption returned her 256 MiB lease,
    marked the process 'leased', and nothing judged it (13 GiB of others' reservations taken, alive after 40 s)."""
    from jupyter_gpushare.broker.protocol import BrokerRefused
    from jupyter_gpushare.core.policy import Size
    from jupyter_gpushare.ledger.ledger import Request

    (users, homes), broker = students, _broker(tmp_path, "lease")
    alice = users[ALICE]
    thief = _terminal_python(alice, homes[ALICE])
    her = Caller(ALICE, alice.pw_uid, process=ProcessRef.me())
    bob = Caller(BOB, users[BOB].pw_uid, process=ProcessRef.me())
    try:
        assert "lease" in broker.handle(bob, "reserve", {"kernel_id": "bob-1", "mib": 6144 - 512})
        with pytest.raises(BrokerRefused, match="'process-' are the broker's names for processes it gave a lease to"):
            broker.handle(her, "reserve", {"kernel_id": _key(thief.pid), "mib": 256})
        # what an older broker let her make: a client's lease under that name, owned by her "server" (this process)
        led = broker._ledger
        led.owner = ProcessRef.me()
        led.reserve(Request(_key(thief.pid), Size(mib=256), ALICE), broker.policy, broker.cards, False)
        broker.backend.fake.add_process(thief.pid, 8192)
        with caplog.at_level(logging.WARNING):
            found = _sweep(broker)
        assert found[thief.pid]["status"] == "judged" and found[thief.pid]["stolen_mib"] > 0, found
        assert thief.wait(5) == -signal.SIGKILL
        assert f"process {thief.pid} of {ALICE}" in caplog.text and "that kernels have reserved" in caplog.text
    finally:
        if thief.poll() is None:
            thief.kill()


def test_a_graphics_context_is_counted_and_judged_like_any_memory(tmp_path, students):
    """The driver lists a process with a graphics context (Vulkan, EGL) apart from compute ones. Its memory is
    memory: counted when adopting, and judged like any process without a lease (only unleased_exempt_users, root's
    compositor by default, are listed only). Before, such processes were left out of both (an independent red
    team's 9 GiB "graphics" process stayed alive and unlisted beside 4.7 GiB of reservations on a 10 GiB card)."""
    (users, homes), broker = students, _broker(tmp_path, "lease")
    drawer = _terminal_python(users[ALICE], homes[ALICE])
    staff = Caller("staff", 0, process=ProcessRef.me())
    try:
        assert "lease" in broker.handle(staff, "reserve", {"kernel_id": "k-staff", "mib": 4096 - 512})
        broker.backend.fake.add_process(drawer.pid, 9000, kind="graphics")
        found = _sweep(broker)
        assert found[drawer.pid]["status"] == "judged" and found[drawer.pid]["stolen_mib"] > 0, found
        assert drawer.wait(5) == -signal.SIGKILL
    finally:
        if drawer.poll() is None:
            drawer.kill()


def test_adoption_never_overbooks_and_a_shortfall_falls_on_the_newest(tmp_path, students, caplog):
    """Bob's 3.9 GiB terminal job runs without a lease (his limits leave it none) beside 4 GiB of reservations on
    the 10 GiB card; Alice then starts two 1 GiB jobs. Adoption counts what processes without a lease really use:
    her first job is adopted, the second would overbook the card and is not; the card's shortfall falls on the
    process that arrived last (her second job), never on Bob, who was there first and fitted. Before, both of hers
    were adopted (reservations alone left room) and the shortfall was laid on the largest process without a lease:
    Bob's job was ended 0.1 s later as a thief, and the log blamed him."""
    (users, homes), broker = students, _broker(tmp_path, "lease", limits={"max_kernel": "3GiB"})
    alice, bob = users[ALICE], users[BOB]
    fake = broker.backend.fake
    bystander = _terminal_python(bob, homes[BOB])
    first, second = _terminal_python(alice, homes[ALICE]), _terminal_python(alice, homes[ALICE])
    staff = Caller("staff", 0, process=ProcessRef.me())
    try:
        for kid in ("k-staff-1", "k-staff-2"):  # 4 GiB of reservations, within the 3 GiB a kernel here may have
            assert "lease" in broker.handle(staff, "reserve", {"kernel_id": kid, "mib": 2048 - 512})
        fake.add_process(bystander.pid, 3994)
        assert _sweep(broker)[bystander.pid]["status"] == "judged"  # no lease fits his limits: judged, with grace
        fake.add_process(first.pid, 1024)
        assert _sweep(broker)[first.pid]["status"] == "leased"
        fake.add_process(second.pid, 1024)
        with caplog.at_level(logging.WARNING):
            found = _sweep(broker)
        assert found[second.pid]["status"] == "judged" and found[second.pid]["stolen_mib"] > 0, found
        assert found[bystander.pid]["stolen_mib"] == 0, found
        assert second.wait(5) == -signal.SIGKILL
        assert running(bystander.pid) and running(first.pid)
        ended = [r.getMessage() for r in caplog.records if ": ended, " in r.getMessage()]
        assert len(ended) == 1 and f"process {second.pid} of {ALICE}" in ended[0], ended  # the admin's log: hers
        reserved = sum(x.reserved_mib for x in broker._ledger.leases())
        assert reserved + 3994 <= 10240  # the reservations and what the card really holds never pass it
    finally:
        for p in (bystander, first, second):
            if p.poll() is None:
                p.kill()


def test_below_the_required_level_a_process_is_stopped_not_adopted(tmp_path, students):
    """With GpuShareApp.required_enforcement = 'cgroup', a terminal process outside every kernel's cgroup cannot be
    held at that level: it is stopped at its first reading (not adopted at 'watchdog'), and the admin's view says
    why. Before, it was adopted at level 'watchdog' in 0.8 s."""
    import dataclasses

    (users, homes), broker = students, _broker(tmp_path, "lease")
    broker.policy = dataclasses.replace(broker.policy, required_level="cgroup")
    terminal = _terminal_python(users[BOB], homes[BOB])
    try:
        broker.backend.fake.add_process(terminal.pid, 1000)
        found = _sweep(broker)
        assert found[terminal.pid]["status"] == "stopped", found
        assert "'watchdog' enforcement level" in found[terminal.pid]["why"]
        assert "requires 'cgroup'" in found[terminal.pid]["why"]
        assert terminal.wait(5) == -signal.SIGKILL
        assert not [x for x in broker._ledger.leases() if x.adopted]
        admin = Caller("root", 0, admin=True, process=ProcessRef.me())
        (said,) = [u for u in broker.handle(admin, "view", {})["unleased"] if u["pid"] == terminal.pid]
        assert said["status"] == "stopped" and "required_enforcement" in said["why"]
    finally:
        if terminal.poll() is None:
            terminal.kill()


def test_a_teachers_release_of_an_adopted_lease_stops_the_process(tmp_path, students, monkeypatch, caplog):
    """A terminal process that was given a lease is released by a teacher: after the same deadline a kernel's
    server gets, the broker releases the lease and stops the process (it may not be adopted again); the outcome is
    in the admin's view and the log. Before, the release was "ok" and never happened (no server takes a notice for
    a terminal process)."""
    from jupyter_gpushare.ledger import notices

    monkeypatch.setattr(notices, "RELEASE_WITHIN_S", 0.5)
    (users, homes), broker = students, _broker(tmp_path, "lease")
    script = _terminal_python(users[BOB], homes[BOB])
    admin = Caller("root", 0, admin=True, process=ProcessRef.me())
    try:
        broker.backend.fake.add_process(script.pid, 1000)
        assert _sweep(broker)[script.pid]["status"] == "leased"
        said = broker.handle(admin, "act", {"kernel_id": _key(script.pid), "action": "release", "why": "exam"})
        assert said["deadline"] is not None and said["outcome"] == ""
        assert running(script.pid)  # the deadline first
        time.sleep(0.6)
        with caplog.at_level(logging.WARNING):
            found = _sweep(broker)
        assert (
            found[script.pid]["status"] == "stopped"
            and "released its kernel's GPU reservation" in found[script.pid]["why"]
        )
        assert script.wait(5) == -signal.SIGKILL
        assert not [x for x in broker._ledger.leases() if x.adopted]
        (ruling,) = broker.handle(admin, "view", {})["rulings"]
        assert (ruling["action"], ruling["outcome"], ruling["user"]) == ("release", "released at the deadline", BOB)
        assert f"process {script.pid} of {BOB}" in caplog.text and "its server did not give it back" in caplog.text
    finally:
        if script.poll() is None:
            script.kill()


@pytest.mark.parametrize("dodge", ["its server releases", "its server detaches"])
def test_a_teachers_release_leaves_nothing_adoptable_however_the_lease_goes(tmp_path, students, dodge):
    """A teacher releases Alice's kernel; before the deadline her server gives the lease back itself (or detaches
    the kernel process from it) instead of parking or restarting the kernel, which keeps its 2,000 MiB. That process
    is of a kernel a teacher released: it is not adopted but stopped at the next reading. Before, it was adopted at
    once, and when the teacher released that lease too, the process (its owner) released it itself and was adopted
    again (found by an independent red team)."""
    (users, homes), broker = students, _broker(tmp_path, "lease")
    alice = users[ALICE]
    kernel = _terminal_python(alice, homes[ALICE])
    server = Caller(ALICE, alice.pw_uid, process=ProcessRef.me())
    admin = Caller("root", 0, admin=True, process=ProcessRef.me())
    try:
        assert "lease" in broker.handle(server, "reserve", {"kernel_id": "k1", "mib": 2048})
        broker.handle(server, "attach", {"kernel_id": "k1", "pid": kernel.pid})
        broker.backend.fake.add_process(kernel.pid, 2000)
        assert not _sweep(broker)  # its lease's: nothing without one
        broker.handle(admin, "act", {"kernel_id": "k1", "action": "release", "why": "exam"})
        if dodge == "its server releases":
            broker.handle(server, "release", {"kernel_id": "k1"})
        else:
            broker.handle(server, "attach", {"kernel_id": "k1", "pid": None})
        found = _sweep(broker)
        assert found[kernel.pid]["status"] == "stopped", found
        assert "root released its kernel's GPU reservation" in found[kernel.pid]["why"]
        assert kernel.wait(5) == -signal.SIGKILL
        assert not [x for x in broker._ledger.leases() if x.adopted]
    finally:
        if kernel.poll() is None:
            kernel.kill()


def test_a_shortfall_falls_on_the_process_that_grew_not_on_an_earlier_bystander(tmp_path, students):
    """The attacker's process arrives first with 100 MiB; a bystander arrives later with 3.9 GiB and fits; then the
    attacker grows to 3 GiB and the card is short of what leases reserved. The shortfall falls on the process that
    grew last (the attacker's), not on the bystander. Before, blame followed who was seen first: the bystander was
    ended at once as a thief and the attacker kept the memory (found by an independent red team)."""
    (users, homes), broker = students, _broker(tmp_path, "stop")
    fake = broker.backend.fake
    attacker, bystander = _terminal_python(users[ALICE], homes[ALICE]), _terminal_python(users[BOB], homes[BOB])
    staff = Caller("staff", 0, process=ProcessRef.me())
    try:
        assert "lease" in broker.handle(staff, "reserve", {"kernel_id": "k-staff", "mib": 4096 - 512})
        fake.add_process(attacker.pid, 100)
        _sweep(broker)
        fake.add_process(bystander.pid, 3900)
        assert _sweep(broker)[bystander.pid]["stolen_mib"] == 0
        fake.remove_process(attacker.pid)
        fake.add_process(attacker.pid, 3000)
        found = _sweep(broker)
        assert found[attacker.pid]["stolen_mib"] > 0 and found[bystander.pid]["stolen_mib"] == 0, found
        assert attacker.wait(5) == -signal.SIGKILL
        assert running(bystander.pid)
    finally:
        for p in (attacker, bystander):
            if p.poll() is None:
                p.kill()
