"""Websockets to kernels that wait for a GPU: opened at once, the client's messages kept until the kernel runs.

jupyter_server's kernel websocket (``ZMQChannelsWebsocketConnection.prepare``) waits up to
``kernel_info_timeout`` (60 s) for the kernel to answer before it completes the websocket's handshake. A kernel
in line (held.py) cannot answer, and a browser lets only one websocket to a server be in its handshake at a time:
one waiting notebook would hold up the websockets of every other notebook of the page, and a proxy's read
timeout would cut the handshake. So for a kernel whose start is held, the handshake completes at once; what the
client sends meanwhile (JupyterLab's kernel_info request, the cells run while it waits) is kept here, in order,
and once the kernel runs the connection is made as jupyter_server makes it (kernel_info, then the nudge that
makes sure the kernel's output reaches this client) and the kept messages are sent on. If the kernel will never
run (its wait ended), the websocket is closed. A kernel that does not wait is connected as usual.

A kernel in line that runs while it waits completes the handshake as jupyter_server does, once it answers. It runs at
idle CPU priority (host/priority.py), so where the running kernels keep every CPU busy, that answer may take
long. A client in that handshake wants the kernel all the same: it is counted (``connecting``), so the kernel keeps
its place in line and is granted when room is freed (Line._wanted), not passed over as a kernel nobody wants. A
client that leaves during the handshake is counted until jupyter_server gives it up (``kernel_info_timeout``).

A parked kernel (parking.py) is brought back by the next cell its client runs, and the cell goes to the kernel at
once: its CPU work runs meanwhile, and only a GPU call in it waits, inside the driver, until the kernel's state is
back (the cell says so in one line: _gpushare_wait). Any client's cell brings it back the same way, through the
kernel's own word; this one is only the quickest.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
from tornado import web
from tornado.websocket import WebSocketClosedError

KEPT_MAX = 1000  # messages held for one kernel (all its websockets); past it the client is told to reconnect later
KEPT_MAX_BYTES = 64 << 20
_held_for: dict[str, list[int]] = {}  # kernel id -> [messages, bytes] its connections hold now
_connecting: Counter[str] = Counter()  # kernel id -> its websockets whose handshake waits for the kernel's answer


def connecting(kernel_id: str) -> int:
    """How many clients are opening a websocket to the kernel now: their handshake waits for its answer."""
    return _connecting[kernel_id]


def held_start(kernel_manager: Any) -> Any:
    """The kernel's held start (held.HeldStart) while it waits for a GPU, else None."""
    held = getattr(getattr(kernel_manager, "provisioner", None), "held", None)
    return held if held is not None and held.waiting else None


