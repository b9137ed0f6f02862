"""A kernel is a cgroup: its processes, and every process they start, stay in a group of their own.

A process tree loses a double-forked daemon (it is re-parented to init), and an environment can be wiped
(``env -i``) or rewritten (``CUDA_VISIBLE_DEVICES``). A cgroup holds both: membership is inherited by every
child and only a process allowed to write another group's ``cgroup.procs`` can leave, which a kernel's user may
not. Where the host lets this process create cgroups (root, or a subtree delegated to its user), each kernel gets
``<this process's cgroup>/gpushare-kernels/<kernel id>`` in the unified (v2) hierarchy and, where the cgroup v1
devices controller is mounted, in that one too. Its processes enter it before the kernel runs (standin.py
writes its own pid, then becomes the kernel), and:

- **tracking**: whose a GPU process is is read from ``/proc/<pid>/cgroup`` (``kernel_of``), so what a kernel's
  escaped children use is still the kernel's, for the over-quota policy and for admission;
- **card isolation**: the group may open only its lease's cards (``/dev/nvidia<minor>``, major 195, and the
  control devices), and a kernel started without a GPU none of the NVIDIA devices, whatever its environment
  says: an eBPF device program attached to its unified (v2) group (``device_program``), or, where that cannot
  be loaded, the v1 devices controller. Where neither works, use on a card outside the lease is counted as
  over-use on that card (procs.unreserved_use).

Where none of this is possible (no cgroup filesystem, no permission), kernels are tracked by their process
tree, and ``level`` says so (doctor, the API).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import re
import signal
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .gpu import Card

log = logging.getLogger("jupyter_gpushare")

GROUP = "gpushare-kernels"  # the directory, under this process's own cgroup, that holds one group per kernel
NVIDIA_MAJOR = 195  # /dev/nvidia<minor>; /dev/nvidiactl is 195:255, nvidia-modeset 195:254
NVIDIA_CONTROL = (254, 255)
MAX_MINOR = 253  # the highest card minor number denied to a kernel without that card
_KERNEL_ID = re.compile(rf"/{GROUP}/([0-9A-Za-z._-]{{1,100}})(?:/|$)")  # its group, or a sub-group of it


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, super options) of every cgroup filesystem this process sees."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if "-" not in fields[6:]:
                    continue
                sep = fields.index("-", 6)
                fstype, options = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
                if fstype in ("cgroup", "cgroup2"):
                    out.append((fields[4], fstype, options))
    except OSError:
        pass
    return out


def _own_paths(pid: int | str = "self") -> dict[str, str]:
    """This process's cgroup per hierarchy: "" for the unified one, each v1 controller's name otherwise."""
    paths: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for name in controllers.split(",") if controllers else [""]:
                    paths[name] = path
    except (OSError, ValueError):
        pass
    return paths


def kernel_of(pid: int) -> str | None:
    """The kernel whose group a process is in, or None: from /proc/<pid>/cgroup (any user may read it), for a
    group named as ours and owned by root or by this process's user (a user with a delegated subtree of their
    own could name a group like another kernel's; its owner gives it away)."""
    for path in _own_paths(pid).values():
        m = _KERNEL_ID.search(path)
        if m is not None and _trusted_group(path):
            return m.group(1)
    return None


def held_in_group(pid: int, kernel_id: str) -> tuple[bool, str | None]:
    """How a process is held, read from outside it (the broker's view of a server's kernel): whether it is in its
    kernel's own group, and whether the driver limits that group at allocation time ("dmem", else None)."""
    if kernel_of(pid) != kernel_id:
        return False, None
    unified = _own_paths(pid).get("")
    mount = next((m for m, fstype, _ in _mounts() if fstype == "cgroup2"), None)
    if unified is None or mount is None:
        return True, None
    try:
        with open(os.path.join(mount + unified.rstrip("/"), "dmem.max")) as f:
            limited = any(len(x.split()) == 2 and x.startswith("nvidia/") and x.split()[1] != "max" for x in f)
    except OSError:
        limited = False
    return True, "dmem" if limited else None


