"""The daemon's state database: active bans, ban history, source positions, feed metadata.

Only the `nftblockd.state` package imports sqlite3: this module is the store; schema.py holds the tables and
their migrations, salvage.py what happens to a damaged or unusable file, db.py the connection layer they
share, foreign.py the read-only access to fail2ban's database. Targets are packed with the address codec
(`addr.pack_target`).

This module never touches the kernel, reads no config and runs no asyncio: the daemon calls it from a worker
thread (`asyncio.to_thread`). Every public method is safe to call from any thread: one connection per `Store`
(`check_same_thread=False`) guarded by one lock, so calls are serialised, never interleaved.

What is stored (schema.py: version `SCHEMA_VERSION` in `PRAGMA user_version`, upgraded by `MIGRATIONS`):
- `bans`: one row per (blocklist, target): `until` (epoch seconds, NULL = permanent), a `label` id and the
  time the row was `created`. The target is stored packed (`addr.pack_target`: 4 or 16 address bytes, plus one
  prefix-length byte for ranges): packing is ~10x cheaper than printing an address and is what netlink needs.
  (origin, reason, jail) and the blocklist are interned in `labels`; reasons should therefore be templated
  ("5 failures in 10m"), not per address. The table is WITHOUT ROWID: the primary key *is* the row.
- `bulk`: many single addresses of one label in one row: `keys` (packed addresses end to end), `until`, and
  `ends` (one float64 per address, +inf = permanent; NULL = all end at `until`). A bulk save (`BULK_ROWS`
  addresses or more) writes one; `compact_rows` moves single-address rows into them (in chunks, each one
  transaction), so that a restart reads a few blobs instead of a million rows. `bulk_dead`: tombstones of
  addresses unbanned after a bulk row was written (a tombstone newer than the row hides the address).
  Of one address saved several times, the save that ends last wins (a re-ban never shortens a ban): within
  a label the later save (a row over a bulk row, a later bulk row over an earlier one), across labels
  `drop_shadowed`.
- `history`: (at, jail, target text, until) per ban a jail made, for escalation; pruned by age.
- `positions`: key -> text (file offsets as JSON, journal cursors). `feeds`: feed name -> JSON text.
- `fleet_outbox`: this host's bans and unbans for the fleet, numbered (`oseq`, never reused), with a state:
  pending (to publish), published (kept while active: re-asserted after a server lost them) or dead
  (expired, or unbanned since). `fleet_cursor`: per fleet, the server run id and the last stream id applied.

Writes: every public write is ONE transaction (`commit` can combine bans, deletions, history and positions in
one, so a position never runs ahead of the bans its lines produced). Bans are sorted by key and written with
multi-row statements (`_CHUNK` rows each), so the B-tree fills page after page; the cyclic GC is paused
during bulk work. `save_bans` is an upsert: the last call wins for a (blocklist, target); `created` keeps its
first value.

Reads for a restart: `load_saved(now)` is what the daemon uses: the single-address rows come out of SQLite
already grouped by (label, key length), as packed keys end to end and ends in whole ms (one aggregate,
computed with the GIL released; no Python object per row until the keys are unpacked), plus the rows of
ranges and the bulk rows. `load_active_compact(now)` (rows as SQLite returns them plus a label table) is the
plain form it is tested against; `load_active_rows(now)` gives flat tuples (no `ipaddress` object per row).
Expired rows are filtered out, and deleted by `prune`.

Durability: WAL journal. `synchronous="full"` (the default) fsyncs the WAL at each commit, so an acknowledged
write survives power loss, at ~0.3-1 ms per commit on SSD/virtio (batched calls make that negligible);
`"normal"` survives a crash of the process (SIGKILL) but may lose the last commits on power loss. Either way
a crash never leaves a half-applied call or a duplicate row. The fleet's bookkeeping (`fleet_round`,
`fleet_mark_published`, `set_fleet_cursor`) commits without an fsync even under "full" (`_unsynced`): the next
fsync'd commit carries it to the disk, and losing it in a power cut only republishes or replays.

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

import array
import contextlib
import functools
import gc
import itertools
import json
import logging
import math
import operator
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias, TypeVar, cast

from nftblockd.addr import IPNet, pack_target
from nftblockd.ends import ends_ms, last_end, pack_ends, unpack_ends, unpack_ends_ms
from nftblockd.events import Ban
from nftblockd.state.change import TimedBans
from nftblockd.state.db import WHAT, ProblemKind, StoreError, StoreProblem, Unusable, classify, transaction
from nftblockd.state.salvage import memory_fallback, replace_corrupt
from nftblockd.state.schema import HISTORY_INSERT, Synchronous, label_id, open_file, verify_quick

__all__ = [
    "BULK_ROWS",
    "COMPACT_ROWS",
    "BanRow",
    "CompactBans",
    "HistoryEntry",
    "HistoryRow",
    "OutboxItem",
    "OutboxRow",
    "PackedBans",
    "PruneStats",
    "Row",
    "SavedBans",
    "Store",
    "StoreError",
    "StorePositions",
    "StoreProblem",
    "ends_ms",
    "group_rows",
    "hex_ends_ms",
    "pack_ends",
    "unpack_ends",
    "unpack_ends_ms",
]

log = logging.getLogger("nftblockd.store")
T = TypeVar("T")
BULK_ROWS = 1000  # a bulk save of at least this many single addresses is stored as one `bulk` row
_CHUNK = 200  # rows per multi-row INSERT (200 x 5 = 1000 parameters, far below SQLite's 32766)
_DELETE_CHUNK = 500  # targets per "DELETE ... target IN (...)"
VACUUM_SHARE = 0.25  # give free pages back once they are this share of the file ...
VACUUM_MIN_PAGES = 256  # ... and at least this many (1 MiB with 4 KiB pages)

BanRow: TypeAlias = tuple[str, bytes, float | None, str, str, str]
"""(blocklist, packed target, until or None, origin, reason, jail): one active ban (`load_active_rows`)."""
HistoryRow: TypeAlias = tuple[str, str, float, float | None]
"""(jail, target as text, ban start, ban end or None): one ban in a jail's history (tracker.HistoryRow)."""
PackedBans: TypeAlias = tuple[str, list[bytes], float | None, str, str, str]
"""(blocklist, packed targets, until, origin, reason, jail): many bans sharing one label and end (bulk saves)."""
HistoryEntry: TypeAlias = tuple[str, str, float] | tuple[str, str, float, float | None]


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
    # (label id, until or None, key length 4|16, concatenated packed addresses, ends): bulk saves, tombstones
    # applied. `ends` is None when every address ends at `until`, else one end per address (`unpack_ends`):
    # the rows of compacted single bans (`compact_rows`). An end may have passed: callers filter.
    bulk: list[tuple[int, float | None, int, bytes, bytes | None]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SavedBans:
    """Active bans as a restart reads them: see `Store.load_saved`."""

    labels: dict[int, tuple[str, str, str, str]]  # label id -> (blocklist, origin, reason, jail)
    # (label id, key length 4|16, packed addresses end to end, the end of each in ms since the epoch or None =
    # permanent): the single-address rows, one entry per label and key length, each address once
    hosts: list[tuple[int, int, bytes, list[int | None]]]
    others: list[Row]  # the rows of ranges (label id, packed target, until or None), as SQLite returns them
    bulk: list[tuple[int, float | None, int, bytes, bytes | None]]  # as `CompactBans.bulk`


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


_UPSERT_HEAD = "INSERT INTO bans(blocklist, target, until, label, created) VALUES "
_UPSERT_TAIL = " ON CONFLICT(blocklist, target) DO UPDATE SET until = excluded.until, label = excluded.label"
_SQL_ACTIVE = "SELECT label, target, until FROM bans WHERE until IS NULL OR until > ?"
# A restart's read of single-address rows: per (label, key length) the keys end to end and each end as 16 hex
# digits of whole ms (truncated as Python's int(until * 1000) truncates; -1 = permanent). Aggregates inside
# SQLite, with the GIL released, instead of a tuple, a bytes and a float per row (~0.9 s for a million rows,
# grouped and joined). A BLOB given to group_concat is taken byte for byte (as TEXT in the database's UTF-8,
# with its length: a NUL does not end it); CAST back to BLOB gives those bytes.
_ACTIVE = "(until IS NULL OR until > ?)"
_KEYS, _ENDS = "CAST(group_concat(target, ''){} AS BLOB)", \
    "group_concat(printf('%016x', coalesce(CAST(until * 1000 AS INTEGER), -1)), ''){}"
_SQL_GROUPS = f"SELECT DISTINCT label, length(target) FROM bans WHERE {_ACTIVE}"
_SQL_HOSTS_ONE = (f"SELECT {_KEYS.format('')}, {_ENDS.format('')} FROM bans"
                  f" WHERE {_ACTIVE} AND label = ? AND length(target) = ?")
_SQL_HOSTS_ALL = (f"SELECT label, length(target), {_KEYS.format('')}, {_ENDS.format('')} FROM bans"
                  f" WHERE {_ACTIVE} AND length(target) IN (4, 16) GROUP BY label, length(target)")
_SQL_OTHERS = f"SELECT label, target, until FROM bans WHERE {_ACTIVE} AND length(target) NOT IN (4, 16)"
_FILTER_GROUPS = 4  # 2 to this many groups: one scan, a FILTER per group; more: one scan and a sort by group


def _sql_hosts_by_filter(groups: Sequence[tuple[int, int]]) -> tuple[str, list[int]]:
    """One scan for all these (label, key length) groups, keys and ends of each (no sort, unlike GROUP BY;
    but each FILTER is evaluated for every row: for one group a WHERE is cheaper)."""
    cols = []
    params = []
    for lid, size in groups:
        where = " FILTER (WHERE label = ? AND length(target) = ?)"
        cols += [_KEYS.format(where), _ENDS.format(where)]
        params += [lid, size, lid, size]
    return f"SELECT {', '.join(cols)} FROM bans WHERE {_ACTIVE} AND length(target) IN (4, 16)", params


_BAN_KEY = operator.itemgetter(0, 1)
_FIRST, _SECOND, _THIRD = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)
COMPACT_ROWS = 10_000  # compact_rows moves single-address rows into bulk rows from this many rows on ...
COMPACT_CHUNK = 100_000  # ... this many rows per transaction (~0.3 s of the store's time each)
Row: TypeAlias = tuple[int, bytes, float | None]
"""(label id, packed target, until or None): one saved row as `load_active_compact` returns it."""


