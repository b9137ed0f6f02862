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

import dataclasses
import math
import os
import sqlite3
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from ..core.history import HistoryRules, Learned, Run, choose_peak
from ..core.policy import CardView, Policy, PolicyError, UserLimits, format_mib
from ..host.gpu import Card, DeviceSample
from ..host.procs import Owner, ProcessRef, SessionRef
from . import notices, parked
from .attribution import unreserved_use
from .estimate import PastHolds, likely_at, record_holds
from .file import LedgerError, LedgerFile, check_ledger
from .leases import Lease, Waiter, Waiting
from .notices import Notice
from .queue import Entry, Request, ages_from, check_waiting, choose_card
from .rows import (
    adopt_row,
    ahead_of,
    end_waits,
    enter_leases,
    exact_quota,
    held_by,
    lease_of,
    line_of,
    notebooks_in,
    owner_columns,
    owner_of,
    place_after,
    read_ledger,
    read_notebooks,
    record_run,
    reserved_by_card,
    waiter_of,
    waiting_answer,
)

__all__ = [
    "Lease", "Ledger", "LedgerError", "Owner", "ProcessRef", "Request", "SessionRef", "Waiter", "Waiting",
    "check_ledger", "read_ledger", "read_notebooks",
]  # fmt: skip

WAITER_STALE_S = 30.0  # a waiter not heard from for this long has been abandoned
LEGACY_S, LEGACY_SESSION_S = 1e8, 60.0  # a host-clock value this far ahead was written on the wall clock


def host_clock() -> float:
    """Seconds on a clock that every process of this host shares and no one steps (CLOCK_BOOTTIME: monotonic,
    counting suspend). Session expiries and waiters' heartbeats are kept on it, so a step of the wall clock
    neither reclaims a live server's leases nor keeps a dead one's."""
    return time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))


ALIVE_CACHE_S = 1.0  # how long a "still running" answer is trusted (a gone process stays gone)
REAP_EVERY_S = 1.0  # reserve() reaps at most this often, and always before it answers "no room"


class MadeGroups:
    """The kernels' cgroups the broker made (its ledger's ``cgroups`` table), each with the uid whose kernel entered
    it: what a restarted broker judges again, and nothing else on the host's cgroup tree."""

    _file: LedgerFile

    def groups_made(self) -> dict[str, int]:
        with self._file.read() as db:
            return dict(db.execute("SELECT kernel_id, uid FROM cgroups").fetchall())

    def group_made(self, kernel_id: str, uid: int | None) -> None:
        """Record the group made for ``uid`` (None: it was removed)."""
        with self._file.tx() as db:
            db.execute("DELETE FROM cgroups WHERE kernel_id=?", (kernel_id,))
            if uid is not None:
                db.execute("INSERT INTO cgroups (kernel_id, uid) VALUES (?,?)", (kernel_id, uid))


