"""The ledger's rows read as values (a lease, a kernel in line, their owner; the line in order, what a user holds,
what each card has reserved), and read-only access to a ledger file for `jupyter gpushare status` and `doctor`
(no transaction, no reaping)."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable, Sequence

from ..core.history import MAX_ROWS, ROWS_PER_USER, RUNS_KEPT, HistoryRules, Run, notebooks
from ..core.policy import CardView, Policy, PolicyError, Size, UserLimits, parse_size
from ..host.gpu import Card
from ..host.procs import Owner, ProcessRef, SessionRef
from .file import PEAK_COLUMNS, open_readonly
from .leases import ADOPTED, Lease, Waiter, Waiting
from .queue import Entry, Request


def owner_of(row: sqlite3.Row) -> Owner:
    if "owner_session" in row.keys() and row["owner_session"]:  # (read_ledger may read a schema-1 file)
        return SessionRef(row["owner_session"])
    return ProcessRef(row["owner_pid"], row["owner_start"])


def owner_columns(owner: Owner) -> tuple[int, float, str | None]:
    """(owner_pid, owner_start, owner_session) for a row."""
    if isinstance(owner, SessionRef):
        return 0, 0.0, owner.id
    return owner.pid, owner.start, None


def waiter_of(r: sqlite3.Row) -> Waiter:
    try:
        quota: Size | None = parse_size(r["quota"])
    except PolicyError:  # never written by this code: shown as unknown
        quota = None
    return Waiter(r["ticket"], r["kernel_id"], quota, r["user"], r["kernel_name"], owner_of(r), r["created"])


def lease_of(row: sqlite3.Row) -> Lease:
    kernel = ProcessRef(row["kernel_pid"], row["kernel_start"]) if row["kernel_pid"] else None
    return Lease(
        kernel_id=row["kernel_id"],
        card_uuid=row["card_uuid"],
        card_index=row["card_index"],
        quota_mib=row["quota_mib"],
        reserve_mib=row["reserve_mib"],
        user=row["user"],
        kernel_name=row["kernel_name"],
        owner=owner_of(row),
        kernel=kernel,
        created=row["created"],
    )


# -- read-only access (status and doctor) ------------------------------------------------------------


def line_of(db: sqlite3.Connection) -> list[Entry]:
    """The queue, in order; a row whose quota cannot be read (never written by this code) holds no one back."""
    line = []
    for r in db.execute("SELECT * FROM waiters ORDER BY ticket"):
        try:
            quota = parse_size(r["quota"], "a waiter's quota")
        except PolicyError:
            continue
        cards = frozenset(filter(None, (r["cards"] or "").split(",")))
        ages = r["ages_from"] if "ages_from" in r.keys() else None  # (a file no server of this release opened)
        line.append(Entry(r["ticket"], r["kernel_id"], quota, r["user"], r["created"], cards, ages))
    return line


def held_by(
    db: sqlite3.Connection, user: str, kernel_id: str, line: Sequence[Entry], cards: Sequence[Card]
) -> list[int]:
    """The quotas a user holds (leases) and asks for (kernels in line, on the largest card), but for
    ``kernel_id``'s own: what per-user limits count."""
    held = [r[0] for r in db.execute("SELECT quota_mib FROM leases WHERE user=?", (user,))]
    biggest = max((c.total_mib for c in cards), default=0)
    return held + [e.quota.resolve(biggest) for e in line if e.user == user and e.kernel_id != kernel_id]


def reserved_by_card(db: sqlite3.Connection) -> dict[str, int]:
    rows = db.execute("SELECT card_uuid, SUM(quota_mib + reserve_mib) FROM leases GROUP BY card_uuid")
    return {uuid: int(total) for uuid, total in rows}


def enter_leases(db: sqlite3.Connection, leases: Iterable[Lease]) -> None:
    """Enter leases as they are, each that the file does not have already (a re-created file: Ledger._enter_known)."""
    for lease in leases:
        kernel = lease.kernel
        db.execute(
            "INSERT OR IGNORE INTO leases (kernel_id, card_uuid, card_index, quota_mib, reserve_mib, user, kernel_name,"
            " owner_pid, owner_start, owner_session, kernel_pid, kernel_start, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (lease.kernel_id, lease.card_uuid, lease.card_index, lease.quota_mib, lease.reserve_mib, lease.user,
             lease.kernel_name, *owner_columns(lease.owner), kernel.pid if kernel else None,
             kernel.start if kernel else None, lease.created),
        )  # fmt: skip