def hex_ends_ms(text: str) -> list[int | None]:
    """The ends of `_ENDS` (16 hex digits of ms each, -1 = permanent) as ints, None for permanent."""
    arr = array.array("q", bytes.fromhex(text))
    if sys.byteorder == "little":
        arr.byteswap()
    ends: list[int | None] = arr.tolist()  # type: ignore[assignment]
    if "ffffffffffffffff" in text:  # a C-level search (`-1 in arr` makes an int per element: ~45 ms a million)
        ends = [None if x == -1 else x for x in ends]
    return ends


HostGroups: TypeAlias = dict[tuple[int, int], tuple[list[int], list[int | None]]]
"""(label id, address length) -> (host keys, their ends in ms since the epoch, None = permanent): saved
single-address bans ready to restore."""


def drop_shadowed(groups: HostGroups, blocklist_of: Mapping[int, str]) -> int:
    """An address saved under several labels (a jail's ban, then a longer `nftblock ban` of it) keeps the save
    that ends last (a re-ban never shortens a ban; None = permanent is last of all); it is dropped from the
    other labels' groups, in place. Returns how many entries went. Free when no address is in two groups of
    one blocklist and family (one set of keys per family with several groups); a Python pass otherwise."""
    families: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for g in groups:
        families.setdefault((blocklist_of[g[0]], g[1]), []).append(g)
    dropped = 0
    for members in families.values():
        if len(members) < 2:
            continue
        total = sum(len(groups[g][0]) for g in members)
        if len(set(itertools.chain.from_iterable(groups[g][0] for g in members))) == total:
            continue
        best: dict[int, tuple[float, tuple[int, int]]] = {}
        for g in members:
            keys, untils = groups[g]
            for k, u in zip(keys, untils, strict=True):
                end = math.inf if u is None else u
                cur = best.get(k)
                if cur is None or end > cur[0]:
                    best[k] = (end, g)
        for g in members:
            keys, untils = groups[g]
            keep = [best[k][1] == g for k in keys]
            if not all(keep):
                dropped += len(keep) - sum(keep)
                groups[g] = (list(itertools.compress(keys, keep)), list(itertools.compress(untils, keep)))
    return dropped


