"""Host-wide GPU reservations in SQLite: the only code that writes the ledger.

One row per kernel that holds GPU memory (``leases``) and one per kernel waiting for room
(``waiters``, FIFO by ticket). Every change runs in one ``BEGIN IMMEDIATE`` transaction, so
processes sharing the file never overbook a card. WAL mode with ``synchronous=NORMAL``: a commit
survives the crash of any process; only a crash of the whole OS can lose the last commits, and
then every kernel they describe is gone too.

Leases name two processes, each as (pid, start time) so a reused pid is not mistaken for the
original: the owner (the Jupyter server or nbclient process that reserved) and the kernel.
A lease whose owner and kernel are both gone is reclaimed by whoever next opens a transaction;
leases of a live owner are released by that owner (see manager.py).

A server the broker cannot see as a process (in a container, identified by its JupyterHub token)
owns its leases through a session instead (``sessions``): alive while it keeps calling the broker
before ``expires``; its leases name no kernel process (the server releases those of kernels it no
longer has), and they are reclaimed once the session expires.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Union

import psutil

from .gpu import Card
from .policy import CardView, Policy, Size, UserLimits

SCHEMA_VERSION = 2  # 2: sessions, and an owner_session column in leases and waiters
WAITER_STALE_S = 30.0  # a waiter not heard from for this long has been abandoned
ALIVE_CACHE_S = 1.0  # how long a "still running" answer is trusted (a gone process stays gone)
REAP_EVERY_S = 1.0  # reserve() reaps at most this often, and always before it answers "no room"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    kernel_id    TEXT PRIMARY KEY,
    card_uuid    TEXT NOT NULL,
    card_index   INTEGER NOT NULL,
    quota_mib    INTEGER NOT NULL,
    reserve_mib  INTEGER NOT NULL,
    user         TEXT NOT NULL DEFAULT '',
    kernel_name  TEXT NOT NULL DEFAULT '',
    owner_pid    INTEGER NOT NULL,
    owner_start  REAL NOT NULL,
    owner_session TEXT,
    kernel_pid   INTEGER,
    kernel_start REAL,
    created      REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS waiters (
    ticket       INTEGER PRIMARY KEY AUTOINCREMENT,
    kernel_id    TEXT NOT NULL UNIQUE,
    quota        TEXT NOT NULL,
    user         TEXT NOT NULL DEFAULT '',
    kernel_name  TEXT NOT NULL DEFAULT '',
    owner_pid    INTEGER NOT NULL,
    owner_start  REAL NOT NULL,
    owner_session TEXT,
    created      REAL NOT NULL,
    heartbeat    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id           TEXT PRIMARY KEY,
    user         TEXT NOT NULL,
    expires      REAL NOT NULL
)
"""
_MIGRATE_FROM_1 = """
ALTER TABLE leases ADD COLUMN owner_session TEXT;
ALTER TABLE waiters ADD COLUMN owner_session TEXT
"""


class LedgerError(RuntimeError):
    """The ledger file cannot be used. The message names the file and what to do."""


@dataclass(frozen=True)
class ProcessRef:
    """A process identified by pid and start time, so a reused pid does not pass for it."""

    pid: int
    start: float

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        try:
            return cls(pid, psutil.Process(pid).create_time())
        except psutil.Error:
            return None

    @classmethod
    def me(cls) -> ProcessRef:
        ref = cls.of(os.getpid())
        assert ref is not None
        return ref

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.start) < 0.05 and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return self._hidden()
        except psutil.Error:
            return False

    def _hidden(self) -> bool:
        """Whether a process /proc does not show is there all the same, another user's behind hidepid: then
        it is taken for alive (its start time cannot be checked), so its memory is never handed out twice."""
        try:
            os.kill(self.pid, 0)  # signal 0: only asks whether the pid exists
        except PermissionError:  # it does, and is not ours
            return True
        except OSError:
            return False
        return False  # ours, so /proc would show it: the pid came back for a new process


@dataclass(frozen=True)
class SessionRef:
    """A server known to the broker by a session (see the module's doc), not as a process it can see."""

    id: str