class WaitingKernelConnection(ZMQChannelsWebsocketConnection):
    """jupyter_server's kernel websocket connection, for kernels that may wait for a GPU."""

    _held: Any = None  # the kernel's held start, while this connection waits for it
    _kept: list | None = None  # the client's messages, kept until the kernel runs
    _handed = False  # connected to the kernel as jupyter_server connects
    _closed = False
    _joining: asyncio.Future | None = None
    _holds = (0, 0)  # what this connection counts in _held_for: messages, bytes
    _left = False  # the client closed its websocket (disconnect)

    async def prepare(self) -> None:
        held = held_start(self.kernel_manager)
        if held is None:
            _connecting[self.kernel_id] += 1
            try:
                await super().prepare()  # (waits for the kernel's first answer)
            finally:
                _connecting[self.kernel_id] -= 1
                if not _connecting[self.kernel_id]:
                    del _connecting[self.kernel_id]
            if self._left:  # the page left meanwhile: jupyter_server's handler would shake hands with nobody, and
                # fail on the connection its on_close dropped (a traceback in the log); end the request here
                raise web.HTTPError(499, reason="Client Closed Request")
            return
        await self._register_session()
        self.session.key = self.kernel_manager.session.key
        self._held, self._kept = held, []

    def connect(self) -> asyncio.Future[None] | None:  # type: ignore[override]
        if self._held is None:
            connected = super().connect()
            if connected is not None and getattr(self.kernel_manager, "execution_state", None) == "busy":
                connected.add_done_callback(lambda _: self._say_busy())
            return connected
        # Counted as a client at once: a kernel in line that someone watches stays in line (Line.watchers).
        self.multi_kernel_manager.notify_connect(self.kernel_id)
        ZMQChannelsWebsocketConnection._open_sockets.add(self)
        self._joining = asyncio.ensure_future(self._join_when_started(self._held))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def _say_busy(self) -> None:
        """A page that connects to a busy kernel (reloaded while a cell waits for its GPU) would read its status as
        "unknown" until the cell ends: its kernel_info request waits behind the cell, and jupyter_server does not
        nudge a busy kernel. It is told the status jupyter_server knows, as jupyter_server tells "restarting"."""
        try:
            self._send_status_message("busy")
        except WebSocketClosedError:  # (the page left meanwhile)
            pass

    async def _join_when_started(self, held: Any) -> None:
        if not await asyncio.shield(held.started):
            self.websocket_handler.close()  # the kernel will not run (its wait ended): the client learns it is gone
            return
        info = self.request_kernel_info()
        try:
            await asyncio.wait_for(asyncio.wrap_future(info), self.kernel_info_timeout)
        except asyncio.TimeoutError:
            self.log.warning("Timeout waiting for kernel_info reply from %s", self.kernel_id)
        if self._kept is None:  # the client left meanwhile
            return
        self.multi_kernel_manager.notify_disconnect(self.kernel_id)  # super().connect() counts it again
        self._handed = True
        connected = super().connect()
        if connected is not None:
            await connected
        kept, self._kept = self._kept, None
        self._let_go()
        for message in kept or ():
            super().handle_incoming_message(message)

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        if self._kept is None:
            parking = getattr(getattr(self.kernel_manager, "provisioner", None), "parking", None)
            if parking is not None and _runs_code(incoming_msg):
                if parking.away(self.kernel_id):
                    parking.resume(self.kernel_id)  # the kernel is parked: its cell brings it back (parking.py)
                parking.touch(self.kernel_id)  # a cell on its way: not idle, whatever the last reading said
            return super().handle_incoming_message(incoming_msg)
        if self._hold(incoming_msg):
            self._kept.append(incoming_msg)

    def _hold(self, message: Any) -> bool:
        """Count a message held for the kernel, against one budget for all its websockets; past it the client is
        told to reconnect once the kernel runs, and the message is not held (False)."""
        held = _held_for.setdefault(self.kernel_id, [0, 0])
        if held[0] >= KEPT_MAX or held[1] + len(message) > KEPT_MAX_BYTES:
            self.log.warning("Kernel %s waits for a GPU: too many messages held for its clients", self.kernel_id)
            self.websocket_handler.close(1013, "The kernel waits for a GPU; reconnect once it runs.")
            return False
        held[0], held[1] = held[0] + 1, held[1] + len(message)
        self._holds = (self._holds[0] + 1, self._holds[1] + len(message))
        return True

    def _let_go(self) -> None:
        """This connection's held messages were sent on, or dropped: the kernel's budget gets them back."""
        held = _held_for.get(self.kernel_id)
        if held is not None:
            held[0], held[1] = held[0] - self._holds[0], held[1] - self._holds[1]
            if held[0] <= 0:
                del _held_for[self.kernel_id]
        self._holds = (0, 0)

    def disconnect(self) -> None:  # type: ignore[override]  # (synchronous in ZMQChannelsWebsocketConnection)
        self._left = True
        kept, self._kept = self._kept, None
        if kept is not None:
            self._let_go()
        if kept is None or self._handed:
            if not self._closed:
                super().disconnect()
            return
        # Not connected to the kernel yet: nothing but the count, the session and the wait to undo.
        self._closed = True
        if self._joining is not None:
            self._joining.cancel()
        self.multi_kernel_manager.notify_disconnect(self.kernel_id)
        if self._open_sessions.get(self.session_key) is self.websocket_handler:
            self._open_sessions.pop(self.session_key)
        ZMQChannelsWebsocketConnection._open_sockets.discard(self)
        if not self._close_future.done():
            self._close_future.set_result(None)


def waiting_connection_class(configured: type) -> type | None:
    """The connection class to use for kernel websockets, given the server's: ours, or a subclass of both when the
    server's is a subclass of jupyter_server's; None when it is another kind (a gateway's), which is left as is."""
    if configured is ZMQChannelsWebsocketConnection or issubclass(configured, WaitingKernelConnection):
        return WaitingKernelConnection
    if issubclass(configured, ZMQChannelsWebsocketConnection):
        return type(f"Waiting{configured.__name__}", (WaitingKernelConnection, configured), {})
    return None


def _runs_code(message: Any) -> bool:
    """Whether a client's message asks the kernel to run code (an execute request, in either wire format)."""
    raw = message if isinstance(message, (bytes, str)) else b""
    return (b"execute_request" if isinstance(raw, bytes) else "execute_request") in raw  # type: ignore[operator]
