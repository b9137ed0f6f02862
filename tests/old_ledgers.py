"""What an old release wrote, for the tests of upgrades (ledger, history)."""

V1_SCHEMA = """
CREATE TABLE leases (kernel_id TEXT PRIMARY KEY, card_uuid TEXT NOT NULL, card_index INTEGER NOT NULL,
    quota_mib INTEGER NOT NULL, reserve_mib INTEGER NOT NULL, user TEXT NOT NULL DEFAULT '',
    kernel_name TEXT NOT NULL DEFAULT '', owner_pid INTEGER NOT NULL, owner_start REAL NOT NULL,
    kernel_pid INTEGER, kernel_start REAL, created REAL NOT NULL);
CREATE TABLE waiters (ticket INTEGER PRIMARY KEY AUTOINCREMENT, kernel_id TEXT NOT NULL UNIQUE,
    quota TEXT NOT NULL, user TEXT NOT NULL DEFAULT '', kernel_name TEXT NOT NULL DEFAULT '',
    owner_pid INTEGER NOT NULL, owner_start REAL NOT NULL, created REAL NOT NULL, heartbeat REAL NOT NULL);
PRAGMA user_version=1;
"""