_trusted: dict[str, bool] = {}


def _trusted_group(path: str) -> bool:
    if path not in _trusted:
        owners = set()
        for mount, _fstype, _options in _mounts():
            try:
                owners.add(os.stat(mount + path).st_uid)
            except OSError:
                continue
        _trusted[path] = bool(owners) and owners <= {0, os.geteuid()}
        if len(_trusted) > 4096:  # kernels come and go: a bounded memory of them
            _trusted.clear()
    return _trusted[path]


def card_minors(card: Card | None) -> list[int] | None:
    """The NVIDIA device nodes a kernel's group may open: its card's. None (no NVIDIA device) without a card, or
    on a simulated card without a device node; every card's where the driver does not say a real card's minor
    number (no isolation by device node there, rather than a kernel that cannot open its own card)."""
    if card is None:
        return None
    if card.minor is not None:
        return [card.minor]
    return None if card.simulated else list(range(MAX_MINOR + 1))


@dataclass(frozen=True)
class Level:
    """How this process holds its kernels' processes: ``tracking`` "cgroup" or "tree"; ``isolation`` whether
    a kernel can be kept from opening cards outside its lease; ``allocation`` how the driver limits a kernel's
    group at allocation time ("dmem", or None: not here); ``reason`` what is missing, in words."""

    tracking: str
    isolation: bool
    reason: str | None = None
    allocation: str | None = None
    allocation_reason: str | None = None
    escapable: bool = False  # a kernel (this process's user) may move its processes out of its group

    def to_dict(self) -> dict:
        return {
            "tracking": self.tracking,
            "escapable": self.escapable,
            "card_isolation": self.isolation,
            "reason": self.reason,
            "allocation": self.allocation,
            "allocation_reason": self.allocation_reason,
        }


