"""The host memory that parked kernels' GPU state takes, counted once for the whole host.

Owns the ``parked`` table: one row per kernel whose GPU state a server moved to host memory (server/parking.py),
with its user, the server that parked it and how much it takes. A park is admitted against one budget in the same
transaction that records it, so the servers of every user on a host (each with the broker's budget, or the file's
lock without a broker) never park more than the host was given for it. A row goes when the state is back on its
card or gone, and with the server that parked it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from ..core.policy import PolicyError, format_mib
from ..host.procs import Owner
from .rows import owner_columns, owner_of


def admit(db: sqlite3.Connection, kernel_id: str, mib: int, budget_mib: int | None, owner: Owner, now: float) -> None:
    """Count ``mib`` for the kernel's parked state, within ``budget_mib`` for the host (None: no bound); PolicyError
    ``park-budget`` with the figures when it does not fit. A row of another server for that kernel id stays as it
    is (PolicyError): a kernel id another user reserved after a park names no state of hers."""
    row = db.execute("SELECT * FROM parked WHERE kernel_id=?", (kernel_id,)).fetchone()
    if row is not None and owner_of(row) != owner:
        raise PolicyError(f"Kernel {kernel_id}'s GPU state was parked by another server; it is not parked again here.")
    drop(db, kernel_id)
    if budget_mib is not None:
        held = db.execute("SELECT coalesce(sum(mib), 0) FROM parked").fetchone()[0]
        if held + mib > budget_mib:
            raise PolicyError(
                f"Its {format_mib(mib)} of GPU state does not fit the host memory kept for parked kernels: "
                f"{format_mib(held)} of {format_mib(budget_mib)} is taken (GpuShareApp.park_host_budget, for the "
                "whole host). It is not parked.",
                "park-budget", parked_mib=mib, held_mib=held, budget_mib=budget_mib,
            )  # fmt: skip
    row = db.execute("SELECT user FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone()
    db.execute(
        "INSERT INTO parked (kernel_id, user, mib, owner_pid, owner_start, owner_session, since) VALUES (?,?,?,?,?,?,?)",
        (kernel_id, row[0] if row else "", mib, *owner_columns(owner), now),
    )


def since(db: sqlite3.Connection, kernel_id: str, owner: Owner) -> float | None:
    """When ``owner`` parked the kernel, or None (it is not its parked kernel): a resume's place in line."""
    row = db.execute("SELECT * FROM parked WHERE kernel_id=?", (kernel_id,)).fetchone()
    return row["since"] if row is not None and owner_of(row) == owner else None


def drop(db: sqlite3.Connection, kernel_id: str) -> None:
    db.execute("DELETE FROM parked WHERE kernel_id=?", (kernel_id,))


def on_host(db: sqlite3.Connection) -> dict[str, tuple[str, Owner, int]]:
    """Every parked kernel of the host: its user, the server that parked it and the host memory it takes."""
    return {r["kernel_id"]: (r["user"], owner_of(r), r["mib"]) for r in db.execute("SELECT * FROM parked")}


def reap(db: sqlite3.Connection, alive: Callable[[Owner], bool]) -> None:
    """The parked state of servers that are gone went with them."""
    for kernel_id, (_user, owner, _mib) in on_host(db).items():
        if not alive(owner):
            drop(db, kernel_id)
