"""Durable state in one SQLite database: active bans, ban history, source positions, feed metadata.

This is the only module that imports sqlite3. It never touches the kernel, reads no config and runs no
asyncio: the daemon calls it from a worker thread (`asyncio.to_thread`). Every public method is safe to call
from any thread: one connection per `Store` (`check_same_thread=False`) guarded by one lock, so calls are
serialised, never interleaved.

What is stored (schema version `SCHEMA_VERSION`, kept in `PRAGMA user_version`, upgraded by `_MIGRATIONS`):
- `bans`: one row per (blocklist, target): `until` (epoch seconds, NULL = permanent), a `label` id and the
  time the row was `created`. The target is stored packed (`pack_target`: 4 or 16 address bytes, plus one
  prefix-length byte for ranges): packing is ~10x cheaper than printing an address and is what netlink needs.
  (origin, reason, jail) and the blocklist are interned in `labels`; reasons should therefore be templated
  ("5 failures in 10m"), not per address. The table is WITHOUT ROWID: the primary key *is* the row.
- `history`: (at, jail, target text, until) per ban a jail made, for escalation; pruned by age.
- `positions`: key -> text (file offsets as JSON, journal cursors). `feeds`: feed name -> JSON text.
- `fleet_outbox`: this host's bans and unbans for the fleet, numbered (`oseq`, never reused), with a state:
  pending (to publish), published (kept while active: re-asserted after a server lost them) or dead
  (expired, or unbanned since). `fleet_cursor`: per fleet, the server run id and the last stream id applied.

Writes: every public write is ONE transaction (`apply` can combine bans, deletions, history and positions in
one, so a position never runs ahead of the bans its lines produced). Bans are sorted by key and written with
multi-row statements (`_CHUNK` rows each), so the B-tree fills page after page; the cyclic GC is paused
during bulk work. `save_bans` is an upsert: the last call wins for a (blocklist, target); `created` keeps its
first value.

Reads for a restart: `load_active_compact(now)` (rows as SQLite returns them plus a label table) is the fast
path; `load_active_rows(now)` gives flat tuples; `load_active_bans(now)` builds `Ban` objects (slow for big
sets: an `ipaddress` object per row). Expired rows are filtered out, and deleted by `prune`.

Durability: WAL journal. `synchronous="full"` (the default) fsyncs the WAL at each commit, so an acknowledged
write survives power loss, at ~0.3-1 ms per commit on SSD/virtio (batched calls make that negligible);
`"normal"` survives a crash of the process (SIGKILL) but may lose the last commits on power loss. Either way
a crash never leaves a half-applied call or a duplicate row.

Growth: `prune(now, history_horizon)` deletes expired bans, old history and unused labels, then returns free
pages to the filesystem (`auto_vacuum=INCREMENTAL`) once they exceed `VACUUM_SHARE` of the file; the WAL file
is capped at `WAL_SIZE_LIMIT` after checkpoints.

Problems (the store keeps the daemon enforcing and says what happened, see `StoreProblem`):
- corrupt database (not a database, truncated, fails `quick_check`, or corruption met later): readable bans,
  history, positions and feed metadata are salvaged, the file (and its -wal) is renamed to
  `<name>.corrupt-<UTC time>`, and a new database is started with the salvage.
- unusable database (unwritable directory or file, disk full at open, locked, written by a newer nftblockd,
  not ours): the file is left untouched, its content is copied read-only into memory when possible, and the
  store runs in memory (`persistent` is False): changes will not survive a restart.
- a write failing later (disk full, I/O error): `StoreError` is raised; nothing of that call was stored.
"""

from __future__ import annotations

import contextlib
import gc
import ipaddress
import itertools
import json
import logging
import operator
import os
import socket
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeAlias, TypeVar

from nftblockd.events import Ban, IPNet, Origin

__all__ = [
    "SCHEMA_VERSION", "BanRow", "CompactBans", "HistoryRow", "OutboxItem", "OutboxRow", "PruneStats",
    "ReadOnlyDatabase", "Store",
    "StoreError", "StorePositions", "StoreProblem", "open_readonly", "pack_target", "target_text",
    "unpack_target",
]

log = logging.getLogger("nftblockd.store")
T = TypeVar("T")

SCHEMA_VERSION = 3
BULK_ROWS = 1000  # a bulk save of at least this many single addresses is stored as one `bulk` row
_CHUNK = 200  # rows per multi-row INSERT (200 x 5 = 1000 parameters, far below SQLite's 32766)
_DELETE_CHUNK = 500  # targets per "DELETE ... target IN (...)"
CACHE_KIB = 16384  # page cache; random-key upserts into a million rows crawl with the 2 MiB default
WAL_SIZE_LIMIT = 32 * 1024 * 1024  # the WAL file is truncated to this after a checkpoint
VACUUM_SHARE = 0.25  # give free pages back once they are this share of the file ...
VACUUM_MIN_PAGES = 256  # ... and at least this many (1 MiB with 4 KiB pages)
BUSY_TIMEOUT = 5.0  # seconds to wait for another process's lock (an operator's sqlite3 shell)

BanRow: TypeAlias = tuple[str, bytes, float | None, str, str, str]
"""(blocklist, packed target, until or None, origin, reason, jail): one active ban (`load_active_rows`)."""
HistoryRow: TypeAlias = tuple[str, str, float, float | None]
"""(jail, target as text, ban start, ban end or None): one ban in a jail's history (tracker.HistoryRow)."""
PackedBans: TypeAlias = tuple[str, list[bytes], float | None, str, str, str]
"""(blocklist, packed targets, until, origin, reason, jail): many bans sharing one label and end (bulk saves)."""
HistoryEntry: TypeAlias = tuple[str, str, float] | tuple[str, str, float, float | None]
ProblemKind: TypeAlias = Literal["corrupt", "unwritable", "full", "busy", "too_new", "foreign", "io",
                                 "closed"]
Synchronous: TypeAlias = Literal["full", "normal"]


# --- packed targets ----------------------------------------------------------------------------------

_V4_MAPPED_PREFIX = b"\x00" * 10 + b"\xff\xff"


