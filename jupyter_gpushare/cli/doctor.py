"""`jupyter gpushare doctor`: every check of this host's set-up, each finding with what to do."""

from __future__ import annotations

import getpass
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from traitlets.config import Config

from ..broker.client import BrokerLedger
from ..broker.groups import BrokerGroups
from ..broker.paths import fillable_by_students
from ..broker.protocol import DEFAULT_SOCKET
from ..config.settings import GpuShareApp, settings_from
from ..config.sources import load_config
from ..core.addresses import BrokerAt
from ..core.policy import CardView, PolicyError, format_mib
from ..host.cgroups import KernelCgroups
from ..ledger.file import SETTLE_S
from ..ledger.ledger import LedgerError, check_ledger, read_notebooks
from ..server.manager import kernel_cgroups


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


def diagnose(
    config: Config | None = None, socket_path: str | None = None, sources: Sequence[str] = ()
) -> list[Finding]:
    """Every check of `jupyter gpushare doctor`, each with what to do. ``config``: the settings to check
    (default: what this user's Jupyter server reads, ``sources.load_config``); ``sources``: where they came from."""
    if config is None:
        config, sources = load_config(running=True)
    app, findings = _config_findings(config, sources)
    driver, count, nvml_error = _nvml()
    findings.append(_driver_finding(app, driver, count, nvml_error))
    if app is not None:
        findings.append(_cards_finding(app))
        findings.append(_parking_finding(app))
    socket_path = socket_path or getattr(app, "broker_socket", "") or None
    if socket_path:
        broker = app.broker(socket_path) if app is not None else None
        broker = broker or BrokerAt(socket_path)
        findings += _broker_findings(broker)
        findings += _users_kernels_findings(broker)
    else:
        findings.append(_no_broker_finding())
        if app is not None:
            findings.append(_ledger_finding(app.ledger_path))
            findings.append(_ledger_disk_finding(app.ledger_path))
            findings.append(_history_finding(app))
    findings += _tier_findings(driver, nvml_error, shared=bool(socket_path))
    return findings + _cgroup_findings(app, shared=bool(socket_path))


def _users_kernels_findings(broker: BrokerAt) -> list[Finding]:
    """What every user's kernels get, as the broker reads them (an admin's view): the level of each running kernel."""
    client = BrokerLedger.at(broker, timeout=5.0)
    try:
        view = client.view()
    except (LedgerError, PolicyError):
        return []  # said by the broker finding
    finally:
        client.close()
    levels = view.get("levels")
    if levels is None:
        return [Finding("tier: users' kernels", "info", "Only an admin of the broker sees how other users' kernels are held.",
                        "Run doctor as root, or as one of GpuShareBroker.admin_users.")]  # fmt: skip
    if not levels:
        return [Finding("tier: users' kernels", "info", "No kernel of any user runs now: start one and run doctor again to see how it is held.")]  # fmt: skip
    counts: dict[str, list[str]] = {}
    for kernel_id, held in sorted(levels.items()):
        counts.setdefault(held["level"], []).append(f"{held['user']}'s {kernel_id[:8]}")
    said = "; ".join(
        f"{len(ks)} at '{lvl}' ({', '.join(ks[:5])}{', …' if len(ks) > 5 else ''})"
        for lvl, ks in sorted(counts.items())
    )
    weak = [lvl for lvl in counts if lvl in ("caps", "watchdog")]
    return [Finding("tier: users' kernels", "warn" if weak else "ok", f"As the broker reads them now: {said}.",
                    "Kernels at 'watchdog' are tracked by their process tree only: their users' servers cannot make cgroups, "
                    "and the broker made none for them. Keep GpuShareApp.kernel_cgroups = 'auto' for the broker and the "
                    "servers, and run the broker where it may make cgroups (root, cgroup v2 or v1 mounted): it then makes "
                    "each kernel's group, which its student cannot leave (docs/admin-guide.md, Enforcement levels)." if weak else "")]  # fmt: skip