class KernelCgroups:
    """Creates, fills, restricts and removes the kernels' groups of this process."""

    def __init__(self, enabled: bool = True, isolation: str = "auto", dmem_root: str | None = None) -> None:
        """``isolation``: how cards are kept closed where both ways work: "auto" (an eBPF device program on the
        unified hierarchy, else the v1 devices controller), "bpf" or "v1" (tests use these to try each).
        ``dmem_root``: where the unified hierarchy's root is, for the driver's per-cgroup limits (default: where
        it is mounted)."""
        self.bases: list[str] = []  # <mount><own cgroup>/gpushare-kernels, unified first
        self.devices: str | None = None  # the v1 devices controller's base, when it is the way cards are closed
        self.bpf: str | None = None  # the unified hierarchy's base, when device programs are the way
        self.unified: str | None = None  # the unified hierarchy's base, where a kernel's dmem limit is written
        self.dmem: DeviceMemoryLimits | None = None
        self._programs: dict[str, int] = {}  # kernel id -> its attached device program's fd
        level = self._detect(isolation) if enabled else Level("tree", False, "kernel cgroups are off (kernel_cgroups)")
        self.level = self._allocation(level, dmem_root)

    def _allocation(self, level: Level, root: str | None) -> Level:
        """The driver's per-cgroup limit, where this host has one for our kernels' groups (dmem)."""
        if self.unified is None:
            return dataclasses.replace(level, allocation_reason="kernels have no cgroup of their own here")
        if root is None:
            root = next((mount for mount, fstype, _ in _mounts() if fstype == "cgroup2"), "/sys/fs/cgroup")
        limits = DeviceMemoryLimits(root)
        missing = limits.enable(self.unified)
        if missing is not None:
            return dataclasses.replace(level, allocation_reason=missing)
        self.dmem = limits
        return dataclasses.replace(level, allocation="dmem")

    def limit(self, kernel_id: str, pci_bus_id: str | None, mib: int | None) -> bool:
        """The driver's hard limit on the kernel's group: ``mib`` on the card at ``pci_bus_id`` (None: no limit,
        a kernel without a GPU, or one in line). True when the card now refuses the group's processes more."""
        if self.dmem is None or self.unified is None:
            return False
        group = os.path.join(self.unified, kernel_id)
        return self.dmem.set(group, pci_bus_id, mib)

    def _detect(self, isolation: str) -> Level:
        own = _own_paths()
        problems: list[str] = []
        unified = None
        for mount, fstype, options in _mounts():
            if fstype == "cgroup2":
                key = ""
            elif "devices" in options.split(","):
                key = "devices"
            else:
                continue
            if key not in own:
                continue
            base = os.path.join(mount + own[key].rstrip("/"), GROUP)
            try:
                os.makedirs(base, exist_ok=True)
                probe = os.path.join(base, f".probe-{os.getpid()}")
                os.mkdir(probe)
                os.rmdir(probe)
            except OSError as e:
                problems.append(f"{base}: {e.strerror or e}")
                continue
            if key == "devices":
                self.devices = base
            else:
                unified = self.unified = base
            if base not in self.bases:
                self.bases.insert(0 if fstype == "cgroup2" else len(self.bases), base)
        if not self.bases:
            why = "; ".join(problems) or "no cgroup filesystem is mounted"
            return Level("tree", False, f"kernels are tracked by their process tree: cgroups cannot be created ({why})")
        if unified is not None and isolation in ("auto", "bpf") and (self.devices is None or isolation == "bpf"):
            try:
                os.close(_load(device_program(None)))  # may this process load device programs?
                self.bpf, self.devices = unified, None
            except (OSError, AttributeError, TypeError) as e:  # no bpf(2) here, or not allowed
                problems.append(f"an eBPF device program cannot be loaded ({e})")
        if isolation == "bpf" and self.bpf is None:
            self.devices = None
        # A kernel runs as this process's user: where that user may write this process's own group (root, or a
        # subtree delegated to it), a kernel may move what it starts there, out of its group, and it survives the
        # kernel. Said as it is ("own cgroup, escapable"); only a root helper that owns the kernels' groups
        # (not built) would close it.
        escapable = any(os.access(os.path.join(os.path.dirname(b), "cgroup.procs"), os.W_OK) for b in self.bases)
        if self.bpf is None and self.devices is None:
            why = "; ".join(problems) or "neither an eBPF device program nor the cgroup v1 devices controller is usable"
            return Level(
                "cgroup",
                False,
                f"no card isolation: {why}; use on a card outside a kernel's lease is counted as over-use",
                escapable=escapable,
            )
        return Level("cgroup", True, None, escapable=escapable)

    def no_isolation(self, why: str) -> None:
        """Keep tracking, without card isolation (``why``: what is missing)."""
        self.devices = self.bpf = None
        self.level = Level(self.level.tracking, False, f"no card isolation: {why}")

    def _dirs(self, kernel_id: str) -> list[str]:
        if not re.fullmatch(r"[0-9A-Za-z._-]{1,100}", kernel_id) or kernel_id.startswith("."):
            raise ValueError(f"not a kernel id for a cgroup: {kernel_id!r}")
        return [os.path.join(base, kernel_id) for base in self.bases]

    def through_broker(self, kernel_id: str) -> tuple[str, str] | None:
        """Where the kernel's first process asks to enter its group instead (the broker's socket, the kernel id):
        None, it writes ``create``'s files itself (broker/groups.py says otherwise)."""
        return None

    def create(self, kernel_id: str, minors: list[int] | None) -> list[str]:
        """The kernel's groups, made (or kept) and restricted to the cards of ``minors`` (None: no GPU at all).
        Returns the ``cgroup.procs`` files its first process must write its pid to; [] where there are none."""
        if not self.bases:
            return []
        dirs = self._dirs(kernel_id)
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        self.allow(kernel_id, minors)
        return [os.path.join(d, "cgroup.procs") for d in dirs]

    def move(self, old_id: str, kernel_id: str, minors: list[int] | None) -> None:
        """What runs in ``old_id``'s groups (a warm kernel's) goes into ``kernel_id``'s, made and restricted to the
        cards of ``minors`` as ``create`` makes them; ``old_id``'s groups go (the unified hierarchy renames none)."""
        procs = self.create(kernel_id, minors)
        for pid in sorted(self.pids(old_id)):
            for path in procs:
                try:
                    with open(path, "w") as f:
                        f.write(str(pid))
                except ProcessLookupError:
                    break  # (it ended meanwhile)
        self.remove(old_id)

    def allow(self, kernel_id: str, minors: list[int] | None) -> None:
        """Which NVIDIA cards the kernel's group may open: those of ``minors`` and the control devices, or (None)
        none of the NVIDIA devices. Devices already open stay open: this is set before the kernel runs."""
        if self.bpf is not None:
            self._attach_program(kernel_id, minors)
        if self.devices is None:
            return
        d = os.path.join(self.devices, kernel_id)
        try:
            _write(d, "devices.allow", "a *:* rwm")  # start from the parent's rules: every device it allows
            parent_allows_all = True
        except PermissionError:  # the parent is a list of allowed devices (a container's): add ours to what is left
            parent_allows_all = False
        if minors is None:
            _write(d, "devices.deny", f"c {NVIDIA_MAJOR}:* rwm")
            return
        if not parent_allows_all:
            for minor in (*minors, *NVIDIA_CONTROL):
                try:
                    _write(d, "devices.allow", f"c {NVIDIA_MAJOR}:{minor} rwm")
                except PermissionError:
                    pass  # the parent does not allow it either
        for minor in range(MAX_MINOR + 1):
            if minor not in minors:
                _write(d, "devices.deny", f"c {NVIDIA_MAJOR}:{minor} rwm")

    def _attach_program(self, kernel_id: str, minors: list[int] | None) -> None:
        """The group's device program, replaced: the new one is attached before the old one goes (both deny
        meanwhile, never neither). A group this process did not attach to since it started (a broker that
        restarted) has its programs found on the group itself and detached as the old one would be."""
        assert self.bpf is not None
        group = os.path.join(self.bpf, kernel_id)
        known = self._programs.get(kernel_id)
        olds = [known] if known is not None else _attached(group)
        prog = _load(device_program(minors))
        try:
            _attach(group, prog)
        except OSError:
            os.close(prog)
            for old in olds if known is None else []:
                os.close(old)
            raise
        self._programs[kernel_id] = prog
        for old in olds:
            try:
                _attach(group, old, _BPF_PROG_DETACH)
            finally:
                os.close(old)

    def _tree(self, kernel_id: str) -> list[str]:
        """The kernel's groups and every sub-group under them, deepest first (a kernel whose user may write its
        group, under delegation, can make sub-groups and move processes into them)."""
        out: list[str] = []
        for d in self._dirs(kernel_id) if self.bases else []:
            for root, _dirs, _files in os.walk(d, topdown=False):
                out.append(root)
        return out

    def pids(self, kernel_id: str) -> set[int]:
        """Every process in the kernel's groups now, their sub-groups' included."""
        out: set[int] = set()
        for d in self._tree(kernel_id):
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    out.update(int(x) for x in f.read().split())
            except (OSError, ValueError):
                continue
        return out

    def remove(self, kernel_id: str, keep: bool = False, grace_s: float = 2.0) -> int:
        """End whatever is left in the kernel's groups (a daemon its kernel started) and, unless ``keep`` (a
        restart), remove them. Returns how many processes had to be killed."""
        if not self.bases:
            return 0
        killed: set[int] = set()
        deadline = time.monotonic() + grace_s
        while True:
            left = self.pids(kernel_id)
            if not left:
                break
            if time.monotonic() > deadline:
                log.warning("jupyter-gpushare: processes %s of kernel %s would not end", sorted(left), kernel_id)
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except OSError:
                    pass
            time.sleep(0.02)
        prog = None if keep else self._programs.pop(kernel_id, None)
        if prog is not None:
            os.close(prog)  # (removing the group detaches it)
        for d in [] if keep else self._tree(kernel_id):  # sub-groups first
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("jupyter-gpushare: the cgroup %s could not be removed: %s", d, e)
        return len(killed)