def pack_target(net: IPNet) -> bytes:
    """Network address bytes (4 or 16), plus one prefix-length byte unless it is a single address.

    IPv4-mapped IPv6 (`::ffff:1.2.3.4`) is packed as the IPv4 address it carries, so one host has one key.
    """
    packed = net.network_address.packed
    plen = net.prefixlen
    if len(packed) == 16 and plen >= 96 and packed[:12] == _V4_MAPPED_PREFIX:
        packed, plen = packed[12:], plen - 96
    if plen == len(packed) * 8:
        return packed
    return packed + bytes((plen,))


def unpack_target(key: bytes) -> IPNet:
    """Inverse of `pack_target`; raises ValueError for bytes that are not a packed target."""
    n = len(key)
    if n == 4:
        return ipaddress.IPv4Network(key)
    if n == 16:
        return ipaddress.IPv6Network(key)
    if n == 5:
        return ipaddress.IPv4Network((key[:4], key[4]))
    if n == 17:
        return ipaddress.IPv6Network((key[:16], key[16]))
    raise ValueError(f"not a packed target: {key!r}")


def _v6_text(packed: bytes) -> str:
    if packed[:10] == _V4_MAPPED_PREFIX[:10]:
        return str(ipaddress.IPv6Address(packed))  # inet_ntop prints ::1.2.3.4, ipaddress ::102:304
    return socket.inet_ntop(socket.AF_INET6, packed)


def target_text(key: bytes) -> str:
    """`format_target(unpack_target(key))`, without building ipaddress objects."""
    n = len(key)
    if n == 4:
        return socket.inet_ntop(socket.AF_INET, key)
    if n == 16:
        return _v6_text(key)
    if n == 5:
        return f"{socket.inet_ntop(socket.AF_INET, key[:4])}/{key[4]}"
    if n == 17:
        return f"{_v6_text(key[:16])}/{key[16]}"
    raise ValueError(f"not a packed target: {key!r}")


# --- values ------------------------------------------------------------------------------------------

OutboxItem: TypeAlias = tuple[str, str, float | None, str, float]
"""(op "ban"|"unban", target text, until or None, src, created): one own fleet event to queue."""


class OutboxRow(NamedTuple):
    """One row of the fleet outbox (`until` None = permanent)."""

    oseq: int
    op: str
    target: str
    until: float | None
    src: str
    created: float



class StoreError(Exception):
    """The state database failed; `str()` is a sentence for operators naming the file.

    `kind`: corrupt | unwritable | full | busy | too_new | foreign | io | closed.
    """

    def __init__(self, kind: ProblemKind, path: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.path = path


@dataclass(frozen=True, slots=True)
class StoreProblem:
    """Something went wrong with the database and the store worked around it; log `message`, count `kind`.

    `in_memory`: state is now kept in memory only (nothing survives a restart until the operator fixes it).
    `lost_state`: the database was replaced; the daemon should save again the bans it holds (`save_bans`).
    """

    kind: ProblemKind
    path: str
    message: str
    moved_to: str | None = None
    in_memory: bool = False
    lost_state: bool = False
    recovered_bans: int = 0


@dataclass(frozen=True, slots=True)
class PruneStats:
    bans: int  # expired bans deleted
    history: int  # history rows past the horizon deleted
    labels: int  # labels no ban uses any more
    freed_pages: int  # pages given back to the filesystem (page size 4 KiB)


@dataclass(frozen=True, slots=True)
class CompactBans:
    """Active bans in the form SQLite returns them: see `Store.load_active_compact`."""

    labels: dict[int, tuple[str, str, str, str]]  # label id -> (blocklist, origin, reason, jail)
    rows: list[tuple[int, bytes, float | None]]  # (label id, packed target, until or None)
    # (label id, until or None, key length 4|16, concatenated packed addresses): bulk saves, tombstones applied
    bulk: list[tuple[int, float | None, int, bytes]] = field(default_factory=list)


class _Unusable(Exception):
    def __init__(self, kind: ProblemKind, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def _classify(exc: BaseException) -> ProblemKind:
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc).lower()
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text \
            or "not a database" in text:
        return "corrupt"
    if name.startswith("SQLITE_FULL") or "disk is full" in text:
        return "full"
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return "busy"
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")):
        return "unwritable"
    return "io"


_WHAT = {
    "corrupt": "is corrupt", "unwritable": "cannot be written", "full": "cannot grow: the disk is full",
    "busy": "is locked by another process", "io": "failed", "too_new": "is too new", "foreign": "is not ours",
    "closed": "is closed",
}


# --- schema ------------------------------------------------------------------------------------------

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


# _MIGRATIONS[n] upgrades a database at version n to n + 1, inside one transaction with the version bump.
# Append, never edit: a released step is what existing databases went through.
_MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migrate_0_to_1, _migrate_1_to_2, _migrate_2_to_3]


def _connect(target: str, *, uri: bool = False) -> sqlite3.Connection:
    return sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False,
                           timeout=BUSY_TIMEOUT, cached_statements=64)


def _ro_uri(path: Path, *, immutable: bool = False) -> str:
    q = "immutable=1" if immutable else "mode=ro"
    return f"file:{urllib.parse.quote(str(path.absolute()))}?{q}"


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # Building a million row tuples triggers the cyclic GC hundreds of times for nothing (tuples of atoms hold
    # no cycles); pausing it makes bulk loads ~30% faster. Restored even if the load fails.
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _too_new(version: int) -> _Unusable:
    return _Unusable("too_new", f"schema version {version}; this nftblockd knows up to {SCHEMA_VERSION}")


def _schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _migrate(conn: sqlite3.Connection) -> None:
    version = _schema_version(conn)
    if version > SCHEMA_VERSION:
        raise _too_new(version)
    if version == 0:
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise _Unusable("foreign", "it holds tables but no nftblockd schema version")
        # Only possible before the first table exists; lets prune() give free pages back.
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    while version < len(_MIGRATIONS):
        with _transaction(conn):
            _MIGRATIONS[version](conn)
            version += 1
            conn.execute(f"PRAGMA user_version = {version}")


def _configure(conn: sqlite3.Connection, synchronous: Synchronous) -> None:
    conn.execute(f"PRAGMA synchronous = {'FULL' if synchronous == 'full' else 'NORMAL'}")
    conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
    conn.execute("PRAGMA temp_store = MEMORY")


