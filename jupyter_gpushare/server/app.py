"""The server extension: wiring, and start/stop of background work. Its settings are ``settings.GpuShareApp``."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING, Any

from jupyter_client.provisioning import KernelProvisionerFactory
from jupyter_client.session import Session
from jupyter_server.extension.application import ExtensionApp
from traitlets import TraitError

from ..broker.groups import BrokerGroups
from ..config.settings import GpuShareApp
from ..config.sources import publish
from ..core.addresses import PROVISIONER_NAME
from ..core.policy import EnforcePolicy, PolicyError
from ..ledger.ledger import LedgerError, Waiting
from .manager import QuotaManager, build_manager, use_in_process
from .records import Change, Changes, KernelRecord
from .sampler import Readings
from .seam.connection import connecting
from .seam.internals import has_session, pending_kernel_ids, stop_cleanly_on_sigint
from .seam.refusals import quiet_refusals
from .services import Services
from .state import SCHEMA_FILE, STATE_SCHEMA
from .warm import WarmPool

if TYPE_CHECKING:
    from jupyter_server.serverapp import ServerApp

ANNOUNCE_EVERY_S = 0.1  # how soon a change is announced on the event bus
TRIM_TIMEOUT_S = 3.0  # how long an idle kernel has to give its frameworks' cached GPU memory back before a park
TRIMMED = ("torch", "cupy", "simulated")  # what a kernel's trim may say it did (bootstrap/_gpushare_alloc.trim)


class Announcer:
    """Says on the server's event bus (STATE_SCHEMA) that the state changed in a way a person would notice, and
    for which kernels, within ANNOUNCE_EVERY_S of the change, so that browsers read GET /api/gpushare/state then
    instead of polling fast. The parts that change the state say so as they do it (``changed``: the kernels'
    registry and the enforcer); nothing compares snapshots. Changes within one interval go out together."""

    def __init__(self, events: Any) -> None:
        self.events = events
        if events is not None:
            events.register_event_schema(SCHEMA_FILE)
        self._pending: set[Change] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self.count = 0

    def changed(self, change: Change) -> None:
        """A change a person would notice (of one kernel's, or of no one kernel's). Any thread."""
        if self.events is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # from another thread: onto the loop first
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self.changed, change)
            return
        self._loop = loop
        self._pending.add(change)
        if self._handle is None:
            self._handle = loop.call_later(ANNOUNCE_EVERY_S, self._announce)

    def _announce(self) -> None:
        self._handle = None
        changes = sorted(self._pending, key=lambda c: (c.kernel_id or "", c.what))
        self._pending = set()
        self.count += 1
        self.events.emit(
            schema_id=STATE_SCHEMA,
            data={
                "version": str(self.count),
                "kernel_ids": sorted({c.kernel_id for c in changes if c.kernel_id}),
                "changes": [{"kernel_id": c.kernel_id, "what": c.what} for c in changes],
            },
        )

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class ServerStarts:
    """How a Jupyter server starts kernels (services.KernelStarts): a kernel in line is listed at once and launched
    when granted (held.py). It is granted only while a notebook (a session) or a client wants it, and a kernel whose
    wait ends without a grant is shut down with its session."""

    holds = True

    def __init__(self, kernels: Any, sessions: Any, log: Any) -> None:
        """``kernels``, ``sessions``: the server's kernel and session managers."""
        self.kernels, self.sessions, self.log = kernels, sessions, log

    def watchers(self, kernel_id: str) -> int:
        """Its clients: websockets open, and those whose handshake waits for the kernel (seam/connection.py)."""
        if kernel_id not in self.kernels:
            return 0
        try:
            return self.kernels.kernel_model(kernel_id).get("connections", 0) + connecting(kernel_id)
        except TraitError:  # a kernel jupyter_server is still starting has no model yet (no last_activity)
            return connecting(kernel_id)

    def may_grant(self, kernel_id: str) -> bool:
        return kernel_id in self.kernels and (self.watchers(kernel_id) > 0 or has_session(self.sessions, kernel_id))

    def end_kernel(self, kernel_id: str) -> None:
        asyncio.ensure_future(self._end(kernel_id))

    async def _end(self, kernel_id: str) -> None:
        try:
            found = [
                s["id"] for s in await self.sessions.list_sessions() if (s.get("kernel") or {}).get("id") == kernel_id
            ]
            for session_id in found:
                await self.sessions.delete_session(session_id)
            if kernel_id in self.kernels:
                await self.kernels.shutdown_kernel(kernel_id, now=True)
        except Exception:
            self.log.exception("jupyter-gpushare: kernel %s, whose wait ended, could not be shut down", kernel_id)

    def on_wait(self, rec: KernelRecord, got: Waiting) -> None:
        """The server's kernel model and the kernel's waiting cell say where a kernel in line stands (its provisioner
        describes it), and a parked kernel on its way back hears its place too (its cells say it)."""
        if rec.parked is not None:
            self.tell(rec.kernel_id, {"parked": {"position": got.position}})
        elif (describe := getattr(self._provisioner(rec.kernel_id), "describe_wait", None)) is not None:
            describe()

    def tell(self, kernel_id: str, message: dict[str, Any]) -> bool:
        if not self.hears(kernel_id):
            return False
        self._provisioner(kernel_id).held.say(message)
        return True

    def hears(self, kernel_id: str) -> bool:
        held = getattr(self._provisioner(kernel_id), "held", None)
        return held is not None and held.open and held.answers

    async def restart(self, kernel_id: str) -> bool:
        try:
            await self.kernels.restart_kernel(kernel_id, now=True)
            return True
        except Exception as e:  # noqa: BLE001 (gone meanwhile, a restart under way: said in the event)
            self.log.warning("jupyter-gpushare: kernel %s could not be restarted: %s", kernel_id, e)
            return False

    def _provisioner(self, kernel_id: str) -> Any:
        return getattr(self.kernels.get_kernel(kernel_id), "provisioner", None) if kernel_id in self.kernels else None

    def can_stand_by(self, kernel_id: str) -> bool:
        held = getattr(self._provisioner(kernel_id), "held", None)
        return held is not None and held.open and held.answers and not held.using

    async def stand_by(self, kernel_id: str) -> str:
        stand_by = getattr(self._provisioner(kernel_id), "stand_by", None)
        return "cannot" if stand_by is None else await stand_by()

    async def trim(self, kernel_id: str) -> list[str] | None:
        """Ask the kernel to evaluate its bootstrap's ``trim()`` (``ask``); what it says is read only as names of
        frameworks it knows. None when it did not answer within TRIM_TIMEOUT_S (a cell runs after all, or no
        bootstrap), or cannot be asked."""
        said = await self.ask(kernel_id, "__import__('_gpushare_alloc').trim()", TRIM_TIMEOUT_S)
        return None if said is None else [name for name in TRIMMED if repr(name) in said]

    async def ask(self, kernel_id: str, expression: str, timeout: float) -> str | None:
        """Evaluate ``expression`` in the kernel, on a shell channel of the server's own: a silent request (no output,
        no execution count; a notebook sees the kernel busy for a moment). Its value's text, as the kernel says it
        (untrusted: the caller reads it only for what it expects), "" when it raised; None when the kernel did not
        answer within ``timeout`` s (a cell runs) or cannot be asked."""
        if kernel_id not in self.kernels:
            return None
        kernel = self.kernels.get_kernel(kernel_id)
        # A session of its own: a client's shell socket is known to the kernel by its session's id, and one that
        # shared the kernel manager's would take the replies meant for its other clients (seen: a cell's reply lost).
        own = Session(key=kernel.session.key, signature_scheme=kernel.session.signature_scheme)
        client = kernel.client(session=own)
        heard = getattr(kernel, "last_activity", None)
        try:
            client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
            msg_id = client.execute("", silent=True, store_history=False, user_expressions={"said": expression})
            deadline = asyncio.get_running_loop().time() + timeout
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                reply = await client.get_shell_msg(timeout=left)
                if reply.get("parent_header", {}).get("msg_id") == msg_id:
                    got = reply["content"].get("user_expressions", {}).get("said", {})
                    await _idle_again(kernel, heard)
                    return str(got.get("data", {}).get("text/plain", "")) if got.get("status") == "ok" else ""
        except Exception as e:  # noqa: BLE001 (no answer in time, a kernel gone)
            self.log.info("jupyter-gpushare: kernel %s did not answer %s: %r", kernel_id, expression, e)
        finally:
            client.stop_channels()
        return None