def _cgroup_findings(app: GpuShareApp | None, shared: bool) -> list[Finding]:
    """How this user's kernels are tracked, isolated and limited (cgroups.py, levels.py), as this process finds the
    host. With a broker, other users' servers run as themselves: their kernels are in _users_kernels_findings."""
    cgroups = kernel_cgroups(app) if app is not None else KernelCgroups()
    level = cgroups.level
    whose = f"this user's ({getpass.getuser()}) kernels" if shared else "the kernels"
    if level.tracking != "cgroup":
        return [Finding("tier: kernel cgroups", "warn", f"{whose[0].upper()}{whose[1:]} are tracked by their process tree: {level.reason}.",
                        "Run the server as root or give its user a delegated cgroup subtree (systemd: Delegate=yes), "
                        "and keep GpuShareApp.kernel_cgroups = 'auto' (docs/admin-guide.md, Enforcement levels).")]  # fmt: skip
    if isinstance(cgroups, BrokerGroups):
        found = [Finding("tier: kernel cgroups", "ok", f"Each of {whose} runs in a cgroup the broker makes for it: whatever it starts "
                         "stays the kernel's, and the kernel cannot leave it.")]  # fmt: skip
    elif level.escapable:
        found = [Finding("tier: kernel cgroups", "warn", f"Each of {whose} runs in a cgroup of its own, which it can leave: its user "
                         "may write this server's own cgroup (root, or a delegated subtree).",
                         "Run the servers as the students with a broker on its Unix socket: the broker then makes the kernels' "
                         "cgroups where they cannot leave them (docs/security.md).")]  # fmt: skip
    else:
        found = [Finding("tier: kernel cgroups", "ok", f"Each of {whose} runs in a cgroup of its own: whatever it starts stays the kernel's.")]  # fmt: skip
    if level.allocation:
        found.append(Finding("tier: driver cgroup limits", "ok", "The NVIDIA driver limits each kernel's cgroup to its reservation (dmem): "
                             "an allocation past it fails in the driver, whatever the kernel calls."))  # fmt: skip
    else:
        found.append(Finding("tier: driver cgroup limits", "info", f"No allocation-time limit: {level.allocation_reason}.",
                             "NVIDIA r615+ drivers on Linux 6.14+ with the dmem controller limit each kernel's cgroup (docs/security.md)."))  # fmt: skip
    if level.isolation:
        way = "an eBPF device program on its cgroup" if cgroups.bpf else "the cgroup v1 devices controller"
        found.append(Finding("tier: card isolation", "ok", f"Each kernel may open only its own card ({way}); one without a GPU none."))  # fmt: skip
    else:
        found.append(Finding("tier: card isolation", "warn", f"Kernels are not kept from other cards: {level.reason}.",
                             "Use on other cards is counted as over-use. Isolation needs root (or CAP_BPF) for an eBPF device "
                             "program, or the cgroup v1 devices controller."))  # fmt: skip
    return found


def _config_findings(config: Config, sources: Sequence[str]) -> tuple[GpuShareApp | None, list[Finding]]:
    read = f" Read from: {', '.join(sources)}." if sources else " No config file was found: the defaults apply."
    try:
        app = settings_from(config)
        policy = app.build_policy()
        cards = _cards(app)
        app.check(policy, [CardView(c.uuid, c.index, c.total_mib) for c in cards])
    except PolicyError as e:
        fix = "Fix this setting where it is set; the server refuses to start with it."
        return None, [Finding("config", "error", f"{e}{read}", fix)]
    detail = f"GpuShareApp settings are valid (default quota {policy.default_quota}, on_full {policy.on_full}).{read}"
    return app, [Finding("config", "ok", detail)]


def _cards(app: GpuShareApp) -> list:
    from ..host.gpu import open_backend

    try:
        return open_backend(app.gpu_backend, app.simulated_cards).cards()
    except Exception:  # a lost card: the cards finding says so
        return []


