"""The broker's connections: who each one is, its share of the broker, and its requests, one line at a time.

A part of GpuShareBroker (server.py): what it needs of the broker is declared at the top of the class (the
guard, the logs, who a caller is, the handling of a request, the socket's settings). listener.py accepts the
connections and admits them by the guard first.
"""

from __future__ import annotations

import asyncio
import grp
import inspect
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from ..core.policy import PolicyError
from ..ledger.ledger import LedgerError
from .guard import Guard, LogLimiter
from .identity import Caller, peer_credentials
from .paths import untrusted_dir
from .protocol import MAX_LINE, AuthArgs, BrokerRefused, decode_request, encode, policy_refusal, refusal

AUTH_TIMEOUT_S = 10.0  # a TCP caller that has not authenticated by then is disconnected


class Connections:
    # -- what the broker provides (server.py: its settings, setup and identity) ------------------------
    guard: Guard
    log: logging.Logger
    log_limited: LogLimiter
    idle_timeout: float  # seconds a connection may stay silent
    socket_path: str
    socket_group: str

    def identify(self, pid: int, uid: int) -> Caller:
        """Who a Unix-socket caller is."""
        raise NotImplementedError

    def authenticate(self, token: str, instance: str) -> Caller:
        """Who a TCP caller is, by its JupyterHub token."""
        raise NotImplementedError

    def handle(self, caller: Caller, op: str, args: Any) -> Any:
        """Answer one decoded request (ops.py)."""
        raise NotImplementedError

    def _touch(self, caller: Caller) -> None:
        """The caller's server is alive (its heartbeat)."""
        raise NotImplementedError

    def _trusted_uid(self, uid: int) -> bool:
        """Whether a uid's connections are exempt from the per-user shares (root, the broker's own)."""
        raise NotImplementedError

    # -- the socket ------------------------------------------------------------------------------------

    # Ledger calls run on the event loop's own thread: each takes well under a millisecond, only the
    # broker writes the file (no lock waits), and a thread hop per request cost more than the call.

    def _unix_key(self, conn: socket.socket, address: Any) -> tuple[str, bool, tuple[int, int]]:
        """A Unix-socket caller's share of the broker is its uid's (from the kernel, before it says anything)."""
        pid, uid, _gid = peer_credentials(conn)
        return f"uid:{uid}", self._trusted_uid(uid), (pid, uid)

    @staticmethod
    def _tcp_key(conn: socket.socket, address: Any) -> tuple[str, bool, None]:
        """A TCP caller's share is its address's until it authenticates, then its Hub user's."""
        return f"peer:{address[0]}", False, None

    async def _client(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        key: str,
        trusted: bool,
        peer: tuple[int, int] | None,
    ) -> None:
        """One admitted connection (listener.py counted it for ``key``): who it is, then its requests one line at
        a time. ``peer``: (pid, uid) on the Unix socket, None on TCP (the caller must authenticate first)."""
        loop = asyncio.get_running_loop()
        caller: Caller | None = None
        refused: BrokerRefused | None = None
        try:
            if peer is not None:  # the kernel says who is calling (NSS lookups may be slow: off the loop)
                pid, uid = peer
                try:
                    caller = await loop.run_in_executor(None, self.identify, pid, uid)
                except BrokerRefused as e:  # answered to every request on this connection
                    refused = e
            while True:
                timeout = AUTH_TIMEOUT_S if caller is None and refused is None else self.idle_timeout or None
                try:
                    line = await asyncio.wait_for(reader.readline(), timeout)
                except asyncio.TimeoutError:
                    break  # idle: the server reconnects on its next call
                except ValueError:  # longer than MAX_LINE: answer once, then drop the connection
                    writer.write(encode(refusal("Refused", f"A request line is at most {MAX_LINE} bytes.")))
                    break
                if not line:
                    break
                pause = self.guard.delay(key, trusted, size=len(line))
                if pause:
                    await asyncio.sleep(pause)
                if refused is not None:
                    writer.write(encode(refusal("Refused", str(refused))))
                elif caller is None:
                    caller, key, reply = await self._authenticate(line, key, writer)
                    writer.write(encode(reply))
                    if caller is None:
                        break
                else:
                    began = time.perf_counter()
                    reply = self._answer(caller, line)
                    spent = time.perf_counter() - began
                    if inspect.isawaitable(reply.get("result")):  # a 'watch': it waits for a change (room.py)
                        reply = {"ok": True, "result": await reply["result"]}
                    answer = encode(reply)
                    self.guard.charge(key, trusted, spent, len(answer))
                    writer.write(answer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            self.log_limited("connection-failed", logging.ERROR, "jupyter-gpushare broker: a client connection failed", exc_info=True)  # fmt: skip
        finally:
            self.guard.leave(key)
            writer.close()

    async def _authenticate(
        self, line: bytes, key: str, writer: asyncio.StreamWriter
    ) -> tuple[Caller | None, str, dict]:
        """A TCP caller's first request, which must be 'auth' with its JupyterHub token: (caller, its key, the
        reply); the caller is None when refused."""
        try:
            op, args = decode_request(line)
            if op != "auth" or not isinstance(args, AuthArgs):
                raise BrokerRefused(
                    "Send your JupyterHub API token first ({'op': 'auth', 'args': {'token': ..., 'instance': "
                    "...}}): on TCP the broker knows callers only by it."
                )
            caller = await asyncio.get_running_loop().run_in_executor(
                None, self.authenticate, args.token, args.instance
            )
        except BrokerRefused as e:
            self.log_limited(
                f"auth:{key}", logging.WARNING, "jupyter-gpushare broker: %s not authenticated: %s", key, e
            )
            return None, key, refusal("Refused", str(e))
        assert caller.session is not None
        new_key = f"hub:{caller.user}"
        reason = self.guard.rekey(key, new_key)
        if reason is not None:
            return None, key, refusal("Refused", reason)
        self.log.info(
            "%s authenticated by JupyterHub token as %s", writer.get_extra_info("peername"), caller.session.id
        )
        self._touch(caller)
        return caller, new_key, {"ok": True, "result": {"user": caller.user, "admin": caller.admin}}

    def _answer(self, caller: Caller, line: bytes) -> dict:
        """The reply to one request line of an identified caller; never raises."""
        try:
            op, args = decode_request(line)
            self._touch(caller)
            if op == "auth":
                return {"ok": True, "result": {"user": caller.user, "admin": caller.admin}}
            return {"ok": True, "result": self.handle(caller, op, args)}
        except PolicyError as e:
            return policy_refusal(e)
        except LedgerError as e:
            return refusal("LedgerError", str(e))
        except BrokerRefused as e:
            return refusal("Refused", str(e))
        except Exception as e:  # a bug, or a user_limits_hook that raised: answer, keep serving
            self.log_limited("request-failed", logging.ERROR, "jupyter-gpushare broker: %r from %s failed", line[:200], caller, exc_info=True)  # fmt: skip
            return refusal("LedgerError", f"The broker failed on this request ({type(e).__name__}); see its log.")

    def _prepare_socket(self) -> None:
        path = Path(self.socket_path)
        if not path.parent.exists():
            path.parent.mkdir(parents=True)
            os.chmod(path.parent, 0o755)  # the umask is 077: let users reach the socket
        why = untrusted_dir(path.parent)
        if why:
            raise SystemExit(
                f"jupyter-gpushare broker: the socket's directory {path.parent} is not safe: {why}, so a student "
                "could bind the socket first and answer other students' requests. Use a directory only root can "
                "write, e.g. GpuShareBroker.socket_path = '/run/jupyter-gpushare/broker.sock'."
            )
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # left behind by a broker that is gone
            else:
                raise SystemExit(f"jupyter-gpushare broker: another broker already listens on {path}.")
            finally:
                probe.close()

    def _secure_socket(self) -> None:
        if self.socket_group:
            try:
                gid = grp.getgrnam(self.socket_group).gr_gid
            except KeyError as e:
                raise SystemExit(
                    f"jupyter-gpushare broker: GpuShareBroker.socket_group {self.socket_group!r} is not a group."
                ) from e
            os.chown(self.socket_path, -1, gid)
            os.chmod(self.socket_path, 0o660)
        else:
            os.chmod(self.socket_path, 0o666)