# -- the driver's per-cgroup GPU memory limit (dmem) ---------------------------------------------------------


class DeviceMemoryLimits:
    """The NVIDIA driver's per-cgroup hard limit on GPU memory, through the Linux dmem controller (kernel 6.14+,
    driver r615+). The driver registers each GPU as a region, ``nvidia/<domain:bus:device>.0/vidmem``, listed with
    its size in the root's ``dmem.capacity``; a group's ``dmem.max`` holds ``<region> <bytes>``, and an allocation
    by any process in the group (or below it) past that fails in the driver, whatever it calls. A process in no
    limited group is not charged, so the limit goes on every kernel's own group. (On the driver's other backend,
    its own accounting over the misc controller, limits are set only through NVML: not done here.)"""

    def __init__(self, root: str) -> None:
        self.root = root

    def regions(self) -> dict[str, str]:
        """The driver's regions by PCI bus id (upper case, ``00000000:01:00.0``): region name."""
        found = {}
        try:
            with open(os.path.join(self.root, "dmem.capacity")) as f:
                for line in f:
                    name = line.split()[0] if line.split() else ""
                    m = re.fullmatch(r"nvidia/([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.\d/vidmem", name)
                    if m:
                        found[_bus_id(m.group(1))] = name
        except OSError:
            pass
        return found

    def enable(self, base: str) -> str | None:
        """Turn the dmem controller on for the groups under ``base`` (every group from the root down hands it on);
        None when it is on, else why it cannot be, in words."""
        if not self.regions():
            return (
                "the driver registers no GPU with the cgroup dmem controller here (it needs Linux 6.14+ and an NVIDIA "
                f"driver r615+; {os.path.join(self.root, 'dmem.capacity')} lists no nvidia region)"
            )
        rel = os.path.relpath(base, self.root)
        if rel.startswith(".."):
            return f"the kernels' groups ({base}) are not under the cgroup root {self.root}"
        path = self.root
        for part in [*(p for p in rel.split(os.sep) if p not in ("", ".")), None]:
            try:
                with open(os.path.join(path, "cgroup.subtree_control")) as f:
                    on = "dmem" in f.read().split()
                if not on:
                    _write(path, "cgroup.subtree_control", "+dmem")
            except OSError as e:
                return (
                    f"the dmem controller cannot be turned on for {path} ({e.strerror or e}); a group that holds "
                    "processes cannot hand it on: run the server in a sub-group of its delegated cgroup (systemd: "
                    "Delegate=yes with DelegateSubgroup=server)"
                )
            if part is not None:
                path = os.path.join(path, part)
        return None

    def set(self, group: str, pci_bus_id: str | None, mib: int | None) -> bool:
        """Limit ``group`` to ``mib`` on the card at ``pci_bus_id`` (None: lift the limit on every card). True when
        the group's dmem.max now says so."""
        regions = self.regions()
        if pci_bus_id is None or mib is None:
            for region in regions.values():
                _write(group, "dmem.max", f"{region} max")
            return False
        found = regions.get(_bus_id(pci_bus_id))
        if found is None:
            return False
        region = found
        for other in regions.values():  # a kernel restarted onto another card keeps no limit on the old one
            if other != region:
                _write(group, "dmem.max", f"{other} max")
        limit = mib * 2**20
        _write(group, "dmem.max", f"{region} {limit}")
        with open(os.path.join(group, "dmem.max")) as f:
            return any(line.split() == [region, str(limit)] for line in f)


