"""A teacher's actions on the host's line and reservations, and the notices that carry them to the kernel's server.

Owns the ``notices`` table and what each action does to the ledger's rows. An admin (the host view's ``admin``:
the broker's admins, or the owner of a ledger file) acts on any kernel of the host:

- ``front``: a kernel in line moves to the front (its ticket before every other's); it is served first where it
  fits, under the line's rules.
- ``remove``: a kernel in line is taken out of it. Its server ends its wait, and the kernel runs on without a GPU.
- ``release``: a kernel's reservation is to be given back. Its server parks it where it can (its state kept), else
  restarts it, in line: only the server that runs the kernel can stop its GPU work, so the lease stays until then.

Each action leaves a notice (the kernel, the action, who, why, when) that the kernel's server takes at its next
reconcile (``take``), acts on, and says to the student as an event with who did it and why. Who acts, and on
which kernels a server may take notices, is checked by the caller (the broker's ops, the server's handler).
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

ACTIONS = ("front", "remove", "release")
WHY_MAX = 200  # characters of a teacher's reason
# A teacher's reason, shown to the student: one line of printable text (no control, line-separator,
# bidirectional-override or lone-surrogate characters), as the broker and the server's API both check it
WHY = re.compile(r"[^\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]{0,200}")
NOTICES_KEPT_S = 24 * 3600.0  # a notice no server took (its kernel is gone) is dropped after this


class NoSuchKernel(LookupError):
    """The action's kernel is not where the action needs it (in line, or holding a reservation)."""


@dataclass(frozen=True)
class Notice:
    kernel_id: str
    action: str
    by: str
    why: str
    at: float

    def to_json(self) -> dict:
        return {"kernel_id": self.kernel_id, "action": self.action, "by": self.by, "why": self.why, "at": self.at}

    @classmethod
    def from_json(cls, d: dict) -> Notice:
        return cls(str(d["kernel_id"]), str(d["action"]), str(d["by"]), str(d["why"]), float(d["at"]))


def act(db: sqlite3.Connection, kernel_id: str, action: str, by: str, why: str, now: float) -> Notice:
    """Carry ``action`` out on ``kernel_id`` and leave its notice. NoSuchKernel when the kernel is not in line
    (front, remove) or holds no reservation (release); ValueError for an action that does not exist."""
    if action not in ACTIONS:
        raise ValueError(f"{action!r} is not an action; one of {', '.join(ACTIONS)}")
    if action == "release":
        if db.execute("SELECT 1 FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone() is None:
            raise NoSuchKernel(f"Kernel {kernel_id} holds no GPU reservation now.")
    else:
        if db.execute("SELECT 1 FROM waiters WHERE kernel_id=?", (kernel_id,)).fetchone() is None:
            raise NoSuchKernel(f"Kernel {kernel_id} is not in line now.")
    if action == "front":
        first = db.execute("SELECT min(ticket) FROM waiters").fetchone()[0]
        db.execute("UPDATE waiters SET ticket=? WHERE kernel_id=?", (first - 1, kernel_id))
    notice = Notice(kernel_id, action, by, why[:WHY_MAX], now)
    db.execute(
        "INSERT INTO notices (kernel_id, action, by, why, at) VALUES (?,?,?,?,?)",
        (notice.kernel_id, notice.action, notice.by, notice.why, notice.at),
    )
    return notice


def take(db: sqlite3.Connection, kernel_ids: set[str], now: float) -> list[Notice]:
    """The notices for these kernels, oldest first, taken (each is given once); old ones nobody took dropped."""
    db.execute("DELETE FROM notices WHERE at < ?", (now - NOTICES_KEPT_S,))
    found = [
        Notice(*row)
        for row in db.execute("SELECT kernel_id, action, by, why, at FROM notices ORDER BY rowid")
        if row[0] in kernel_ids
    ]
    db.executemany("DELETE FROM notices WHERE kernel_id=? AND at=?", [(n.kernel_id, n.at) for n in found])
    return found
