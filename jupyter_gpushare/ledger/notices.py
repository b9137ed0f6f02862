"""A teacher's rulings on the host's line and reservations: what each does to the ledger's rows at once, the notice
that tells the kernel's server, and what the ledger's owner (the broker) carries out itself when that server does not.

Owns the ``notices`` and ``barred`` tables. An admin (the host view's ``admin``: the broker's admins, or the owner of
a ledger file) acts on any kernel of the host:

- ``front``: a kernel in line moves to the front (its ticket before every other's); it is served first where it
  fits, under the line's rules. Done at once.
- ``remove``: a kernel in line is taken out of it, at once, here: its place is gone whatever its server does, and
  the kernel may not join the line again for ``barred_s`` (``reserve`` refuses it with the teacher's words, code
  ``taken-out``). Its server ends its wait and the kernel runs on without a GPU.
- ``release``: a kernel's reservation is to be given back. Its server parks it where it can (its state kept), else
  restarts it; it has until the notice's ``deadline`` (RELEASE_WITHIN_S). Past it, the ledger's owner releases the
  lease itself (``overdue``) and treats what the kernel's processes still hold as use without a lease (the broker:
  broker/unleased.py, no adoption for them).

A notice is bound to the kernel it was written for: its id, the server that held it then (owner columns) and the
creation of the lease or place in line it was about (``bound``). Only that server takes it (``take``), and not once
the kernel holds a newer lease or place than the one ruled on. Every ruling keeps its outcome (``done``, ``outcome``)
for the admin's view for NOTICES_KEPT_S.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sqlite3
from dataclasses import dataclass

from ..core.policy import PolicyError
from ..host.procs import Owner
from . import parked
from .estimate import record_holds
from .leases import Lease
from .rows import end_waits, lease_of, owner_columns, owner_of

ACTIONS = ("front", "remove", "release")
WHY_MAX = 200  # characters of a teacher's reason
# A teacher's reason, shown to the student: one line of printable text (no control, line-separator,
# bidirectional-override or lone-surrogate characters), as the broker and the server's API both check it
WHY = re.compile(r"[^\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]{0,200}")
NOTICES_KEPT_S = 24 * 3600.0  # a ruling is kept this long (its notice, if no server took it, then dropped)
RELEASE_WITHIN_S = 10.0  # a release's server parks or restarts the kernel within this, or the broker releases it
BARRED_S = 600.0  # a kernel taken out of line may not join it again for this long (GpuShareApp.taken_out_for)
RULINGS_SHOWN = 50  # the most recent rulings an admin's view lists

# Outcomes (``outcome``): what became of a ruling, for the admin's view and the log.
DONE = "done"  # front and remove: carried out by the ledger at once
BY_SERVER = "released by its server"  # a release its server carried out before the deadline
BY_BROKER = "released at the deadline"  # a release the ledger's owner carried out itself
GONE = "gone"  # the kernel gave its reservation back otherwise (shut down) before the deadline


class NoSuchKernel(LookupError):
    """The action's kernel is not where the action needs it (in line, or holding a reservation)."""


class TakenOut(LookupError):
    """A kernel a teacher took out of line asks to join it again too soon (``reserve`` turns it into a refusal)."""

    def __init__(self, by: str, why: str, until: float) -> None:
        super().__init__(by, why, until)
        self.by, self.why, self.until = by, why, until

    def refusal(self, now: float) -> PolicyError:
        """The refusal a student reads (code ``taken-out``): who, why, and when the kernel may join again."""
        wait_s = max(1, round(self.until - now))
        said = f": {self.why}" if self.why else ""
        return PolicyError(
            f"{self.by} took this kernel out of the GPU line{said}. It may join the line again in "
            f"{math.ceil(wait_s / 60)} min; until then its cells run without a GPU. Ask {self.by} if it needs the "
            "GPU sooner.",
            "taken-out", by=self.by, why=self.why, wait_s=wait_s,
        )  # fmt: skip


@dataclass(frozen=True)
class Notice:
    kernel_id: str
    action: str
    by: str
    why: str
    at: float
    user: str = ""  # the kernel's user
    deadline: float | None = None  # a release: when the ledger's owner releases it itself
    taken: float | None = None  # when its server took the notice
    done: float | None = None  # when the ruling took effect
    outcome: str = ""  # what became of it (DONE, BY_SERVER, BY_BROKER, GONE; "" while pending)

    def to_json(self) -> dict:
        return {
            "kernel_id": self.kernel_id, "action": self.action, "by": self.by, "why": self.why, "at": self.at,
            "user": self.user, "deadline": self.deadline, "taken": self.taken, "done": self.done,
            "outcome": self.outcome,
        }  # fmt: skip

    @classmethod
    def from_json(cls, d: dict) -> Notice:
        def when(key: str) -> float | None:
            return None if d.get(key) is None else float(d[key])

        return cls(
            str(d["kernel_id"]), str(d["action"]), str(d["by"]), str(d["why"]), float(d["at"]), str(d.get("user", "")),
            when("deadline"), when("taken"), when("done"), str(d.get("outcome", "")),
        )  # fmt: skip


