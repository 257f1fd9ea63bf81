"""A damaged or unusable state database: salvage what can be read, move the file aside, or run in memory.

Internal to `nftblockd.state`: `Store` calls `replace_corrupt` when it meets corruption (at open or mid-run)
and `memory_fallback` when the file cannot be used at all. Both return a fresh connection and the
`StoreProblem` that says what happened. A database that is not ours or is too new is never written or moved.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nftblockd.state import schema
from nftblockd.state.db import WHAT, StoreProblem, Unusable, connect, ro_uri, transaction
from nftblockd.state.schema import HISTORY_INSERT, Synchronous, label_id, migrate, open_file, open_memory

__all__ = ["memory_fallback", "replace_corrupt"]


@dataclass(slots=True)
class _Salvage:
    labels: dict[int, tuple[str, str, str, str]]
    bans: list[tuple[str, bytes, float | None, int, float]]
    history: list[tuple[float, str, str, float | None]]
    positions: list[tuple[str, str]]
    feeds: list[tuple[str, str]]
    bulk: list[tuple[int, float | None, float, int, bytes, bytes | None]] = field(default_factory=list)
    bulk_dead: list[tuple[str, bytes, float]] = field(default_factory=list)
    truncated_bytes: int = 0  # how much shorter the file is than its header says

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


_HEADER_MAGIC = b"SQLite format 3\x00"


def truncated_bytes(path: Path) -> int:
    """Bytes missing from the end of a database file, from its header's page size (offset 16) and page count
    (offset 28): 0 when the file is whole or its header cannot be read (an empty or overwritten file)."""
    try:
        with path.open("rb") as f:
            head = f.read(100)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return 0
    if len(head) < 100 or not head.startswith(_HEADER_MAGIC):
        return 0
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    return max(0, page_size * pages - size)


def _padded_copy(path: Path, missing: int) -> Path | None:
    """A copy of a truncated database zero-filled to the size its header says, or None if it cannot be made.

    SQLite follows the header's page count into pages past the end of a short file and fails the whole read;
    in a copy filled with zero pages it reads every page that survived and stops only at the missing ones
    (measured: 20,000 bans with the last 8 KiB cut off: 0 rows read from the file, 19,736 from the copy)."""
    copy = path.with_name(f".{path.name}.salvage")
    try:
        shutil.copyfile(path, copy)
        with copy.open("r+b") as f:
            f.truncate(os.fstat(f.fileno()).st_size + missing)
    except OSError:  # no space for it, most likely: salvage from the file as it is
        copy.unlink(missing_ok=True)
        return None
    return copy


def _salvage(path: Path) -> _Salvage:
    s = _Salvage({}, [], [], [], [])
    s.truncated_bytes = truncated_bytes(path)
    copy = _padded_copy(path, s.truncated_bytes) if s.truncated_bytes else None
    try:
        _read_salvage(copy or path, s)
    finally:
        if copy is not None:
            copy.unlink(missing_ok=True)
    return s


def _read_salvage(path: Path, s: _Salvage) -> None:
    try:
        conn = connect(ro_uri(path), uri=True)
    except sqlite3.Error:
        return
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
        _read_until_error(conn, "SELECT label, until, created, keylen, keys, ends FROM bulk", s.bulk)  # v4
        if not s.bulk:  # a v2 or v3 database: no per-address ends
            _read_until_error(conn, "SELECT label, until, created, keylen, keys, NULL FROM bulk", s.bulk)
        _read_until_error(conn, "SELECT blocklist, target, at FROM bulk_dead", s.bulk_dead)
    finally:
        conn.close()


def _restore_salvage(conn: sqlite3.Connection, s: _Salvage) -> tuple[int, int]:
    """Write salvaged rows into a fresh database; rows that do not fit the schema any more are dropped.
    Returns (bans recovered, rows dropped)."""
    good = [b for b in s.bans
            if isinstance(b[0], str) and isinstance(b[1], bytes) and len(b[1]) in (4, 5, 16, 17)]
    with transaction(conn):
        ids = {old: label_id(conn, key) for old, key in s.labels.items()}
        rows = []
        for bl, target, until, label, created in good:
            new = ids.get(label)
            if new is None:  # its label was lost with the damage: keep the ban, say where it came from
                new = label_id(conn, (bl, "store", "recovered from a corrupt state database", ""))
            rows.append((bl, target, until, new, created))
        conn.executemany("INSERT OR REPLACE INTO bans(blocklist, target, until, label, created)"
                         " VALUES(?, ?, ?, ?, ?)", rows)
        conn.executemany(HISTORY_INSERT + "(?, ?, ?, ?)", s.history)
        conn.executemany("INSERT OR REPLACE INTO positions(key, value) VALUES(?, ?)", s.positions)
        conn.executemany("INSERT OR REPLACE INTO feeds(name, meta) VALUES(?, ?)", s.feeds)
        bulk = []
        for label, until, created, keylen, keys, ends in s.bulk:
            if keylen not in (4, 16) or not isinstance(keys, bytes) or len(keys) % keylen:
                continue
            if not isinstance(ends, bytes) or len(ends) != len(keys) // keylen * 8:
                ends = None  # every address then ends at `until`, the latest of them: kept, never shortened
            new = ids.get(label)
            if new is None:
                new = label_id(conn, ("default", "store", "recovered from a corrupt state database", ""))
            bulk.append((new, until, created, keylen, keys, ends))
        conn.executemany("INSERT INTO bulk(label, until, created, keylen, keys, ends) VALUES(?, ?, ?, ?, ?, ?)",
                         bulk)
        conn.executemany("INSERT OR REPLACE INTO bulk_dead(blocklist, target, at) VALUES(?, ?, ?)", s.bulk_dead)
    dropped = len(s.bans) - len(good) + len(s.bulk) - len(bulk)
    return len(rows) + sum(len(b[4]) // b[3] for b in bulk), dropped


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
            src = connect(ro_uri(path, immutable=immutable), uri=True)
        except sqlite3.Error:
            continue
        try:
            version = schema.schema_version(src)
            if not 0 < version <= schema.SCHEMA_VERSION:
                return None
            schema.verify_quick(src)
            mem = connect(":memory:")
            try:
                src.backup(mem)
            except sqlite3.Error:
                mem.close()
                raise
        except (sqlite3.Error, Unusable):
            continue
        finally:
            src.close()
        try:
            migrate(mem)
            count = int(mem.execute("SELECT count(*) FROM bans").fetchone()[0])
        except (sqlite3.Error, Unusable):
            mem.close()
            return None
        return mem, count
    return None


def replace_corrupt(path: Path, detail: str, synchronous: Synchronous
                    ) -> tuple[sqlite3.Connection, StoreProblem]:
    salvage = _salvage(path)
    try:
        moved = _move_aside(path)
    except OSError as exc:
        raise Unusable("unwritable", f"it is corrupt ({detail}) and could not be moved aside: "
                                     f"{exc.strerror or exc}") from None
    conn = open_file(path, synchronous, verify=False)
    read = len(salvage)
    try:
        recovered, dropped = _restore_salvage(conn, salvage) if read else (0, 0)
    except sqlite3.Error:
        recovered, dropped = 0, read
    kept = (f"; recovered {recovered} ban{'' if recovered == 1 else 's'} from it" if recovered
            else "; no ban in it could be recovered")
    return conn, StoreProblem(
        "corrupt", str(path),
        f"state database {path} is corrupt ({detail}); moved it to {moved.name} and started a new one{kept}",
        moved_to=str(moved), lost_state=True, recovered_bans=recovered, salvaged_rows=read - dropped,
        dropped_rows=dropped, truncated_bytes=salvage.truncated_bytes)


def memory_fallback(path: Path, exc: Unusable) -> tuple[sqlite3.Connection, StoreProblem]:
    copy = _readonly_copy(path) if exc.kind not in ("corrupt", "too_new", "foreign") else None
    if copy is not None:
        conn, count = copy
        had = f"; loaded the {count} ban{'' if count == 1 else 's'} saved in it, read-only"
    else:
        conn, had = open_memory(), ""
    if exc.kind == "too_new":
        why = f"state database {path} was written by a newer nftblockd ({exc.detail}); left it untouched"
    elif exc.kind == "foreign":
        why = f"{path} is not an nftblockd state database ({exc.detail}); left it untouched"
    else:
        why = (f"state database {path} {WHAT[exc.kind]} ({exc.detail}); check the permissions, free space"
               f" and mount of {path.parent}")
    return conn, StoreProblem(
        exc.kind, str(path),
        f"{why}{had}; keeping state in memory only, so changes from now on will not survive a restart",
        in_memory=True, lost_state=copy is None, recovered_bans=copy[1] if copy else 0)