def _parking_finding(app: GpuShareApp) -> Finding:
    """Whether idle kernels can be parked here: the driver's checkpoint API (driver 570+), or the stand-in of
    simulated cards."""
    from ..host.checkpoint import DriverCheckpoint, checkpointer_for
    from ..host.gpu import open_backend

    if not app.park_after:
        return Finding("parking", "info", "Idle kernels are not parked (GpuShareApp.park_after = 0).")
    try:
        checkpointer = checkpointer_for(open_backend(app.gpu_backend, app.simulated_cards))
    except Exception as e:  # noqa: BLE001 (the driver finding says what is wrong with the backend)
        return Finding("parking", "warn", f"Idle kernels cannot be parked: {e}.")
    reason = checkpointer.probed() if isinstance(checkpointer, DriverCheckpoint) else checkpointer.unavailable()
    if reason:
        return Finding("parking", "warn", f"Idle kernels cannot be parked: {reason}. They keep their reservations "
                       "until the idle policy acts.", "Parking needs NVIDIA driver 570 or later (the CUDA checkpoint API).")  # fmt: skip
    by = "the driver's checkpoint API" if checkpointer.kind == "driver" else "a stand-in (simulated cards)"
    return Finding("parking", "ok", f"Idle kernels ({', '.join(app.park_frameworks)}) are parked after "
                   f"{app.park_after:.0f} s while others wait, by {by}.")  # fmt: skip


def _driver_finding(app: GpuShareApp | None, driver: str | None, count: int | None, nvml_error: str | None) -> Finding:
    if not nvml_error:
        return Finding("driver", "ok", f"NVIDIA driver {driver}, NVML sees {count} device(s).")
    mode, simulated = getattr(app, "gpu_backend", "auto"), bool(getattr(app, "simulated_cards", ""))
    broken = mode == "nvml" or (mode == "auto" and not simulated)
    if not broken:
        return Finding("driver", "info", nvml_error + "; simulated cards are configured.")
    fix = "Install the NVIDIA driver (nvidia-smi must work) and nvidia-ml-py; kernels start without a GPU until then."
    return Finding("driver", "error", nvml_error, fix)


def _cards_finding(app: GpuShareApp) -> Finding:
    from ..host.gpu import open_backend
    from ..host.gpu.pod import pod_limit_mib

    try:
        backend = open_backend(app.gpu_backend, app.simulated_cards)
        cards = backend.cards()
    except Exception as e:
        return Finding("cards", "error", f"The card list cannot be read: {e}", "Run nvidia-smi; a lost card needs a reset or reboot.")  # fmt: skip
    if not cards:
        return Finding(
            "cards", "error", f"No card: {backend.reason}", "Check the driver (above) and GpuShareApp.cards."
        )
    text = ", ".join(f"{c.index}: {c.name} {format_mib(c.total_mib)}" for c in cards)
    if any(pod_limit_mib(c.index) is not None for c in cards):  # (the sizes above are already the shares)
        text += " (HAMi's share of the GPU for this pod)"
    if backend.simulated:
        return Finding("cards", "warn", text + " [simulated: no real memory]", "Set GpuShareApp.gpu_backend = 'nvml' on a GPU host.")  # fmt: skip
    return Finding("cards", "ok", text)


def _broker_findings(broker: BrokerAt) -> list[Finding]:
    findings = []
    socket_path = broker.socket
    client = BrokerLedger.at(broker, timeout=5.0)
    try:
        hello = client.hello()
        findings.append(Finding("broker", "ok", f"The broker at {socket_path} answers: you are {hello['user']!r}"
                                f"{' (admin)' if hello['admin'] else ''}, {len(hello['cards'])} card(s), your limits {hello['limits']}."))  # fmt: skip
    except (LedgerError, PolicyError) as e:
        down = "not reachable" in str(e)
        findings.append(Finding("broker", "error", str(e), "Start it: systemctl start jupyter-gpushare-broker (docs/multi-user.md)." if down
                                else "See the message; docs/multi-user.md describes the broker's settings."))  # fmt: skip
    finally:
        client.close()
    if socket_path.startswith("tcp://"):
        findings.append(Finding("broker", "warn", "This server's JupyterHub token crosses plain TCP to the broker.",
                                "Unless that network is private to the servers, give the broker a certificate "
                                "(GpuShareBroker.tcp_certfile) and use tls:// (docs/multi-user.md)."))  # fmt: skip
    return findings