class Ledger(MadeGroups):
    """Reservations in one SQLite file, shared by every process that opens it.

    Not thread-safe: use one Ledger per thread (the manager keeps one on a worker thread).
    """

    def __init__(self, path: str | os.PathLike, owner: Owner | None = None):
        self.path = Path(path)
        self.owner = owner or ProcessRef.me()
        self._alive_until: dict[ProcessRef, float] = {}
        self._last_reap = 0.0
        self._dead: set[ProcessRef] = set()
        # Every lease this process last saw or wrote: what it enters again if the file is re-created.
        self._known: dict[str, Lease] = {}
        self._past = PastHolds()  # how long reservations were held before (estimate.py), read when it changed
        self.barred_s = notices.BARRED_S  # how long a kernel a teacher took out of line stays out of it
        self._file = LedgerFile(path, on_replaced=self._enter_known)
        with self._file.read() as db:
            self._seen(db.execute("SELECT * FROM leases").fetchall())

    @property
    def replaced(self) -> str | None:
        """What happened the last time the file was removed or replaced under this process, or None."""
        return self._file.replaced

    def outside(self, samples: Sequence[DeviceSample], leases: Sequence[Lease] | None = None) -> dict[str, int]:
        """Per card, what processes in no lease's kernel tree use (procs.unreserved_use)."""
        return unreserved_use(samples, self.leases() if leases is None else leases)

    def caller(self) -> tuple[None, bool, None]:
        """This user's own file: everything in it is theirs, and no per-user limits apply."""
        return None, True, None

    def kernel_notebooks(self) -> dict[str, str]:
        """Not kept in a file: each server names its own kernels' notebooks."""
        return {}

    def close(self) -> None:
        self._file.close()

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._file.tx()

    def _seen(self, rows: list[sqlite3.Row]) -> list[Lease]:
        """The whole leases table as just read: remembered for a re-creation."""
        leases = [lease_of(r) for r in rows]
        self._known = {lease.kernel_id: lease for lease in leases}
        return leases

    def _enter_known(self, db: sqlite3.Connection) -> int:
        """Enter the leases this process knew into a re-created file (inside its first transaction)."""
        enter_leases(db, self._known.values())
        return len(self._known)

    # -- queries ---------------------------------------------------------------------------

    def leases(self) -> list[Lease]:
        with self._file.read() as db:
            return sorted(self._seen(db.execute("SELECT * FROM leases").fetchall()), key=lambda x: x.created)

    def get(self, kernel_id: str) -> Lease | None:
        with self._file.read() as db:
            row = db.execute("SELECT * FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone()
        return lease_of(row) if row else None

    def waiters(self) -> list[Waiter]:
        with self._file.read() as db:
            return [waiter_of(r) for r in db.execute("SELECT * FROM waiters ORDER BY ticket")]

    def reserved_by_card(self) -> dict[str, int]:
        with self._file.read() as db:
            return reserved_by_card(db)

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
        """Reserve room for a kernel on the best-fitting card, in the queue's order (queue.py).

        With ``wait`` the request keeps its place in the queue until admitted or cancelled (call again to retry;
        each call is a heartbeat), for at most ``policy.queue_timeout_s``: past it, the place is given up and the
        answer says ``expired``. Without ``wait``, a request that cannot be admitted now is not queued.
        Kernels ahead in line are served first where they fit; one that fits now passes those that do not
        (backfill), except kernels that have waited ``policy.overtake_limit_s``, whose cards are kept for them.
        Idempotent: a kernel that already holds a lease gets it back.
        ``cards``: the cards this request may use (all of the caller's). ``limits``: the user's other leases and
        kernels in line (same ``req.user``) are checked in the same transaction, so no two concurrent starts of
        one user pass a per-user limit together; PolicyError says which limit, and also refuses a user's kernel
        past ``policy.max_waiting`` in line. ``outside`` (card uuid -> MiB, ``sampler.unreserved_use``) is what
        processes that hold no reservation use: it is taken as well.
        """
        now = time.time()
        uuids = sorted(c.uuid for c in cards)
        with self._tx() as db:
            reaped = now - self._last_reap >= REAP_EVERY_S
            if reaped:
                self._reap(db, now)
            row = db.execute("SELECT * FROM leases WHERE kernel_id=?", (req.kernel_id,)).fetchone()
            if row:
                return lease_of(row)
            try:
                notices.barred(db, req.kernel_id, now)
            except notices.TakenOut as e:
                raise e.refusal(now) from None
            settling = self._file.settle_until(db) - now
            line = line_of(db)
            mine = next((e for e in line if e.kernel_id == req.kernel_id), None)
            views = self._views(db, cards, outside)
            gives_up_at = (mine.created if mine else now) + policy.queue_timeout_s if wait else math.inf
            gives_up: float | None = gives_up_at if gives_up_at < math.inf else None
            if mine is not None and now >= gives_up_at:
                end_waits(db, "kernel_id=?", (req.kernel_id,), now)
                return waiting_answer(req, policy, views, len(ahead_of(line, mine)), expired=True, gives_up_at=gives_up)
            if limits is not None:  # before queueing: a request over a limit never waits
                held = held_by(db, req.user, req.kernel_id, line, cards)
                biggest = max((c.total_mib for c in cards if policy.card_allowed(c.uuid, c.index)), default=0)
                limits.check(req.user, req.quota.resolve(biggest), biggest, held)
            entry = mine or Entry(0, req.kernel_id, req.quota, req.user, now, frozenset(uuids))
            since = parked.since(db, req.kernel_id, self.owner) if mine is None else None  # a resume: parked.py
            card = choose_card(entry, ahead_of(line, mine, since), views, policy, now) if settling <= 0 else None
            if card is None and not reaped and settling <= 0:  # room held by kernels that are gone is room
                self._reap(db, now)
                line = line_of(db)
                mine = next((e for e in line if e.kernel_id == req.kernel_id), None)
                views = self._views(db, cards, outside)
                card = choose_card(entry, ahead_of(line, mine, since), views, policy, now)
            if card is None:
                if wait and mine is None:
                    check_waiting(req.user, sum(e.user == req.user for e in line), policy)
                    db.execute("DELETE FROM unserved WHERE ended < ?", (now - policy.queue_timeout_s,))
                    unserved = db.execute("SELECT ended FROM unserved WHERE user=?", (req.user,)).fetchone()
                    db.execute(
                        "INSERT INTO waiters (ticket, kernel_id, quota, user, kernel_name, owner_pid, owner_start,"
                        " owner_session, created, heartbeat, cards, ages_from) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                        (place_after(db, since), req.kernel_id, exact_quota(req.quota), req.user, req.kernel_name,
                         *owner_columns(self.owner), now, host_clock(), ",".join(uuids),
                         ages_from(now, unserved[0] if unserved else None, policy)),
                    )  # fmt: skip
                elif wait:
                    db.execute("UPDATE waiters SET heartbeat=? WHERE kernel_id=?", (host_clock(), req.kernel_id))
                reason = (
                    f"The GPU ledger {self.path} was removed or replaced while Jupyter servers used it; every "
                    f"server enters its kernels' reservations again, and new reservations resume in "
                    f"{settling:.0f} s."
                    if settling > 0
                    else ""
                )
                ahead, leases = ahead_of(line, mine, since), self._seen(db.execute("SELECT * FROM leases").fetchall())
                likely = likely_at(db, self._past, leases, entry, ahead, views, policy, now) if wait else None
                return waiting_answer(req, policy, views, len(ahead), reason, gives_up_at=gives_up, likely_at=likely)
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
                    *owner_columns(self.owner),
                    now,
                ),
            )
            db.execute("DELETE FROM waiters WHERE kernel_id=?", (req.kernel_id,))
            lease = lease_of(db.execute("SELECT * FROM leases WHERE kernel_id=?", (req.kernel_id,)).fetchone())
        self._known[lease.kernel_id] = lease
        return lease

    def act(self, kernel_id: str, action: str, by: str, why: str) -> Notice:
        with self._tx() as db:
            return notices.act(db, kernel_id, action, by, why, time.time(), self.barred_s)

    def take_notices(self, kernel_ids: set[str], user: str | None = None) -> list[Notice]:
        """The notices written for this owner's kernels among ``kernel_ids`` (notices.take), with ``user`` only
        that user's."""
        with self._file.read() as db:  # asked at every server's reconcile: a write only when there is a notice
            if db.execute("SELECT 1 FROM notices WHERE taken IS NULL LIMIT 1").fetchone() is None:
                return []
        with self._tx() as db:
            return notices.take(db, kernel_ids, self.owner, time.time(), user)

    def ruled_away(self) -> tuple[dict[str, str], dict[int, tuple[float, str]]]:
        """The kernels a teacher released in the last day and the kernel processes they named, each with who did
        (notices.ruled_away): what may hold no GPU memory without a reservation."""
        with self._file.read() as db:
            return notices.ruled_away(db, time.time())

    def rulings(self) -> list[Notice]:
        """The last rulings of the host's admins, with their outcomes, newest first (the admin's view)."""
        with self._file.read() as db:
            return notices.recent(db, time.time())

    def overdue_releases(self) -> list[tuple[Notice, Lease]]:
        """Releases a teacher ruled whose deadline passed with the lease still held: released now, here (the
        broker's part of a ruling, notices.py), each with the lease it was."""
        with self._file.read() as db:  # (asked at every reading of the broker's: a write only when one is due)
            if not notices.due(db, time.time()):
                return []
        with self._tx() as db:
            out = notices.overdue(db, time.time())
        for _, lease in out:
            self._known.pop(lease.kernel_id, None)
        return out

    def park(self, kernel_id: str, mib: int, budget_mib: int | None) -> None:
        with self._tx() as db:
            sessions = {r[0] for r in db.execute("SELECT id FROM sessions")}
            parked.reap(db, lambda owner: self._alive(owner, sessions))  # (a server that is gone holds none)
            parked.admit(db, kernel_id, mib, budget_mib, self.owner, time.time())

    def unpark(self, kernel_id: str) -> None:
        with self._tx() as db:
            parked.drop(db, kernel_id)

    def parked(self) -> dict[str, tuple[str, Owner, int]]:
        """Every parked kernel of the host (parked.on_host)."""
        with self._file.read() as db:
            return parked.on_host(db)

    def cancel_wait(self, kernel_id: str) -> None:
        with self._tx() as db:
            end_waits(db, "kernel_id=?", (kernel_id,), time.time())

    def adopt(
        self,
        kernel_id: str,
        user: str,
        card: Card,
        mib: int,
        process: ProcessRef,
        policy: Policy,
        limits: UserLimits | None = None,
        others_mib: int = 0,
    ) -> Lease | None:
        """A lease for a process that already holds ``mib`` on ``card`` without one (the broker's unleased_action
        'lease'): in ``user``'s name, owned by the process itself (reclaimed once it ends), if the card's
        reservations and ``others_mib`` (what other processes without a lease use on it, as the card says) leave
        room for it and ``limits`` allow it; None otherwise. It jumps no line: the memory is in use already, and
        admission counted it as taken; this only names its holder. A lease already under ``kernel_id`` is returned
        only if it is this very process's adoption (an adopted lease of the same pid and start time): anything else
        of that name is not this process's, and covers nothing of it."""
        with self._tx() as db:
            lease = adopt_row(
                db, kernel_id, user, card, mib, process, policy.usable_mib(card.total_mib) - others_mib, limits
            )
        if lease is not None:
            self._known[kernel_id] = lease
        return lease

    def attach(self, kernel_id: str, kernel: ProcessRef | None) -> None:
        """Record the kernel process that uses a lease (again after each restart)."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone()
            if row is not None:  # (a release ruled on it is about the process it named until now too)
                notices.kernel_seen(db, row)
            db.execute(
                "UPDATE leases SET kernel_pid=?, kernel_start=? WHERE kernel_id=?",
                (kernel.pid if kernel else None, kernel.start if kernel else None, kernel_id),
            )
        if kernel_id in self._known:
            self._known[kernel_id] = dataclasses.replace(self._known[kernel_id], kernel=kernel)

    def resize(
        self,
        kernel_id: str,
        quota_mib: int,
        policy: Policy,
        cards: Sequence[Card],
        limits: UserLimits | None = None,
        outside: Mapping[str, int] | None = None,
    ) -> Lease | None:
        """Change a kernel's reservation in place: the same lease on the same card, with ``quota_mib`` (the CUDA
        context reserve is kept). A smaller quota always fits. A larger one takes the extra from what its card has
        unreserved, ahead of the kernels in line (it holds the card already), or changes nothing and raises
        PolicyError ``grow-no-room`` with the figures. ``cards``, ``limits`` and ``outside`` as for ``reserve``.
        None when the kernel holds no reservation."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone()
            if row is None:
                return None
            lease = lease_of(row)
            extra = quota_mib - lease.quota_mib
            if extra > 0:
                card = next((c for c in cards if c.uuid == lease.card_uuid), None)
                total = card.total_mib if card else 0
                view = self._views(db, [card], outside)[0] if card else None
                free = max(0, view.room_mib(policy)) if view else 0
                if limits is not None:
                    others = "SELECT quota_mib FROM leases WHERE user=? AND kernel_id!=?"
                    limits.check(
                        lease.user, quota_mib, total, [r[0] for r in db.execute(others, (lease.user, kernel_id))]
                    )
                if extra > free:
                    raise PolicyError(
                        f"A quota of {format_mib(quota_mib)} needs {format_mib(extra)} more on its card, "
                        f"GPU {lease.card_index}, which has {format_mib(free)} unreserved now. The kernel keeps its "
                        f"{format_mib(lease.quota_mib)} quota and its card; ask again once others have shut down, or "
                        "ask for less.",
                        "grow-no-room", quota_mib=quota_mib, extra_mib=extra, free_mib=free, card_index=lease.card_index,
                    )  # fmt: skip
            db.execute("UPDATE leases SET quota_mib=? WHERE kernel_id=?", (quota_mib, kernel_id))
            lease = lease_of(db.execute("SELECT * FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone())
        self._known[kernel_id] = lease
        return lease

    def release(self, kernel_id: str) -> Lease | None:
        """Give a kernel's reservation back. Idempotent: None when it held none."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone()
            db.execute("DELETE FROM leases WHERE kernel_id=?", (kernel_id,))
            end_waits(db, "kernel_id=?", (kernel_id,), time.time())
            record_holds(db, [lease_of(row)] if row else [], time.time())
            if row:
                notices.released(db, row, time.time(), by_server=True)
        self._known.pop(kernel_id, None)
        return lease_of(row) if row else None

    def release_owned_except(self, keep: set[str]) -> list[Lease]:
        """Release this owner's leases for kernels it no longer knows (died past the restart limit)."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT * FROM leases WHERE owner_pid=? AND owner_start=? AND owner_session IS ?",
                owner_columns(self.owner),
            ).fetchall()
            gone = [r for r in rows if r["kernel_id"] not in keep]
            db.executemany("DELETE FROM leases WHERE kernel_id=?", [(r["kernel_id"],) for r in gone])
            for row in gone:
                notices.released(db, row, time.time(), by_server=False)
        for row in gone:
            self._known.pop(row["kernel_id"], None)
        return [lease_of(r) for r in gone]

    def record_peak(self, kernel_id: str, path: str, run: Run, rules: HistoryRules) -> bool:
        """Remember a run's figures (one row per kernel process: a second call for the same process replaces it),
        then forget runs past the rules' age and the row bounds (history.RUNS_KEPT, ROWS_PER_USER, MAX_ROWS)."""
        if not rules.kept:
            return False
        with self._tx() as db:
            row = db.execute("SELECT * FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone()
            if row is not None:
                record_run(db, lease_of(row), path, run, rules, time.time())
        return row is not None

    def learned_peak(self, user: str, kernel_name: str, path: str, rules: HistoryRules) -> Learned | None:
        if not rules.kept:
            return None
        with self._file.read() as db:
            rows = db.execute(
                "SELECT user, peak_mib, need_mib, failed, recorded FROM peaks"
                " WHERE kernel_name=? AND path=? AND recorded >= ?",
                (kernel_name, path, time.time() - rules.max_age_s),
            ).fetchall()
        return choose_peak([(r[0], Run(r[1], r[2], bool(r[3])), r[4]) for r in rows], user, rules)

    def notebooks(self, rules: HistoryRules, user: str | None = None) -> list[dict]:
        """Every user's notebooks with recorded runs (or ``user``'s only), and what they teach (history.notebooks),
        within the age."""
        with self._file.read() as db:
            return notebooks_in(db, time.time() - rules.max_age_s, user)

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

    def hear_waiters_within(self, seconds: float) -> None:
        """Every kernel in line must call again within ``seconds`` or leave it (a broker back from a crash: the
        waiters of servers that died meanwhile would otherwise head the line until WAITER_STALE_S)."""
        with self._tx() as db:
            db.execute("UPDATE waiters SET heartbeat=min(heartbeat, ?)", (host_clock() - WAITER_STALE_S + seconds,))

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

    def _views(
        self, db: sqlite3.Connection, cards: Sequence[Card], outside: Mapping[str, int] | None = None
    ) -> list[CardView]:
        reserved, outside = reserved_by_card(db), outside or {}
        return [CardView(c.uuid, c.index, c.total_mib, reserved.get(c.uuid, 0), outside.get(c.uuid, 0)) for c in cards]

    def _reap(self, db: sqlite3.Connection, now: float) -> list[Lease]:
        self._last_reap = now
        tick = host_clock()
        # Rows an older version wrote on the wall clock (far ahead of the host clock): from now on, host clock.
        db.execute("UPDATE sessions SET expires=? WHERE expires > ?", (tick + LEGACY_SESSION_S, tick + LEGACY_S))
        db.execute("UPDATE waiters SET heartbeat=? WHERE heartbeat > ?", (tick, tick + LEGACY_S))
        db.execute("DELETE FROM sessions WHERE expires < ?", (tick,))
        sessions = {r[0] for r in db.execute("SELECT id FROM sessions")}
        rows = db.execute("SELECT * FROM leases").fetchall()
        dead = [
            (lease, row)
            for lease, row in zip(self._seen(rows), rows)
            if not self._alive(lease.owner, sessions)
            and (lease.kernel is None or not self._alive(lease.kernel, sessions))
        ]
        db.executemany("DELETE FROM leases WHERE kernel_id=?", [(lease.kernel_id,) for lease, _ in dead])
        for lease, row in dead:
            self._known.pop(lease.kernel_id, None)
            notices.released(db, row, now, by_server=False)
        parked.reap(db, lambda owner: self._alive(owner, sessions))
        for row in db.execute("SELECT * FROM waiters").fetchall():
            if tick - row["heartbeat"] > WAITER_STALE_S or not self._alive(owner_of(row), sessions):
                end_waits(db, "ticket=?", (row["ticket"],), now)
        return [lease for lease, _ in dead]
