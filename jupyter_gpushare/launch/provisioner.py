"""Kernel launch hook: reserve -> environment -> launch -> keep across restarts -> release.

It is the default provisioner of every jupyter_client program of the environment it is installed in: the wheel's
``jupyter_gpushare_provisioner.pth`` sets JUPYTER_DEFAULT_PROVISIONER_NAME unless it is set (nbclient, papermill,
``jupyter execute``, nbconvert, ``jupyter console``), and the server extension makes it the server's default
(app.py), so every kernel gets a quota with no kernelspec edited. Outside a server it reads the server's config
files and the running program's own options (``_manager``), says on stderr where a kernel stands while it waits,
gives its place up on Ctrl-C, and gives back what a program that exits did not (``end_at_exit``).

The reservation is decided only in ``cleanup(restart)``, which is the one call that gets
the right restart flag (jupyter_client#1061). The kernel's ports are held from the moment they are
picked (Linux), and a kernel that dies before it was stable is restarted on new ones, keeping its
reservation (docs/jupyter-client-port-reuse.md).
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import shutil
from importlib.metadata import entry_points
from typing import Any

from jupyter_client.provisioning import KernelProvisionerFactory, LocalProvisioner
from traitlets import Bool, Unicode

from ..core.addresses import PROVISIONER_NAME
from ..core.policy import PolicyError, Size, format_mib, parse_size
from ..host import priority
from ..host.reports import remove_reports, report_dir
from ..server.manager import process_manager, use_in_process
from ..server.records import Grant, QuotaUnavailable
from ..server.seam.internals import forget_pending
from .batch import (
    StoppedWaiting,
    end_at_exit,
    end_by,
    not_started,
    program_config,
    program_manager,
    said,
    until_ctrl_c,
)
from .held import HeldStart, standin_command
from .kernel_env import drop_inherited, kernel_env
from .port import KernelPort
from .ports import HeldPorts, close
from .warm_start import WarmStarts

WAITING = "Waiting for a GPU"  # how the server's kernel model's reason begins while a kernel is in line
JOIN_IDLE_S = 2.0  # how long a join waits for jupyter_server to hear a kernel idle (its last cell's status, late)
HAND_OVER_S = 5.0  # how long a join waits for the kernel to be told that its wait ended (its record says so first)
JOIN_ASK_S = 8.0  # how long an idle kernel has to agree to join the line again in place (3 s: late on a loaded host)
STAND_BY_ASK_S = 3.0  # how long a kernel has to answer when asked to stand by (its pipe's thread answers)


class GpuShareProvisioner(WarmStarts, HeldPorts, LocalProvisioner):
    """A LocalProvisioner that holds a GPU reservation for its kernel."""

    quota = Unicode(
        "",
        config=True,
        help="GPU memory quota for kernels of this kernelspec ('8GiB', '25%'); set it in the kernelspec's "
        "metadata.kernel_provisioner.config. Empty (default): the server's GpuShareApp.default_quota.",
    )

    hold_ports = Bool(
        True,
        config=True,
        help="Linux, tcp transport: keep each of the kernel's ports bound by the server (SO_REUSEADDR, never "
        "listening) from the moment it is picked until the kernel shuts down, so that no other socket's bind(0) or "
        "connect() is given it before the kernel binds it; the kernel's listener (SO_REUSEADDR, as libzmq's) still "
        "binds it. Default True. False: ports are only free when picked, as in jupyter_client. No effect elsewhere.",
    )

    _grant: Grant | None = None
    _watching_death = False
    _held: HeldStart | None = None
    _attach_at_launch = True  # False for a kernel in line: attached at its grant
    _admitting: asyncio.Future | None = None
    _launched: tuple[list[str], dict[str, str]] = ([], {})  # the command and environment it was launched with

    def _manager(self) -> KernelPort:
        manager = process_manager()
        if manager is None:  # outside a Jupyter server (nbclient, papermill, `jupyter execute`)
            manager = program_manager(self.config, self.log, self._who)
            use_in_process(manager)
        return manager

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        chosen = chosen_default(self.kernel_spec, self.config)
        if chosen is not None:
            return await self._hand_over(chosen, **kwargs)
        if self._warm:
            return await self.warm_pre_launch(kwargs)
        manager = self._manager()
        language = (self.kernel_spec.language or "").lower()
        rec = manager.record(self.kernel_id, self._kernel_name, language)
        manager.update(rec, path=self._notebook_path((kwargs.get("env") or {}).get("JPY_SESSION_NAME")) or rec.path)
        keep = self._grant is not None and self._grant.mode == "gpu" and rec.lease is not None
        if keep and rec.pending_quota is not None:  # a restart for a new quota keeps the reservation, resized
            await manager.apply_quota(self.kernel_id)
            self._grant.lease = rec.lease  # type: ignore[union-attr]  # (kept above)
        if not keep:
            if self._grant is not None and self._grant.mode == "gpu":
                await manager.release(self.kernel_id, "quota changed", forget=False)
            try:
                requested = parse_size(self.quota, f"{self._kernel_name} kernelspec quota") if self.quota else None
                self._grant = await self._admit(manager, language, requested, first_use=True)
            except PolicyError as e:
                self._forget_failed_start()
                raise QuotaUnavailable(str(e), status=400) from e
            except BaseException:
                self._forget_failed_start()
                raise
        try:
            # Ports are picked only now, once admitted or in line (a kernel in line holds them: its clients may
            # connect to them at once, and it binds them once granted).
            kwargs = await self._pick_ports(**kwargs)  # after this, kwargs["env"] always exists
            drop_inherited(kwargs["env"])
            assert self._grant is not None  # (admitted above, or kept from before the restart)
            # It runs at once, its GPU hidden until the grant (held.py); or, granted now, it keeps a pipe through
            # which it may be asked to stand by later
            if self._grant.mode in ("queued", "standby") or (self._grant.mode == "gpu" and self._may_stand_by):
                self._held = HeldStart()
            kwargs["env"].update(await self._kernel_env(kwargs["env"]))
        except BaseException:
            await self._release("failed to start")
            raise
        return kwargs

    async def _hand_over(self, name: str, **kwargs: Any) -> dict[str, Any]:
        """Let the provisioner ``name`` (the program's chosen default) start the kernel instead: the KernelManager
        uses whichever provisioner it holds for the launch and everything after."""
        found = entry_points(group=KernelProvisionerFactory.GROUP_NAME, name=name)
        if not found:
            installed = sorted(ep.name for ep in entry_points(group=KernelProvisionerFactory.GROUP_NAME))
            raise ValueError(
                f"KernelProvisionerFactory.default_provisioner_name = {name!r} names no installed kernel provisioner "
                f"(installed: {', '.join(installed)}). Install it, or remove the setting."
            )
        km = self.parent
        assert km is not None  # (the KernelManager that created this provisioner)
        other = next(iter(found)).load()(kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=km)
        km.provisioner = other
        return await other.pre_launch(**kwargs)

    async def _admit(
        self, manager: KernelPort, language: str, requested: Size | None, first_use: bool = False
    ) -> Grant:
        """The kernel's grant. In a server a kernel in line is admitted later (``_admit_held``), and with
        ``first_use`` a Python kernel may be told to ask at its first GPU use (line_place, ``_asked``); outside a
        server the start waits here for its GPU, and Ctrl-C takes it out of line, says so in one line, and ends the
        program (a KeyboardInterrupt without a traceback, batch.said)."""
        first_use = first_use and manager.policy.line_place == "first-use" and language == "python"
        hold = manager.holds_starts
        admitting = manager.admit(self.kernel_id, self._kernel_name, language, requested, hold, first_use)
        if manager.holds_starts:
            return await admitting
        try:
            return await until_ctrl_c(admitting)
        except (QuotaUnavailable, PolicyError) as e:  # one line, and an exit status of its own (batch.not_started)
            code = e.code if isinstance(e, QuotaUnavailable) else f"refused-{e.code}"
            raise not_started(f"{self._who} was not started: {e}", code) from None
        except StoppedWaiting:
            await manager.release(self.kernel_id, "Ctrl-C", said=True)
            raise said(
                f"{self._who} stopped waiting for a GPU (Ctrl-C): it left the line and was not started."
            ) from None

    async def _kernel_env(self, base: dict[str, str]) -> dict[str, str]:
        """What the grant adds to the kernel's environment ``base``: its card, quota and framework caps."""
        manager, grant = self._manager(), self._grant
        assert grant is not None
        rec = manager.records.get(self.kernel_id)
        peak = rec.learned_peak_mib if rec else None
        most, learns = await manager.max_quota_mib(grant), manager.learns
        return kernel_env(grant, self.kernel_id, self._python, base, report_dir(), most, peak, learns)

    @property
    def _may_stand_by(self) -> bool:
        """A granted kernel keeps a pipe to the server, which may ask it to stand by (parking.py): a Python kernel of
        a server under line_place = 'start'."""
        manager = self._manager()
        return self._python and manager.holds_starts and manager.policy.line_place == "start"

    async def launch_kernel(self, cmd: list[str], **kwargs: Any):
        held = self._held
        assert self._grant is not None  # (pre_launch)
        waits = self._grant.mode in ("queued", "standby", "warm")
        self._attach_at_launch = not waits
        self._launched = (cmd, dict(kwargs.get("env") or {}))
        warm = self.warm_kernel()
        if warm is not None:
            info = await self.take_warm(warm, kwargs)
            if info is not None:
                return info
        try:
            _check_command(cmd, kwargs.get("env"))  # a kernelspec that cannot start is an error now, as Jupyter says
            # Its cgroups (cgroups.py), entered before it runs: none of its card while it waits (and none without
            # a GPU). The stand-in enters them, then becomes the kernel.
            groups, broker = self._manager().cgroups(self.kernel_id, None if waits else self._grant)
            if held is not None:  # in line, it runs now and its grant comes through a pipe; granted, it keeps one
                kwargs = held.command(kwargs)
            if groups or broker:
                cmd = standin_command(groups, cmd, broker)
            info = await super().launch_kernel(cmd, **kwargs)
        except BaseException as e:
            # jupyter_server answers a failed restart with a bare 500 and logs no cause: the log says it here
            self.log.warning("gpushare: kernel %s could not be launched: %r", self.kernel_id, e)
            if held is not None:
                held.end()
            await self._release("failed to launch")  # a failed Popen never reaches cleanup()
            self._forget_failed_start()
            raise
        if held is not None:
            held.launched()
            if self._grant.mode in ("queued", "warm") and self._manager().policy.line_cpu == "idle" and self.pid:
                priority.yield_cpu(self.pid)  # it yields the CPU until its grant (or hand-over)
            if self._grant.mode != "warm":
                self.listen(held)
        return info

    def listen(self, held: HeldStart) -> None:
        """Hear what the kernel says on its pipe (held.py): its asks, its stand-by, its demands; in line, await its
        grant."""
        held.listen(
            lambda: self._asked(held), lambda: self._stood_by(held), lambda: self._wanted(held), self._cell_waits
        )
        if self._grant is not None and self._grant.mode == "queued":
            self._admitting = asyncio.ensure_future(self._admit_held(held))

    def _asked(self, held: HeldStart) -> None:
        """The kernel's first GPU use asks for its GPU (line_place = 'first-use', or since it stood by): it joins the
        line now."""
        rec = self._manager().records.get(self.kernel_id)
        if held is self._held and rec is not None and rec.state == "standby" and self._admitting is None:
            self._admitting = asyncio.ensure_future(self._in_line(held))

    def _cell_waits(self, cell: dict[str, Any] | None) -> None:
        """The kernel says which of its cells waits for the GPU: the API says it while the kernel waits (a page
        reloaded meanwhile shows that cell's outcome)."""
        manager = self._manager()
        rec = manager.records.get(self.kernel_id)
        if rec is not None and rec.state == "queued":
            manager.update(rec, held_cell=cell)

    def _wanted(self, held: HeldStart) -> None:
        """The kernel says it is wanted (a cell or a comm message of any client): parked, it comes back."""
        if held is self._held:
            self._manager().resume(self.kernel_id)

    async def stand_by(self) -> str:
        """Give back the GPU this kernel holds and has not used, while others wait (parking.py decides when): the
        kernel agrees only if it imported no GPU framework (``_gpushare_wait._stand_by``); it then holds no
        reservation, its card is closed to it, and its next GPU use asks again, as at a first use. Returns
        "standby", else what the kernel said ("kept:<why>") or "cannot" (no pipe to it, or no answer in time: an
        answer that comes later still stands it by)."""
        manager, held = self._manager(), self._held
        rec = manager.records.get(self.kernel_id)
        if held is None or rec is None or rec.state != "running" or rec.lease is None:
            return "cannot"
        standby = kernel_env(Grant("standby"), self.kernel_id, self._python, held.env, report_dir())
        return await held.stand_by(standby, STAND_BY_ASK_S)

    async def _stood_by(self, held: HeldStart) -> None:
        """The kernel agreed to stand by: the server gives its reservation to the line (parking.py); it asks again
        at its next GPU use."""
        try:
            await self._manager().stood_by(self.kernel_id)
        finally:
            if held is self._held:
                self._grant, self._admitting = Grant("standby"), None

    async def _admit_held(self, held: HeldStart) -> None:
        """Wait for the held kernel's grant, then turn its stand-in into the kernel; or, if its wait ends without
        one, have the server shut it down (the manager said why, in an event)."""
        manager = self._manager()
        granted = asyncio.ensure_future(manager.granted(self.kernel_id))
        try:
            self.describe_wait()  # (and again at each answer of the ledger: the line tells, ServerStarts.on_wait)
            self._grant = await granted
        except asyncio.CancelledError:  # shut down, restarted, or taken out of line for another quota
            granted.cancel()
            return
        except QuotaUnavailable:  # the server shuts it down (its shut-down ends the stand-in), unless it closes
            if not manager.closing:  # and shuts every kernel down itself
                manager.end_kernel(self.kernel_id)
            return
        await self._hand_over_grant(held)

    async def _hand_over_grant(self, held: HeldStart) -> None:
        """Open the card to the kernel and send it its grant. A wait that ended without a GPU keeps the pipe (and
        ``held``): the kernel may join the line again in place (``join_again``)."""
        manager = self._manager()
        assert self._grant is not None
        if (rec := manager.records.get(self.kernel_id)) is not None:
            manager.update(rec, held_cell=None)  # (its cell goes on now, or is told why not)
        if self.pid:  # granted, or runs on without a GPU: at normal priority again, before it hears (host/priority.py)
            await manager.blocking(priority.restore, self.pid)
        try:
            await manager.open_cards(self.kernel_id, self._grant)
            await held.release(await self._kernel_env(held.env), keep=self._may_stand_by)
        except Exception:
            self.log.exception("jupyter-gpushare: kernel %s could not be given its GPU after its wait", self.kernel_id)
            held.end()
            return
        finally:
            self.describe_wait(done=True)
        if held is self._held and not held.open:
            self._held = None
        await manager.attach(self.kernel_id, self.pid)

    async def join_again(self) -> str:
        """A kernel whose wait ended without a GPU joins the line again in place: the same process, its variables
        kept. Only where the kernel agrees (``_gpushare_wait.can_rejoin``: no GPU framework was imported since: one
        that ran without the GPU keeps that) and its pipe is open. Returns "ok" (in line again, or granted at
        once), else what the kernel said instead: "imported:<names>", "busy" (it did not answer: a cell runs), or
        "cannot". QuotaUnavailable where a rule refuses it now (it runs on without a GPU, and may join later)."""
        manager = self._manager()
        rec = manager.records.get(self.kernel_id)
        handing = self._admitting
        if rec is not None and rec.state == "cpu" and rec.wait_ended and handing is not None and not handing.done():
            await asyncio.wait({handing}, timeout=HAND_OVER_S)  # its wait ended, and the kernel is being told so
            rec = manager.records.get(self.kernel_id)  # (its record says so first): from once it knows
        held = self._held
        if held is None or not held.open or rec is None or rec.state != "cpu" or not rec.wait_ended:
            return "cannot"
        for _ in range(int(JOIN_IDLE_S / 0.05)):  # jupyter_server's word: a cell runs (one that just ended: idle soon)
            if getattr(self.parent, "execution_state", None) != "busy":
                break
            await asyncio.sleep(0.05)
        else:
            return "busy"
        said = await manager.ask(self.kernel_id, "__import__('_gpushare_wait').can_rejoin()", JOIN_ASK_S)
        if said is None:
            return "busy"
        said = said.strip("'\"")
        if said != "ok":
            return said if re.fullmatch(r"imported:[\w.,]+", said) else "cannot"
        try:
            held.rejoin()
        except (OSError, RuntimeError):  # its reader is gone (the kernel closed the pipe), or it shut down meanwhile
            return "cannot"
        await self._in_line(held, raises=True)
        return "ok"

    async def _in_line(self, held: HeldStart, raises: bool = False) -> None:
        """A running kernel asks for its GPU (joins again, or its first GPU use): granted at once, or in line with
        its grant to come through ``held``. Refused by a rule now (its event says which), it runs on without a GPU
        and may join again; QuotaUnavailable is raised then with ``raises``."""
        manager = self._manager()
        language = (self.kernel_spec.language or "").lower()
        requested = parse_size(self.quota, f"{self._kernel_name} kernelspec quota") if self.quota else None
        try:
            self._grant = await self._admit(manager, language, requested)
        except QuotaUnavailable as e:
            rec = manager.record(self.kernel_id, self._kernel_name, language)
            manager.move(rec, "cpu", reason=str(e), wait_ended="cancelled", line=None)
            self._grant = Grant("cpu", reason=str(e))
            self._admitting = None
            await self._hand_over_grant(held)
            if raises:
                raise
            return
        if self._grant.mode == "queued":
            self._admitting = asyncio.ensure_future(self._admit_held(held))
        else:
            self._admitting = None
            await self._hand_over_grant(held)

    def describe_wait(self, done: bool = False) -> None:
        """What the server's kernel model says of a kernel in line (its ``reason``), for every Jupyter client, and
        what the kernel itself hears (its cell that waits for the GPU says it)."""
        km, rec = self.parent, self._manager().records.get(self.kernel_id)
        got = rec.line.answer if rec is not None and rec.state == "queued" and rec.line else None
        if got is not None and self._held is not None and not done:
            self._held.progress({"position": got.position, "need_mib": got.need_mib,
                                 "likely_at": got.likely_at and round(got.likely_at),
                                 "gives_up_at": got.gives_up_at and round(got.gives_up_at)})  # fmt: skip
        if km is None or not hasattr(km, "execution_state"):
            return
        if done or got is None:
            if str(getattr(km, "reason", "")).startswith(WAITING):
                km.reason = ""
            return
        km.reason = f"{WAITING}: #{got.position} in line, needs {format_mib(got.need_mib)}"

    async def post_launch(self, **kwargs: Any) -> None:
        await super().post_launch(**kwargs)
        manager = self._manager()
        if self._attach_at_launch:  # (a kernel in line is attached at its grant)
            await manager.attach(self.kernel_id, self.pid)
        elif (rec := manager.records.get(self.kernel_id)) is not None:
            manager.update(rec, pid=self.pid)  # its process runs while it waits: the API says which
        if not manager.holds_starts:  # a program, not a server: what it does not clean up is given back at its exit
            end_at_exit(self)
        if self._ports_renewed:
            self._ports_renewed = False
            self._watch_activity_on_new_ports()
        parent = self.parent
        if not self._watching_death and parent is not None and hasattr(parent, "add_restart_callback"):
            # Past the restart limit the server drops the kernel without cleanup(): release then.
            parent.add_restart_callback(self._kernel_died, "dead")
            self._watching_death = True

    @property
    def held(self) -> HeldStart | None:
        """The kernel's pipes while it waits for its grant, and after it for a Python kernel of a server under
        'start' (it may be asked to stand by); None when it has none, or once they are closed."""
        return self._held

    async def shutdown_requested(self, restart: bool = False) -> None:
        await super().shutdown_requested(restart=restart)
        self._stop_holding()

    def _stop_holding(self) -> None:
        """The kernel shuts down (or restarts) while in line: close its pipe. A restart launches a new kernel,
        which keeps the kernel's place in line (QuotaManager.admit)."""
        held, self._held = self._held, None
        if held is not None:
            held.end()
        if self._admitting is not None:
            self._admitting.cancel()
            self._admitting = None

    def _notebook_path(self, session_name: str | None) -> str | None:
        """The session's notebook, relative to the server's root (as JupyterLab opens it)."""
        root = getattr(getattr(self.parent, "parent", None), "root_dir", None)
        if not session_name or not root:
            return session_name
        rel = os.path.relpath(session_name, root)
        return session_name if rel.startswith("..") else rel.replace(os.sep, "/")

    def _forget_failed_start(self) -> None:
        forget_pending(getattr(self.parent, "parent", None), self.kernel_id)

    def _kernel_died(self) -> None:
        asyncio.ensure_future(self._release("died past its restart limit"))

    async def cleanup(self, restart: bool = False) -> None:
        self._stop_holding()
        await super().cleanup(restart=restart)
        manager = process_manager()
        if manager is None:
            return  # a program whose settings were refused (``_manager``): nothing was reserved
        async with manager.cleaning():
            await manager.end_groups(self.kernel_id, restart)
            if self._warm:  # (nothing reserved; what its bootstrap reported goes)
                close(self._ports)
                self._ports = ()
                await manager.blocking(remove_reports, report_dir(), self.kernel_id)
            elif restart:  # the process that ran is gone: its peak is history (a shutdown records it in release)
                await manager.remember_peak(self.kernel_id)
            else:
                await self._release("shut down")

    def end_at_exit(self, deadline: float) -> None:
        """The program exits while this kernel still holds its reservation (``jupyter console`` asks its kernel to
        shut down and exits without cleanup()): wait until ``deadline`` for the kernel to end (it was asked to, or
        ipykernel sees its parent gone), end it then, and give the reservation back (batch.end_at_exit)."""
        manager = process_manager()
        rec = manager.records.get(self.kernel_id) if manager is not None else None
        if manager is None or rec is None or rec.lease is None:
            return  # cleaned up already, or nothing reserved
        end_by(self.process, self.pgid, deadline)
        close(self._ports)
        self._ports = ()
        manager.end_at_exit(self.kernel_id)

    async def _release(self, why: str) -> None:
        self._grant = None
        self._stop_holding()
        close(self._ports)
        self._ports = ()
        await self._manager().release(self.kernel_id, why)


def chosen_default(kernel_spec: Any, config: Any) -> str | None:
    """Another default provisioner chosen in the config of the program that starts a kernel outside a server
    (``c.KernelProvisionerFactory.default_provisioner_name``), when we are only its default (its kernelspec names
    no provisioner): jupyter_client gives the factory of a KernelManager without a parent (nbclient's) no config,
    so the choice reached it only through JUPYTER_DEFAULT_PROVISIONER_NAME, which the .pth set."""
    if "provisioner_name" in kernel_spec.metadata.get("kernel_provisioner", {}):
        return None
    manager = process_manager()
    if manager is not None and manager.holds_starts:
        return None  # a server: its factory has the server's config
    found, _ = program_config(config)
    section = found["KernelProvisionerFactory"] if "KernelProvisionerFactory" in found else {}
    name = section.get("default_provisioner_name")
    return name if isinstance(name, str) and name and name != PROVISIONER_NAME else None


def _check_command(cmd: list[str], env: dict[str, str] | None) -> None:
    """FileNotFoundError or PermissionError, as Popen raises them, for a kernel command that cannot be run (the
    stand-in that enters the kernel's cgroups would otherwise start, and fail only after the start answered)."""
    program = cmd[0] if cmd else ""
    path = program if os.sep in program else shutil.which(program, path=os.pathsep.join(os.get_exec_path(env)))
    if not path or not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if not os.access(path, os.X_OK) or os.path.isdir(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