def group_rows(rows: list[Row]) -> dict[tuple[int, int], list[Row]]:
    """Saved rows by (label id, packed target length), each group in the rows' order.

    Every pass is C-level (a million rows of one label and size, the usual jail restore, take ~60 ms; a
    per-row dict look-up took ~0.3 s): one label and one size is the whole list; a few labels are filtered
    out one by one; many labels are sorted by label (a stable sort keeps the order within each)."""
    labels = set(map(_FIRST, rows))
    if len(labels) <= 1:
        by_label = {lid: rows for lid in labels}
    elif len(labels) <= 8:
        by_label = {lid: [r for r in rows if r[0] == lid] for lid in labels}
    else:
        by_label = {lid: list(grp) for lid, grp in itertools.groupby(sorted(rows, key=_FIRST), key=_FIRST)}
    out: dict[tuple[int, int], list[Row]] = {}
    for lid, grp in by_label.items():
        sizes = set(map(len, map(_SECOND, grp)))
        if len(sizes) == 1:
            out[(lid, sizes.pop())] = grp
            continue
        for r in grp:
            out.setdefault((lid, len(r[1])), []).append(r)
    return out


def _log_problem(problem: StoreProblem) -> None:
    log.error("%s", problem.message)


# --- the store ---------------------------------------------------------------------------------------