_COLUMNS = "kernel_id, action, by, why, at, user, deadline, taken, done, outcome"


def _notice(row: sqlite3.Row | tuple) -> Notice:
    return Notice(*row)


def act(
    db: sqlite3.Connection, kernel_id: str, action: str, by: str, why: str, now: float, barred_s: float = BARRED_S
) -> Notice:
    """Carry ``action`` out on ``kernel_id`` and leave its notice, bound to the server that holds the kernel now.
    NoSuchKernel when the kernel is not in line (front, remove) or holds no reservation (release); ValueError for an
    action that does not exist."""
    if action not in ACTIONS:
        raise ValueError(f"{action!r} is not an action; one of {', '.join(ACTIONS)}")
    table = "leases" if action == "release" else "waiters"
    row = db.execute(f"SELECT * FROM {table} WHERE kernel_id=?", (kernel_id,)).fetchone()
    if row is None:
        where = "holds no GPU reservation" if action == "release" else "is not in line"
        raise NoSuchKernel(f"Kernel {kernel_id} {where} now.")
    why, deadline, done, outcome = why[:WHY_MAX], None, None, ""
    if action == "front":
        first = db.execute("SELECT min(ticket) FROM waiters").fetchone()[0]
        db.execute("UPDATE waiters SET ticket=? WHERE kernel_id=?", (first - 1, kernel_id))
        done, outcome = now, DONE
    elif action == "remove":
        end_waits(db, "kernel_id=?", (kernel_id,), now)
        db.execute(
            "INSERT INTO barred (kernel_id, user, by, why, until) VALUES (?,?,?,?,?) ON CONFLICT(kernel_id) DO UPDATE "
            "SET user=excluded.user, by=excluded.by, why=excluded.why, until=excluded.until",
            (kernel_id, row["user"], by, why, now + barred_s),
        )
        done, outcome = now, DONE
    else:
        deadline = now + RELEASE_WITHIN_S
    kernel = (row["kernel_pid"], row["kernel_start"]) if action == "release" else (None, None)
    db.execute(
        "INSERT INTO notices (kernel_id, action, by, why, at, user, owner_pid, owner_start, owner_session, bound,"
        " deadline, done, outcome, kernel_pid, kernel_start) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (kernel_id, action, by, why, now, row["user"], *owner_columns(owner_of(row)), row["created"], deadline, done,
         outcome, *kernel),
    )  # fmt: skip
    return Notice(kernel_id, action, by, why, now, row["user"], deadline, None, done, outcome)


def barred(db: sqlite3.Connection, kernel_id: str, now: float) -> None:
    """TakenOut if a teacher took ``kernel_id`` out of line less than its bar ago."""
    row = db.execute("SELECT by, why, until FROM barred WHERE kernel_id=? AND until > ?", (kernel_id, now)).fetchone()
    if row is not None:
        raise TakenOut(row[0], row[1], row[2])


def take(
    db: sqlite3.Connection, kernel_ids: set[str], owner: Owner | None, now: float, user: str | None = None
) -> list[Notice]:
    """The notices for these kernels written for ``owner`` (None: any holder) and, with ``user``, that user's kernels,
    oldest first, each given once. A notice about a lease or place in line older than the kernel's present one is dropped
    untaken: it was about a kernel that is no longer there."""
    forget(db, now)
    found, stale = [], []
    rows = db.execute(
        f"SELECT rowid, {_COLUMNS}, owner_pid, owner_start, owner_session, bound FROM notices WHERE taken IS NULL "
        "ORDER BY rowid"
    ).fetchall()
    for row in rows:
        if row["kernel_id"] not in kernel_ids or (user is not None and row["user"] != user):
            continue
        if owner is not None and row["owner_pid"] is not None and owner_of(row) != owner:
            continue  # another server's (another user's kernel that had this id once, or another of this user's)
        now_held = db.execute(
            "SELECT created FROM leases WHERE kernel_id=? UNION ALL SELECT created FROM waiters WHERE kernel_id=?",
            (row["kernel_id"], row["kernel_id"]),
        ).fetchone()
        if row["bound"] is not None and now_held is not None and now_held[0] > row["bound"]:
            stale.append(row["rowid"])
            continue
        found.append(row)
    db.executemany(
        "UPDATE notices SET taken=? WHERE rowid=?", [(now, r["rowid"]) for r in found] + [(now, r) for r in stale]
    )
    return [dataclasses.replace(_notice(tuple(r)[1:11]), taken=now) for r in found]


