"""The server extension: configuration traits, wiring, and start/stop of background work."""

from __future__ import annotations

import asyncio
import logging
import os

from jupyter_client.provisioning import KernelProvisionerFactory
from jupyter_core.paths import jupyter_data_dir
from jupyter_server.extension.application import ExtensionApp
from traitlets import Dict, Enum, Float, List, TraitError, Unicode, default
from traitlets.config import Config

from .broker import is_tcp, parse_tcp
from .enforce import IDLE_ACTIONS, OVER_QUOTA_ACTIONS, EnforcePolicy
from .gpu import open_backend
from .ledger import LedgerError
from .manager import QuotaManager
from .policy import DEFAULT_MIN_QUOTA_MIB, ON_FULL_CHOICES, Policy, PolicyError, Size, parse_size
from .sampler import MIN_INTERVAL_S

PROVISIONER_NAME = "gpushare-provisioner"


class GpuShareApp(ExtensionApp):
    """GPU memory quotas for notebook kernels on a shared GPU server."""

    name = "jupyter_gpushare"
    load_other_extensions = True

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
        help="What happens to a kernel when no card has room: 'queue' = wait in FIFO order up to "
        "queue_timeout seconds, then refuse; 'cpu' = start it without a GPU and say so; 'reject' = refuse "
        "at once with how much was free and needed. Default: 'queue'.",
    )
    queue_timeout = Float(
        600.0,
        config=True,
        help="Seconds a queued kernel waits for room before its start is refused (on_full='queue'). "
        "Default: 600. 0 = wait without limit.",
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
        default_value="notify",
        config=True,
        help="What happens to a kernel over its reservation for over_quota_grace seconds: 'notify' = an event (and a "
        "notification in JupyterLab) only; 'interrupt' = interrupt the running cell (frameworks usually keep their "
        "memory cached); 'restart' = restart the kernel, keeping its reservation; 'shutdown' = shut it down and "
        "release it. Default: 'notify', because a student loses the kernel's state on a restart and most overshoots "
        "are CUDA libraries (cuDNN, cuBLAS) outside the framework cap; choose 'restart' where a neighbour's OOM "
        "costs more than that.",
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

    broker_socket = Unicode(
        "",
        config=True,
        help="Unix socket of this host's GPU broker (`jupyter gpushare broker`, docs/multi-user.md), e.g. "
        "'/run/jupyter-gpushare/broker.sock', or 'tcp://host:port' ('tls://host:port' when the broker has "
        "GpuShareBroker.tcp_certfile) for a server in a container, which then identifies itself with its "
        "$JUPYTERHUB_API_TOKEN. When set, reservations go through the broker, which "
        "owns the host's ledger and applies per-user limits, and ledger_path is not used. Default: '' = no "
        "broker: this server uses ledger_path itself.",
    )
    broker_ca_file = Unicode(
        "",
        config=True,
        help="PEM file of the CA that signed the broker's TLS certificate (GpuShareBroker.tcp_certfile), for "
        "broker_socket = 'tls://host:port'. Default: '' = the system's trusted CAs.",
    )

    @default("ledger_path")
    def _default_ledger_path(self) -> str:
        return os.path.join(jupyter_data_dir(), "gpushare", "ledger.sqlite")

    def build_policy(self) -> Policy:
        """The parsed rules; PolicyError names the trait and the bad value."""
        if self.queue_timeout < 0:
            raise PolicyError(
                f"GpuShareApp.queue_timeout: {self.queue_timeout!r} is negative; use seconds, e.g. 600, or 0 for no limit."
            )
        if is_tcp(self.broker_socket):
            try:
                parse_tcp(self.broker_socket, "GpuShareApp.broker_socket")
            except ValueError as e:
                raise PolicyError(str(e)) from e
        if self.broker_ca_file and not os.access(self.broker_ca_file, os.R_OK):
            raise PolicyError(
                f"GpuShareApp.broker_ca_file = {self.broker_ca_file!r} is not a file this server can read; name the "
                "PEM file of the CA that signed the broker's certificate, or '' for the system's CAs."
            )
        default_quota = parse_size(self.default_quota, "GpuShareApp.default_quota")
        if default_quota.is_zero:
            raise PolicyError("GpuShareApp.default_quota: '0' gives Python kernels no GPU; use e.g. '4GiB'.")
        min_quota = parse_size(self.min_quota, "GpuShareApp.min_quota")
        if min_quota.is_zero:
            raise PolicyError(
                "GpuShareApp.min_quota: '0' would let a kernel ask for a quota of nothing; use e.g. "
                f"'{DEFAULT_MIN_QUOTA_MIB}MiB'."
            )
        max_quota = parse_size(self.max_quota, "GpuShareApp.max_quota") if self.max_quota else None
        kernel_quotas = {k: parse_size(v, f"GpuShareApp.kernel_quotas[{k!r}]") for k, v in self.kernel_quotas.items()}
        quotas = {"GpuShareApp.default_quota": default_quota, "GpuShareApp.max_quota": max_quota}
        quotas.update((f"GpuShareApp.kernel_quotas[{k!r}]", q) for k, q in kernel_quotas.items() if not q.is_zero)
        for name, quota in quotas.items():
            if _below(quota, min_quota):
                raise PolicyError(
                    f"{name}: {quota} is less than GpuShareApp.min_quota ({min_quota}); raise it, or lower min_quota."
                )
        return Policy(
            default_quota=default_quota,
            max_quota=max_quota,
            min_quota=min_quota,
            context_reserve_mib=parse_size(self.context_reserve, "GpuShareApp.context_reserve", allow_percent=False).mib
            or 0,
            headroom=parse_size(self.card_headroom, "GpuShareApp.card_headroom"),
            on_full=self.on_full,
            queue_timeout_s=self.queue_timeout or float("inf"),
            kernel_quotas=kernel_quotas,
            cards=tuple(self.cards),
        )

    def build_manager(self) -> QuotaManager:
        policy = self.build_policy()
        backend = open_backend(self.gpu_backend, self.simulated_cards)
        return QuotaManager(
            policy,
            backend,
            self.ledger_path,
            log=self.log,
            broker_socket=self.broker_socket or None,
            broker_ca_file=self.broker_ca_file,
        )

    def _link_jupyter_server_extension(self, serverapp) -> None:
        # jupyter_server only logs a warning when an extension's config cannot be loaded, and would
        # then run kernels without quotas. A bad quota config must stop the server instead.
        try:
            super()._link_jupyter_server_extension(serverapp)
        except (TraitError, ValueError) as e:
            self._fail(str(e))

    def _fail(self, why: str) -> None:
        self.log.critical("jupyter-gpushare cannot start: %s", why)
        raise SystemExit(f"jupyter-gpushare: bad configuration: {why}")

    def initialize_settings(self) -> None:
        try:
            manager = self.build_manager()
        except PolicyError as e:
            self._fail(str(e))
        QuotaManager.install(manager)
        self.settings["gpushare_manager"] = manager
        self._make_sampler(manager)
        self._make_default_provisioner()
        self._start_reconciling()
        info = manager.backend.describe()
        if manager.backend.simulated:
            self.log.warning(
                "jupyter-gpushare: SIMULATED cards %s (no real GPU memory).", [c.total_mib for c in manager.cards]
            )
        elif not manager.cards:
            self.log.warning("jupyter-gpushare: no GPU (%s). Kernels start without one.", info["reason"])
        else:
            self.log.info(
                "jupyter-gpushare: cards %s; ledger %s",
                [f"{c.index}:{c.name}" for c in manager.cards],
                self.ledger_path,
            )

    def _make_sampler(self, manager: QuotaManager) -> None:
        """The sampler thread (started with the server) and the policies it feeds."""
        from . import metrics
        from .enforce import Enforcer
        from .sampler import Sampler

        try:
            policy = self.build_enforce_policy()
        except PolicyError as e:
            self._fail(str(e))
        if self.sample_interval < MIN_INTERVAL_S:
            self.log.warning(
                "GpuShareApp.sample_interval %s is below %s s; using %s s.",
                self.sample_interval,
                MIN_INTERVAL_S,
                MIN_INTERVAL_S,
            )
        enforcer = Enforcer(manager, self.serverapp.kernel_manager, policy, log=self.log)
        loop = self._server_loop()
        sampler = Sampler(manager, self.sample_interval, loop=loop, on_sample=enforcer.on_sample, log=self.log)
        manager.latest_samples = sampler.latest_samples  # what processes without a reservation use is taken too
        self.settings["gpushare_sampler"] = sampler
        self.settings["gpushare_enforcer"] = enforcer
        metrics.install(sampler, enforcer)
        # Started here, not in the start hook: embedders and test fixtures do not always run that hook.
        sampler.start()

    def _make_default_provisioner(self) -> None:
        """Give every kernel without a provisioner stanza ours, unless the admin chose another.

        (jupyter_server reads only ``jpserver_extensions`` from jupyter_server_config.d files, so the
        wheel cannot ship this setting as config.)
        """
        kpf = KernelProvisionerFactory.instance(parent=self.serverapp.kernel_manager)
        chosen = "default_provisioner_name" in self.serverapp.config.get("KernelProvisionerFactory", {})
        if chosen or os.environ.get(KernelProvisionerFactory.default_provisioner_name_env):
            if kpf.default_provisioner_name != PROVISIONER_NAME:
                self.log.warning(
                    "jupyter-gpushare: the default kernel provisioner is %r, so kernels get no GPU quota unless "
                    "their kernelspec names %r.",
                    kpf.default_provisioner_name,
                    PROVISIONER_NAME,
                )
            return
        kpf.default_provisioner_name = PROVISIONER_NAME

    def initialize_handlers(self) -> None:
        from .handlers import handlers

        self.handlers.extend(handlers)

    def build_enforce_policy(self) -> EnforcePolicy:
        """The over-quota and idle rules; PolicyError names the trait and the bad value."""
        for name in ("near_quota_threshold", "over_quota_grace", "idle_timeout", "idle_shutdown_delay"):
            if getattr(self, name) < 0:
                raise PolicyError(f"GpuShareApp.{name}: {getattr(self, name)!r} is negative.")
        if self.near_quota_threshold > 1:
            raise PolicyError(
                f"GpuShareApp.near_quota_threshold: {self.near_quota_threshold!r} is a fraction of the reservation, e.g. 0.9."
            )
        return EnforcePolicy(
            near_ratio=self.near_quota_threshold,
            over_grace_s=self.over_quota_grace,
            over_action=self.over_quota_action,
            idle_timeout_s=self.idle_timeout,
            idle_action=self.idle_action,
            idle_shutdown_delay_s=self.idle_shutdown_delay,
        )

    def _server_loop(self) -> asyncio.AbstractEventLoop | None:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:  # `jupyter lab`: the server's loop exists but does not run yet
            return getattr(getattr(self.serverapp, "io_loop", None), "asyncio_loop", None)

    def _start_reconciling(self) -> None:
        """The periodic reconcile task, once there is a loop to run it (test fixtures do not always run the start
        hook, so it is tried at set-up too)."""
        loop = self._server_loop()
        if getattr(self, "_reconcile_task", None) is None and loop is not None:
            self._reconcile_task = loop.create_task(self._reconcile_forever())

    async def _start_jupyter_server_extension(self, serverapp) -> None:
        self._start_reconciling()
        self.settings["gpushare_sampler"].loop = asyncio.get_running_loop()

    async def _reconcile_forever(self) -> None:
        manager = self.settings["gpushare_manager"]
        failing = None
        while True:
            await asyncio.sleep(self.reconcile_interval)
            kernels = self.serverapp.kernel_manager
            try:
                await manager.reconcile(known={*kernels.list_kernel_ids(), *getattr(kernels, "_pending_kernels", {})})
                failing = None
            except LedgerError as e:  # a full disk, a broker that is down: said once, tried again every interval
                if str(e) != failing:
                    self.log.warning("jupyter-gpushare: reconcile failed: %s", e)
                failing = str(e)
            except Exception:
                self.log.exception("jupyter-gpushare: reconcile failed")

    async def stop_extension(self) -> None:
        # Kernels are shut down after extensions (ServerApp._cleanup): keep the manager and its
        # ledger open so their releases still land. Queued starts end first (a pending start would
        # hold up the kernels' shutdown); the periodic task stops.
        manager = self.settings.get("gpushare_manager")
        if manager is not None:
            await manager.stop_admitting()
        task = getattr(self, "_reconcile_task", None)
        if task:
            task.cancel()
        sampler = self.settings.get("gpushare_sampler")
        if sampler is not None:
            from . import metrics

            metrics.uninstall(sampler)
            sampler.stop()
            await self.settings["gpushare_enforcer"].close()


def _below(quota: Size | None, minimum: Size) -> bool:
    """Whether ``quota`` is less than ``minimum`` whatever the card (only sizes of one kind compare)."""
    if quota is None:
        return False
    if quota.mib is not None and minimum.mib is not None:
        return quota.mib < minimum.mib
    return quota.percent is not None and minimum.percent is not None and quota.percent < minimum.percent


def build_manager(config: Config, log: logging.Logger | None = None) -> QuotaManager:
    """A QuotaManager from traitlets config, for kernels started outside a Jupyter server."""
    app = GpuShareApp(config=config)
    if log is not None:
        app.log = log
    return app.build_manager()