def _verify(conn: sqlite3.Connection) -> None:
    rows = conn.execute("PRAGMA quick_check(5)").fetchall()
    if rows != [("ok",)]:
        raise _Unusable("corrupt", "; ".join(str(r[0]) for r in rows))


def _open_file(path: Path, synchronous: Synchronous, verify: bool) -> sqlite3.Connection:
    if path.exists() and not path.is_file():
        raise _Unusable("unwritable", "it is not a regular file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _Unusable("unwritable", f"cannot create {path.parent}: {exc.strerror or exc}") from None
    try:
        conn = _connect(str(path))
    except sqlite3.Error as exc:
        raise _Unusable(_classify(exc), str(exc)) from None
    try:
        version = _schema_version(conn)  # the first read: "file is not a database" shows here
        if version > SCHEMA_VERSION:
            raise _too_new(version)
        if version == 0:
            if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                # Checked before anything is written: someone else's database keeps its journal mode.
                raise _Unusable("foreign", "it holds tables but no nftblockd schema version")
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before WAL writes the first page
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise _Unusable("unwritable", f"cannot switch it to WAL mode (journal mode stays {mode})")
        _configure(conn, synchronous)
        _migrate(conn)
        if verify:
            _verify(conn)
        with _transaction(conn):  # proves we can write now, not at the first ban
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('last_open', ?)",
                         (repr(time.time()),))
    except _Unusable:
        conn.close()
        raise
    except sqlite3.Error as exc:
        conn.close()
        raise _Unusable(_classify(exc), str(exc)) from None
    return conn


_UPSERT_HEAD = "INSERT INTO bans(blocklist, target, until, label, created) VALUES "
_UPSERT_TAIL = " ON CONFLICT(blocklist, target) DO UPDATE SET until = excluded.until, label = excluded.label"
_HISTORY_HEAD = "INSERT OR IGNORE INTO history(at, jail, target, until) VALUES "
_SQL_ACTIVE = "SELECT label, target, until FROM bans WHERE until IS NULL OR until > ?"
_BAN_KEY = operator.itemgetter(0, 1)
_FIRST = operator.itemgetter(0)
_SQL_ADD_LABEL = "INSERT OR IGNORE INTO labels(blocklist, origin, reason, jail) VALUES(?, ?, ?, ?)"
_SQL_LABEL_ID = "SELECT id FROM labels WHERE blocklist = ? AND origin = ? AND reason = ? AND jail = ?"


def _label_id(conn: sqlite3.Connection, key: tuple[str, str, str, str]) -> int:
    conn.execute(_SQL_ADD_LABEL, key)
    return int(conn.execute(_SQL_LABEL_ID, key).fetchone()[0])


def _open_memory() -> sqlite3.Connection:
    conn = _connect(":memory:")
    try:
        _migrate(conn)
    except (sqlite3.Error, _Unusable) as exc:  # not the database's fault: ours
        conn.close()
        raise StoreError("io", ":memory:", f"cannot create the state schema even in memory ({exc});"
                                           " this is a bug in nftblockd") from None
    return conn


# --- salvage and fallback ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Salvage:
    labels: dict[int, tuple[str, str, str, str]]
    bans: list[tuple[str, bytes, float | None, int, float]]
    history: list[tuple[float, str, str, float | None]]
    positions: list[tuple[str, str]]
    feeds: list[tuple[str, str]]
    bulk: list[tuple[int, float | None, float, int, bytes]] = field(default_factory=list)
    bulk_dead: list[tuple[str, bytes, float]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.bans) + len(self.history) + len(self.positions) + len(self.feeds) + len(self.bulk)


def _read_until_error(conn: sqlite3.Connection, sql: str, out: list[Any]) -> None:
    """Append rows until the first error: whatever precedes the damage is kept."""
    try:
        cur = conn.execute(sql)
        while batch := cur.fetchmany(4096):
            out.extend(batch)
    except sqlite3.Error:
        pass


def _salvage(path: Path) -> _Salvage:
    s = _Salvage({}, [], [], [], [])
    try:
        conn = _connect(_ro_uri(path), uri=True)
    except sqlite3.Error:
        return s
    try:
        labels: list[tuple[int, str, str, str, str]] = []
        _read_until_error(conn, "SELECT id, blocklist, origin, reason, jail FROM labels", labels)
        s.labels = {r[0]: (r[1], r[2], r[3], r[4]) for r in labels}
        # Forwards, then backwards from the other end: rows on both sides of a damaged page are kept.
        head: list[tuple[str, bytes, float | None, int, float]] = []
        tail: list[tuple[str, bytes, float | None, int, float]] = []
        _read_until_error(conn, "SELECT blocklist, target, until, label, created FROM bans", head)
        _read_until_error(conn, "SELECT blocklist, target, until, label, created FROM bans"
                                " ORDER BY blocklist DESC, target DESC", tail)
        s.bans = list({(r[0], r[1]): r for r in (*head, *tail)}.values())
        _read_until_error(conn, "SELECT at, jail, target, until FROM history", s.history)
        _read_until_error(conn, "SELECT key, value FROM positions", s.positions)
        _read_until_error(conn, "SELECT name, meta FROM feeds", s.feeds)
        _read_until_error(conn, "SELECT label, until, created, keylen, keys FROM bulk", s.bulk)  # v2 tables
        _read_until_error(conn, "SELECT blocklist, target, at FROM bulk_dead", s.bulk_dead)
    finally:
        conn.close()
    return s


