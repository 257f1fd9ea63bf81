"""Fleet tables of the state store: the outbox (pending, published, dead) and the cursor."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nftblockd.state.schema import SCHEMA_VERSION
from nftblockd.state.store import OutboxItem, Store, StoreError
from tests.helpers.store import memory_store

NOW = 1_700_000_000.0


def test_outbox_order_expiry_and_unbans(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as st:
        seqs = st.fleet_enqueue([("ban", "203.0.113.1", NOW + 100, "jail:sshd", NOW),
                                 ("ban", "203.0.113.2", NOW + 5, "cli", NOW),
                                 ("ban", "203.0.113.3", None, "cli", NOW),
                                 ("ban", "203.0.113.4", NOW + 100, "cli", NOW)])
        assert seqs == sorted(seqs) and len(set(seqs)) == 4
        st.fleet_enqueue([("unban", "203.0.113.4", None, "cli", NOW + 1)])
        assert st.fleet_outbox_size() == 4
        # at NOW+10 the 5-second ban is over: skipped; the unbanned one is never published
        pending = st.fleet_pending(NOW + 10)
        assert [(r.op, r.target) for r in pending] == [("ban", "203.0.113.1"), ("ban", "203.0.113.3"),
                                                       ("unban", "203.0.113.4")]
        st.fleet_mark_published([r.oseq for r in pending])
        assert st.fleet_pending(NOW + 10) == [] and st.fleet_outbox_size() == 0
        own = st.fleet_own_active(NOW + 10, NOW - 60)
        assert [(r.target, r.until) for r in own] == [("203.0.113.1", NOW + 100), ("203.0.113.3", None)]
        # another host unbanned .1 fleet-wide after we banned it: not ours to re-assert any more
        st.fleet_forget([("203.0.113.1", NOW + 20), ("203.0.113.3", NOW - 1)])
        assert [r.target for r in st.fleet_own_active(NOW + 30, NOW - 60)] == ["203.0.113.3"]
        assert st.fleet_prune(NOW + 30, 3600) >= 4
        assert [r.target for r in st.fleet_own_active(NOW + 30, NOW - 60)] == ["203.0.113.3"]
        # past the horizon even a permanent ban is no longer "recent"
        assert st.fleet_prune(NOW + 7200, 3600) == 1


def test_a_fleet_counted_ban_is_kept_as_published_never_pending(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as st:
        st.fleet_enqueue([], noted=[("ban", "192.0.2.77", NOW + 100, "count:sshd", NOW)])
        assert st.fleet_pending(NOW) == [] and st.fleet_outbox_size() == 0  # the count script published it
        own = st.fleet_own_active(NOW + 1, NOW - 60)
        assert [(r.target, r.until, r.src) for r in own] == [("192.0.2.77", NOW + 100, "count:sshd")]
        st.fleet_forget([("192.0.2.77", NOW + 2)])  # unbanned fleet-wide afterwards: not re-asserted
        assert st.fleet_own_active(NOW + 3, NOW - 60) == []


def test_a_publish_round_is_mark_then_queue_then_read_in_one_transaction(tmp_path: Path) -> None:
    # fleet_round against the three calls it stands for, on two stores fed the same events
    batches: list[list[OutboxItem]] = [
        [("ban", "203.0.113.1", NOW + 100, "jail:sshd", NOW), ("ban", "203.0.113.2", NOW + 5, "cli", NOW)],
        [("unban", "203.0.113.1", None, "cli", NOW + 1), ("ban", "203.0.113.3", None, "cli", NOW + 1)],
        [],
        [("ban", "203.0.113.4", NOW + 100, "cli", NOW + 2)],
    ]
    with Store.open(tmp_path / "a.db") as a, Store.open(tmp_path / "b.db") as b:
        sent_a: list[int] = []
        sent_b: list[int] = []
        for i, items in enumerate(batches):
            now = NOW + 3 + 4 * i  # the 5-second ban ends on the way
            got = a.fleet_round(sent_a, items, now, limit=2)
            b.fleet_mark_published(sent_b)
            b.fleet_enqueue(items)
            want = b.fleet_pending(now, limit=2)
            assert got == want
            sent_a, sent_b = [r.oseq for r in got], [r.oseq for r in want]
        assert a.fleet_outbox_size() == b.fleet_outbox_size() == 1  # the last round's read is not marked yet
        assert a.fleet_round(sent_a, [], NOW + 20) == [] and a.fleet_outbox_size() == 0
    # one transaction: a failure leaves nothing of the round behind (the queued items are not written)
    with Store.open(tmp_path / "c.db") as c:
        bad: Any = ("ban", None, None, "cli", NOW)  # a NULL target: the table refuses it
        with pytest.raises(StoreError):
            c.fleet_round([], [("ban", "203.0.113.9", NOW + 100, "cli", NOW), bad], NOW)
        assert c.fleet_outbox_size() == 0


def test_oseq_is_never_reused_and_survives_restart(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store.open(path) as st:
        (a,) = st.fleet_enqueue([("ban", "203.0.113.1", NOW + 1, "cli", NOW)])
        st.fleet_mark_published([a])
        st.fleet_prune(NOW + 2, 3600)
        st.set_fleet_cursor("prod", "run1", "1700000000000-0")
        st.set_fleet_cursor("prod", "run2", "1700000000001-3")
    with Store.open(path) as st:
        (b,) = st.fleet_enqueue([("ban", "203.0.113.1", NOW + 1, "cli", NOW)])
        assert b > a
        assert st.fleet_cursor("prod") == ("run2", "1700000000001-3") and st.fleet_cursor("other") is None


def test_version_2_database_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store.open(path) as st:
        st.set_positions({"k": "v"})
    with sqlite3.connect(path) as c:
        c.execute("DROP TABLE fleet_outbox")
        c.execute("DROP TABLE fleet_cursor")
        c.execute("ALTER TABLE bulk DROP COLUMN ends")  # schema 4's
        c.execute("PRAGMA user_version = 2")
    with Store.open(path) as st:
        assert st.get_position("k") == "v" and st.fleet_outbox_size() == 0
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4


def test_memory_store_has_the_tables() -> None:
    st = memory_store()
    st.fleet_enqueue([("ban", "203.0.113.1", None, "cli", NOW)])
    assert st.fleet_outbox_size() == 1


def _pending_plain(conn: sqlite3.Connection, now: float, limit: int) -> list[tuple[Any, ...]]:
    """The reference: every ended pending ban marked dead first (one UPDATE over the whole outbox), then the first
    `limit` pending rows."""
    conn.execute("UPDATE fleet_outbox SET state = 2 WHERE state = 0 AND op = 'ban' AND until <= ?", (now,))
    return list(conn.execute("SELECT oseq, op, target, until, src, created FROM fleet_outbox WHERE state = 0"
                             " ORDER BY oseq LIMIT ?", (limit,)))


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 100])
def test_pending_reads_only_its_rows_and_comes_to_what_the_whole_outbox_scan_did(tmp_path: Path,
                                                                                  limit: int) -> None:
    # runs of ended bans longer than a round, unbans, permanent bans: every round, the same rows published
    ends: list[float | None] = [NOW - 1] * 9 + [NOW + 5, None, NOW - 5, NOW + 50] + [NOW - 2] * 4 + [NOW + 9]
    items: list[OutboxItem] = [("ban", f"203.0.113.{i}", end, "cli", NOW - 100) for i, end in enumerate(ends)]
    items.insert(3, ("unban", "198.51.100.1", None, "cli", NOW - 100))
    with Store.open(tmp_path / "a.db") as a, Store.open(tmp_path / "b.db") as b:
        a.fleet_enqueue(items)
        b.fleet_enqueue(items)
        ref = sqlite3.connect(tmp_path / "b.db", isolation_level=None)
        try:
            for now in (NOW, NOW, NOW + 6, NOW + 100):
                got = a.fleet_pending(now, limit)
                want = _pending_plain(ref, now, limit)
                assert [tuple(r) for r in got] == want
                a.fleet_mark_published([r.oseq for r in got])
                ref.executemany("UPDATE fleet_outbox SET state = CASE op WHEN 'ban' THEN 1 ELSE 2 END"
                                " WHERE oseq = ?", [(r[0],) for r in want])
            assert a.fleet_pending(NOW + 100, limit) == [] and a.fleet_outbox_size() == 0
        finally:
            ref.close()


def test_the_publisher_numbers_rows_above_every_oseq_used_and_never_reuses_one(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store.open(path) as st:
        assert st.fleet_next_oseq() == 1
        (a,) = st.fleet_enqueue([("ban", "203.0.113.1", NOW + 1, "cli", NOW)])
        st.fleet_mark_published([a])
        st.fleet_prune(NOW + 2, 3600)  # the row is gone; its number stays used
        first = st.fleet_next_oseq()
        assert first == a + 1
        rows = st.fleet_round([], [("ban", "203.0.113.2", NOW + 100, "cli", NOW),
                                   ("unban", "203.0.113.3", None, "cli", NOW)], NOW, first=first)
        assert [r.oseq for r in rows] == [first, first + 1]
        with pytest.raises(StoreError):  # a number used already: the whole round is refused
            st.fleet_round([first], [("ban", "203.0.113.4", NOW + 100, "cli", NOW)], NOW, first=first + 1)
        assert [r.oseq for r in st.fleet_pending(NOW)] == [first, first + 1]
    with Store.open(path) as st:
        assert st.fleet_next_oseq() == first + 2
        assert st.fleet_enqueue([("ban", "203.0.113.5", NOW + 1, "cli", NOW)]) == [first + 2]  # drawn: next


def _syncs(statements: list[str]) -> list[str]:
    return [s for s in statements if s.startswith(("PRAGMA synchronous", "BEGIN", "COMMIT", "ROLLBACK"))]


def test_fleet_bookkeeping_commits_skip_the_fsync_and_the_ban_saves_keep_it(tmp_path: Path) -> None:
    # the publisher's round, its marks and the cursor commit without an fsync (the next ban save's fsync takes
    # them to the disk); every other write keeps synchronous=FULL, and a failed round restores it too
    item: OutboxItem = ("ban", "203.0.113.1", NOW + 100, "jail:sshd", NOW)
    with Store.open(tmp_path / "s.db") as st:
        conn = st._conn  # (the statements the store sends are what is tested)
        assert conn is not None
        seen: list[str] = []
        conn.set_trace_callback(seen.append)
        unsynced = ["PRAGMA synchronous = NORMAL", "BEGIN IMMEDIATE", "COMMIT", "PRAGMA synchronous = FULL"]
        first = st.fleet_next_oseq()
        rows = st.fleet_round([], [item], NOW, first=first)
        assert _syncs(seen) == unsynced and [r.oseq for r in rows] == [first]
        seen.clear()
        st.fleet_mark_published([first])
        st.set_fleet_cursor("lab", "run1", "1-0")
        assert _syncs(seen) == unsynced * 2
        seen.clear()
        with pytest.raises(StoreError):  # a number used already: refused, rolled back, FULL again
            st.fleet_round([], [item], NOW, first=first)
        assert _syncs(seen) == ["PRAGMA synchronous = NORMAL", "BEGIN IMMEDIATE", "ROLLBACK",
                                "PRAGMA synchronous = FULL"]
        seen.clear()
        st.fleet_enqueue([item])  # the offline queue: the only copy of events not yet out, fsync'd
        st.set_positions({"k": "v"})
        assert _syncs(seen) == ["BEGIN IMMEDIATE", "COMMIT"] * 2
        conn.set_trace_callback(None)
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    with Store.open(tmp_path / "n.db", synchronous="normal") as st:
        conn = st._conn
        assert conn is not None
        seen = []
        conn.set_trace_callback(seen.append)
        st.fleet_round([], [item], NOW)
        assert _syncs(seen) == ["BEGIN IMMEDIATE", "COMMIT"]
        conn.set_trace_callback(None)


def test_an_unsynced_round_survives_the_process_dying(tmp_path: Path) -> None:
    # synchronous=NORMAL in WAL mode loses nothing when the process dies (only a power cut can): a child
    # writes a round and exits without closing anything
    path = tmp_path / "s.db"
    code = ("import os, sys\nfrom nftblockd.state.store import Store\n"
            f"st = Store.open({str(path)!r})\n"
            f"st.fleet_round([], [('ban', '203.0.113.9', {NOW + 100}, 'cli', {NOW})], {NOW}, first=1)\n"
            "sys.stdout.flush()\nos._exit(0)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with Store.open(path) as st:
        assert [(r.oseq, r.target) for r in st.fleet_pending(NOW)] == [(1, "203.0.113.9")]