def _no_broker_finding() -> Finding:
    if os.path.exists(DEFAULT_SOCKET):
        return Finding("broker", "warn", f"A broker socket exists at {DEFAULT_SOCKET}, but this server does not use it "
                       "(GpuShareApp.broker_socket is set to '', or the broker started after the server).",
                       f"Remove broker_socket = '' (it then defaults to {DEFAULT_SOCKET}), or restart the server, so "
                       "this host's users share one ledger.")  # fmt: skip
    return Finding("broker", "info", "No broker configured: this user's servers share their own ledger file.",
                   "On a host with several users, run a broker (docs/multi-user.md).")  # fmt: skip


def _tier_findings(driver: str | None, nvml_error: str | None, shared: bool) -> list[Finding]:
    findings = [Finding("tier: framework caps", "ok", "TensorFlow, PyTorch, JAX and CuPy are capped inside each kernel (cooperative).")]  # fmt: skip
    if nvml_error:
        findings.append(Finding("tier: NVML watchdog", "warn", "Not available without NVML: bypassing the framework caps goes unnoticed.",
                                "Install the NVIDIA driver and nvidia-ml-py."))  # fmt: skip
    else:
        findings.append(Finding("tier: NVML watchdog", "ok", "Available: per-process GPU memory is measured and over-quota kernels are acted on."))  # fmt: skip
    mps = shutil.which("nvidia-cuda-mps-control")
    findings.append(Finding("tier: MPS", "info", f"nvidia-cuda-mps-control {'found at ' + mps if mps else 'not found'}; MPS is opt-in only "
                            "(a crashed client can take the card from everyone)."))  # fmt: skip
    findings.append(_ptrace_finding(shared))
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


def _ledger_disk_finding(path: str) -> Finding:
    """Whether a filesystem others can fill holds the ledger (then reservations are refused until there is space)."""
    shared = fillable_by_students(Path(path))
    if shared:
        return Finding(
            "ledger disk",
            "info",  # (this user's own ledger: filling its disk stops this user's reservations first)
            f"The ledger {path} is on the same filesystem as {shared}: when it is full, every reservation is refused "
            "(with the reason; nothing is overbooked) and kernels start without a GPU until there is space.",
            "On a shared host, use a broker with its ledger on a filesystem of its own (docs/multi-user.md).",
        )
    return Finding("ledger disk", "ok", f"The ledger {path} is not on a filesystem that /tmp, /home or /dev/shm share.")


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


def _history_finding(app: GpuShareApp) -> Finding:
    """What notebooks have taught (quotas learned from history), in figures; the list is in `status`."""
    rules = app.build_history()
    if not rules.kept:
        return Finding("history", "info", "No peaks are recorded (history_max_age_days = 0).")
    try:
        books = read_notebooks(app.ledger_path, rules) if Path(app.ledger_path).exists() else []
    except LedgerError as e:
        return Finding("history", "warn", f"The recorded peaks cannot be read: {e}")
    failed = [n for n in books if n["failed"]]
    use = "set the quota" if rules.enabled else "are shown only (quota_from_history is off)"
    text = f"{len(books)} notebook(s) have recorded runs; what they teach {use}."
    if failed:
        text += f" {len(failed)} ran out of memory on a run: their next kernels get at least 1.5x that run's quota."
    return Finding("history", "ok", text + " Per notebook: jupyter gpushare status.")


SYMBOL = {"ok": "ok   ", "info": "info ", "warn": "WARN ", "error": "ERROR"}


def render(findings: Sequence[Finding]) -> str:
    """The findings as lines for people: status, check, detail, and what to do for warnings and errors."""
    lines = []
    for f in findings:
        lines.append(f"[{SYMBOL[f.status]}] {f.check}: {f.detail}")
        if f.fix and f.status in ("warn", "error"):
            lines.append(f"        what to do: {f.fix}")
    return "\n".join(lines)
