"""The state database's schema: its tables, the migrations between versions, and opening a file with them.

Internal to `nftblockd.state`. The version is kept in `PRAGMA user_version`; `MIGRATIONS[n]` upgrades a
database at version n to n + 1. A database from a newer nftblockd, or one that holds tables but no version,
is refused (`Unusable`), never written. This module stores no ban: that is store.py's job.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeAlias

from nftblockd.events import clip_reason
from nftblockd.state.db import StoreError, Unusable, classify, connect, transaction

__all__ = ["CACHE_KIB", "HISTORY_INSERT", "MIGRATIONS", "SCHEMA_VERSION", "WAL_SIZE_LIMIT", "Synchronous",
           "label_id", "migrate", "open_file", "open_memory", "schema_version", "verify_quick"]

SCHEMA_VERSION = 4
CACHE_KIB = 16384  # page cache; random-key upserts into a million rows crawl with the 2 MiB default
WAL_SIZE_LIMIT = 32 * 1024 * 1024  # the WAL file is truncated to this after a checkpoint

Synchronous: TypeAlias = Literal["full", "normal"]


_SCHEMA_V1 = (
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE labels(id INTEGER PRIMARY KEY, blocklist TEXT NOT NULL, origin TEXT NOT NULL,"
    " reason TEXT NOT NULL, jail TEXT NOT NULL, UNIQUE(blocklist, origin, reason, jail))",
    "CREATE TABLE bans(blocklist TEXT NOT NULL, target BLOB NOT NULL, until REAL, label INTEGER NOT NULL,"
    " created REAL NOT NULL, PRIMARY KEY(blocklist, target)) WITHOUT ROWID",
    "CREATE TABLE history(at REAL NOT NULL, jail TEXT NOT NULL, target TEXT NOT NULL, until REAL,"
    " PRIMARY KEY(at, jail, target)) WITHOUT ROWID",
    "CREATE TABLE positions(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE feeds(name TEXT PRIMARY KEY, meta TEXT NOT NULL) WITHOUT ROWID",
)


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    for stmt in _SCHEMA_V1:
        conn.execute(stmt)


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    # A bulk ban (`nftblock ban -` of 100k addresses, a fail2ban import) is one row holding every packed
    # address: writing 100k rows cost ~0.7 s, one row a few ms. An unban of an address in a bulk row leaves a
    # tombstone in `bulk_dead`; a tombstone newer than a bulk row hides that address from the row.
    conn.execute("CREATE TABLE bulk(id INTEGER PRIMARY KEY, label INTEGER NOT NULL, until REAL,"
                 " created REAL NOT NULL, keylen INTEGER NOT NULL, keys BLOB NOT NULL)")
    conn.execute("CREATE TABLE bulk_dead(blocklist TEXT NOT NULL, target BLOB NOT NULL, at REAL NOT NULL,"
                 " PRIMARY KEY(blocklist, target)) WITHOUT ROWID")


def _migrate_2_to_3(conn: sqlite3.Connection) -> None:
    # Fleet mode: the outbox survives a restart while the server is away (AUTOINCREMENT: an oseq is never
    # reused, it names one event fleet-wide); the cursor lets a restarted host replay instead of snapshotting.
    conn.execute("CREATE TABLE fleet_outbox(oseq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL,"
                 " target TEXT NOT NULL, until REAL, src TEXT NOT NULL, created REAL NOT NULL,"
                 " state INTEGER NOT NULL DEFAULT 0)")
    conn.execute("CREATE INDEX fleet_outbox_state ON fleet_outbox(state, oseq)")
    conn.execute("CREATE INDEX fleet_outbox_target ON fleet_outbox(target)")
    conn.execute("CREATE TABLE fleet_cursor(fleet TEXT PRIMARY KEY, run_id TEXT NOT NULL, last_id TEXT NOT NULL)"
                 " WITHOUT ROWID")


def _migrate_3_to_4(conn: sqlite3.Connection) -> None:
    # Bulk rows with an end per address: the store compacts single-address rows (jail bans, saved one decision
    # at a time) into bulk rows so that a restart reads a few blobs instead of a million rows. NULL: every
    # address of the row ends at `until` (what every bulk row written before holds).
    conn.execute("ALTER TABLE bulk ADD COLUMN ends BLOB")


# MIGRATIONS[n] upgrades a database at version n to n + 1, inside one transaction with the version bump.
# Append, never edit: a released step is what existing databases went through.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migrate_0_to_1, _migrate_1_to_2, _migrate_2_to_3,
                                                          _migrate_3_to_4]


def _too_new(version: int) -> Unusable:
    return Unusable("too_new", f"schema version {version}; this nftblockd knows up to {SCHEMA_VERSION}")


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection) -> None:
    version = schema_version(conn)
    if version > SCHEMA_VERSION:
        raise _too_new(version)
    if version == 0:
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise Unusable("foreign", "it holds tables but no nftblockd schema version")
        # Only possible before the first table exists; lets prune() give free pages back.
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    while version < len(MIGRATIONS):
        with transaction(conn):
            MIGRATIONS[version](conn)
            version += 1
            conn.execute(f"PRAGMA user_version = {version}")


def _configure(conn: sqlite3.Connection, synchronous: Synchronous) -> None:
    conn.execute(f"PRAGMA synchronous = {'FULL' if synchronous == 'full' else 'NORMAL'}")
    conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
    conn.execute("PRAGMA temp_store = MEMORY")


def verify_quick(conn: sqlite3.Connection) -> None:
    rows = conn.execute("PRAGMA quick_check(5)").fetchall()
    if rows != [("ok",)]:
        raise Unusable("corrupt", "; ".join(str(r[0]) for r in rows))


def open_file(path: Path, synchronous: Synchronous, verify: bool) -> sqlite3.Connection:
    if path.exists() and not path.is_file():
        raise Unusable("unwritable", "it is not a regular file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Unusable("unwritable", f"cannot create {path.parent}: {exc.strerror or exc}") from None
    try:
        conn = connect(str(path))
    except sqlite3.Error as exc:
        raise Unusable(classify(exc), str(exc)) from None
    try:
        version = schema_version(conn)  # the first read: "file is not a database" shows here
        if version > SCHEMA_VERSION:
            raise _too_new(version)
        if version == 0:
            if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                # Checked before anything is written: someone else's database keeps its journal mode.
                raise Unusable("foreign", "it holds tables but no nftblockd schema version")
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before WAL writes the first page
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise Unusable("unwritable", f"cannot switch it to WAL mode (journal mode stays {mode})")
        _configure(conn, synchronous)
        migrate(conn)
        if verify:
            verify_quick(conn)
        with transaction(conn):  # proves we can write now, not at the first ban
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('last_open', ?)",
                         (repr(time.time()),))
    except Unusable:
        conn.close()
        raise
    except sqlite3.Error as exc:
        conn.close()
        raise Unusable(classify(exc), str(exc)) from None
    return conn


HISTORY_INSERT = "INSERT OR IGNORE INTO history(at, jail, target, until) VALUES "
_SQL_ADD_LABEL = "INSERT OR IGNORE INTO labels(blocklist, origin, reason, jail) VALUES(?, ?, ?, ?)"
_SQL_LABEL_ID = "SELECT id FROM labels WHERE blocklist = ? AND origin = ? AND reason = ? AND jail = ?"


def label_id(conn: sqlite3.Connection, key: tuple[str, str, str, str]) -> int:
    blocklist, origin, reason, jail = key
    key = (blocklist, origin, clip_reason(reason), clip_reason(jail))  # a client's text is bounded on disk too
    conn.execute(_SQL_ADD_LABEL, key)
    return int(conn.execute(_SQL_LABEL_ID, key).fetchone()[0])


def open_memory() -> sqlite3.Connection:
    conn = connect(":memory:")
    try:
        migrate(conn)
    except (sqlite3.Error, Unusable) as exc:  # not the database's fault: ours
        conn.close()
        raise StoreError("io", ":memory:", f"cannot create the state schema even in memory ({exc});"
                                           " this is a bug in nftblockd") from None
    return conn