class Store:
    """The daemon's state database. Build it with `Store.open(path)`.

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
            return cls(open_file(p, synchronous, verify), p, persistent=True, synchronous=synchronous,
                       report=report)
        except Unusable as exc:
            if exc.kind == "corrupt":
                try:
                    conn, problem = replace_corrupt(p, exc.detail, synchronous)
                    store = cls(conn, p, persistent=True, synchronous=synchronous, report=report)
                    store._note(problem)
                    return store
                except Unusable as again:
                    exc = again
            conn, problem = memory_fallback(p, exc)
            store = cls(conn, p, persistent=False, synchronous=synchronous, report=report)
            store._note(problem)
            return store

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
            except (sqlite3.Error, Unusable) as exc:
                kind = exc.kind if isinstance(exc, Unusable) else classify(exc)
                self._labels = self._read_labels(self._conn, quiet=True)
                if kind != "corrupt" or not self.persistent:
                    raise self._error(kind, what, exc) from None
                first = exc.detail if isinstance(exc, Unusable) else str(exc)
            # Corruption met mid-run: replace the database (as at open) and do the call once more on the new
            # one; the problem tells the daemon to save again what it holds.
            self._conn.close()
            self._conn = None
            try:
                conn, problem = replace_corrupt(self.path, first, self.synchronous)
            except Unusable as exc2:
                conn, problem = memory_fallback(self.path, exc2)
                self.persistent = False
            self._conn = conn
            self._labels = self._read_labels(conn)
            self._note(problem)
            try:
                return fn(conn)
            except sqlite3.Error as exc:
                raise self._error(classify(exc), what, exc) from None

    @contextlib.contextmanager
    def _unsynced(self, conn: sqlite3.Connection) -> Iterator[None]:
        """A transaction that does not fsync at its commit (`PRAGMA synchronous = NORMAL` for it alone): for the
        fleet's bookkeeping, which the next fsync'd commit (the ban saves) makes durable with it, since WAL frames
        reach the disk in order. A process crash loses none of it; a power cut may lose what was committed since
        the last fsync (at worst: an event not yet acknowledged by the server is not published, a published one
        is published again). At 1,000 bans/s these commits' fsyncs held the ban saves an own ban's publication
        waits for (the store's lock; docs/fleet.md, round three)."""
        if self.synchronous != "full":
            yield
            return
        conn.execute("PRAGMA synchronous = NORMAL")
        try:
            yield
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA synchronous = FULL")

    def _error(self, kind: ProblemKind, what: str, exc: BaseException) -> StoreError:
        return StoreError(kind, str(self.path), f"state database {self.path} {WHAT[kind]} ({exc});"
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

    def commit(self, *, save: Iterable[Ban] = (), delete: Iterable[tuple[str, IPNet]] = (),
              history: Iterable[HistoryEntry] = (), positions: Mapping[str, str] | None = None,
              created: float | None = None, save_packed: Iterable[PackedBans] = (),
              delete_packed: Iterable[tuple[str, list[bytes]]] = (), save_timed: Iterable[TimedBans] = ()) -> None:
        """Save bans, delete (blocklist, target) keys, record history and set positions: ONE transaction.

        Deletions run before saves, so a key in both ends up saved. `created` (default: now) is recorded for
        new rows only. `save_timed`: single addresses each with its own end, one bulk row per entry of
        `BULK_ROWS` addresses or more (rows otherwise); the caller passes only addresses no row of the same
        (blocklist, address) holds yet (bans new to the state), since a row wins over a bulk row at a restart.
        On StoreError nothing of the call was stored.
        """
        stamp = time.time() if created is None else created
        bans = save if isinstance(save, list | tuple) else list(save)
        packed, bulk = _rows_or_bulk(save_packed)
        timed = _timed_bulk(save_timed, packed)
        deletes = _deletes_by_blocklist(delete, delete_packed)
        hist: list[Any] = []
        for e in history:
            hist += (e[2], e[0], e[1], e[3] if len(e) > 3 else None)
        pos = list(positions.items()) if positions else []
        if not (bans or packed or bulk or timed or deletes or hist or pos):
            return

        def run(conn: sqlite3.Connection) -> None:
            # Label ids are resolved here, against this connection: after a corrupt database was replaced
            # the retry sees the new database's ids.
            with _gc_paused():
                flat, new = self._ban_params(bans, stamp, packed)
                with transaction(conn):
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
                        lid = label_id(conn, (blocklist, origin, reason, jail))
                        conn.execute("INSERT INTO bulk(label, until, created, keylen, keys) VALUES(?, ?, ?, ?, ?)",
                                     (lid, until, stamp, len(targets[0]), b"".join(targets)))
                    for t in timed:
                        lid = label_id(conn, (t.blocklist, t.origin, t.reason, t.jail))
                        conn.execute("INSERT INTO bulk(label, until, created, keylen, keys, ends)"
                                     " VALUES(?, ?, ?, ?, ?, ?)", (lid, last_end(t.ends), stamp, t.keylen, t.keys,
                                                                   t.ends))
                    if hist:
                        _insert_many(conn, HISTORY_INSERT, "", 4, hist)
                    if pos:
                        conn.executemany("INSERT OR REPLACE INTO positions(key, value) VALUES(?, ?)", pos)
            self._labels.update(real)

        self._run("save bans" if bans or packed or bulk or timed else "save state", run)

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
        return {key: label_id(conn, key) for key in new}

    def save_bans(self, bans: Iterable[Ban], *, created: float | None = None) -> None:
        """Upsert bans keyed by (blocklist, target) in one transaction (a million in one call is fine)."""
        self.commit(save=bans, created=created)

    def set_positions(self, positions: Mapping[str, str]) -> None:
        self.commit(positions=positions)

    def set_feed_meta(self, name: str, meta: Mapping[str, Any]) -> None:
        text = json.dumps(meta, separators=(",", ":"), sort_keys=True)

        def run(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                conn.execute("INSERT OR REPLACE INTO feeds(name, meta) VALUES(?, ?)", (name, text))

        self._run(f"save the metadata of feed {name}", run)

    def delete_feed_meta(self, name: str) -> None:
        def run(conn: sqlite3.Connection) -> None:
            with transaction(conn):
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

    def load_saved(self, now: float) -> SavedBans:
        """Every ban with no end or ending after `now`, as a restart wants them: the single-address rows
        grouped by (label, key length) into packed keys and ends in ms (`SavedBans.hosts`), the rows of ranges
        as `load_active_compact` gives them, and the bulk rows.

        Compared with `load_active_compact` plus grouping, a million single-address rows cost ~0.25 s of
        SQLite (GIL released) and ~0.04 s of Python instead of ~0.9 s of Python."""
        def run(conn: sqlite3.Connection) -> SavedBans:
            labels = {i: k for k, i in self._read_labels(conn).items()}
            hosts: list[tuple[int, int, bytes, list[int | None]]] = []
            others: list[Row] = []
            conn.execute("BEGIN")  # one snapshot for the few statements below
            try:
                found, others = self._saved_rows(conn, now)
                for lid, size, keys, ends in found:
                    if keys and ends is not None:
                        hosts.append((lid, size, bytes(keys), hex_ends_ms(ends)))
                missing = ({h[0] for h in hosts} | {r[0] for r in others}) - labels.keys()
                if missing:  # only after damage quick_check did not see, or a hand edit: keep the bans anyway
                    marks = ",".join("?" * len(missing))
                    sql = f"SELECT DISTINCT label, blocklist FROM bans WHERE label IN ({marks})"
                    for lid, blocklist in conn.execute(sql, tuple(missing)):
                        labels.setdefault(lid, (blocklist, "store", "", ""))
                bulk = self._load_bulk(conn, now, labels)
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return SavedBans(labels, hosts, others, bulk)

        return self._run("load bans", run)

    @staticmethod
    def _saved_rows(conn: sqlite3.Connection, now: float
                    ) -> tuple[list[tuple[int, int, bytes | None, str | None]], list[Row]]:
        """`load_saved`'s reads of the rows: (label id, key length, keys, ends) per group of single addresses,
        and the rows of ranges. First the groups (a DISTINCT scan, ~0.13 s for a million rows), then one
        aggregate scan: a WHERE for one group (~0.45 s for a million rows), a FILTER per group for a few (one
        group's FILTERs cost ~0.63 s: each is evaluated for every row), a GROUP BY for more (a sort)."""
        groups = conn.execute(_SQL_GROUPS, (now,)).fetchall()
        host_groups = sorted(g for g in groups if g[1] in (4, 16))
        found: list[tuple[int, int, bytes | None, str | None]]
        if len(host_groups) == 1:
            (lid, size), = host_groups
            found = [(lid, size, *conn.execute(_SQL_HOSTS_ONE, (now, lid, size)).fetchone())]
        elif len(host_groups) <= _FILTER_GROUPS:
            sql, params = _sql_hosts_by_filter(host_groups)
            row = conn.execute(sql, (*params, now)).fetchone() if host_groups else ()
            found = [(lid, size, row[2 * i], row[2 * i + 1]) for i, (lid, size) in enumerate(host_groups)]
        else:
            found = conn.execute(_SQL_HOSTS_ALL, (now,)).fetchall()
        others = conn.execute(_SQL_OTHERS, (now,)).fetchall() if len(host_groups) < len(groups) else []
        return found, others

    @staticmethod
    def _load_bulk(conn: sqlite3.Connection, now: float, labels: dict[int, tuple[str, str, str, str]]
                   ) -> list[tuple[int, float | None, int, bytes, bytes | None]]:
        out = []
        dead: dict[str, dict[bytes, float]] = {}
        for blocklist, target, at in conn.execute("SELECT blocklist, target, at FROM bulk_dead"):
            dead.setdefault(blocklist, {})[target] = at
        for lid, until, created, keylen, keys, ends in conn.execute(
                "SELECT label, until, created, keylen, keys, ends FROM bulk WHERE until IS NULL OR until > ?"
                " ORDER BY id", (now,)):
            if lid not in labels:
                continue
            gone = {t for t, at in dead.get(labels[lid][0], {}).items() if at > created}
            if gone:  # rare: an address of this bulk save was unbanned later
                parts = [keys[i:i + keylen] for i in range(0, len(keys), keylen)]
                keep = [t not in gone for t in parts]
                keys = b"".join(itertools.compress(parts, keep))
                if ends is not None:
                    ends = b"".join(itertools.compress([ends[i:i + 8] for i in range(0, len(ends), 8)], keep))
            out.append((lid, until, keylen, keys, ends))
        return out

    def compact_rows(self, now: float, min_rows: int = COMPACT_ROWS, chunk: int = COMPACT_CHUNK) -> int:
        """Move the single-address rows into bulk rows, one per (label, address length) and chunk, each
        address keeping its end; returns how many rows moved (0 when fewer than `min_rows` wait).

        Jail bans are saved one decision at a time, as rows; a restart reading a million of them spends ~1 s
        in SQLite and Python, against ~0.06 s for the same bans as blobs. Rows whose end has passed are
        dropped on the way (prune would). Each chunk of `chunk` rows (in key order) is ONE transaction, so a
        crash leaves every address either in its row or in a bulk row, never both or neither, and other calls
        (the saves of new bans) run between chunks instead of waiting for a million rows. A compacted row is
        newer than every tombstone (an unban deletes the row, so a live row was saved after any unban of its
        address): none hides its addresses.
        """
        count = self._run("count saved bans", lambda c: int(c.execute(
            "SELECT count(*) FROM (SELECT 1 FROM bans LIMIT ?)", (min_rows,)).fetchone()[0]))
        if count < min_rows:
            return 0
        moved = 0
        after: tuple[str, bytes] = ("", b"")
        while True:
            n, last = self._run("compact saved bans", functools.partial(self._compact_chunk, now=now, after=after,
                                                                          chunk=chunk))
            moved += n
            if last is None:
                return moved
            after = last

    @staticmethod
    def _compact_chunk(conn: sqlite3.Connection, *, now: float, after: tuple[str, bytes], chunk: int
                       ) -> tuple[int, tuple[str, bytes] | None]:
        """One chunk of `compact_rows`: the next `chunk` rows after `after` in key order; (rows moved, the last
        key seen, or None at the end)."""
        with _gc_paused(), transaction(conn):
            page = conn.execute("SELECT blocklist, target, label, until FROM bans WHERE (blocklist, target) > (?, ?)"
                                " ORDER BY blocklist, target LIMIT ?", (*after, chunk)).fetchall()
            if not page:
                return 0, None
            rows: list[Row] = [(lid, t, u) for _b, t, lid, u in page if len(t) in (4, 16) and (u is None or u > now)]
            for (lid, keylen), grp in group_rows(rows).items():
                untils = list(map(_THIRD, grp))
                until = None if None in untils else max(cast("list[float]", untils))
                conn.execute("INSERT INTO bulk(label, until, created, keylen, keys, ends) VALUES(?, ?, ?, ?, ?, ?)",
                             (lid, until, now, keylen, b"".join(map(_SECOND, grp)), pack_ends(untils)))
            last = (page[-1][0], page[-1][1])
            conn.execute("DELETE FROM bans WHERE (blocklist, target) > (?, ?) AND (blocklist, target) <= (?, ?)"
                         " AND length(target) IN (4, 16)", (*after, *last))
        return len(rows), last if len(page) == chunk else None

    def load_active_rows(self, now: float) -> list[BanRow]:
        """Every ban with no end or ending after `now`, as plain tuples (no ipaddress objects), one per
        (blocklist, target): a row wins over a bulk save of the same address, a later bulk save over an earlier
        one (a row is written after any bulk row it overlaps: `compact_rows` empties the rows).

        `target` is packed (`addr.unpack_target`, `addr.target_text`); the label strings are shared between rows.
        About 25% slower than `load_active_compact`, which it is built on.
        """
        compact = self.load_active_compact(now)
        labels = compact.labels
        out: dict[tuple[str, bytes], BanRow] = {}  # one per (blocklist, target): the latest save
        with _gc_paused():
            for lid, until, keylen, keys, ends in compact.bulk:  # oldest first
                b, o, r, j = labels[lid]
                each = unpack_ends(ends) if ends is not None else None
                for n, i in enumerate(range(0, len(keys), keylen)):
                    u = until if each is None else each[n]
                    if u is None or u > now:
                        t = keys[i:i + keylen]
                        out[(b, t)] = (b, t, u, o, r, j)
            for lid, target, until in compact.rows:  # a row is newer than any bulk save it overlaps
                b, o, r, j = labels[lid]
                out[(b, target)] = (b, target, until, o, r, j)
        return list(out.values())

    def load_history(self, since: float) -> list[HistoryRow]:
        """History rows that started at or after `since`, oldest first."""
        return self._run("load ban history", lambda c: [
            (j, t, at, u) for at, j, t, u in
            c.execute("SELECT at, jail, target, until FROM history WHERE at >= ? ORDER BY at", (since,))])

    # -- fleet outbox and cursor ------------------------------------------------------------------------

    def fleet_enqueue(self, items: Iterable[OutboxItem], first: int | None = None,
                      noted: Sequence[OutboxItem] = (), noted_first: int | None = None) -> list[int]:
        """Queue own bans/unbans for publishing, in order; returns their oseqs (`first`, `first` + 1, ... when
        given: the publisher numbers what it publishes before the rows are written). An unban also kills the
        earlier bans of its target (a pending one is never published; a published one is never re-asserted).

        `noted`: own bans the server holds without this outbox having published them (fleet-counted bans: the
        count script appended them to the stream), written after `items` as published rows (numbered from
        `noted_first` when given), so that a re-assert gives them back to a server that lost them."""
        rows = list(items)

        def run(conn: sqlite3.Connection) -> list[int]:
            with transaction(conn):
                out = _fleet_enqueue(conn, rows, first)
                _fleet_enqueue(conn, list(noted), noted_first, PUBLISHED)
                return out

        return self._run("queue fleet events", run)

    def fleet_pending(self, now: float, limit: int = 10000) -> list[OutboxRow]:
        """Pending events in oseq order; bans that ended meanwhile are marked dead and skipped."""

        def run(conn: sqlite3.Connection) -> list[OutboxRow]:
            with transaction(conn):
                return _fleet_pending(conn, now, limit)

        return self._run("read the fleet outbox", run)

    def fleet_mark_published(self, oseqs: Iterable[int]) -> None:
        """Published bans stay (re-assert); published unbans have done their job."""
        keys = [(o,) for o in oseqs]

        def run(conn: sqlite3.Connection) -> None:
            with self._unsynced(conn), transaction(conn):  # (lost in a power cut: published again, harmless)
                _fleet_mark_published(conn, keys)

        self._run("mark fleet events published", run)

    def fleet_round(self, published: Iterable[int], items: Iterable[OutboxItem], now: float,
                    limit: int = 10000, first: int | None = None, noted: Sequence[OutboxItem] = (),
                    noted_first: int | None = None) -> list[OutboxRow]:
        """A publish round's store work in ONE transaction (one commit, one call on the store thread):
        `fleet_mark_published(published)`, then `fleet_enqueue(items, first, noted, noted_first)`, then
        `fleet_pending(now, limit)`. Its commit does not fsync (`_unsynced`): the bans' own saves do, right after."""
        keys = [(o,) for o in published]
        rows = list(items)

        def run(conn: sqlite3.Connection) -> list[OutboxRow]:
            with self._unsynced(conn), transaction(conn):
                if keys:
                    _fleet_mark_published(conn, keys)
                if rows:
                    _fleet_enqueue(conn, rows, first)
                if noted:
                    _fleet_enqueue(conn, list(noted), noted_first, PUBLISHED)
                return _fleet_pending(conn, now, limit)

        return self._run("queue and read fleet events", run)

    def fleet_forget(self, targets: Iterable[tuple[str, float]]) -> None:
        """A fleet-wide unban of `target` at `at`: own bans of it made before then are over."""
        keys = [(t, at) for t, at in targets]

        def run(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                conn.executemany("UPDATE fleet_outbox SET state = 2 WHERE target = ? AND op = 'ban' AND state < 2"
                                 " AND created < ?", keys)

        if keys:
            self._run("record fleet unbans", run)

    def fleet_own_active(self, now: float, since: float) -> list[OutboxRow]:
        """Own published bans made since `since` and still running, in oseq order."""
        return self._run("read own fleet bans", lambda c: [OutboxRow(*r) for r in c.execute(
            "SELECT oseq, op, target, until, src, created FROM fleet_outbox WHERE state = 1 AND created >= ?"
            " AND (until IS NULL OR until > ?) ORDER BY oseq", (since, now))])

    def fleet_requeue(self, oseqs: Iterable[int]) -> None:
        """Published bans to publish again (a re-assert): back to pending, published by the publisher's rounds
        with their retries, instead of by the catch-up that found the server lacking them."""
        keys = [(o,) for o in oseqs]

        def run(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                conn.executemany("UPDATE fleet_outbox SET state = 0 WHERE oseq = ? AND state = 1", keys)

        if keys:
            self._run("re-queue fleet bans", run)

    def fleet_next_oseq(self) -> int:
        """The oseq the next queued event gets: above every oseq ever used (AUTOINCREMENT's own record)."""
        row = self._run("read the fleet outbox's sequence", lambda c: c.execute(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'fleet_outbox'), 0),"
            " coalesce((SELECT max(oseq) FROM fleet_outbox), 0))").fetchone())
        return int(row[0]) + 1

    def fleet_outbox_size(self) -> int:
        return int(self._run("count the fleet outbox", lambda c: c.execute(
            "SELECT count(*) FROM fleet_outbox WHERE state = 0").fetchone()[0]))

    def fleet_prune(self, now: float, horizon: float) -> int:
        """Drop dead rows, ended bans and published rows older than the horizon; returns how many."""

        def run(conn: sqlite3.Connection) -> int:
            with transaction(conn):
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
            with self._unsynced(conn), transaction(conn):  # (lost in a power cut: a little replayed, harmless)
                conn.execute("INSERT INTO fleet_cursor(fleet, run_id, last_id) VALUES (?, ?, ?) ON CONFLICT(fleet)"
                             " DO UPDATE SET run_id = excluded.run_id, last_id = excluded.last_id",
                             (fleet, run_id, last_id))

        self._run("save the fleet cursor", run)

    def get_position(self, key: str) -> str | None:
        row = self._run("read a position", lambda c: c.execute(
            "SELECT value FROM positions WHERE key = ?", (key,)).fetchone())
        return None if row is None else str(row[0])

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
            with transaction(conn):
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
            verify_quick(conn)

        self._run("check the database", run)
        return len(self.problems) == before

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


PENDING, PUBLISHED = 0, 1  # fleet_outbox.state (2: dead)


def _fleet_enqueue(conn: sqlite3.Connection, rows: list[OutboxItem], first: int | None = None,
                   state: int = PENDING) -> list[int]:
    """`first`: the oseqs are given (`first` + i), not drawn; one not above every oseq used so far fails the
    transaction (an oseq is never reused: it names one event fleet-wide). `state`: PUBLISHED for rows the
    server already holds (fleet-counted bans)."""
    if first is not None and rows:
        used = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'fleet_outbox'").fetchone()
        if used is not None and first <= used[0]:
            raise sqlite3.IntegrityError(f"fleet oseq {first} was used already (up to {used[0]})")
    out = []
    for i, (op, target, until, src, created) in enumerate(rows):
        if op == "unban":
            conn.execute("UPDATE fleet_outbox SET state = 2 WHERE target = ? AND op = 'ban' AND state < 2", (target,))
        cur = conn.execute("INSERT INTO fleet_outbox(oseq, op, target, until, src, created, state)"
                           " VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (None if first is None else first + i, op, target, until, src, created, state))
        out.append(int(cur.lastrowid or 0))
    return out


def _fleet_pending(conn: sqlite3.Connection, now: float, limit: int) -> list[OutboxRow]:
    """The first `limit` pending rows still worth publishing; the ended bans met on the way are marked dead.
    Only the rows read are looked at: marking every ended pending ban first (one UPDATE over the whole pending
    set) made each round cost as much as the outbox is long, and publishing a million queued bans quadratic
    (100 rounds of 10,000 over a shrinking million). An ended ban further on is marked when a round reaches it."""
    live: list[OutboxRow] = []
    after = 0
    while True:
        want = limit - len(live)
        rows = [OutboxRow(*r) for r in conn.execute(
            "SELECT oseq, op, target, until, src, created FROM fleet_outbox WHERE state = 0 AND oseq > ?"
            " ORDER BY oseq LIMIT ?", (after, want))]
        dead = [(r.oseq,) for r in rows if r.op == "ban" and r.until is not None and r.until <= now]
        if not dead:
            return live + rows
        conn.executemany("UPDATE fleet_outbox SET state = 2 WHERE oseq = ?", dead)
        live += [r for r in rows if not (r.op == "ban" and r.until is not None and r.until <= now)]
        if len(rows) < want:  # the outbox holds no more
            return live
        after = rows[-1].oseq


def _fleet_mark_published(conn: sqlite3.Connection, keys: list[tuple[int]]) -> None:
    conn.executemany("UPDATE fleet_outbox SET state = CASE op WHEN 'ban' THEN 1 ELSE 2 END"
                     " WHERE oseq = ? AND state = 0", keys)


def _rows_or_bulk(save_packed: Iterable[PackedBans]) -> tuple[list[PackedBans], list[PackedBans]]:
    """Packed saves to store row by row, and those big enough (and of one address size) for a bulk row."""
    packed: list[PackedBans] = []
    bulk: list[PackedBans] = []
    for entry in save_packed:
        targets = entry[1]
        size = len(targets[0]) if targets else 0
        if len(targets) >= BULK_ROWS and size in (4, 16) and all(len(t) == size for t in targets):
            bulk.append(entry)
        else:
            packed.append(entry)
    return packed, bulk


def _timed_bulk(save_timed: Iterable[TimedBans], rows: list[PackedBans]) -> list[TimedBans]:
    """Timed saves big enough for a bulk row; the others appended to `rows` as packed saves, one per address."""
    out: list[TimedBans] = []
    for t in save_timed:
        n = len(t.keys) // t.keylen
        if n >= BULK_ROWS:
            out.append(t)
            continue
        rows += [(t.blocklist, [t.keys[i * t.keylen:(i + 1) * t.keylen]], u, t.origin, t.reason, t.jail)
                 for i, u in enumerate(unpack_ends(t.ends))]
    return out


def _deletes_by_blocklist(delete: Iterable[tuple[str, IPNet]], delete_packed: Iterable[tuple[str, list[bytes]]]
                          ) -> dict[str, list[bytes]]:
    deletes: dict[str, list[bytes]] = {}
    for blocklist, target in delete:
        deletes.setdefault(blocklist, []).append(pack_target(target))
    for blocklist, targets in delete_packed:
        deletes.setdefault(blocklist, []).extend(targets)
    return deletes


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