Owner = Union[ProcessRef, SessionRef]  # (Python 3.9: no X | Y at run time)


def _owner(row: sqlite3.Row) -> Owner:
    if "owner_session" in row.keys() and row["owner_session"]:  # (read_ledger may read a schema-1 file)
        return SessionRef(row["owner_session"])
    return ProcessRef(row["owner_pid"], row["owner_start"])


def _owner_columns(owner: Owner) -> tuple[int, float, str | None]:
    """(owner_pid, owner_start, owner_session) for a row."""
    if isinstance(owner, SessionRef):
        return 0, 0.0, owner.id
    return owner.pid, owner.start, None


@dataclass(frozen=True)
class Lease:
    kernel_id: str
    card_uuid: str
    card_index: int
    quota_mib: int
    reserve_mib: int
    user: str
    kernel_name: str
    owner: Owner
    kernel: ProcessRef | None
    created: float

    @property
    def reserved_mib(self) -> int:
        return self.quota_mib + self.reserve_mib

    def to_dict(self) -> dict:
        d = asdict(self)
        d["reserved_mib"] = self.reserved_mib
        return d


@dataclass(frozen=True)
class Waiting:
    """Not admitted (yet): where the request stands and why."""

    kernel_id: str
    position: int  # 1 = next in line
    need_mib: int  # quota + context reserve on the card that fits best, 0 if none could
    free_mib: int  # the most room on any allowed card: unreserved, less what processes without a reservation use
    ahead: int  # waiters before this one
    outside_mib: int = 0  # what processes without a reservation use on the allowed cards, together


@dataclass(frozen=True)
class Waiter:
    ticket: int
    kernel_id: str
    quota: str
    user: str
    kernel_name: str
    owner: Owner
    created: float


@dataclass(frozen=True)
class Request:
    kernel_id: str
    quota: Size
    user: str = ""
    kernel_name: str = ""


def _waiter(r: sqlite3.Row) -> Waiter:
    return Waiter(r["ticket"], r["kernel_id"], r["quota"], r["user"], r["kernel_name"], _owner(r), r["created"])


def _lease(row: sqlite3.Row) -> Lease:
    kernel = ProcessRef(row["kernel_pid"], row["kernel_start"]) if row["kernel_pid"] else None
    return Lease(
        kernel_id=row["kernel_id"],
        card_uuid=row["card_uuid"],
        card_index=row["card_index"],
        quota_mib=row["quota_mib"],
        reserve_mib=row["reserve_mib"],
        user=row["user"],
        kernel_name=row["kernel_name"],
        owner=_owner(row),
        kernel=kernel,
        created=row["created"],
    )