def adopt_row(
    db: sqlite3.Connection,
    kernel_id: str,
    user: str,
    card: Card,
    mib: int,
    process: ProcessRef,
    room_mib: int,
    limits: UserLimits | None,
) -> Lease | None:
    """The adopted lease of ``process`` (Ledger.adopt): the one it already has, else a new one of ``mib`` where
    the card's reservations leave ``room_mib`` for it and ``limits`` allow it; None otherwise, and for a lease of
    that name that is not this very process's adoption."""
    row = db.execute("SELECT * FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone()
    if row:
        lease = lease_of(row)
        return lease if lease.adopted and lease.kernel == process and lease.owner == process else None
    if reserved_by_card(db).get(card.uuid, 0) + mib > room_mib:
        return None
    if limits is not None:
        held = [r[0] for r in db.execute("SELECT quota_mib FROM leases WHERE user=?", (user,))]
        try:
            limits.check(user, mib, card.total_mib, held)
        except PolicyError:
            return None
    db.execute(
        "INSERT INTO leases (kernel_id, card_uuid, card_index, quota_mib, reserve_mib, user, kernel_name,"
        " owner_pid, owner_start, owner_session, kernel_pid, kernel_start, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (kernel_id, card.uuid, card.index, mib, 0, user, ADOPTED, *owner_columns(process), process.pid, process.start,
         time.time()),
    )  # fmt: skip
    return lease_of(db.execute("SELECT * FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone())


def record_run(db: sqlite3.Connection, lease: Lease, path: str, run: Run, rules: HistoryRules, now: float) -> None:
    """A run's figures for the lease's kernel process (one row per process: a second call replaces it), then runs
    past the rules' age and the row bounds forgotten (history.RUNS_KEPT, ROWS_PER_USER, MAX_ROWS)."""
    key = f"{lease.kernel.pid}:{lease.kernel.start}" if lease.kernel else ""
    db.execute(
        f"INSERT OR REPLACE INTO peaks ({PEAK_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
        (lease.kernel_id, key, lease.user, lease.kernel_name, path, run.peak_mib, lease.reserved_mib, now)
        + (run.need_mib, int(run.failed)),
    )
    db.execute("DELETE FROM peaks WHERE recorded < ?", (now - rules.max_age_s,))
    newest = "SELECT rowid FROM peaks WHERE {} ORDER BY recorded DESC LIMIT -1 OFFSET ?"
    db.execute(
        f"DELETE FROM peaks WHERE rowid IN ({newest.format('user=? AND kernel_name=? AND path=?')})",
        (lease.user, lease.kernel_name, path, RUNS_KEPT),
    )
    db.execute(f"DELETE FROM peaks WHERE rowid IN ({newest.format('user=?')})", (lease.user, ROWS_PER_USER))
    db.execute(f"DELETE FROM peaks WHERE rowid IN ({newest.format('1')})", (MAX_ROWS,))


def notebooks_in(db: sqlite3.Connection, since: float, user: str | None = None) -> list[dict]:
    """The notebooks with runs recorded since ``since``: every user's, or ``user``'s only (read by its index: one
    student's view never reads the others' rows)."""
    query = "SELECT user, kernel_name, path, peak_mib, need_mib, failed, recorded FROM peaks WHERE recorded >= ?"
    args: tuple = (since,)
    if user is not None:
        query, args = query + " AND user = ?", (since, user)
    rows = db.execute(query, args).fetchall()
    return notebooks((r[0], r[1], r[2], Run(r[3], r[4], bool(r[5])), r[6]) for r in rows)


def read_notebooks(path: str | os.PathLike, rules: HistoryRules) -> list[dict]:
    """The notebooks with recorded runs in a ledger file, read without writing to it ([] before any was)."""
    db = open_readonly(path)
    try:
        return notebooks_in(db, time.time() - rules.max_age_s)
    except sqlite3.OperationalError:  # a file without the peaks table (or its newer columns)
        return []
    finally:
        db.close()


def read_ledger(path: str | os.PathLike) -> tuple[list[Lease], list[Waiter]]:
    """Leases and waiters of a ledger file, read without writing to it (no reaping)."""
    db = open_readonly(path)
    try:
        leases = [lease_of(r) for r in db.execute("SELECT * FROM leases ORDER BY created")]
        waiters = [waiter_of(r) for r in db.execute("SELECT * FROM waiters ORDER BY ticket")]
        return leases, waiters
    finally:
        db.close()


def exact_quota(quota: Size) -> str:
    """A quota as the ledger keeps it for kernels in line: exact, and read back by parse_size."""
    if quota.percent is not None:
        return f"{quota.percent:.9f}".rstrip("0").rstrip(".") + "%"
    return f"{quota.mib}MiB"


def end_waits(db: sqlite3.Connection, where: str, args: tuple, now: float) -> None:
    """Take kernels out of line without a grant (timed out, stopped, shut down, abandoned), and remember when each
    of their users last left unserved: a re-join within a timeout does not age again (queue.ages_from)."""
    users = {r[0] for r in db.execute(f"SELECT user FROM waiters WHERE {where}", args)}
    db.execute(f"DELETE FROM waiters WHERE {where}", args)
    db.executemany(
        "INSERT INTO unserved (user, ended) VALUES (?, ?) ON CONFLICT(user) DO UPDATE SET ended=max(ended, excluded.ended)",
        [(u, now) for u in users],
    )


def ahead_of(line: Sequence[Entry], mine: Entry | None, since: float | None = None) -> list[Entry]:
    """The kernels ahead of ``mine`` in line (for a request not in line: all of them, or, a parked kernel's resume,
    those that joined before it gave its place up at ``since``)."""
    if mine is None and since is not None:
        return [e for e in line if e.created <= since]
    return [e for e in line if mine is None or e.ticket < mine.ticket]


def place_after(db: sqlite3.Connection, since: float | None) -> int | None:
    """The ticket of a parked kernel's resume joining the line: after the kernels that joined before its park
    (``since``), before every later one, whose tickets move up one; None (the next ticket) for any other request."""
    if since is None:
        return None
    later = [r[0] for r in db.execute("SELECT ticket FROM waiters WHERE created > ? ORDER BY ticket DESC", (since,))]
    for ticket in later:  # (highest first: the key stays unique)
        db.execute("UPDATE waiters SET ticket=? WHERE ticket=?", (ticket + 1, ticket))
    return later[-1] if later else None


def waiting_answer(
    req: Request,
    policy: Policy,
    views: Sequence[CardView],
    ahead: int,
    reason: str = "",
    expired: bool = False,
    gives_up_at: float | None = None,
    likely_at: float | None = None,
) -> Waiting:
    """A kernel not admitted (yet): its place, what it needs on the card that fits best, what is free."""
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
        reason=reason,
        expired=expired,
        gives_up_at=gives_up_at,
        likely_at=likely_at,
    )