async def _idle_again(kernel: Any, heard: Any, within_s: float = 2.0) -> None:
    """Until the server has heard the kernel go busy and idle again for a request of ours: its status comes on
    iopub, which may trail the shell's reply, and a busy heard after a park would read as a demand (enforce.py
    resumes a parked kernel seen busy). At most ``within_s``: a cell that starts meanwhile keeps it busy."""
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        if getattr(kernel, "execution_state", None) != "busy" and getattr(kernel, "last_activity", None) != heard:
            return
        await asyncio.sleep(0.05)


class GpuShareExtension(ExtensionApp):
    """GPU memory quotas for notebook kernels on a shared GPU server: the jupyter-server extension.

    Admins configure it as ``c.GpuShareApp.*`` (settings.py), which this reads from the server's config,
    command line included. A bad setting, or settings that cannot work together on this host's cards,
    stop the server at start with the setting's name and a fix: a server that ran on without its
    extension would run every kernel without a quota.
    """

    name = "jupyter_gpushare"
    load_other_extensions = True
    classes = [GpuShareApp]

    @property
    def server(self) -> ServerApp:
        """The jupyter-server this extension was loaded into (set before any of the methods below run)."""
        assert self.serverapp is not None
        return self.serverapp

    def _fail(self, why: str) -> None:
        self.log.critical("jupyter-gpushare cannot start: %s", why)
        raise SystemExit(f"jupyter-gpushare: cannot start: {why}")

    def initialize_settings(self) -> None:
        """Everything the extension runs on. Any failure here stops the server with the reason: jupyter-server
        would log a warning and run on without the extension, every kernel with every GPU and no quota."""
        try:
            self._initialize()
        except (PolicyError, TraitError) as e:
            self._fail(str(e))
        except Exception as e:  # noqa: BLE001 (fail closed, whatever it was)
            self.log.exception("jupyter-gpushare: the extension could not be set up")
            self._fail(
                f"the extension could not be set up ({type(e).__name__}: {e}). Without it every kernel would start "
                "with every GPU and no quota, so the server stops. Check the GpuShareApp options (each given once) "
                "and `jupyter gpushare doctor`."
            )

    def _initialize(self) -> None:
        self.gpushare = settings = GpuShareApp(parent=self)
        self.announcer = Announcer(getattr(self.serverapp, "event_logger", None))
        enforcing = settings.build_enforce_policy()
        # What the manager works with, made first: its sampler's readings are filled in once the sampler is made (it
        # needs the manager), and the registry's changes are heard by the announcer, then by the snapshot.
        services = Services(
            starts=ServerStarts(self.server.kernel_manager, self.server.session_manager, self.log),
            readings=Readings(),
            changes=Changes(),
            watchdog=enforcing.over_action,
        )
        services.changes.listen(self.announcer.changed)
        manager = build_manager(settings, self.log, services)
        use_in_process(manager)
        self.settings["gpushare_manager"] = manager
        self._published = publish(settings)  # for this user's `jupyter gpushare status` and `doctor`
        self._make_sampler(manager, services, enforcing)
        self._wait_websockets()
        self._make_default_provisioner()
        self._make_warm_pool(manager)
        self._quiet = quiet_refusals(self.server.log)  # a refused start is logged once, by the manager
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
                settings.broker_socket or settings.ledger_path,
            )

    def _make_sampler(self, manager: QuotaManager, services: Services, enforcing: EnforcePolicy) -> None:
        """The sampler thread (started with the server), the policies it feeds, and the server's one snapshot,
        built at each of its ticks and at each change of the registry (snapshot.py), which the handlers read."""
        from . import metrics
        from .enforce import Enforcer
        from .sampler import Sampler
        from .snapshot import Snapshots

        settings = self.gpushare
        enforcer = Enforcer(manager, self.server.kernel_manager, enforcing, self.log, manager.clock, services.changes)
        snapshots = Snapshots(
            manager, judged=lambda: enforcer.states, log=self.log, on_reports=manager.learning.saw_reports
        )
        services.changes.listen(snapshots.changed)
        loop = self._server_loop()

        def on_sample(usage: Any) -> None:
            # read often while a kernel is over its reservation
            sampler.hurry(enforcer.on_sample(usage, snapshots.current))
            snapshots.tick(usage)

        sampler = Sampler(
            manager, settings.sample_interval, loop=loop, on_sample=on_sample, log=self.log, readings=services.readings
        )
        self.settings["gpushare_sampler"] = sampler
        self.settings["gpushare_enforcer"] = enforcer
        self.settings["gpushare_snapshots"] = snapshots
        metrics.install(snapshots)
        # Started here, not in the start hook: embedders and test fixtures do not always run that hook.
        sampler.start()

    def _wait_websockets(self) -> None:
        """A kernel that waits for a GPU is listed at once, its process launched when it is granted (ServerStarts);
        its websockets open at once (seam/connection.py)."""
        from .seam.connection import waiting_connection_class

        configured = self.settings.get("kernel_websocket_connection_class")  # (a copy of the server's settings)
        ours = waiting_connection_class(configured) if configured is not None else None
        if ours is None:
            self.log.warning(
                "jupyter-gpushare: kernel websockets use %s, so a websocket to a kernel that waits for a GPU waits "
                "up to kernel_info_timeout before it opens.",
                configured,
            )
        else:
            self.settings["kernel_websocket_connection_class"] = ours  # copied back into the server's

    def _make_default_provisioner(self) -> None:
        """Give every kernel without a provisioner stanza ours, unless the admin chose another.

        (jupyter_server reads only ``jpserver_extensions`` from jupyter_server_config.d files, so the
        wheel cannot ship this setting as config.)
        """
        kpf = KernelProvisionerFactory.instance(parent=self.server.kernel_manager)
        chosen = "default_provisioner_name" in self.server.config.get("KernelProvisionerFactory", {})
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

    def _make_warm_pool(self, manager: QuotaManager) -> None:
        """The server's warm kernels (warm.py), filled once the server's loop runs."""
        settings = self.gpushare
        if not settings.warm_kernels:
            return
        if isinstance(manager.holding.cgroups, BrokerGroups):
            self.log.warning(
                "jupyter-gpushare: GpuShareApp.warm_kernels is ignored: the host's broker makes the kernels' cgroups, "
                "and a warm kernel's group cannot become a notebook's there (not built). Kernels start fresh."
            )
            return
        manager.warm = WarmPool(
            self.server.kernel_manager,
            settings.warm_kernels,
            settings.warm_kernelspecs,
            settings.warm_imports,
            self.server.root_dir,
            self.log,
        )

    def initialize_handlers(self) -> None:
        from .handlers import handlers

        self.handlers.extend(handlers)

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
            warm = self.settings["gpushare_manager"].warm
            if warm is not None:
                loop.call_soon(warm.start)

    async def _start_jupyter_server_extension(self, serverapp) -> None:
        self._start_reconciling()
        self.settings["gpushare_sampler"].loop = asyncio.get_running_loop()
        stop_cleanly_on_sigint(serverapp, self.log)

    async def _reconcile_forever(self) -> None:
        manager = self.settings["gpushare_manager"]
        manager.line.keep_watching()  # (with a broker) what it says reaches this server at once: a ruling too
        failing = None
        while True:
            await asyncio.sleep(self.gpushare.reconcile_interval)
            kernels = self.server.kernel_manager
            try:
                await manager.reconcile(known={*kernels.list_kernel_ids(), *pending_kernel_ids(kernels)})
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
            if manager.warm is not None:
                await manager.warm.stop()
        task = getattr(self, "_reconcile_task", None)
        if task:
            task.cancel()
        if getattr(self, "announcer", None) is not None:
            self.announcer.stop()
        if getattr(self, "_quiet", None) is not None:
            self.server.log.removeFilter(self._quiet)
        if getattr(self, "_published", None):
            with contextlib.suppress(OSError):
                os.unlink(self._published)
        sampler = self.settings.get("gpushare_sampler")
        if sampler is not None:
            from . import metrics

            snapshots = self.settings["gpushare_snapshots"]
            metrics.uninstall(snapshots)
            sampler.stop()
            snapshots.stop()
            await self.settings["gpushare_enforcer"].close()
        if manager is not None:
            manager.close_if_done()  # no kernel to release (else the last one's clean-up closes it)
