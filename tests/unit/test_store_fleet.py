"""Fleet tables of the state store: the outbox (pending, published, dead) and the cursor."""

from __future__ import annotations

import sqlite3
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
