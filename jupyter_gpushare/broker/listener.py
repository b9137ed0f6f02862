"""Accepting connections fairly: a caller over its share is refused before anything is built for it.

asyncio's own servers make a transport, streams and a task for every connection before the broker sees
who is calling, and accept up to a hundred at a time; one student reconnecting in a loop then keeps the
event loop busy with work for nobody, and everyone's requests wait behind it. Here a listening socket is
read in small batches (``BATCH``), the caller's key comes from the socket itself (peer credentials, or
the peer's address), and a caller over its connection cap gets one refusal line and is closed at once:
a few system calls. Only admitted connections get streams (and TLS) and a task.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Awaitable
from typing import Any, Callable

from .guard import Guard, LogLimiter
from .protocol import MAX_LINE, encode, refusal

BATCH = 16  # connections accepted per turn of the event loop, so requests already in are served between
BACKLOG = 1024
OUT_OF_FILES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

# (connection, peer address) -> (guard key, trusted, what the handler needs to know of the caller)
KeyOf = Callable[[socket.socket, Any], tuple[str, bool, Any]]
# (reader, writer, key, trusted, info) -> handled; it leaves the guard itself (a key may change on the way)
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str, bool, Any], Awaitable[None]]


class Listener:
    """Serves one listening socket: accepts, admits by the guard, hands admitted connections to ``handle``."""

    def __init__(
        self,
        sock: socket.socket,
        guard: Guard,
        key_of: KeyOf,
        handle: Handler,
        log_limited: LogLimiter,
        tls: ssl.SSLContext | None = None,
        handshake_timeout: float = 10.0,
    ):
        self.sock, self.guard, self.key_of, self.handle = sock, guard, key_of, handle
        self.log_limited, self.tls, self.handshake_timeout = log_limited, tls, handshake_timeout
        self.tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        sock.setblocking(False)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for task in self.tasks:
            task.cancel()

    def _accept(self) -> None:
        assert self._loop is not None
        for _ in range(BATCH):
            try:
                conn, address = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: stop accepting for a moment, say so (rarely)
                self.log_limited("accept", logging.ERROR, "jupyter-gpushare broker: cannot accept a connection: %s", e)
                if e.errno in OUT_OF_FILES:
                    self._loop.remove_reader(self.sock.fileno())
                    self._loop.call_later(0.1, self._loop.add_reader, self.sock.fileno(), self._accept)
                return
            try:
                key, trusted, info = self.key_of(conn, address)
            except OSError:
                conn.close()
                continue
            reason = self.guard.enter(key, trusted)
            if reason is not None:
                self.log_limited(f"cap:{key}", logging.WARNING, "jupyter-gpushare broker: %s refused: %s", key, reason)
                try:
                    conn.setblocking(False)
                    if self.tls is None:  # (a TLS caller cannot read a line before its handshake: just closed)
                        conn.send(encode(refusal("Refused", reason)))
                except OSError:
                    pass
                conn.close()
                continue
            task = self._loop.create_task(self._serve(conn, key, trusted, info))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _serve(self, conn: socket.socket, key: str, trusted: bool, info: Any) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_LINE, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol,
                conn,
                ssl=self.tls,
                ssl_handshake_timeout=self.handshake_timeout if self.tls else None,
            )
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as e:  # a TLS handshake that failed or never came
            self.guard.leave(key)
            conn.close()
            self.log_limited(
                f"handshake:{key}", logging.INFO, "jupyter-gpushare broker: %s: no TLS session: %s", key, e
            )
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        await self.handle(reader, writer, key, trusted, info)


def unix_listener_socket(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(BACKLOG)
    return sock


def tcp_listener_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=BACKLOG, reuse_port=False)
