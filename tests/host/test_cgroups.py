"""A kernel is a cgroup: real cgroups of this host, real processes, real device nodes, a real server.

What a student's kernel starts stays the kernel's (a double-forked daemon, an ``env -i`` child, ``python -I``),
is counted as the kernel's, and ends with it; a kernel may open only its own card's device node, and one
without a GPU none, whatever its environment says. Device nodes are made with mknod at NVIDIA's major
number (195) in a temporary directory: with no NVIDIA driver loaded, opening one the cgroup allows fails
with ENXIO (no such device), one it denies with EPERM, so the cgroup's answer is what is tested.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from kernels import run_in_kernel
from servers import running, wait_until

from jupyter_gpushare.host.cgroups import NVIDIA_MAJOR, KernelCgroups, kernel_of
from jupyter_gpushare.launch.held import standin_command

LEVEL = KernelCgroups().level
needs_cgroups = pytest.mark.skipif(LEVEL.tracking != "cgroup", reason=f"no cgroups here: {LEVEL.reason}")
needs_isolation = pytest.mark.skipif(not LEVEL.isolation, reason=f"no devices controller here: {LEVEL.reason}")

# A child that double-forks a daemon (re-parented to init: out of the kernel's process tree), one started with
# an empty environment, and one in Python's isolated mode; each sleeps, and the daemon's pid is printed.
ESCAPES = textwrap.dedent(
    """
    import os, subprocess, sys, time
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode()); os.close(w)
            time.sleep(120); os._exit(0)
        os._exit(0)
    os.close(w)
    daemon = int(os.read(r, 20))
    bare = subprocess.Popen(["env", "-i", "/bin/sleep", "120"])
    isolated = subprocess.Popen([sys.executable, "-I", "-c", "import time; time.sleep(120)"])
    print(daemon, bare.pid, isolated.pid)
    """
)


def _open_error(path: Path) -> int:
    try:
        os.close(os.open(path, os.O_RDONLY))
    except OSError as e:
        return e.errno
    return 0


@pytest.fixture
def nodes(tmp_path):
    """Device nodes at NVIDIA's major number: card 0, card 1 and the control device (nvidiactl)."""
    made = {}
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)):
        try:
            os.mknod(tmp_path / name, stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, minor))
        except PermissionError:
            pytest.skip("mknod needs root")
        made[name] = tmp_path / name
    return made


