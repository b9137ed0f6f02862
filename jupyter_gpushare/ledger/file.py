"""The ledger's SQLite file: opening it, its schema, one transaction at a time, and noticing when it is gone.

Every process that reserves (Jupyter servers of one user, nbclient, or the host's broker) opens the same
file. Writers queue on a flock of ``<file>.lock`` (the kernel wakes the next one at once) rather than on
SQLite's busy handler, which polls with growing sleeps and can starve a writer.

A file removed or replaced under running processes (``rm ledger.sqlite``, a restore from a backup, its
``-wal`` deleted) would split them: each would write to its own copy and together book more than a card.
So every transaction first checks that the files it opened are still the ones at the path (device and
inode of the file, its ``-wal``, ``-shm`` and ``.lock``). If not, the process opens the file at the path
(creating it), enters again the reservations it knew (``on_replaced``), and marks the file as settling:
no new reservation is granted for ``SETTLE_S`` seconds, while every other server does the same.
Any SQLite or OS error (a full disk) becomes a LedgerError that names the file and what to do.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, TextIO

log = logging.getLogger("jupyter_gpushare.ledger.ledger")

# 2: sessions, and an owner_session column in leases and waiters. The peaks table (history.py), the waiters'
# cards and ages_from columns, the unserved table (queue.py), the holds (estimate.py) and notices tables came later without
# a new version: older releases
# never read them (an older server's waiter gets the columns' defaults: any card, aging from its start), so servers
# of both can share a file while a host is upgraded.
SCHEMA_VERSION = 2
PEAK_COLUMNS = "kernel_id, run, user, kernel_name, path, peak_mib, reserved_mib, recorded, need_mib, failed"
SETTLE_S = 30.0  # after a re-creation, no new reservations for this long (servers re-enter theirs first)
NOTICE_COLUMNS_ADDED = (  # the notices' columns after the first (notices.py); a file of an older release gets them
    ("user", "TEXT NOT NULL DEFAULT ''"),
    ("owner_pid", "INTEGER"),
    ("owner_start", "REAL"),
    ("owner_session", "TEXT"),
    ("bound", "REAL"),
    ("deadline", "REAL"),
    ("taken", "REAL"),
    ("done", "REAL"),
    ("outcome", "TEXT NOT NULL DEFAULT ''"),
    ("kernel_pid", "INTEGER"),
    ("kernel_start", "REAL"),
)
_FILES = ("", "-wal", "-shm")  # the database and SQLite's WAL files next to it

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
    heartbeat    REAL NOT NULL,
    cards        TEXT NOT NULL DEFAULT '',
    ages_from    REAL
);
CREATE TABLE IF NOT EXISTS unserved (
    user         TEXT PRIMARY KEY,
    ended        REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id           TEXT PRIMARY KEY,
    user         TEXT NOT NULL,
    expires      REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key          TEXT PRIMARY KEY,
    value        TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS peaks (
    kernel_id    TEXT NOT NULL,
    run          TEXT NOT NULL,
    user         TEXT NOT NULL,
    kernel_name  TEXT NOT NULL,
    path         TEXT NOT NULL,
    peak_mib     INTEGER NOT NULL,
    reserved_mib INTEGER NOT NULL,
    recorded     REAL NOT NULL,
    need_mib     INTEGER,
    failed       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (kernel_id, run)
);
CREATE INDEX IF NOT EXISTS peaks_notebook ON peaks (kernel_name, path, recorded);
CREATE INDEX IF NOT EXISTS peaks_user ON peaks (user, recorded);
CREATE TABLE IF NOT EXISTS notices (
    kernel_id    TEXT NOT NULL,
    action       TEXT NOT NULL,
    by           TEXT NOT NULL,
    why          TEXT NOT NULL,
    at           REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS barred (
    kernel_id    TEXT PRIMARY KEY,
    user         TEXT NOT NULL,
    by           TEXT NOT NULL,
    why          TEXT NOT NULL,
    until        REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS parked (
    kernel_id    TEXT PRIMARY KEY,
    user         TEXT NOT NULL,
    mib          INTEGER NOT NULL,
    owner_pid    INTEGER NOT NULL,
    owner_start  REAL NOT NULL,
    owner_session TEXT,
    since        REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS holds (
    user         TEXT NOT NULL,
    kernel_name  TEXT NOT NULL,
    held_s       REAL NOT NULL,
    ended        REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS cgroups (
    kernel_id    TEXT PRIMARY KEY,
    uid          INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS peaks_recorded ON peaks (recorded)
"""  # meta: settle_until, while a re-created file settles (ledger_file.LedgerFile._recreate); peaks: one row per
# kernel process (run: its pid and start time) with the peak GPU memory it reached, the quota it teaches and whether
# it ran out of memory (history.Run; need_mib and failed came later, like waiters.cards); peaks_recorded
# keeps the age and MAX_ROWS pruning of every record_peak an index walk (2 ms at 200,000 rows, 290 ms without);
# notices, barred: a teacher's rulings (notices.py; the notices' owner, bound, deadline and outcome columns came
# later, like waiters.cards); parked: the host memory parked kernels' GPU state takes, host-wide (Ledger.park);
# cgroups: the kernels' groups the broker made, with the uid whose kernel entered each (Ledger.groups_made)
_MIGRATE_FROM_1 = """
ALTER TABLE leases ADD COLUMN owner_session TEXT;
ALTER TABLE waiters ADD COLUMN owner_session TEXT
"""