def released(db: sqlite3.Connection, lease: sqlite3.Row, now: float, by_server: bool) -> None:
    """The kernel's lease (its row) is given back (``by_server``: by the server that holds it, else it ended): a
    release ruled on it is done, and the kernel process it last named is the one the ruling was about."""
    kernel_seen(db, lease)
    db.execute(
        "UPDATE notices SET done=?, outcome=? WHERE kernel_id=? AND action='release' AND outcome=''",
        (now, BY_SERVER if by_server else GONE, lease["kernel_id"]),
    )


def kernel_seen(db: sqlite3.Connection, lease: sqlite3.Row) -> None:
    """A release ruled on this lease, still to be done, is about the kernel process the lease names now (it is
    about to name another, or none): that process may hold no GPU memory without a lease afterwards."""
    if lease["kernel_pid"] is not None:
        db.execute(
            "UPDATE notices SET kernel_pid=?, kernel_start=? WHERE kernel_id=? AND action='release' AND outcome=''",
            (lease["kernel_pid"], lease["kernel_start"], lease["kernel_id"]),
        )


def ruled_away(db: sqlite3.Connection, now: float) -> tuple[dict[str, str], dict[int, tuple[float, str]]]:
    """What a teacher released in the last day, and who: the kernel ids, and the kernel processes they named (pid ->
    start time, who)."""
    kernels: dict[str, str] = {}
    processes: dict[int, tuple[float, str]] = {}
    rows = db.execute(
        "SELECT kernel_id, by, kernel_pid, kernel_start FROM notices WHERE action='release' AND at >= ?",
        (now - NOTICES_KEPT_S,),
    )
    for kernel_id, by, pid, start in rows:
        kernels[kernel_id] = by
        if pid is not None:
            processes[pid] = (start, by)
    return kernels, processes


def overdue(db: sqlite3.Connection, now: float) -> list[tuple[Notice, Lease]]:
    """Releases past their deadline whose lease is still held, each with its lease: the leases are removed here
    (their holds recorded, estimate.py) and each ruling is marked done by the ledger's owner, which then deals with
    what the kernels' processes still hold (the broker: broker/unleased.py)."""
    rows = db.execute(
        f"SELECT rowid, {_COLUMNS}, bound FROM notices WHERE action='release' AND outcome='' AND deadline <= ?", (now,)
    ).fetchall()
    out = []
    for row in rows:
        lease = db.execute("SELECT * FROM leases WHERE kernel_id=?", (row["kernel_id"],)).fetchone()
        if lease is None or (row["bound"] is not None and lease["created"] != row["bound"]):
            db.execute("UPDATE notices SET done=?, outcome=? WHERE rowid=?", (now, GONE, row["rowid"]))
            continue
        kernel_seen(db, lease)
        db.execute("DELETE FROM leases WHERE kernel_id=?", (row["kernel_id"],))
        parked.drop(db, row["kernel_id"])
        db.execute("UPDATE notices SET done=?, outcome=? WHERE rowid=?", (now, BY_BROKER, row["rowid"]))
        out.append((dataclasses.replace(_notice(tuple(row)[1:11]), done=now, outcome=BY_BROKER), lease_of(lease)))
    record_holds(db, [lease for _, lease in out], now)
    return out


def due(db: sqlite3.Connection, now: float) -> bool:
    """Whether a release not yet done is past its deadline."""
    soonest = db.execute("SELECT min(deadline) FROM notices WHERE action='release' AND outcome=''").fetchone()[0]
    return soonest is not None and soonest <= now


def recent(db: sqlite3.Connection, now: float) -> list[Notice]:
    """The last rulings, newest first (the admin's view)."""
    rows = db.execute(
        f"SELECT {_COLUMNS} FROM notices WHERE at >= ? ORDER BY rowid DESC LIMIT ?",
        (now - NOTICES_KEPT_S, RULINGS_SHOWN),
    )
    return [_notice(tuple(r)) for r in rows]


def forget(db: sqlite3.Connection, now: float) -> None:
    """Rulings and bars past their time."""
    db.execute("DELETE FROM notices WHERE at < ?", (now - NOTICES_KEPT_S,))
    db.execute("DELETE FROM barred WHERE until < ?", (now,))