def _bus_id(text: str) -> str:
    """A PCI bus id as the driver names its dmem regions: an 8-digit domain, upper case, without the function."""
    text = text.upper().split(".")[0]
    domain, rest = text.split(":", 1) if text.count(":") == 2 else ("0", text)
    return f"{int(domain, 16):08X}:{rest}"


# -- cgroup v2: an eBPF device program per kernel group ------------------------------------------------

_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine)
_BPF_PROG_LOAD, _BPF_PROG_ATTACH, _BPF_PROG_DETACH, _BPF_PROG_GET_FD_BY_ID, _BPF_PROG_QUERY = 5, 8, 9, 13, 16
_BPF_PROG_TYPE_CGROUP_DEVICE, _BPF_CGROUP_DEVICE, _BPF_F_ALLOW_MULTI = 15, 6, 2


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, dst | (src << 4), off, imm)


def device_program(minors: list[int] | None) -> bytes:
    """The eBPF program (BPF_PROG_TYPE_CGROUP_DEVICE) that denies NVIDIA character devices (major 195) but the
    card minors of ``minors`` and, with any card, the control devices; None: every NVIDIA device. Other devices
    are left to the other programs of the hierarchy (a program may only narrow)."""
    allowed = [] if minors is None else [*minors, *NVIDIA_CONTROL]
    body = [
        _insn(0x61, dst=2, src=1, off=0),  # r2 = ctx->access_type
        _insn(0x57, dst=2, imm=0xFFFF),  # r2 &= 0xffff: the device type
        _insn(0x61, dst=3, src=1, off=4),  # r3 = ctx->major
        _insn(0x61, dst=4, src=1, off=8),  # r4 = ctx->minor
    ]
    checks = [(0x55, 2, 2), (0x55, 3, NVIDIA_MAJOR)] + [(0x15, 4, m) for m in allowed]  # jne / jeq to "allow"
    deny = [_insn(0xB7, dst=0, imm=0), _insn(0x95)]  # r0 = 0; exit
    for i, (code, reg, imm) in enumerate(checks):
        to_allow = len(checks) - i - 1 + len(deny)  # jump over the checks left and the deny
        body.append(_insn(code, dst=reg, off=to_allow, imm=imm))
    return b"".join(body + deny + [_insn(0xB7, dst=0, imm=1), _insn(0x95)])  # allow: r0 = 1; exit