class Ledger:
    """Reservations in one SQLite file, shared by every process that opens it.

    Not thread-safe: use one Ledger per thread (the manager keeps one on a worker thread).
    """

    def __init__(self, path: str | os.PathLike, owner: Owner | None = None):
        self.path = Path(path)
        self.owner = owner or ProcessRef.me()
        self._alive_until: dict[ProcessRef, float] = {}
        self._last_reap = 0.0
        self._dead: set[ProcessRef] = set()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Writers queue on a flock (the kernel wakes the next one at once) rather than on
            # SQLite's busy handler, which polls with growing sleeps and can starve a writer.
            self._lock = open(self.path.with_name(self.path.name + ".lock"), "a+")
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise LedgerError(
                    f"The GPU ledger {self.path} was written by a newer jupyter-gpushare (schema {version}, "
                    f"this one knows {SCHEMA_VERSION}). Upgrade jupyter-gpushare on every server of this host."
                )
            with self._tx():
                version = self._db.execute("PRAGMA user_version").fetchone()[0]  # again, under the lock
                exists = self._db.execute("SELECT 1 FROM sqlite_master WHERE name='leases'").fetchone()
                for statement in filter(str.strip, (_MIGRATE_FROM_1 if exists and version == 1 else "").split(";")):
                    self._db.execute(statement)
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._db.execute("SELECT count(*) FROM leases").fetchone()
        except LedgerError:
            raise
        except (sqlite3.Error, OSError) as e:
            raise LedgerError(
                f"The GPU ledger {self.path} cannot be used ({e}). It holds the reservations of running "
                "kernels, so it was left as it is. If it is damaged, stop the Jupyter servers of this host, "
                f"move it aside (mv {self.path} {self.path}.bad) and start them again; or point "
                "GpuShareApp.ledger_path at a file on a local disk that this user can write."
            ) from e

    def close(self) -> None:
        self._db.close()
        self._lock.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    # -- queries ---------------------------------------------------------------------------

    def leases(self) -> list[Lease]:
        return [_lease(r) for r in self._db.execute("SELECT * FROM leases ORDER BY created")]

    def get(self, kernel_id: str) -> Lease | None:
        row = self._db.execute("SELECT * FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone()
        return _lease(row) if row else None

    def waiters(self) -> list[Waiter]:
        return [_waiter(r) for r in self._db.execute("SELECT * FROM waiters ORDER BY ticket")]

    def reserved_by_card(self) -> dict[str, int]:
        return self._reserved(self._db)

    # -- changes ---------------------------------------------------------------------------

    def reserve(
        self,
        req: Request,
        policy: Policy,
        cards: Sequence[Card],
        wait: bool,
        limits: UserLimits | None = None,
        outside: Mapping[str, int] | None = None,
    ) -> Lease | Waiting:
        """Reserve room for a kernel on the best-fitting card, in FIFO order.

        With ``wait`` the request keeps its place in the queue until admitted or cancelled
        (call again to retry; each call is a heartbeat). Without it, a request that cannot be
        admitted now is not queued. Requests never jump ahead of older waiters.
        Idempotent: a kernel that already holds a lease gets it back.
        With ``limits``, the user's other leases (same ``req.user``) are checked in the same
        transaction, so no two concurrent starts of one user pass a per-user limit together;
        PolicyError says which limit. ``outside`` (card uuid -> MiB, ``sampler.unreserved_use``) is what
        processes that hold no reservation use: it is taken as well.
        """
        now = time.time()
        with self._tx() as db:
            reaped = now - self._last_reap >= REAP_EVERY_S
            if reaped:
                self._reap(db, now)
            row = db.execute("SELECT * FROM leases WHERE kernel_id=?", (req.kernel_id,)).fetchone()
            if row:
                return _lease(row)
            if limits is not None:  # before queueing: a request over a limit never waits
                held = [r[0] for r in db.execute("SELECT quota_mib FROM leases WHERE user=?", (req.user,))]
                biggest = max((c.total_mib for c in cards if policy.card_allowed(c.uuid, c.index)), default=0)
                limits.check(req.user, req.quota.resolve(biggest), biggest, held)
            if wait:
                db.execute(
                    "INSERT INTO waiters (kernel_id, quota, user, kernel_name, owner_pid, owner_start, owner_session,"
                    " created, heartbeat) VALUES (?,?,?,?,?,?,?,?,?)"
                    " ON CONFLICT(kernel_id) DO UPDATE SET heartbeat=excluded.heartbeat",
                    (req.kernel_id, str(req.quota), req.user, req.kernel_name, *_owner_columns(self.owner), now, now),
                )
            ahead, views = self._ahead(db, req.kernel_id, wait), self._views(db, cards, outside)
            card = policy.place(req.quota, views) if ahead == 0 else None
            if card is None and not reaped:  # room held by kernels that are gone is room
                self._reap(db, now)
                ahead, views = self._ahead(db, req.kernel_id, wait), self._views(db, cards, outside)
                card = policy.place(req.quota, views) if ahead == 0 else None
            if card is None:
                allowed = [v for v in views if policy.card_allowed(v.uuid, v.index)]
                fitting = [
                    policy.need_mib(req.quota, v.total_mib)
                    for v in allowed
                    if policy.need_mib(req.quota, v.total_mib) <= policy.usable_mib(v.total_mib)
                ]
                return Waiting(
                    kernel_id=req.kernel_id,
                    position=ahead + 1,
                    need_mib=min(fitting, default=0),
                    free_mib=max(0, max((v.room_mib(policy) for v in allowed), default=0)),
                    ahead=ahead,
                    outside_mib=sum(v.outside_mib for v in allowed),
                )
            quota_mib = req.quota.resolve(card.total_mib)
            if limits is not None:  # exact now that the card (and so a percentage's size) is known
                limits.check(req.user, quota_mib, card.total_mib, held)
            db.execute(
                "INSERT INTO leases (kernel_id, card_uuid, card_index, quota_mib, reserve_mib, user, kernel_name,"
                " owner_pid, owner_start, owner_session, created) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    req.kernel_id,
                    card.uuid,
                    card.index,
                    quota_mib,
                    policy.context_reserve_mib,
                    req.user,
                    req.kernel_name,
                    *_owner_columns(self.owner),
                    now,
                ),
            )
            db.execute("DELETE FROM waiters WHERE kernel_id=?", (req.kernel_id,))
            return _lease(db.execute("SELECT * FROM leases WHERE kernel_id=?", (req.kernel_id,)).fetchone())

    def cancel_wait(self, kernel_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM waiters WHERE kernel_id=?", (kernel_id,))

    def attach(self, kernel_id: str, kernel: ProcessRef | None) -> None:
        """Record the kernel process that uses a lease (again after each restart)."""
        with self._tx() as db:
            db.execute(
                "UPDATE leases SET kernel_pid=?, kernel_start=? WHERE kernel_id=?",
                (kernel.pid if kernel else None, kernel.start if kernel else None, kernel_id),
            )

    def release(self, kernel_id: str) -> Lease | None:
        """Give a kernel's reservation back. Idempotent: None when it held none."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone()
            db.execute("DELETE FROM leases WHERE kernel_id=?", (kernel_id,))
            db.execute("DELETE FROM waiters WHERE kernel_id=?", (kernel_id,))
            return _lease(row) if row else None

    def release_owned_except(self, keep: set[str]) -> list[Lease]:
        """Release this owner's leases for kernels it no longer knows (died past the restart limit)."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT * FROM leases WHERE owner_pid=? AND owner_start=? AND owner_session IS ?",
                _owner_columns(self.owner),
            ).fetchall()
            gone = [_lease(r) for r in rows if r["kernel_id"] not in keep]
            db.executemany("DELETE FROM leases WHERE kernel_id=?", [(lease.kernel_id,) for lease in gone])
            return gone

    def adopt(self, kernel_id: str) -> None:
        """Take over a lease whose owner is gone but whose kernel lives (a restarted server)."""
        with self._tx() as db:
            db.execute(
                "UPDATE leases SET owner_pid=?, owner_start=?, owner_session=? WHERE kernel_id=?",
                (*_owner_columns(self.owner), kernel_id),
            )

    def touch_session(self, session: SessionRef, user: str, expires: float) -> None:
        """Open or extend a session: its leases live until ``expires`` unless touched again."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO sessions (id, user, expires) VALUES (?,?,?)"
                " ON CONFLICT(id) DO UPDATE SET expires=max(expires, excluded.expires)",
                (session.id, user, expires),
            )

    def extend_sessions(self, until: float) -> None:
        """Give every session until ``until`` to call again (a broker that was down could not be called)."""
        with self._tx() as db:
            db.execute("UPDATE sessions SET expires=? WHERE expires < ?", (until, until))

    def reap(self) -> list[Lease]:
        """Reclaim leases whose owner and kernel are both gone, and abandoned waiters."""
        with self._tx() as db:
            return self._reap(db, time.time())

    def _alive(self, proc: Owner, sessions: set[str]) -> bool:
        if proc == self.owner:
            return True
        if isinstance(proc, SessionRef):
            return proc.id in sessions
        if proc in self._dead:
            return False
        now = time.monotonic()
        if self._alive_until.get(proc, 0) > now:
            return True
        if proc.alive():
            self._alive_until[proc] = now + ALIVE_CACHE_S
            return True
        self._alive_until.pop(proc, None)
        self._dead.add(proc)
        return False

    @staticmethod
    def _ahead(db: sqlite3.Connection, kernel_id: str, waiting: bool) -> int:
        """Waiters before this request (all of them, for a request that does not queue)."""
        if not waiting:
            return db.execute("SELECT count(*) FROM waiters").fetchone()[0]
        ticket = db.execute("SELECT ticket FROM waiters WHERE kernel_id=?", (kernel_id,)).fetchone()[0]
        return db.execute("SELECT count(*) FROM waiters WHERE ticket < ?", (ticket,)).fetchone()[0]

    def _views(
        self, db: sqlite3.Connection, cards: Sequence[Card], outside: Mapping[str, int] | None = None
    ) -> list[CardView]:
        reserved, outside = self._reserved(db), outside or {}
        return [CardView(c.uuid, c.index, c.total_mib, reserved.get(c.uuid, 0), outside.get(c.uuid, 0)) for c in cards]

    def _reap(self, db: sqlite3.Connection, now: float) -> list[Lease]:
        self._last_reap = now
        db.execute("DELETE FROM sessions WHERE expires < ?", (now,))
        sessions = {r[0] for r in db.execute("SELECT id FROM sessions")}
        dead = []
        for row in db.execute("SELECT * FROM leases").fetchall():
            if self._alive(_owner(row), sessions):
                continue
            kernel = ProcessRef(row["kernel_pid"], row["kernel_start"]) if row["kernel_pid"] else None
            if kernel is None or not self._alive(kernel, sessions):
                dead.append(_lease(row))
        db.executemany("DELETE FROM leases WHERE kernel_id=?", [(lease.kernel_id,) for lease in dead])
        for row in db.execute("SELECT * FROM waiters").fetchall():
            if now - row["heartbeat"] > WAITER_STALE_S or not self._alive(_owner(row), sessions):
                db.execute("DELETE FROM waiters WHERE ticket=?", (row["ticket"],))
        return dead

    @staticmethod
    def _reserved(db: sqlite3.Connection) -> dict[str, int]:
        rows = db.execute("SELECT card_uuid, SUM(quota_mib + reserve_mib) FROM leases GROUP BY card_uuid")
        return {uuid: int(total) for uuid, total in rows}


# -- read-only access (status and doctor) ------------------------------------------------------------


def _open_readonly(path: str | os.PathLike) -> sqlite3.Connection:
    path = Path(path)
    if not path.exists():
        raise LedgerError(f"There is no GPU ledger at {path} (no kernel has reserved GPU memory with it yet).")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        db.row_factory = sqlite3.Row
        db.execute("SELECT count(*) FROM leases").fetchone()
        return db
    except sqlite3.Error as e:
        raise LedgerError(
            f"The GPU ledger {path} cannot be read ({e}). If you are not its owner, ask the broker instead "
            "(jupyter gpushare status --socket ...); if it is damaged, see jupyter gpushare doctor."
        ) from e


def read_ledger(path: str | os.PathLike) -> tuple[list[Lease], list[Waiter]]:
    """Leases and waiters of a ledger file, read without writing to it (no reaping)."""
    db = _open_readonly(path)
    try:
        leases = [_lease(r) for r in db.execute("SELECT * FROM leases ORDER BY created")]
        waiters = [_waiter(r) for r in db.execute("SELECT * FROM waiters ORDER BY ticket")]
        return leases, waiters
    finally:
        db.close()


def check_ledger(path: str | os.PathLike) -> dict:
    """Health of a ledger file, read-only: SQLite's integrity_check, schema version, journal mode, counts."""
    db = _open_readonly(path)
    try:
        integrity = [r[0] for r in db.execute("PRAGMA integrity_check")]
        return {
            "path": str(path),
            "integrity": "ok" if integrity == ["ok"] else "; ".join(integrity[:5]),
            "schema": db.execute("PRAGMA user_version").fetchone()[0],
            "journal_mode": db.execute("PRAGMA journal_mode").fetchone()[0],
            "leases": db.execute("SELECT count(*) FROM leases").fetchone()[0],
            "waiters": db.execute("SELECT count(*) FROM waiters").fetchone()[0],
        }
    finally:
        db.close()
