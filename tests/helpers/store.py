"""What tests (and bench/bench_store.py) ask of a `Store` that the daemon never does.

They go through the store's one way in (`Store._run`: its lock, its connection, its error handling), so the
store itself carries no method that only tests call.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from nftblockd.addr import IPNet, unpack_target
from nftblockd.events import Ban, Origin
from nftblockd.state.db import transaction
from nftblockd.state.schema import open_memory
from nftblockd.state.store import HistoryEntry, Store, StoreProblem

_ORIGINS: frozenset[str] = frozenset({"cli", "jail", "feed", "fail2ban", "store", "remote", "kernel"})


def memory_store() -> Store:
    """A store that keeps everything in memory."""

    def unexpected(problem: StoreProblem) -> None:  # an in-memory database has no file to go wrong
        raise AssertionError(problem.message)

    return Store(open_memory(), Path(":memory:"), persistent=False, synchronous="normal", report=unexpected)


def count_bans(store: Store) -> int:
    """Rows and bulk-saved addresses, active or not (bulk tombstones not applied)."""
    return store._run("count bans", lambda c: int(c.execute(
        "SELECT (SELECT count(*) FROM bans) + (SELECT coalesce(sum(length(keys) / keylen), 0) FROM bulk)"
    ).fetchone()[0]))


def load_active_bans(store: Store, now: float) -> list[Ban]:
    """`load_active_rows` as `Ban` values (about 5x slower: an ipaddress object per row)."""
    return [Ban(unpack_target(t), b, u, origin=_origin(o), reason=r, jail=j)
            for b, t, u, o, r, j in store.load_active_rows(now)]


def delete_bans(store: Store, keys: Iterable[tuple[str, IPNet]]) -> None:
    store.commit(delete=keys)


def record_history(store: Store, entries: Iterable[HistoryEntry]) -> None:
    store.commit(history=entries)


def all_positions(store: Store) -> dict[str, str]:
    return store._run("read positions", lambda c: dict(c.execute("SELECT key, value FROM positions")))


def delete_positions(store: Store, keys: Iterable[str]) -> None:
    ks = [(k,) for k in keys]

    def run(conn: sqlite3.Connection) -> None:
        with transaction(conn):
            conn.executemany("DELETE FROM positions WHERE key = ?", ks)

    store._run("delete positions", run)


def compact(store: Store) -> int:
    """Give every free page back to the filesystem now (prune does it past a threshold); returns how many."""
    return store._run("compact", lambda c: Store._compact(c, force=True))


def integrity_check(store: Store) -> list[str]:
    """`PRAGMA integrity_check` (slow: reads everything); ["ok"] when healthy."""
    return store._run("check integrity", lambda c: [str(r[0]) for r in c.execute("PRAGMA integrity_check")])


def _origin(text: str) -> Origin:
    return text if text in _ORIGINS else "store"  # type: ignore[return-value]