class LedgerError(RuntimeError):
    """The ledger file cannot be used. The message names the file and what to do."""


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class LedgerFile:
    """One process's connection to the ledger file. Not thread-safe (one per thread)."""

    def __init__(self, path: str | os.PathLike, on_replaced: Callable[[sqlite3.Connection], int] | None = None):
        """``on_replaced(db)`` enters again what this process knew into a re-created file (inside the
        transaction) and returns how many reservations it entered."""
        self.path = Path(path)
        self.on_replaced = on_replaced
        self.replaced: str | None = None  # what happened the last time the file was re-created under this process
        self._db: sqlite3.Connection | None = None
        self._lock: TextIO | None = None
        self._files: dict[str, tuple[int, int]] = {}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._open_lock()
            self._lock_held()  # one process at a time turns a new file to WAL: SQLite does not wait for that
            try:
                self._open_db()
            finally:
                assert self._lock is not None
                fcntl.flock(self._lock, fcntl.LOCK_UN)
            with self.tx():
                self._create_schema()
        except LedgerError:
            self.close()
            raise
        except (sqlite3.Error, OSError) as e:
            self.close()
            raise LedgerError(
                f"The GPU ledger {self.path} cannot be used ({e}). It holds the reservations of running "
                "kernels, so it was left as it is. If it is damaged, stop the Jupyter servers of this host, "
                f"move it aside (mv {self.path} {self.path}.bad) and start them again; or point "
                "GpuShareApp.ledger_path at a file on a local disk that this user can write."
            ) from e

    # -- the files -----------------------------------------------------------------------------------------

    @property
    def _lock_path(self) -> str:
        return str(self.path) + ".lock"

    def _open_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()
        self._lock = open(self._lock_path, "a+")

    def _open_db(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        db.row_factory = sqlite3.Row
        self._db = db
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"The GPU ledger {self.path} was written by a newer jupyter-gpushare (schema {version}, "
                f"this one knows {SCHEMA_VERSION}). Upgrade jupyter-gpushare on every server of this host."
            )
        self._files = {}

    def _create_schema(self) -> None:
        db = self._db
        assert db is not None
        version = db.execute("PRAGMA user_version").fetchone()[0]  # again, under the lock
        exists = db.execute("SELECT 1 FROM sqlite_master WHERE name='leases'").fetchone()
        for statement in filter(str.strip, (_MIGRATE_FROM_1 if exists and version == 1 else "").split(";")):
            db.execute(statement)
        for statement in filter(str.strip, _SCHEMA.split(";")):
            db.execute(statement)
        columns = {r[1] for r in db.execute("PRAGMA table_info(waiters)")}
        if "cards" not in columns:  # a file of an older release
            db.execute("ALTER TABLE waiters ADD COLUMN cards TEXT NOT NULL DEFAULT ''")
        if "ages_from" not in columns:
            db.execute("ALTER TABLE waiters ADD COLUMN ages_from REAL")
        if "need_mib" not in {r[1] for r in db.execute("PRAGMA table_info(peaks)")}:
            db.execute("ALTER TABLE peaks ADD COLUMN need_mib INTEGER")
            db.execute("ALTER TABLE peaks ADD COLUMN failed INTEGER NOT NULL DEFAULT 0")
        have = {r[1] for r in db.execute("PRAGMA table_info(notices)")}
        for name, kind in NOTICE_COLUMNS_ADDED:
            if name not in have:
                db.execute(f"ALTER TABLE notices ADD COLUMN {name} {kind}")
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _lock_held(self) -> None:
        """Take the flock of the lock file that is at the path now (a removed lock file would let two
        processes each hold a lock of their own)."""
        while True:
            assert self._lock is not None
            fcntl.flock(self._lock, fcntl.LOCK_EX)
            st = os.fstat(self._lock.fileno())
            if _identity(self._lock_path) == (st.st_dev, st.st_ino):
                return
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._open_lock()

    def _changed(self) -> str | None:
        """Why the files this process opened are no longer the ones at the path, or None."""
        for suffix, ident in self._files.items():
            now = _identity(str(self.path) + suffix)
            if now != ident:
                return f"{self.path}{suffix} was {'removed' if now is None else 'replaced'}"
        return None

    def _remember_files(self) -> None:
        for suffix in _FILES:  # the -wal and -shm files exist once a connection has used the database
            if suffix not in self._files:
                ident = _identity(str(self.path) + suffix)
                if ident is not None:
                    self._files[suffix] = ident

    def _recreate(self, why: str) -> None:
        """Under the lock: open the file at the path anew and enter again what this process knew, and the learned
        peaks its connection can still read in the file that was removed (history.py: what notebooks taught)."""
        peaks = self._old_peaks()
        self._open_db()
        db = self._db
        assert db is not None
        db.execute("BEGIN IMMEDIATE")
        try:
            self._create_schema()
            entered = self.on_replaced(db) if self.on_replaced else 0
            db.executemany(
                f"INSERT OR IGNORE INTO peaks ({PEAK_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                peaks,
            )
            until = time.time() + SETTLE_S
            db.execute(
                "INSERT INTO meta (key, value) VALUES ('settle_until', ?) ON CONFLICT(key) DO UPDATE SET "
                "value=max(CAST(value AS REAL), excluded.value)",
                (until,),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.replaced = (
            f"{why} while this process used it (at {time.strftime('%H:%M:%S')}); it entered again the "
            f"{entered} reservation(s) it knew and {len(peaks)} recorded peak(s), and new reservations waited "
            f"{SETTLE_S:.0f} s for the other servers to do the same"
        )
        log.warning("jupyter-gpushare: the GPU ledger %s.", self.replaced)

    def _old_peaks(self) -> list[tuple]:
        """The peaks table of the file this process had open (removed from the path, still readable through its
        open connection), or [] when it cannot be read."""
        if self._db is None:
            return []
        try:
            return [tuple(r) for r in self._db.execute(f"SELECT {PEAK_COLUMNS} FROM peaks")]
        except sqlite3.Error:
            return []

    # -- transactions --------------------------------------------------------------------------------------

    def _fail(self, e: BaseException) -> LedgerError:
        return LedgerError(
            f"The GPU ledger {self.path} cannot be used now ({e}). Kernels start without a GPU until it can; "
            f"free space on its disk (df -h {self.path.parent}) or fix its permissions. Nothing in it was changed."
        )

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``) under the flock, on the file that is at the path now."""
        try:
            self._lock_held()
        except OSError as e:
            raise self._fail(e) from e
        try:
            why = self._changed()
            if why:
                self._recreate(why)
            db = self._db
            assert db is not None
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # a failed statement may have rolled it back already
                raise
            db.execute("COMMIT")
            self._remember_files()
        except (sqlite3.Error, OSError) as e:
            raise self._fail(e) from e
        finally:
            assert self._lock is not None
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """The connection, for reads; the file is re-opened first if it was replaced."""
        if self._changed():
            with self.tx():
                pass
        assert self._db is not None
        try:
            yield self._db
        except (sqlite3.Error, OSError) as e:
            raise self._fail(e) from e

    def settle_until(self, db: sqlite3.Connection) -> float:
        """Until when new reservations wait (a re-created file), as a Unix time; 0 when they need not."""
        row = db.execute("SELECT value FROM meta WHERE key='settle_until'").fetchone()
        return float(row[0]) if row else 0.0

    def close(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
            self._db = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None


# -- read-only access (status and doctor) ------------------------------------------------------------


def open_readonly(path: str | os.PathLike) -> sqlite3.Connection:
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


def check_ledger(path: str | os.PathLike) -> dict:
    """Health of a ledger file, read-only: SQLite's integrity_check, schema version, journal mode, counts, and
    whether it was re-created under running servers recently (it is then settling)."""
    db = open_readonly(path)
    try:
        integrity = [r[0] for r in db.execute("PRAGMA integrity_check")]
        has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone()
        settle = db.execute("SELECT value FROM meta WHERE key='settle_until'").fetchone() if has_meta else None
        return {
            "path": str(path),
            "integrity": "ok" if integrity == ["ok"] else "; ".join(integrity[:5]),
            "schema": db.execute("PRAGMA user_version").fetchone()[0],
            "journal_mode": db.execute("PRAGMA journal_mode").fetchone()[0],
            "leases": db.execute("SELECT count(*) FROM leases").fetchone()[0],
            "waiters": db.execute("SELECT count(*) FROM waiters").fetchone()[0],
            "recreated_until": float(settle[0]) if settle else None,
        }
    finally:
        db.close()
