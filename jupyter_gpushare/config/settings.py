"""Every setting of jupyter-gpushare in a Jupyter server (``c.GpuShareApp.*``), checked where it is read.

One Configurable holds them: the server extension, the broker, ``jupyter gpushare status`` and ``doctor``,
and the provisioner in a kernel started outside a server (nbclient, papermill, ``jupyter execute``) all
read the same files the same way (``load_config``) into it. Each setting is checked alone by its own
``@validate`` (a bad value is refused with the setting's name and an example), and the settings together
against the host's cards by ``check`` (impossible combinations stop the server at start with a fix).

The class is called GpuShareApp because that is the section admins write, ``c.GpuShareApp.default_quota``;
it is not an application (the server extension is ``app.GpuShareExtension``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from traitlets import Bool, Dict, Enum, Float, Int, List, TraitError, Unicode, default, validate
from traitlets.config import Config

from ..core.history import DAY_S, HistoryRules
from ..core.levels import REQUIRED_CHOICES
from ..core.policy import (
    DEFAULT_MIN_QUOTA_MIB,
    FRAMEWORKS,
    IDLE_ACTIONS,
    LINE_CPU,
    LINE_PLACES,
    MAX_WARM_KERNELS,
    ON_FULL_CHOICES,
    OVER_QUOTA_ACTIONS,
    CardView,
    EnforcePolicy,
    ParkRules,
    Policy,
    PolicyError,
    Size,
    format_mib,
    parse_size,
    warm_import_problem,
)
from .broker_place import BrokerPlace, checked

MIN_INTERVAL_S = 0.2  # the sampler reads the driver at most this often
HISTORY_RANGES = {  # setting -> (highest, example)
    "history_margin": (10, "0.2 (= +20%)"),
    "history_max_age_days": (36500, "90, or 0 for no history"),
    "history_quorum": (1000, "3 (users), or 0: only history_teachers teach others"),
}
SIZES = {  # setting -> (may be a percentage, may be zero, may be empty)
    "default_quota": (True, False, False),
    "max_quota": (True, False, True),
    "min_quota": (True, False, False),
    "context_reserve": (False, True, False),
    "card_headroom": (True, True, False),
}


class GpuShareApp(BrokerPlace):
    """GPU memory quotas for notebook kernels on a shared GPU server: the admin's settings."""

    default_quota = Unicode(
        "4GiB",
        config=True,
        help="GPU memory quota of each Python kernel, e.g. '4GiB', '4096MiB', '4G' or '25%' (of its card). "
        "The kernel's frameworks are capped at this; its reservation on the card is this plus "
        "context_reserve. Default: '4GiB'. '0' is not allowed here: to give a kernelspec no GPU, "
        "set kernel_quotas = {'<name>': '0MiB'}.",
    )
    max_quota = Unicode(
        "",
        config=True,
        help="Largest quota a kernel may ask for (through its kernelspec or the API), e.g. '16GiB' or '50%'. "
        "Default: '' = no limit but the card.",
    )
    min_quota = Unicode(
        f"{DEFAULT_MIN_QUOTA_MIB}MiB",
        config=True,
        help="Smallest quota a kernel may have or ask for (through the API or its kernelspec), e.g. '512MiB' or '1%'. "
        "A smaller quota is refused with this minimum in the message, so a quota of (almost) nothing cannot be used "
        "to slip out of every cap. A kernel that should have no GPU gets kernel_quotas = {'<name>': '0MiB'}: it "
        f"reserves nothing and sees no GPU. Default: '{DEFAULT_MIN_QUOTA_MIB}MiB'.",
    )
    context_reserve = Unicode(
        "640MiB",
        config=True,
        help="GPU memory added to every kernel's reservation for its CUDA context, which no framework cap "
        "counts. Measured on H100/H200: 518-612 MiB per process (PyTorch 612, JAX 552, CuPy 522). "
        "Default: '640MiB'. TensorFlow with cuDNN needs about '1.5GiB'.",
    )
    card_headroom = Unicode(
        "1GiB",
        config=True,
        help="GPU memory kept unreserved on every card, for processes outside Jupyter and for the driver, "
        "e.g. '1GiB' or '5%'. Default: '1GiB'. '0MiB' reserves the whole card.",
    )
    cards = List(
        Unicode(),
        default_value=[],
        config=True,
        help="Cards kernels may use, by index ('0': on a GPU in MIG mode, all its MIG instances) or UUID "
        "('GPU-...', 'MIG-...'). Default: [] = every card.",
    )
    on_full = Enum(
        list(ON_FULL_CHOICES),
        default_value="queue",
        config=True,
        help="What happens to a kernel when no card has room: 'queue' = it is listed at once as waiting, in line "
        "(queue_overtake_limit) up to queue_timeout seconds, its CPU cells running meanwhile (a cell that uses the GPU "
        "waits for the grant); "
        "'cpu' = start it without a GPU and say so; 'reject' = refuse at once with how much was free and needed. "
        "Default: 'queue'.",
    )
    line_place = Enum(
        list(LINE_PLACES),
        default_value="start",
        config=True,
        help="When a notebook's kernel asks for its GPU reservation: 'start' = as it starts (it is granted at once "
        "if a card has room, else it takes its place in line while its CPU cells run); 'first-use' = at the first "
        "import of a GPU framework in it (PyTorch, TensorFlow, JAX, CuPy, numba.cuda, PyCUDA), which waits in its "
        "cell for the grant: a notebook that has not used the GPU yet, or never does, holds no reservation and no "
        "place. Python kernels of a server only (other kernels, and nbclient or papermill, ask at the start). "
        "Default: 'start'. docs/architecture.md compares the two.",
    )
    line_cpu = Enum(
        list(LINE_CPU),
        default_value="idle",
        config=True,
        help="A kernel in line's CPU priority until its grant: 'idle' = its start, its framework's import and its "
        "CPU cells run under SCHED_IDLE, so they cost the kernels that hold a GPU nothing (a class's first wave ran "
        "7-10 s slower beside 22-66 kernels starting in line), and it runs at normal priority from its grant or the "
        "end of its wait on; where the server could not give the priority back (no CAP_SYS_NICE and RLIMIT_NICE "
        "below 20), kernels run at normal priority all along. 'normal' = no change. Default: 'idle'.",
    )
    queue_timeout = Float(
        600.0,
        config=True,
        help="Seconds a queued kernel waits for room (on_full='queue'). Then a notebook's kernel leaves the line "
        "and runs on without a GPU, its variables kept (its notebook offers Join again), with an event that says "
        "why; a program's kernel (jupyter execute, nbconvert, papermill) is not started, and the program ends with "
        "exit status 4. The broker applies its own to every user's kernels. Default: 600. 0 = wait without limit.",
    )
    queue_overtake_limit = Float(
        300.0,
        config=True,
        help="Seconds a kernel in line may be passed by later kernels that fit where it does not (a 2 GiB kernel "
        "is not kept behind a 20 GiB one while 5 GiB are free). Past it, the room it needs on its best card is kept "
        "for it until it fits, so a large kernel is not starved; kept room holds back no kernel for longer than "
        "this, and a user's kernel that joins again within queue_timeout of an unserved wait does not age "
        "(docs/admin-guide.md, the line's rules). Default: 300. 0 = never passed (first come, first served on "
        "each card).",
    )
    queue_max_per_user = Int(
        10,
        config=True,
        help="Kernels one user may have waiting in line at once; one more is refused at once with this limit "
        "in the message (waiting kernels also count against a broker's per-user limits). Default: 10. "
        "0 = no cap.",
    )
    taken_out_for = Float(
        600.0,
        config=True,
        help="Seconds a kernel an admin took out of the line (the host view's Take out) may not join it again: its "
        "server's and its student's asks are refused with the admin's reason until then; a new kernel (another "
        "notebook) joins at the back. With a broker, the broker's setting applies. Default: 600.",
    )
    queue_unwatched_timeout = Float(
        120.0,
        config=True,
        help="Seconds a waiting kernel stays in line with no client connected to it (no open notebook, no "
        "program on its websocket): then it leaves the line and is shut down, with an event, so that no "
        "reservation is granted to a kernel nobody uses. A page reload reconnects within seconds. Default: 120. "
        "0 = never.",
    )
    required_enforcement = Enum(
        list(REQUIRED_CHOICES),
        default_value="none",
        config=True,
        help="The least enforcement level a kernel may get a GPU at; below it, the server and the broker refuse the "
        "kernel a GPU and say why: 'caps' (its frameworks' caps only), 'watchdog' (memory beyond its lease is acted "
        "on, its processes found by their process tree), 'cgroup' (every process it starts stays in its own cgroup), "
        "'allocation' (the card refuses it memory past its lease: the NVIDIA driver's per-cgroup limit, r615+ with "
        "the dmem controller). `jupyter gpushare doctor` and each kernel's 'held' say the level this host gives. "
        "Default: 'none' (no level required).",
    )
    kernel_cgroups = Enum(
        ["auto", "off"],
        default_value="auto",
        config=True,
        help="'auto': where this server may create cgroups (root, or a subtree delegated to its user), each kernel "
        "runs in a cgroup of its own, so every process it starts stays counted as the kernel's (a double-forked "
        "daemon too), and may open only its own card's device (none without a GPU), whatever its environment says "
        "(an eBPF device program on cgroup v2, or the v1 devices controller). A server that runs as a student with a broker "
        "on its Unix socket has the broker (root) make them, so that a kernel cannot leave its group. Elsewhere kernels "
        "are tracked by their process tree, "
        "and `jupyter gpushare doctor` and the API say so. 'off': process trees only. Default: 'auto'.",
    )
    kernel_quotas = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        default_value={},
        config=True,
        help="Quota per kernelspec name, e.g. {'python3': '8GiB', 'ir': '2GiB', 'julia-1.10': '0MiB'}. "
        "Kernels of languages other than Python reserve nothing unless listed. Default: {}.",
    )
    ledger_path = Unicode(
        config=True,
        help="SQLite file holding this host's reservations; it must be on a local disk (WAL mode). "
        "Every Jupyter server of one user on this host shares it. Default: <jupyter data dir>/gpushare/ledger.sqlite.",
    )
    gpu_backend = Enum(
        ["auto", "nvml", "simulated"],
        default_value="auto",
        config=True,
        help="Where cards come from: 'nvml' = the NVIDIA driver; 'simulated' = simulated_cards, even on a GPU "
        "host (for demos and tests); 'auto' = NVML when it finds a card, else simulated_cards if set, else no "
        "GPU. Default: 'auto'.",
    )
    simulated_cards = Unicode(
        "",
        config=True,
        help="Simulated cards for hosts without a GPU, e.g. '24GiB', '2x16GiB' or '24GiB,16GiB'. They are "
        "labelled 'simulated' in every reply, and kernels on them see no GPU. Default: '' = none.",
    )
    reconcile_interval = Float(
        10.0,
        config=True,
        help="Seconds between checks that release the reservations of kernels that are gone. Default: 10.",
    )

    sample_interval = Float(
        1.0,
        config=True,
        help="Seconds between two readings of GPU use (NVML) by the sampler thread; the API, /metrics and the "
        f"over-quota and idle policies see one reading per interval. Default: 1. Values below {MIN_INTERVAL_S} are "
        f"raised to {MIN_INTERVAL_S}.",
    )
    near_quota_threshold = Float(
        0.9,
        config=True,
        help="Fraction of its reservation (quota + context_reserve) at which a kernel is warned that it nears its "
        "quota (state 'near_quota', event 'near-quota'). Default: 0.9. 0 = no such warning.",
    )
    over_quota_grace = Float(
        30.0,
        config=True,
        help="Seconds a kernel may stay over its reservation (its processes' GPU memory, measured by NVML, passes "
        "quota + context_reserve) before over_quota_action is taken. Default: 30. 0 = at the first reading.",
    )
    over_quota_action = Enum(
        list(OVER_QUOTA_ACTIONS),
        default_value="protect",
        config=True,
        help="What happens to a kernel over its reservation for over_quota_grace seconds: 'protect' = neighbours "
        "first: on a card shared with other kernels or programs, interrupt the running cell, then restart the kernel "
        "(keeping its reservation) if it still holds more than its reservation one grace period later; alone on its "
        "card, notify only (what it uses beyond its reservation is counted as taken either way, so no next kernel "
        "is placed on it); 'notify' = an event (and a notification in JupyterLab) only; 'interrupt' = interrupt "
        "the running cell (frameworks usually keep their memory cached); 'restart' = restart the kernel, keeping "
        "its reservation; 'shutdown' = shut it down and release it. Default: 'protect'.",
    )
    idle_timeout = Float(
        3600.0,
        config=True,
        help="Seconds after which a kernel that holds a GPU reservation, shows 0% GPU use and runs no cell is "
        "warned that it is idle (state 'idle', event 'idle'). Default: 3600 (1 hour). 0 = no idle policy.",
    )
    idle_action = Enum(
        list(IDLE_ACTIONS),
        default_value="warn",
        config=True,
        help="What happens to an idle kernel (idle_timeout): 'warn' = an event and the 'idle' state only; "
        "'shutdown' = shut it down idle_shutdown_delay seconds after the warning, giving its memory back. "
        "Default: 'warn'.",
    )
    idle_shutdown_delay = Float(
        600.0,
        config=True,
        help="Seconds between the idle warning and the shutdown, when idle_action = 'shutdown'; any activity in "
        "between cancels it. Default: 600.",
    )

    park_after = Float(
        600.0,
        config=True,
        help="Seconds a kernel that holds a GPU reservation must be idle (no cell running, 0% GPU use) before it is "
        "parked while another kernel waits in line: its GPU state is moved to host memory through the CUDA driver's "
        "checkpoint API and its reservation goes to the line; its next cell brings it back (it waits in line if it "
        "must). Only kernels whose frameworks are all in park_frameworks are parked. Under line_place = 'start', a "
        "Python kernel that has held its reservation this long with nothing on the card, no GPU framework imported "
        "and no child process stands by instead, busy or not: its reservation goes to the line, its cells run on, "
        "and its next GPU use asks again. Default: 600. 0 = never park, never stand by.",
    )
    park_frameworks = List(
        Unicode(),
        default_value=["torch", "cupy", "tensorflow"],
        config=True,
        help="The frameworks whose GPU state survives a park, as measured on the GPU (bench/results/check_park-*): "
        "a kernel that imported any other is not parked. Default: ['torch', 'cupy', 'tensorflow'] (measured intact "
        "on an H200; JAX crashed while parked).",
    )
    park_host_budget = Unicode(
        "50%",
        config=True,
        help="Host memory that all parked kernels' GPU state may take: a size ('64GiB'), or a share of the host's "
        "memory ('50%'). A kernel whose state does not fit is not parked. Default: '50%'.",
    )

    warm_kernels = Int(
        0,
        config=True,
        help="Kernels each server keeps started ahead of time per kernelspec of warm_kernelspecs: a notebook that opens "
        "is handed one at once, set exactly as a fresh kernel (working directory, environment), and then asks for its "
        "GPU. A warm kernel holds no reservation and no card, runs at idle CPU priority, and is replaced by a fresh "
        "start once its kernelspec or the environment changed. Each costs a kernel's memory (about 100 MiB, more with "
        "warm_imports). 0 to 32. Default: 0 (2 suits a class).",
    )
    warm_kernelspecs = List(
        Unicode(), [], config=True, help="Kernelspecs kept warm. Default: [] = the server's default."
    )
    warm_imports = List(
        Unicode(),
        default_value=[],
        config=True,
        help="Modules a warm kernel imports ahead of time, e.g. ['numpy', 'torch']. Of the GPU frameworks only PyTorch "
        "(2.11+): its code runs, touching no GPU; the notebook's `import torch` waits for its GPU and sets the cap as "
        "any. One that fails is named in the server's log and left out. Default: [].",
    )

    quota_from_history = Bool(
        False,
        config=True,
        help="Give a kernel of a notebook that ran before the quota its earlier runs teach: their peak GPU memory "
        "(NVML, CUDA context included) plus history_margin, less context_reserve, within min_quota and max_quota. "
        "A quota asked for (API, sidebar) or set in the kernelspec wins. Peaks are recorded either way. Default: False.",
    )
    history_margin = Float(
        0.2,
        config=True,
        help="Added to a learned peak (quota_from_history): 0.2 = +20%, so a notebook that peaked at 5 GiB reserves "
        "6 GiB. 0 to 10. Default: 0.2.",
    )
    history_max_age_days = Float(
        90.0, config=True, help="Days a recorded peak is kept and learned from. Default: 90. 0 = record no peaks."
    )
    history_teachers = List(
        Unicode(),
        default_value=[],
        config=True,
        help="Users whose runs of a notebook teach every user's first run of it (instructor, TAs), e.g. ['prof']. "
        "With a broker, the broker's setting applies. Default: [].",
    )
    history_quorum = Int(
        3,
        config=True,
        help="Users who must have run a notebook (same path under their root, same kernelspec) before the median of "
        "their peaks teaches others' first run; one user alone never teaches another. With a broker, the broker's "
        "setting applies. Default: 3. 0 = only history_teachers teach others.",
    )

    @default("ledger_path")
    def _default_ledger_path(self) -> str:
        from jupyter_core.paths import jupyter_data_dir

        return os.path.join(jupyter_data_dir(), "gpushare", "ledger.sqlite")

    # -- each setting alone ---------------------------------------------------------------------------

    @validate(*SIZES)
    def _valid_size(self, proposal: Any) -> str:
        name, value = proposal["trait"].name, proposal["value"]
        percent_ok, zero_ok, empty_ok = SIZES[name]
        if empty_ok and value == "":
            return value
        size = checked(lambda: parse_size(value, f"GpuShareApp.{name}", allow_percent=percent_ok))
        if size.is_zero and not zero_ok:
            hint = (
                "; to give a kernelspec no GPU, set kernel_quotas = {'<name>': '0MiB'}"
                if name == "default_quota"
                else ""
            )
            raise TraitError(f"GpuShareApp.{name}: {value!r} is zero; use e.g. '4GiB'{hint}.")
        return value

    @validate("kernel_quotas")
    def _valid_kernel_quotas(self, proposal: Any) -> dict:
        for kernel, value in proposal["value"].items():
            checked(lambda: parse_size(value, f"GpuShareApp.kernel_quotas[{kernel!r}]"))  # noqa: B023
        return proposal["value"]

    @validate("simulated_cards")
    def _valid_simulated_cards(self, proposal: Any) -> str:
        from ..host.gpu import parse_simulated_cards

        if proposal["value"]:
            checked(lambda: parse_simulated_cards(proposal["value"]))
        return proposal["value"]

    @validate(
        "queue_timeout",
        "queue_overtake_limit",
        "queue_unwatched_timeout",
        "taken_out_for",
        "reconcile_interval",
        "over_quota_grace",
        "idle_timeout",
        "idle_shutdown_delay",
    )
    def _valid_seconds(self, proposal: Any) -> float:
        name, value = proposal["trait"].name, proposal["value"]
        if not value >= 0 or value == float("inf") or (name == "reconcile_interval" and value == 0):  # NaN too
            zero = ", or 0 for no limit" if name in ("queue_timeout", "queue_unwatched_timeout") else ""
            raise TraitError(f"GpuShareApp.{name}: {value!r} is not a time; use seconds, e.g. 600{zero}.")
        return value

    @validate("sample_interval")
    def _valid_sample_interval(self, proposal: Any) -> float:
        if proposal["value"] < MIN_INTERVAL_S:
            self.log.warning(
                "GpuShareApp.sample_interval %s is below %s s; using %s s.",
                proposal["value"],
                MIN_INTERVAL_S,
                MIN_INTERVAL_S,
            )
            return MIN_INTERVAL_S
        return proposal["value"]

    @validate("history_margin", "history_max_age_days", "history_quorum")
    def _valid_history(self, proposal: Any) -> float:
        name, value = proposal["trait"].name, proposal["value"]
        highest, example = HISTORY_RANGES[name]
        if not 0 <= value <= highest:  # also False for NaN
            raise TraitError(f"GpuShareApp.{name}: {value!r} is out of range; use 0 to {highest}, e.g. {example}.")
        return value

    @validate("queue_max_per_user")
    def _valid_count(self, proposal: Any) -> int:
        if not 0 <= proposal["value"] <= 100_000:
            raise TraitError(
                f"GpuShareApp.queue_max_per_user: {proposal['value']!r} is not a number of kernels; use 0 to 100000, "
                "e.g. 10, or 0 for no cap."
            )
        return proposal["value"]

    @validate("warm_kernels")
    def _valid_warm_kernels(self, proposal: Any) -> int:
        if not 0 <= proposal["value"] <= MAX_WARM_KERNELS:
            raise TraitError(
                f"GpuShareApp.warm_kernels: {proposal['value']!r} is not a number of warm kernels; use 0 to "
                f"{MAX_WARM_KERNELS}, e.g. 2 (each is a running kernel's memory), or 0 for none."
            )
        return proposal["value"]

    @validate("warm_imports")
    def _valid_warm_imports(self, proposal: Any) -> list[str]:
        for name in proposal["value"]:
            if (problem := warm_import_problem(name)) is not None:
                raise TraitError(f"GpuShareApp.warm_imports: {problem}")
        return list(proposal["value"])

    @validate("near_quota_threshold")
    def _valid_fraction(self, proposal: Any) -> float:
        if not 0 <= proposal["value"] <= 1:
            raise TraitError(
                f"GpuShareApp.near_quota_threshold: {proposal['value']!r} is a fraction of the reservation, e.g. 0.9."
            )
        return proposal["value"]

    # -- the rules they make ---------------------------------------------------------------------------

    def build_policy(self) -> Policy:
        """The quota rules, parsed; PolicyError names the settings whose combination is impossible whatever the
        cards (``check`` tries the rest against the cards)."""
        sizes = {name: parse_size(getattr(self, name), f"GpuShareApp.{name}") for name in SIZES if getattr(self, name)}
        kernel_quotas = {k: parse_size(v, f"GpuShareApp.kernel_quotas[{k!r}]") for k, v in self.kernel_quotas.items()}
        minimum = sizes["min_quota"]
        quotas = {"GpuShareApp.default_quota": sizes["default_quota"], "GpuShareApp.max_quota": sizes.get("max_quota")}
        quotas.update((f"GpuShareApp.kernel_quotas[{k!r}]", q) for k, q in kernel_quotas.items() if not q.is_zero)
        for name, quota in quotas.items():
            if _below(quota, minimum):
                raise PolicyError(
                    f"{name}: {quota} is less than GpuShareApp.min_quota ({minimum}); raise it, or lower min_quota."
                )
        if _below(sizes.get("max_quota"), sizes["default_quota"]):
            raise PolicyError(
                f"GpuShareApp.max_quota ({sizes['max_quota']}) is less than GpuShareApp.default_quota "
                f"({sizes['default_quota']}): every kernel would ask for more than it may have. Raise max_quota or lower "
                "default_quota."
            )
        return Policy(
            default_quota=sizes["default_quota"],
            max_quota=sizes.get("max_quota"),
            min_quota=minimum,
            context_reserve_mib=sizes["context_reserve"].mib or 0,
            headroom=sizes["card_headroom"],
            on_full=self.on_full,
            line_place=self.line_place,
            line_cpu=self.line_cpu,
            required_level=self.required_enforcement,
            queue_timeout_s=self.queue_timeout or float("inf"),
            overtake_limit_s=self.queue_overtake_limit,
            max_waiting=self.queue_max_per_user,
            kernel_quotas=kernel_quotas,
            cards=tuple(self.cards),
        )

    @validate("park_frameworks")
    def _valid_park_frameworks(self, proposal: Any) -> list[str]:
        unknown = sorted(set(proposal["value"]) - set(FRAMEWORKS))
        if unknown:
            raise TraitError(
                f"GpuShareApp.park_frameworks: {unknown} are not frameworks the bootstrap knows; use some of "
                f"{list(FRAMEWORKS)}."
            )
        return list(proposal["value"])

    def build_park(self) -> ParkRules:
        """The rules for parking idle kernels; PolicyError names a budget that is not a size."""
        budget = parse_size(self.park_host_budget, "GpuShareApp.park_host_budget")
        if budget.percent is not None:
            import psutil

            host_mib = psutil.virtual_memory().total >> 20
            mib: int | None = budget.resolve(host_mib)
        else:
            mib = budget.mib
        return ParkRules(after_s=self.park_after, frameworks=tuple(self.park_frameworks), host_budget_mib=mib)

    def build_history(self) -> HistoryRules:
        """The rules of quotas learned from history; PolicyError for a policy without the history it needs."""
        if self.quota_from_history and not self.history_max_age_days:
            raise PolicyError(
                "GpuShareApp.quota_from_history = True learns from recorded peaks, but history_max_age_days = 0 "
                "records none. Set history_max_age_days to e.g. 90, or quota_from_history = False."
            )
        return HistoryRules(
            max_age_s=self.history_max_age_days * DAY_S,
            teachers=frozenset(self.history_teachers),
            quorum=self.history_quorum,
            enabled=self.quota_from_history,
            margin=self.history_margin,
        )

    def build_enforce_policy(self) -> EnforcePolicy:
        """The over-quota and idle rules."""
        return EnforcePolicy(
            near_ratio=self.near_quota_threshold,
            over_grace_s=self.over_quota_grace,
            over_action=self.over_quota_action,
            idle_timeout_s=self.idle_timeout,
            idle_action=self.idle_action,
            idle_shutdown_delay_s=self.idle_shutdown_delay,
        )

    def check(self, policy: Policy, cards: Sequence[CardView]) -> None:
        """The settings as a whole against this host's cards (none: no GPU, nothing to check). PolicyError names
        the settings and the fix: a card list that names no card here, a default or per-kernelspec quota no
        allowed card can hold, a maximum below the default on the cards it applies to."""
        if not cards:
            return
        listed = ", ".join(f"{c.index} ({c.uuid}, {format_mib(c.total_mib)})" for c in cards)
        unknown = [x for x in policy.cards if not any(x in (c.uuid, str(c.index)) for c in cards)]
        if unknown:
            raise PolicyError(
                f"GpuShareApp.cards names {unknown}, which no card of this host is: it has {listed}. Name cards by "
                "index or UUID (nvidia-smi -L), or set cards = [] for every card."
            )
        allowed = [c for c in cards if policy.card_allowed(c.uuid, c.index)]
        quotas = {"GpuShareApp.default_quota": policy.default_quota}
        quotas.update(
            (f"GpuShareApp.kernel_quotas[{k!r}]", q) for k, q in policy.kernel_quotas.items() if not q.is_zero
        )
        for name, quota in quotas.items():
            try:
                policy.check_quota(quota, allowed)
            except PolicyError as e:
                raise PolicyError(f"{name}: {e} Every kernel of that kind would be refused: lower it.") from e


def _below(quota: Size | None, minimum: Size | None) -> bool:
    """Whether ``quota`` is less than ``minimum`` whatever the card (only sizes of one kind compare)."""
    if quota is None or minimum is None:
        return False
    if quota.mib is not None and minimum.mib is not None:
        return quota.mib < minimum.mib
    return quota.percent is not None and minimum.percent is not None and quota.percent < minimum.percent


def settings_from(config: Config) -> GpuShareApp:
    """The settings in ``config``; PolicyError with the setting's name and what is wrong with its value."""
    try:
        return GpuShareApp(config=config)
    except TraitError as e:
        raise PolicyError(str(e)) from e