def _in_group(groups: list[str], code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a Python process that entered ``groups`` first, as a kernel does (standin.py)."""
    return subprocess.run(
        standin_command(groups, [sys.executable, "-c", code]), capture_output=True, text=True, timeout=60
    )


@needs_cgroups
def test_what_a_kernel_starts_stays_in_its_group_and_ends_with_it():
    cgroups, kid = KernelCgroups(), "test-escapes-0001"
    groups = cgroups.create(kid, None)
    try:
        proc = subprocess.Popen(
            standin_command(groups, [sys.executable, "-c", ESCAPES + "\ntime.sleep(120)"]),
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        pids = [int(x) for x in proc.stdout.readline().split()]
        daemon = pids[0]
        assert psutil.Process(daemon).ppid() != proc.pid  # out of the tree...
        assert all(kernel_of(pid) == kid for pid in [proc.pid, *pids])  # ...not out of the group
        assert {proc.pid, *pids} <= cgroups.pids(kid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert psutil.pid_exists(daemon)  # the kernel is gone, what it started is not
        assert cgroups.remove(kid) == 3
        assert not any(running(p) for p in pids)
        assert all(not Path(g).parent.exists() for g in groups)
    finally:
        cgroups.remove(kid)


# A kernel whose user may write its own group (a delegated subtree): it makes a sub-group of it and moves a
# double-forked daemon there (issue 33, #4). Prints the daemon's pid and the sub-group.
SUBGROUP = textwrap.dedent(
    """
    import os, sys, time
    own = open("/proc/self/cgroup").read().split("\\n")
    path = next(line.split(":", 2)[2] for line in own if line.startswith("0::"))
    sub = "/sys/fs/cgroup/unified" + path + "/hideout"
    if not os.path.isdir("/sys/fs/cgroup/unified" + path):
        sub = "/sys/fs/cgroup" + path + "/hideout"
    os.mkdir(sub)
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            open(sub + "/cgroup.procs", "w").write(str(os.getpid()))
            os.write(w, str(os.getpid()).encode()); os.close(w)
            time.sleep(120); os._exit(0)
        os._exit(0)
    os.close(w)
    print(int(os.read(r, 20)), sub, flush=True)
    time.sleep(120)
    """
)


@needs_cgroups
def test_a_sub_group_the_kernel_made_is_counted_and_ends_with_it():
    cgroups, kid = KernelCgroups(), "test-subgroup-0001"
    groups = cgroups.create(kid, None)
    try:
        proc = subprocess.Popen(
            standin_command(groups, [sys.executable, "-c", SUBGROUP]), stdout=subprocess.PIPE, text=True
        )
        daemon, sub = proc.stdout.readline().split()
        assert Path(sub).is_dir() and int(daemon) in cgroups.pids(kid)  # counted as the kernel's
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert running(int(daemon))
        assert cgroups.remove(kid) == 1  # ended with the kernel...
        assert not running(int(daemon))
        assert not Path(sub).exists() and all(not Path(g).parent.exists() for g in groups)  # ...and its groups go
    finally:
        cgroups.remove(kid)


@needs_cgroups
def test_a_group_that_cannot_be_entered_stops_the_start(tmp_path):
    missing = str(tmp_path / "no-such-group" / "cgroup.procs")
    done = _in_group([missing], "print('ran')")
    assert done.returncode == 126 and "ran" not in done.stdout
    assert "could not enter its cgroup" in done.stderr


@needs_isolation
@pytest.mark.parametrize("way", ["bpf", "v1"])
def test_a_kernel_opens_only_its_own_card_and_one_without_a_gpu_none(nodes, way):
    """Both ways of closing cards: an eBPF device program on the unified hierarchy, the v1 devices controller."""
    cgroups = KernelCgroups(isolation=way)
    if (cgroups.bpf if way == "bpf" else cgroups.devices) is None:
        pytest.skip(f"{way} is not available here: {cgroups.level.reason}")
    probe = f"import os\nfor p in {[str(nodes[n]) for n in ('nvidia0', 'nvidia1', 'nvidiactl')]}:\n"
    probe += "    try:\n        os.close(os.open(p, os.O_RDONLY)); print(0)\n    except OSError as e:\n        print(e.errno)\n"
    try:
        on_card0 = _in_group(cgroups.create("test-card-0", [0]), probe)
        no_gpu = _in_group(cgroups.create("test-card-none", None), probe)
        assert on_card0.stdout.split() == [str(errno.ENXIO), str(errno.EPERM), str(errno.ENXIO)], on_card0.stderr
        assert no_gpu.stdout.split() == [str(errno.EPERM)] * 3, no_gpu.stderr
        # Outside any group, every node is allowed (and has no driver behind it).
        assert [_open_error(nodes[n]) for n in ("nvidia0", "nvidia1")] == [errno.ENXIO] * 2
        # A kernel that waited without a card is granted card 1: its group opens card 1 from then on.
        cgroups.allow("test-card-none", [1])
        granted = _in_group([str(Path(base) / "test-card-none" / "cgroup.procs") for base in cgroups.bases], probe)
        assert granted.stdout.split() == [str(errno.EPERM), str(errno.ENXIO), str(errno.ENXIO)], granted.stderr
    finally:
        cgroups.remove("test-card-0")
        cgroups.remove("test-card-none")


# -- in a real server ----------------------------------------------------------------------------------


@pytest.fixture
def gpushare_config(gpushare_config):
    return {**gpushare_config, "simulated_cards": "10GiB,10GiB", "over_quota_action": "notify"}


@needs_cgroups
async def test_a_kernels_daemon_is_counted_as_the_kernels_and_ends_with_it(gpushare, jp_serverapp):
    """The kernel double-forks a daemon that holds 1,000 MiB of the (simulated) card: it is the kernel's use, not
    memory outside Jupyter, and it does not outlive the kernel."""
    fake = jp_serverapp.web_app.settings["gpushare_manager"].backend.fake
    kid = await gpushare.start_kernel()
    rec = await gpushare.kernel(kid)
    assert rec["held"]["tracking"] == "cgroup" and rec["held"]["watchdog"] == "notify"
    daemon, bare, isolated = (int(x) for x in (await run_in_kernel(jp_serverapp, kid, ESCAPES)).split())
    card = rec["card"]["index"]
    for pid in (daemon, bare, isolated):
        fake.add_process(pid, 1000, card=card)

    async def counted():
        k = await gpushare.kernel(kid)
        return k if k["used_mib"] == 3000 else None

    used = await gpushare.wait_for(counted, what="the daemon's and children's memory counted as the kernel's")
    assert sorted(p["pid"] for p in used["processes"]) == sorted([daemon, bare, isolated])
    cards = (await gpushare.get("cards"))["cards"]
    assert cards[card]["outside_mib"] == 440  # 3,000 used against a 2,560 MiB reservation: the rest is taken
    await gpushare.stop_kernel(kid)
    wait_until(lambda: not any(psutil.pid_exists(p) for p in (daemon, bare, isolated)), 10, "the daemon ended")
    events = [e["kind"] for e in (await gpushare.get("events"))["events"] if e["kernel_id"] == kid]
    assert "group-ended" in events


@needs_isolation
async def test_a_kernel_opens_its_own_card_and_not_the_other_whatever_its_environment(gpushare, jp_serverapp, nodes):
    """Deleting CUDA_VISIBLE_DEVICES in the kernel does not open the other card for it."""
    first = await gpushare.start_kernel()
    probe = f"import os\nos.environ.pop('CUDA_VISIBLE_DEVICES', None)\nfor p in {[str(nodes['nvidia0']), str(nodes['nvidia1'])]}:\n"
    probe += "    try:\n        os.close(os.open(p, os.O_RDONLY)); print(0)\n    except OSError as e:\n        print(e.errno)\n"
    card = (await gpushare.kernel(first))["card"]["index"]
    mine, other = str(errno.ENXIO), str(errno.EPERM)
    assert (await run_in_kernel(jp_serverapp, first, probe)).split() == ([mine, other] if card == 0 else [other, mine])
    await gpushare.stop_kernel(first)


class TestWithoutAGpu:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "kernel_quotas": {"python3": "0MiB"}}

    @needs_isolation
    async def test_a_kernel_without_a_gpu_opens_none(self, gpushare, jp_serverapp, nodes):
        kid = await gpushare.start_kernel()
        assert (await gpushare.kernel(kid))["state"] == "none"
        probe = "import os\nos.environ.pop('CUDA_VISIBLE_DEVICES', None)\n"
        probe += f"for p in {[str(nodes[n]) for n in ('nvidia0', 'nvidia1', 'nvidiactl')]}:\n"
        probe += "    try:\n        os.close(os.open(p, os.O_RDONLY)); print(0)\n    except OSError as e:\n        print(e.errno)\n"
        assert (await run_in_kernel(jp_serverapp, kid, probe)).split() == [str(errno.EPERM)] * 3
        await gpushare.stop_kernel(kid)


def test_a_cgroup_that_may_not_be_made_leaves_tracking_by_tree(monkeypatch):
    monkeypatch.setattr("jupyter_gpushare.host.cgroups._mounts", lambda: [])
    level = KernelCgroups().level
    assert (level.tracking, level.isolation) == ("tree", False)
    assert "process tree" in level.reason and "no cgroup filesystem" in level.reason
    assert KernelCgroups(enabled=False).create("k", None) == []


class TestUnreadableLedger:
    """A ledger that cannot be read: kernels start without a GPU (degraded, said why), and their cgroup opens no
    card whatever the kernel does to its environment: fail closed."""

    @pytest.fixture
    def ledger_file(self, tmp_path):
        (tmp_path / "not-a-dir").write_text("a file where the ledger's directory should be")
        return str(tmp_path / "not-a-dir" / "ledger.sqlite")

    @needs_isolation
    async def test_kernels_start_without_a_gpu_and_open_none(self, gpushare, jp_serverapp, nodes, ledger_file):
        kid = await gpushare.start_kernel()
        rec = await gpushare.kernel(kid)
        assert rec["state"] == "cpu" and rec["reason"], rec
        probe = (
            "import os\nprint(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\nos.environ.pop('CUDA_VISIBLE_DEVICES')\n"
        )
        probe += f"for p in {[str(nodes['nvidia0']), str(nodes['nvidiactl'])]}:\n"
        probe += "    try:\n        os.close(os.open(p, os.O_RDONLY)); print(0)\n    except OSError as e:\n        print(e.errno)\n"
        assert (await run_in_kernel(jp_serverapp, kid, probe)).split() == ["''", str(errno.EPERM), str(errno.EPERM)]
        await gpushare.stop_kernel(kid)


def test_a_card_without_a_device_minor_is_never_a_bad_device_rule():
    """Found by the type checker: a card whose driver does not say its minor (and a simulated card) once made the
    kernel's device rule ``c 195:None``, and its start failed where cgroups could be made. A simulated card has no
    device to open; a real card of unknown minor is not isolated by device node rather than made unusable."""
    from jupyter_gpushare.host.cgroups import MAX_MINOR, device_program
    from jupyter_gpushare.host.gpu import Card
    from jupyter_gpushare.server.holding import card_minors

    assert card_minors(None) is None
    assert card_minors(Card(0, "GPU-sim", "Simulated GPU", 10240, simulated=True)) is None
    assert card_minors(Card(0, "GPU-sim", "Simulated GPU", 10240, simulated=True, minor=1)) == [1]  # (tests' nodes)
    assert card_minors(Card(0, "GPU-a", "H100", 81559, minor=3)) == [3]
    unknown = card_minors(Card(0, "GPU-b", "H100", 81559))
    assert unknown == list(range(MAX_MINOR + 1))
    for minors in (None, [3], unknown):
        assert device_program(minors)  # every answer makes a valid program (no None in it)


@needs_cgroups
def test_groups_a_kernels_user_may_leave_are_said_to_be_escapable():
    """Root (as here) may write the server's own group: a kernel of root's can move a process out of its group,
    and the level says so (``held.escapable``; the sidebar: "own cgroup, escapable")."""
    level = KernelCgroups().level
    assert level.escapable is (
        os.geteuid() == 0 or os.access(os.path.dirname(KernelCgroups().bases[0]) + "/cgroup.procs", os.W_OK)
    )
    assert level.to_dict()["escapable"] is level.escapable