def _bpf(cmd: int, attr: bytes) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr, 128)
    fd = libc.syscall(_BPF_SYSCALL, cmd, buf, 128)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf({cmd}): {os.strerror(err)}")
    return fd


def _load(program: bytes) -> int:
    insns = ctypes.create_string_buffer(program, len(program))
    license = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack(
        "<IIQQ", _BPF_PROG_TYPE_CGROUP_DEVICE, len(program) // 8, ctypes.addressof(insns), ctypes.addressof(license)
    )
    return _bpf(_BPF_PROG_LOAD, attr)


def _attached(group: str) -> list[int]:
    """Descriptors of the device programs attached to ``group`` now (BPF_PROG_QUERY, BPF_PROG_GET_FD_BY_ID);
    [] where there are none or they cannot be read."""
    fd = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
    ids = (ctypes.c_uint32 * 64)()
    try:
        attr = struct.pack("<IIIIQI", fd, _BPF_CGROUP_DEVICE, 0, 0, ctypes.addressof(ids), len(ids))
        buf = ctypes.create_string_buffer(attr, 128)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(_BPF_SYSCALL, _BPF_PROG_QUERY, buf, 128) < 0:
            return []
        count = struct.unpack_from("<I", buf.raw, 24)[0]
    finally:
        os.close(fd)
    out = []
    for prog_id in list(ids)[: min(count, len(ids))]:
        try:
            out.append(_bpf(_BPF_PROG_GET_FD_BY_ID, struct.pack("<III", prog_id, 0, 0)))
        except OSError:
            continue
    return out


def _attach(group: str, prog: int, cmd: int = _BPF_PROG_ATTACH) -> None:
    fd = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = _BPF_F_ALLOW_MULTI if cmd == _BPF_PROG_ATTACH else 0
        _bpf(cmd, struct.pack("<IIII", fd, prog, _BPF_CGROUP_DEVICE, flags))
    finally:
        os.close(fd)


def _write(directory: str, name: str, value: str) -> None:
    with open(os.path.join(directory, name), "w") as f:
        f.write(value)