def _restore_salvage(conn: sqlite3.Connection, s: _Salvage) -> int:
    """Write salvaged rows into a fresh database; rows that do not fit the schema any more are dropped."""
    good = [b for b in s.bans
            if isinstance(b[0], str) and isinstance(b[1], bytes) and len(b[1]) in (4, 5, 16, 17)]
    with _transaction(conn):
        ids = {old: _label_id(conn, key) for old, key in s.labels.items()}
        rows = []
        for bl, target, until, label, created in good:
            new = ids.get(label)
            if new is None:  # its label was lost with the damage: keep the ban, say where it came from
                new = _label_id(conn, (bl, "store", "recovered from a corrupt state database", ""))
            rows.append((bl, target, until, new, created))
        conn.executemany("INSERT OR REPLACE INTO bans(blocklist, target, until, label, created)"
                         " VALUES(?, ?, ?, ?, ?)", rows)
        conn.executemany(_HISTORY_HEAD + "(?, ?, ?, ?)", s.history)
        conn.executemany("INSERT OR REPLACE INTO positions(key, value) VALUES(?, ?)", s.positions)
        conn.executemany("INSERT OR REPLACE INTO feeds(name, meta) VALUES(?, ?)", s.feeds)
        bulk = []
        for label, until, created, keylen, keys in s.bulk:
            if keylen not in (4, 16) or not isinstance(keys, bytes) or len(keys) % keylen:
                continue
            new = ids.get(label)
            if new is None:
                new = _label_id(conn, ("default", "store", "recovered from a corrupt state database", ""))
            bulk.append((new, until, created, keylen, keys))
        conn.executemany("INSERT INTO bulk(label, until, created, keylen, keys) VALUES(?, ?, ?, ?, ?)", bulk)
        conn.executemany("INSERT OR REPLACE INTO bulk_dead(blocklist, target, at) VALUES(?, ?, ?)", s.bulk_dead)
    return len(rows) + sum(len(b[4]) // b[3] for b in bulk)


def _move_aside(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    # The WAL goes first: a crash between the two renames must not leave an old WAL next to a new database
    # (SQLite would replay it into the new file).
    for suffix in ("-wal", "-journal"):
        side = Path(f"{path}{suffix}")
        if side.exists():
            os.replace(side, Path(f"{dest}{suffix}"))
    Path(f"{path}-shm").unlink(missing_ok=True)  # an index of the WAL, rebuilt from it when needed
    os.replace(path, dest)
    return dest


def _readonly_copy(path: Path) -> tuple[sqlite3.Connection, int] | None:
    """Copy an existing database we may not write into memory, so saved bans are still restored."""
    if not path.is_file():
        return None
    for immutable in (False, True):  # immutable: a directory where not even the -shm file can be created
        try:
            src = _connect(_ro_uri(path, immutable=immutable), uri=True)
        except sqlite3.Error:
            continue
        try:
            version = _schema_version(src)
            if not 0 < version <= SCHEMA_VERSION:
                return None
            _verify(src)
            mem = _connect(":memory:")
            try:
                src.backup(mem)
            except sqlite3.Error:
                mem.close()
                raise
        except (sqlite3.Error, _Unusable):
            continue
        finally:
            src.close()
        try:
            _migrate(mem)
            count = int(mem.execute("SELECT count(*) FROM bans").fetchone()[0])
        except (sqlite3.Error, _Unusable):
            mem.close()
            return None
        return mem, count
    return None


def _log_problem(problem: StoreProblem) -> None:
    log.error("%s", problem.message)


# --- the store ---------------------------------------------------------------------------------------


class Store:
    """The daemon's state database. Build it with `Store.open(path)` (or `Store.memory()` in tests).

    Thread-safety: one connection, one lock; any thread may call any method, calls run one at a time.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, *, persistent: bool, synchronous: Synchronous,
                 report: Callable[[StoreProblem], None]) -> None:
        self._conn: sqlite3.Connection | None = conn
        self.path = path
        self.persistent = persistent
        self.synchronous = synchronous
        self.problems: list[StoreProblem] = []
        self._report = report
        self._lock = threading.RLock()
        self._labels: dict[tuple[str, str, str, str], int] = self._read_labels(conn)

    # -- opening -------------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path, *, on_problem: Callable[[StoreProblem], None] | None = None,
             synchronous: Synchronous = "full", verify: bool = True) -> Store:
        """Open (or create, with its directories) the database at `path`; a bad database never raises.

        A problem is handed to `on_problem` (default: logged as an error; called on the thread that met the
        problem, later ones too) and kept in `problems`: a corrupt file is moved aside and replaced, an
        unusable one is left alone and the store runs in memory.
        `verify` runs `PRAGMA quick_check` (~0.35 s per million bans) so damage is found now, not mid-run.
        """
        p = Path(path)
        report = on_problem or _log_problem
        try:
            return cls(_open_file(p, synchronous, verify), p, persistent=True, synchronous=synchronous,
                       report=report)
        except _Unusable as exc:
            if exc.kind == "corrupt":
                try:
                    conn, problem = _replace_corrupt(p, exc.detail, synchronous)
                    store = cls(conn, p, persistent=True, synchronous=synchronous, report=report)
                    store._note(problem)
                    return store
                except _Unusable as again:
                    exc = again
            conn, problem = _memory_fallback(p, exc)
            store = cls(conn, p, persistent=False, synchronous=synchronous, report=report)
            store._note(problem)
            return store

    @classmethod
    def memory(cls) -> Store:
        """A store that keeps everything in memory (tests, `--no-state`)."""
        return cls(_open_memory(), Path(":memory:"), persistent=False, synchronous="normal",
                   report=_log_problem)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _note(self, problem: StoreProblem) -> None:
        self.problems.append(problem)
        self._report(problem)

    # -- the one way in ------------------------------------------------------------------------------

    def _run(self, what: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if self._conn is None:
                raise StoreError("closed", str(self.path), f"state database {self.path} is closed ({what})")
            try:
                return fn(self._conn)
            except (sqlite3.Error, _Unusable) as exc:
                kind = exc.kind if isinstance(exc, _Unusable) else _classify(exc)
                self._labels = self._read_labels(self._conn, quiet=True)
                if kind != "corrupt" or not self.persistent:
                    raise self._error(kind, what, exc) from None
                first = exc.detail if isinstance(exc, _Unusable) else str(exc)
            # Corruption met mid-run: replace the database (as at open) and do the call once more on the new
            # one; the problem tells the daemon to save again what it holds.
            self._conn.close()
            self._conn = None
            try:
                conn, problem = _replace_corrupt(self.path, first, self.synchronous)
            except _Unusable as exc2:
                conn, problem = _memory_fallback(self.path, exc2)
                self.persistent = False
            self._conn = conn
            self._labels = self._read_labels(conn)
            self._note(problem)
            try:
                return fn(conn)
            except sqlite3.Error as exc:
                raise self._error(_classify(exc), what, exc) from None

    def _error(self, kind: ProblemKind, what: str, exc: BaseException) -> StoreError:
        return StoreError(kind, str(self.path), f"state database {self.path} {_WHAT[kind]} ({exc});"
                                                f" could not {what}; nothing of this call was stored")

    @staticmethod
    def _read_labels(conn: sqlite3.Connection | None, *, quiet: bool = False
                     ) -> dict[tuple[str, str, str, str], int]:
        if conn is None:
            return {}
        try:
            rows = conn.execute("SELECT id, blocklist, origin, reason, jail FROM labels").fetchall()
        except sqlite3.Error:
            if quiet:
                return {}
            raise
        return {(b, o, r, j): i for i, b, o, r, j in rows}

    # -- writes --------------------------------------------------------------------------------------

    def apply(self, *, save: Iterable[Ban] = (), delete: Iterable[tuple[str, IPNet]] = (),
              history: Iterable[HistoryEntry] = (), positions: Mapping[str, str] | None = None,
              created: float | None = None, save_packed: Iterable[PackedBans] = (),
              delete_packed: Iterable[tuple[str, list[bytes]]] = ()) -> None:
        """Save bans, delete (blocklist, target) keys, record history and set positions: ONE transaction.

        Deletions run before saves, so a key in both ends up saved. `created` (default: now) is recorded for
        new rows only. On StoreError nothing of the call was stored.
        """
        stamp = time.time() if created is None else created
        bans = save if isinstance(save, list | tuple) else list(save)
        packed: list[PackedBans] = []
        bulk: list[PackedBans] = []
        for entry in save_packed:
            targets = entry[1]
            size = len(targets[0]) if targets else 0
            if len(targets) >= BULK_ROWS and size in (4, 16) and all(len(t) == size for t in targets):
                bulk.append(entry)
            else:
                packed.append(entry)
        deletes: dict[str, list[bytes]] = {}
        for blocklist, target in delete:
            deletes.setdefault(blocklist, []).append(pack_target(target))
        for blocklist, targets in delete_packed:
            deletes.setdefault(blocklist, []).extend(targets)
        hist: list[Any] = []
        for e in history:
            hist += (e[2], e[0], e[1], e[3] if len(e) > 3 else None)
        pos = list(positions.items()) if positions else []
        if not (bans or packed or bulk or deletes or hist or pos):
            return

        def run(conn: sqlite3.Connection) -> None:
            # Label ids are resolved here, against this connection: after a corrupt database was replaced
            # the retry sees the new database's ids.
            with _gc_paused():
                flat, new = self._ban_params(bans, stamp, packed)
                with _transaction(conn):
                    real = self._insert_labels(conn, new)
                    if new:
                        swap = {new[k]: real[k] for k in new}
                        for i in range(3, len(flat), 5):
                            if flat[i] < 0:
                                flat[i] = swap[flat[i]]
                    for blocklist, keys in deletes.items():
                        for i in range(0, len(keys), _DELETE_CHUNK):
                            part = keys[i:i + _DELETE_CHUNK]
                            marks = ",".join("?" * len(part))
                            conn.execute(f"DELETE FROM bans WHERE blocklist = ? AND target IN ({marks})",
                                         (blocklist, *part))
                    if deletes and conn.execute("SELECT EXISTS(SELECT 1 FROM bulk)").fetchone()[0]:
                        conn.executemany("INSERT OR REPLACE INTO bulk_dead(blocklist, target, at) VALUES(?, ?, ?)",
                                         [(b, t, stamp) for b, keys in deletes.items() for t in keys])
                    if flat:
                        _insert_many(conn, _UPSERT_HEAD, _UPSERT_TAIL, 5, flat)
                    for blocklist, targets, until, origin, reason, jail in bulk:
                        lid = _label_id(conn, (blocklist, origin, reason, jail))
                        conn.execute("INSERT INTO bulk(label, until, created, keylen, keys) VALUES(?, ?, ?, ?, ?)",
                                     (lid, until, stamp, len(targets[0]), b"".join(targets)))
                    if hist:
                        _insert_many(conn, _HISTORY_HEAD, "", 4, hist)
                    if pos:
                        conn.executemany("INSERT OR REPLACE INTO positions(key, value) VALUES(?, ?)", pos)
            self._labels.update(real)

        self._run("save bans" if bans or packed or bulk else "save state", run)

    def _ban_params(self, bans: Iterable[Ban], created: float, packed: Iterable[PackedBans] = ()
                    ) -> tuple[list[Any], dict[tuple[str, str, str, str], int]]:
        """Flat upsert parameters; a label not yet in the table gets a negative placeholder id."""
        labels = self._labels
        new: dict[tuple[str, str, str, str], int] = {}
        rows: list[tuple[str, bytes, float | None, int, float]] = []
        key: tuple[str, str, str, str]
        for ban in bans:
            key = (ban.blocklist, ban.origin, ban.reason, ban.jail)
            lid = labels.get(key)
            if lid is None:
                lid = new.get(key)
                if lid is None:
                    lid = new[key] = -1 - len(new)
            rows.append((ban.blocklist, pack_target(ban.target), ban.until, lid, created))
        for blocklist, targets, until, origin, reason, jail in packed:
            key = (blocklist, origin, reason, jail)
            lid = labels.get(key)
            if lid is None:
                lid = new.get(key)
                if lid is None:
                    lid = new[key] = -1 - len(new)
            rows += [(blocklist, t, until, lid, created) for t in targets]
        # In key order the B-tree is written page after page instead of at random: 10k-ban batches into a
        # big table take ~25% less CPU, sort included. The sort is stable: of two equal keys the last wins.
        rows.sort(key=_BAN_KEY)
        return list(itertools.chain.from_iterable(rows)), new

    @staticmethod
    def _insert_labels(conn: sqlite3.Connection, new: Iterable[tuple[str, str, str, str]]
                       ) -> dict[tuple[str, str, str, str], int]:
        return {key: _label_id(conn, key) for key in new}

    def save_bans(self, bans: Iterable[Ban], *, created: float | None = None) -> None:
        """Upsert bans keyed by (blocklist, target) in one transaction (a million in one call is fine)."""
        self.apply(save=bans, created=created)

    def delete_bans(self, keys: Iterable[tuple[str, IPNet]]) -> None:
        """Delete (blocklist, target) rows in one transaction; unknown keys are ignored."""
        self.apply(delete=keys)

    def record_history(self, entries: Iterable[HistoryEntry]) -> None:
        """Record (jail, target text, start[, end]) rows; an identical (start, jail, target) is kept once."""
        self.apply(history=entries)

    def set_positions(self, positions: Mapping[str, str]) -> None:
        self.apply(positions=positions)

    def delete_positions(self, keys: Iterable[str]) -> None:
        ks = [(k,) for k in keys]

        def run(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.executemany("DELETE FROM positions WHERE key = ?", ks)

        self._run("delete positions", run)

    def set_feed_meta(self, name: str, meta: Mapping[str, Any]) -> None:
        text = json.dumps(meta, separators=(",", ":"), sort_keys=True)

        def run(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.execute("INSERT OR REPLACE INTO feeds(name, meta) VALUES(?, ?)", (name, text))

        self._run(f"save the metadata of feed {name}", run)

    def delete_feed_meta(self, name: str) -> None:
        def run(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.execute("DELETE FROM feeds WHERE name = ?", (name,))

        self._run(f"delete the metadata of feed {name}", run)

    # -- reads ---------------------------------------------------------------------------------------

    def load_active_compact(self, now: float) -> CompactBans:
        """Every ban with no end or ending after `now`: the fastest form (what a restart should use).

        `rows` are (label id, packed target, until) exactly as SQLite hands them over; `labels` maps each id
        to (blocklist, origin, reason, jail).
        """
        def run(conn: sqlite3.Connection) -> CompactBans:
            labels = {i: k for k, i in self._read_labels(conn).items()}
            with _gc_paused():
                rows: list[tuple[int, bytes, float | None]] = conn.execute(_SQL_ACTIVE, (now,)).fetchall()
                missing = set(map(_FIRST, rows)) - labels.keys()
            if missing:  # only after damage quick_check did not see, or a hand edit: keep the bans anyway
                marks = ",".join("?" * len(missing))
                sql = f"SELECT DISTINCT label, blocklist FROM bans WHERE label IN ({marks})"
                for lid, blocklist in conn.execute(sql, tuple(missing)):
                    labels.setdefault(lid, (blocklist, "store", "", ""))
            return CompactBans(labels, rows, self._load_bulk(conn, now, labels))

        return self._run("load bans", run)

    @staticmethod
    def _load_bulk(conn: sqlite3.Connection, now: float, labels: dict[int, tuple[str, str, str, str]]
                   ) -> list[tuple[int, float | None, int, bytes]]:
        out = []
        dead: dict[str, dict[bytes, float]] = {}
        for blocklist, target, at in conn.execute("SELECT blocklist, target, at FROM bulk_dead"):
            dead.setdefault(blocklist, {})[target] = at
        for lid, until, created, keylen, keys in conn.execute(
                "SELECT label, until, created, keylen, keys FROM bulk WHERE until IS NULL OR until > ? ORDER BY id",
                (now,)):
            if lid not in labels:
                continue
            gone = {t for t, at in dead.get(labels[lid][0], {}).items() if at > created}
            if gone:  # rare: an address of this bulk save was unbanned later
                parts = [keys[i:i + keylen] for i in range(0, len(keys), keylen)]
                keys = b"".join(t for t in parts if t not in gone)
            out.append((lid, until, keylen, keys))
        return out

    def load_active_rows(self, now: float) -> list[BanRow]:
        """Every ban with no end or ending after `now`, as plain tuples (no ipaddress objects).

        `target` is packed (`unpack_target`, `target_text`); the label strings are shared between rows.
        About 25% slower than `load_active_compact`, which it is built on.
        """
        compact = self.load_active_compact(now)
        labels = compact.labels
        out: list[BanRow] = []
        append = out.append
        with _gc_paused():
            for lid, target, until in compact.rows:
                b, o, r, j = labels[lid]
                append((b, target, until, o, r, j))
            for lid, until, keylen, keys in compact.bulk:
                b, o, r, j = labels[lid]
                for i in range(0, len(keys), keylen):
                    append((b, keys[i:i + keylen], until, o, r, j))
        return out

    def load_active_bans(self, now: float) -> list[Ban]:
        """`load_active_rows` as `Ban` values (about 5x slower: use rows for big sets)."""
        return [Ban(unpack_target(t), b, u, origin=_origin(o), reason=r, jail=j)
                for b, t, u, o, r, j in self.load_active_rows(now)]

    def count_bans(self) -> int:
        return self._run("count bans", lambda c: int(c.execute(
            "SELECT (SELECT count(*) FROM bans) + (SELECT coalesce(sum(length(keys) / keylen), 0) FROM bulk)"
        ).fetchone()[0]))

    def load_history(self, since: float) -> list[HistoryRow]:
        """History rows that started at or after `since`, oldest first."""
        return self._run("load ban history", lambda c: [
            (j, t, at, u) for at, j, t, u in
            c.execute("SELECT at, jail, target, until FROM history WHERE at >= ? ORDER BY at", (since,))])

    # -- fleet outbox and cursor ------------------------------------------------------------------------

    def fleet_enqueue(self, items: Iterable[OutboxItem]) -> list[int]:
        """Queue own bans/unbans for publishing, in order; returns their oseqs. An unban also kills the earlier
        bans of its target (a pending one is never published; a published one is never re-asserted)."""
        rows = list(items)

        def run(conn: sqlite3.Connection) -> list[int]:
            out = []
            with _transaction(conn):
                for op, target, until, src, created in rows:
                    if op == "unban":
                        conn.execute("UPDATE fleet_outbox SET state = 2 WHERE target = ? AND op = 'ban'"
                                     " AND state < 2", (target,))
                    cur = conn.execute("INSERT INTO fleet_outbox(op, target, until, src, created) VALUES"
                                       " (?, ?, ?, ?, ?)", (op, target, until, src, created))
                    out.append(int(cur.lastrowid or 0))
            return out

        return self._run("queue fleet events", run)

    def fleet_pending(self, now: float, limit: int = 10000) -> list[OutboxRow]:
        """Pending events in oseq order; bans that ended meanwhile are marked dead and skipped."""

        def run(conn: sqlite3.Connection) -> list[OutboxRow]:
            with _transaction(conn):
                conn.execute("UPDATE fleet_outbox SET state = 2 WHERE state = 0 AND op = 'ban' AND until <= ?",
                             (now,))
                return [OutboxRow(*r) for r in conn.execute(
                    "SELECT oseq, op, target, until, src, created FROM fleet_outbox WHERE state = 0"
                    " ORDER BY oseq LIMIT ?", (limit,))]

        return self._run("read the fleet outbox", run)

    def fleet_mark_published(self, oseqs: Iterable[int]) -> None:
        """Published bans stay (re-assert); published unbans have done their job."""
        keys = [(o,) for o in oseqs]

        def run(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.executemany("UPDATE fleet_outbox SET state = CASE op WHEN 'ban' THEN 1 ELSE 2 END"
                                 " WHERE oseq = ? AND state = 0", keys)

        self._run("mark fleet events published", run)

    def fleet_forget(self, targets: Iterable[tuple[str, float]]) -> None:
        """A fleet-wide unban of `target` at `at`: own bans of it made before then are over."""
        keys = [(t, at) for t, at in targets]

        def run(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.executemany("UPDATE fleet_outbox SET state = 2 WHERE target = ? AND op = 'ban' AND state < 2"
                                 " AND created < ?", keys)

        if keys:
            self._run("record fleet unbans", run)

    def fleet_own_active(self, now: float, since: float) -> list[OutboxRow]:
        """Own published bans made since `since` and still running, in oseq order."""
        return self._run("read own fleet bans", lambda c: [OutboxRow(*r) for r in c.execute(
            "SELECT oseq, op, target, until, src, created FROM fleet_outbox WHERE state = 1 AND created >= ?"
            " AND (until IS NULL OR until > ?) ORDER BY oseq", (since, now))])

    def fleet_outbox_size(self) -> int:
        return int(self._run("count the fleet outbox", lambda c: c.execute(
            "SELECT count(*) FROM fleet_outbox WHERE state = 0").fetchone()[0]))

    def fleet_prune(self, now: float, horizon: float) -> int:
        """Drop dead rows, ended bans and published rows older than the horizon; returns how many."""

        def run(conn: sqlite3.Connection) -> int:
            with _transaction(conn):
                cur = conn.execute("DELETE FROM fleet_outbox WHERE state = 2 OR (state = 1 AND (until <= ?"
                                   " OR created < ?))", (now, now - horizon))
                return int(cur.rowcount)

        return self._run("prune the fleet outbox", run)

    def fleet_cursor(self, fleet: str) -> tuple[str, str] | None:
        """(server run id, last stream id applied) or None."""
        row = self._run("read the fleet cursor", lambda c: c.execute(
            "SELECT run_id, last_id FROM fleet_cursor WHERE fleet = ?", (fleet,)).fetchone())
        return None if row is None else (str(row[0]), str(row[1]))

    def set_fleet_cursor(self, fleet: str, run_id: str, last_id: str) -> None:
        def run(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.execute("INSERT INTO fleet_cursor(fleet, run_id, last_id) VALUES (?, ?, ?) ON CONFLICT(fleet)"
                             " DO UPDATE SET run_id = excluded.run_id, last_id = excluded.last_id",
                             (fleet, run_id, last_id))

        self._run("save the fleet cursor", run)

    def get_position(self, key: str) -> str | None:
        row = self._run("read a position", lambda c: c.execute(
            "SELECT value FROM positions WHERE key = ?", (key,)).fetchone())
        return None if row is None else str(row[0])

    def all_positions(self) -> dict[str, str]:
        return self._run("read positions", lambda c: dict(c.execute("SELECT key, value FROM positions")))

    def positions(self) -> StorePositions:
        """This store as a `sources.base.PositionStore` (get/set one key)."""
        return StorePositions(self)

    def get_feed_meta(self, name: str) -> dict[str, Any] | None:
        """The feed's saved metadata, or None (also when what is saved is not a JSON object)."""
        row = self._run(f"read the metadata of feed {name}", lambda c: c.execute(
            "SELECT meta FROM feeds WHERE name = ?", (name,)).fetchone())
        if row is None:
            return None
        try:
            value = json.loads(row[0])
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    # -- upkeep --------------------------------------------------------------------------------------

    def prune(self, now: float, history_horizon: float | Mapping[str, float]) -> PruneStats:
        """Delete bans that ended, history that started before `now - horizon` and unused labels; then give
        free pages back when they exceed `VACUUM_SHARE` of the file. Call it periodically (hourly is plenty).

        `history_horizon` is seconds for every jail, or per jail (jails not named keep the longest horizon).
        """
        def run(conn: sqlite3.Connection) -> PruneStats:
            with _transaction(conn):
                bans = conn.execute("DELETE FROM bans WHERE until IS NOT NULL AND until <= ?",
                                    (now,)).rowcount
                conn.execute("DELETE FROM bulk WHERE until IS NOT NULL AND until <= ?", (now,))
                # a tombstone older than every bulk row can no longer hide anything
                conn.execute("DELETE FROM bulk_dead WHERE at < coalesce((SELECT min(created) FROM bulk), ?)", (now,))
                if isinstance(history_horizon, Mapping):
                    hist = 0
                    longest = max(history_horizon.values(), default=0.0)
                    for jail, horizon in history_horizon.items():
                        hist += conn.execute("DELETE FROM history WHERE at < ? AND jail = ?",
                                             (now - horizon, jail)).rowcount
                    names = list(history_horizon)
                    hist += conn.execute(
                        f"DELETE FROM history WHERE at < ? AND jail NOT IN ({','.join('?' * len(names))})",
                        (now - longest, *names)).rowcount
                else:
                    hist = conn.execute("DELETE FROM history WHERE at < ?", (now - history_horizon,)).rowcount
                labels = conn.execute("DELETE FROM labels WHERE id NOT IN (SELECT DISTINCT label FROM bans"
                                      " UNION SELECT label FROM bulk)").rowcount
            self._labels = self._read_labels(conn)
            return PruneStats(bans, hist, labels, self._compact(conn, force=False))

        return self._run("prune", run)

    def compact(self) -> int:
        """Give every free page back to the filesystem now; returns how many."""
        return self._run("compact", lambda c: self._compact(c, force=True))

    @staticmethod
    def _compact(conn: sqlite3.Connection, *, force: bool) -> int:
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        if not free or (not force and free < max(VACUUM_MIN_PAGES, pages * VACUUM_SHARE)):
            return 0
        if int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) != 2:
            # A database made without incremental auto-vacuum (by a copy or an old tool): rebuild it once.
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            conn.execute("VACUUM")
        else:
            # One page per step, and Python's execute() steps once: executescript steps it to the end.
            conn.executescript("PRAGMA incremental_vacuum;")
        with contextlib.suppress(sqlite3.Error):  # the WAL shrinks only after a checkpoint
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return free - int(conn.execute("PRAGMA freelist_count").fetchone()[0])

    def verify(self) -> bool:
        """`PRAGMA quick_check` now (~0.35 s per million bans); False if the database was damaged, in which
        case it has been replaced exactly as `open` would have (salvage, move aside, problem reported).

        For a restart on the clock: `open(..., verify=False)`, load, report ready, then `verify()`. Damage in
        the bans table is met by the load itself anyway (it reads every page).
        """
        before = len(self.problems)

        def run(conn: sqlite3.Connection) -> None:
            _verify(conn)

        self._run("check the database", run)
        return len(self.problems) == before

    def integrity_check(self) -> list[str]:
        """`PRAGMA integrity_check` (slow: reads everything); ["ok"] when healthy."""
        return self._run("check integrity",
                         lambda c: [str(r[0]) for r in c.execute("PRAGMA integrity_check")])

    def file_size(self) -> int:
        """Bytes on disk of the database and its WAL (0 in memory)."""
        if not self.persistent:
            return 0
        return sum(os.path.getsize(p) for p in (self.path, Path(f"{self.path}-wal")) if p.exists())


class StorePositions:
    """A `Store` seen as a `sources.base.PositionStore`: each `set` is one transaction."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def get(self, key: str) -> str | None:
        return self._store.get_position(key)

    def set(self, key: str, value: str) -> None:
        self._store.set_positions({key: value})


_ORIGINS: frozenset[str] = frozenset({"cli", "jail", "feed", "fail2ban", "store", "remote"})


def _origin(text: str) -> Origin:
    return text if text in _ORIGINS else "store"  # type: ignore[return-value]


def _insert_many(conn: sqlite3.Connection, head: str, tail: str, width: int, flat: list[Any]) -> None:
    """Run `head VALUES (...),(...) tail` over `flat` (width values per row), `_CHUNK` rows per statement."""
    step = _CHUNK * width
    full = len(flat) - len(flat) % step
    row = "(" + ",".join("?" * width) + ")"
    if full:
        sql = head + ",".join([row] * _CHUNK) + tail
        conn.executemany(sql, (flat[i:i + step] for i in range(0, full, step)))
    if full < len(flat):
        conn.executemany(head + row + tail, (flat[i:i + width] for i in range(full, len(flat), width)))


def _replace_corrupt(path: Path, detail: str, synchronous: Synchronous
                     ) -> tuple[sqlite3.Connection, StoreProblem]:
    salvage = _salvage(path)
    try:
        moved = _move_aside(path)
    except OSError as exc:
        raise _Unusable("unwritable", f"it is corrupt ({detail}) and could not be moved aside: "
                                      f"{exc.strerror or exc}") from None
    conn = _open_file(path, synchronous, verify=False)
    try:
        recovered = _restore_salvage(conn, salvage) if len(salvage) else 0
    except sqlite3.Error:
        recovered = 0
    kept = (f"; recovered {recovered} ban{'' if recovered == 1 else 's'} from it" if recovered
            else "; no ban in it could be recovered")
    return conn, StoreProblem(
        "corrupt", str(path),
        f"state database {path} is corrupt ({detail}); moved it to {moved.name} and started a new one{kept}",
        moved_to=str(moved), lost_state=True, recovered_bans=recovered)


def _memory_fallback(path: Path, exc: _Unusable) -> tuple[sqlite3.Connection, StoreProblem]:
    copy = _readonly_copy(path) if exc.kind not in ("corrupt", "too_new", "foreign") else None
    if copy is not None:
        conn, count = copy
        had = f"; loaded the {count} ban{'' if count == 1 else 's'} saved in it, read-only"
    else:
        conn, had = _open_memory(), ""
    if exc.kind == "too_new":
        why = f"state database {path} was written by a newer nftblockd ({exc.detail}); left it untouched"
    elif exc.kind == "foreign":
        why = f"{path} is not an nftblockd state database ({exc.detail}); left it untouched"
    else:
        why = (f"state database {path} {_WHAT[exc.kind]} ({exc.detail}); check the permissions, free space"
               f" and mount of {path.parent}")
    return conn, StoreProblem(
        exc.kind, str(path),
        f"{why}{had}; keeping state in memory only, so changes from now on will not survive a restart",
        in_memory=True, lost_state=copy is None, recovered_bans=copy[1] if copy else 0)


# --- foreign databases, read-only ------------------------------------------------------------------


class ReadOnlyDatabase:
    """Another program's SQLite database (fail2ban's), opened read-only: queries only, no journal, no lock
    held between queries, so the program that owns it is not disturbed."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    def tables(self) -> set[str]:
        return {str(r[0]) for r in self.query("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def columns(self, table: str) -> list[str]:
        return [str(r[1]) for r in self.query(f"PRAGMA table_info({_quote_ident(table)})")]

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return list(self._conn.execute(sql, tuple(params)).fetchall())
        except sqlite3.Error as exc:
            kind = _classify(exc)
            raise StoreError(kind, str(self.path), f"database {self.path} {_WHAT[kind]} ({exc})") from None

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ReadOnlyDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def open_readonly(path: str | Path) -> ReadOnlyDatabase:
    """Open someone else's database with `mode=ro`; StoreError if missing, unreadable or not a database."""
    p = Path(path)
    if not p.exists():
        raise StoreError("io", str(p), f"database {p} does not exist")
    if not p.is_file():
        raise StoreError("io", str(p), f"database {p} is not a regular file")
    if not os.access(p, os.R_OK):
        raise StoreError("unwritable", str(p), f"database {p} is not readable by this user")
    conn: sqlite3.Connection | None = None
    try:
        conn = _connect(_ro_uri(p), uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # "file is not a database" shows here
    except sqlite3.Error as exc:
        if conn is not None:
            conn.close()
        kind = _classify(exc)
        raise StoreError(kind, str(p), f"database {p} {_WHAT[kind]} ({exc})") from None
    return ReadOnlyDatabase(conn, p)

