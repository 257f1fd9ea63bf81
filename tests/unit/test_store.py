"""The state store: round trips, one transaction per call, growth, damage and crash safety.

Fault injection uses real failures: garbage and truncated files, `chattr +i` (which stops root too), a path
that is a directory, `PRAGMA max_page_count` for a full disk, and SIGKILL of a child process mid-write.
sqlite3 is imported here only to inspect files independently of the code under test.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nftblockd.addr import pack_target, parse_target, target_text
from nftblockd.events import MAX_REASON, Ban
from nftblockd.sources.base import PositionStore
from nftblockd.state import schema as schema_mod
from nftblockd.state.schema import SCHEMA_VERSION
from nftblockd.state.store import (
    PruneStats,
    Row,
    Store,
    StoreError,
    StoreProblem,
)
from tests.helpers.store import (
    all_positions,
    compact,
    count_bans,
    delete_bans,
    delete_positions,
    integrity_check,
    load_active_bans,
    memory_store,
    record_history,
)

NOW = 1_800_000_000.0


def ban(target: str, until: float | None = NOW + 3600, blocklist: str = "default", origin: str = "jail",
        reason: str = "5 failures in 10m", jail: str = "sshd") -> Ban:
    return Ban(parse_target(target), blocklist, until, origin, reason, jail)  # type: ignore[arg-type]


def v4(i: int, until: float | None = NOW + 3600, **kw: str) -> Ban:
    return Ban(ipaddress.IPv4Network(i), kw.get("blocklist", "default"), until, "jail", kw.get("reason", "r"),
               "sshd")


def no_problem(p: StoreProblem) -> None:
    pytest.fail(p.message)


@pytest.fixture
def problems() -> list[StoreProblem]:
    return []


@pytest.fixture
def store(tmp_path: Path, problems: list[StoreProblem]) -> Iterator[Store]:
    s = Store.open(tmp_path / "state" / "state.db", on_problem=problems.append)
    yield s
    s.close()


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path)


def fill(path: Path, n: int) -> int:
    """n bans (a third permanent, the rest ending around NOW), history, a position, feed metadata.

    Returns how many bans are active at NOW."""
    bans = [v4(i + 1, None if i % 3 == 0 else NOW + i - n // 2) for i in range(n)]
    with Store.open(path) as s:
        s.save_bans(bans, created=NOW)
        record_history(s, [("sshd", f"10.0.{i // 256}.{i % 256}", NOW - i) for i in range(500)])
        s.set_positions({"file:/var/log/auth.log": '{"offset": 42}'})
        s.set_feed_meta("drop", {"etag": "x"})
    return sum(1 for b in bans if b.until is None or b.until > NOW)


# --- round trips --------------------------------------------------------------------------------------


def test_new_database_layout(store: Store, problems: list[StoreProblem]) -> None:
    assert problems == []
    assert store.persistent
    with contextlib.closing(raw(store.path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert c.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental


def test_save_and_load(store: Store) -> None:
    bans = [ban("192.0.2.1"), ban("10.0.0.0/8", None, origin="cli", reason="manual", jail=""),
            ban("2001:db8::/64", NOW + 10, blocklist="v6"), ban("::ffff:198.51.100.7"),
            ban("198.51.100.9", NOW - 1)]  # already over
    store.save_bans(bans, created=NOW)
    assert count_bans(store) == 5
    rows = store.load_active_rows(NOW)
    assert sorted((b, target_text(t), u, o, r, j) for b, t, u, o, r, j in rows) == [
        ("default", "10.0.0.0/8", None, "cli", "manual", ""),
        ("default", "192.0.2.1", NOW + 3600, "jail", "5 failures in 10m", "sshd"),
        ("default", "198.51.100.7", NOW + 3600, "jail", "5 failures in 10m", "sshd"),
        ("v6", "2001:db8::/64", NOW + 10, "jail", "5 failures in 10m", "sshd"),
    ]
    assert set(load_active_bans(store, NOW)) == {b for b in bans if b.until is None or b.until > NOW} - {
        bans[3]} | {ban("198.51.100.7")}
    # label strings are shared, not copied per row
    jail_rows = [r for r in rows if r[3] == "jail"]
    assert jail_rows[0][4] is jail_rows[1][4]


def test_upsert_last_wins_and_created_is_kept(store: Store) -> None:
    store.save_bans([ban("192.0.2.1", NOW + 10)], created=NOW)
    store.save_bans([ban("192.0.2.1", NOW + 20, reason="again"), ban("192.0.2.1", NOW + 30, reason="third")],
                    created=NOW + 5)
    assert load_active_bans(store, NOW) == [ban("192.0.2.1", NOW + 30, reason="third")]
    with contextlib.closing(raw(store.path)) as c:
        assert c.execute("SELECT count(*), min(created) FROM bans").fetchone() == (1, NOW)


def test_a_huge_reason_is_clipped_on_disk(store: Store) -> None:
    # Issue 13, item 5: a 5 MB comment became a 5 MB database row. The control API refuses it now; the
    # store clips whatever still comes, as the last guard.
    store.save_bans([ban("192.0.2.1", NOW + 10, reason="x" * 5_000_000)], created=NOW)
    (loaded,) = load_active_bans(store, NOW)
    assert len(loaded.reason) == MAX_REASON and loaded.reason.startswith("xxx")
    with contextlib.closing(raw(store.path)) as c:
        assert c.execute("SELECT max(length(reason)) FROM labels").fetchone() == (MAX_REASON,)


def test_same_target_in_two_blocklists(store: Store) -> None:
    store.save_bans([ban("192.0.2.1"), ban("192.0.2.1", blocklist="other")])
    assert sorted(r[0] for r in store.load_active_rows(NOW)) == ["default", "other"]


def test_delete(store: Store) -> None:
    store.save_bans([v4(i) for i in range(1, 1201)] + [v4(5, blocklist="other")])
    delete_bans(store, [("default", ipaddress.IPv4Network(i)) for i in range(1, 1101)]  # > one DELETE chunk
                      + [("default", parse_target("203.0.113.9")), ("nosuch", parse_target("1.2.3.4"))])
    rows = store.load_active_rows(NOW)
    assert len(rows) == 101
    assert ("other", ipaddress.IPv4Address(5).packed) in {(r[0], r[1]) for r in rows}


def test_apply_deletes_before_saving(store: Store) -> None:
    store.save_bans([ban("192.0.2.1")])
    store.commit(delete=[("default", parse_target("192.0.2.1"))], save=[ban("192.0.2.1", None)])
    assert load_active_bans(store, NOW) == [ban("192.0.2.1", None)]


def test_apply_with_nothing_is_a_no_op(store: Store) -> None:
    store.commit()
    store.save_bans(iter(()))
    assert count_bans(store) == 0


def test_history(store: Store) -> None:
    record_history(store, [("sshd", "192.0.2.1", NOW - 100), ("sshd", "192.0.2.1", NOW - 50, NOW + 50),
                          ("nginx", "2001:db8::/64", NOW - 75, None)])
    record_history(store, [("sshd", "192.0.2.1", NOW - 100)])  # the same record again: kept once
    assert store.load_history(NOW - 1000) == [("sshd", "192.0.2.1", NOW - 100, None),
                                              ("nginx", "2001:db8::/64", NOW - 75, None),
                                              ("sshd", "192.0.2.1", NOW - 50, NOW + 50)]
    assert store.load_history(NOW - 60) == [("sshd", "192.0.2.1", NOW - 50, NOW + 50)]


def test_positions(store: Store) -> None:
    assert store.get_position("file:/x") is None
    store.set_positions({"file:/x": '{"ino": 1, "offset": 10}', "journal": "s=abc;i=1"})
    store.set_positions({"file:/x": '{"ino": 1, "offset": 20}'})
    assert store.get_position("file:/x") == '{"ino": 1, "offset": 20}'
    assert all_positions(store) == {"file:/x": '{"ino": 1, "offset": 20}', "journal": "s=abc;i=1"}
    delete_positions(store, ["journal"])
    assert store.get_position("journal") is None


def test_positions_view_is_a_position_store(store: Store) -> None:
    view: PositionStore = store.positions()
    view.set("k", "v")
    assert view.get("k") == "v" == store.get_position("k")


def test_feed_meta(store: Store) -> None:
    assert store.get_feed_meta("drop") is None
    store.set_feed_meta("drop", {"etag": '"abc"', "last_modified": "Tue, 01 Dec 2026", "count": 812})
    assert store.get_feed_meta("drop") == {"etag": '"abc"', "last_modified": "Tue, 01 Dec 2026", "count": 812}
    with contextlib.closing(raw(store.path)) as c, c:
        c.execute("INSERT INTO feeds(name, meta) VALUES('broken', '{not json'), ('list', '[1]')")
    assert store.get_feed_meta("broken") is None
    assert store.get_feed_meta("list") is None
    store.delete_feed_meta("drop")
    assert store.get_feed_meta("drop") is None


def test_reopen_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    active = fill(path, 1000)
    assert 500 < active < 1000
    with Store.open(path, on_problem=no_problem) as s:
        assert count_bans(s) == 1000
        assert len(s.load_active_rows(NOW)) == active
        assert len(s.load_history(0)) == 500
        assert s.get_position("file:/var/log/auth.log") == '{"offset": 42}'
        assert s.get_feed_meta("drop") == {"etag": "x"}


def test_memory_store() -> None:
    with memory_store() as s:
        assert not s.persistent
        s.save_bans([ban("192.0.2.1")])
        assert len(s.load_active_rows(NOW)) == 1
        assert s.file_size() == 0


def test_closed_store_says_so(store: Store) -> None:
    store.close()
    store.close()
    with pytest.raises(StoreError) as e:
        store.save_bans([ban("192.0.2.1")])
    assert e.value.kind == "closed" and str(store.path) in str(e.value)


def test_threads_share_one_store(store: Store) -> None:
    def worker(base: int) -> None:
        for j in range(40):
            store.save_bans([v4(base + j * 100 + k) for k in range(1, 101)])
            store.set_positions({f"t{base}": str(j)})

    threads = [threading.Thread(target=worker, args=(n * 1_000_000,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert count_bans(store) == 4 * 40 * 100
    assert all_positions(store) == {f"t{n * 1_000_000}": "39" for n in range(4)}


def test_compact_load(store: Store) -> None:
    store.save_bans([ban("192.0.2.1"), ban("192.0.2.2", None), ban("192.0.2.3", NOW - 1),
                     ban("2001:db8::1", blocklist="v6", origin="cli", reason="manual", jail="")])
    compact = store.load_active_compact(NOW)
    assert sorted((compact.labels[lid], target_text(t), u) for lid, t, u in compact.rows) == [
        (("default", "jail", "5 failures in 10m", "sshd"), "192.0.2.1", NOW + 3600),
        (("default", "jail", "5 failures in 10m", "sshd"), "192.0.2.2", None),
        (("v6", "cli", "manual", ""), "2001:db8::1", NOW + 3600),
    ]


def test_load_survives_a_missing_label(store: Store) -> None:
    store.save_bans([ban("192.0.2.1")])
    with contextlib.closing(raw(store.path)) as c, c:
        c.execute("DELETE FROM labels")
    assert store.load_active_rows(NOW) == [("default", pack_target(parse_target("192.0.2.1")), NOW + 3600,
                                            "store", "", "")]
    store.save_bans([ban("192.0.2.2")])  # the label comes back
    assert len(store.load_active_rows(NOW)) == 2


# --- one transaction per call ------------------------------------------------------------------------


def test_a_failed_call_stores_nothing(store: Store) -> None:
    """Disk full in the middle of a big call: StoreError, and neither its bans nor its position are kept."""
    store.commit(save=[v4(i) for i in range(1, 101)], positions={"pos": "before"})
    conn = store._conn
    assert conn is not None
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + 5}")
    with pytest.raises(StoreError) as e:
        store.commit(save=[v4(i) for i in range(1000, 60_000)], positions={"pos": "after"},
                    history=[("sshd", "192.0.2.1", NOW)])
    assert e.value.kind == "full"
    assert str(store.path) in str(e.value) and "nothing of this call was stored" in str(e.value)
    assert count_bans(store) == 100
    assert store.get_position("pos") == "before"
    assert store.load_history(0) == []
    conn.execute("PRAGMA max_page_count = 1073741823")
    store.commit(save=[v4(i) for i in range(1000, 60_000)], positions={"pos": "after"})
    assert count_bans(store) == 100 + 59_000


def test_a_failed_call_with_new_labels_leaves_no_stale_label_ids(store: Store) -> None:
    conn = store._conn
    assert conn is not None
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
    with pytest.raises(StoreError):
        store.save_bans([v4(i, reason=f"r{i}") for i in range(1, 2000)])
    conn.execute("PRAGMA max_page_count = 1073741823")
    store.save_bans([v4(1, reason="r1")])
    assert store.load_active_rows(NOW)[0][4] == "r1"


# --- growth -------------------------------------------------------------------------------------------


def test_prune_deletes_expired_old_history_and_gives_space_back(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with Store.open(path) as s:
        s.save_bans([v4(i, NOW + (10 if i % 10 else 10_000), reason=f"r{i % 7}") for i in range(1, 60_001)])
        s.save_bans([ban("192.0.2.1", None, reason="manual")])
        record_history(s, [("sshd", str(i), NOW - i) for i in range(1000)])
        record_history(s, [("nginx", str(i), NOW - i) for i in range(1000)])
        big = s.file_size()
        stats = s.prune(NOW + 100, {"sshd": 500.0})
        assert stats.bans == 54_000
        assert stats.history == (1000 - 401) + (1000 - 401)  # nginx: not named, gets the longest horizon
        assert stats.labels == 0
        assert stats.freed_pages > 0
        assert count_bans(s) == 6001
        assert len(s.load_active_rows(NOW + 100)) == 6001
        s.prune(NOW + 20_000, 1e9)
        assert load_active_bans(s, NOW + 20_000) == [ban("192.0.2.1", None, reason="manual")]
        assert integrity_check(s) == ["ok"]
        assert s.file_size() < big / 4
        with contextlib.closing(raw(path)) as c:
            assert c.execute("SELECT count(*) FROM labels").fetchone()[0] == 1


def test_prune_below_the_threshold_keeps_the_file(store: Store) -> None:
    def pages() -> tuple[int, int]:  # (in the file, of them free), as another reader of the file sees them
        with contextlib.closing(raw(store.path)) as c:
            return c.execute("PRAGMA page_count").fetchone()[0], c.execute("PRAGMA freelist_count").fetchone()[0]

    store.save_bans([v4(i, NOW + 1) for i in range(1, 2001)])  # a few dozen pages: below VACUUM_MIN_PAGES
    assert store.prune(NOW + 2, 86400) == PruneStats(2000, 0, 1, 0)
    total, free = pages()
    assert free > 0  # the deleted rows left free pages, and prune kept them in the file
    store.save_bans([v4(1)])
    assert compact(store) == free  # a forced compaction gives every one of them back ...
    assert pages() == (total - free, 0)  # ... and the file shrinks by as much


# --- schema versions ----------------------------------------------------------------------------------


def test_forward_migration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.db"
    fill(path, 10)

    def to_v2(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE bans ADD COLUMN note TEXT NOT NULL DEFAULT ''")

    nxt = schema_mod.SCHEMA_VERSION + 1
    monkeypatch.setattr(schema_mod, "MIGRATIONS", [*schema_mod.MIGRATIONS, to_v2])
    monkeypatch.setattr(schema_mod, "SCHEMA_VERSION", nxt)
    with Store.open(path, on_problem=no_problem) as s:
        assert count_bans(s) == 10
    with contextlib.closing(raw(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == nxt
        assert "note" in [r[1] for r in c.execute("PRAGMA table_info(bans)")]


def test_a_failed_migration_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            problems: list[StoreProblem]) -> None:
    path = tmp_path / "state.db"
    fill(path, 10)

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE extra(x)")
        conn.execute("SELECT no_such_function()")

    current = schema_mod.SCHEMA_VERSION
    monkeypatch.setattr(schema_mod, "MIGRATIONS", [*schema_mod.MIGRATIONS, broken])
    monkeypatch.setattr(schema_mod, "SCHEMA_VERSION", current + 1)
    with pytest.raises(StoreError, match="this is a bug in nftblockd"):
        Store.open(path, on_problem=problems.append)  # a broken migration is our bug, not the file's
    with contextlib.closing(raw(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == current
        assert "extra" not in {r[0] for r in c.execute("SELECT name FROM sqlite_master")}


def test_database_from_a_newer_version_is_left_alone(tmp_path: Path, problems: list[StoreProblem]) -> None:
    path = tmp_path / "state.db"
    fill(path, 10)
    with contextlib.closing(raw(path)) as c:
        c.execute("PRAGMA user_version = 99")
    before = path.read_bytes()
    with Store.open(path, on_problem=problems.append) as s:
        assert not s.persistent
        s.save_bans([ban("192.0.2.1")])
        assert count_bans(s) == 1
    assert path.read_bytes() == before
    (p,) = problems
    assert p.kind == "too_new" and p.in_memory
    assert str(path) in p.message and "newer nftblockd" in p.message and "schema version 99" in p.message


def test_someone_elses_database_is_left_alone(tmp_path: Path, problems: list[StoreProblem]) -> None:
    path = tmp_path / "fail2ban.sqlite3"
    with contextlib.closing(raw(path)) as c:
        c.execute("CREATE TABLE bips(ip TEXT, jail TEXT)")
        c.commit()
    before = path.read_bytes()
    with Store.open(path, on_problem=problems.append) as s:
        assert not s.persistent
    assert path.read_bytes() == before
    assert not Path(f"{path}-wal").exists()
    assert problems[0].kind == "foreign" and "not an nftblockd state database" in problems[0].message


# --- damage -------------------------------------------------------------------------------------------


def moved_files(path: Path) -> list[Path]:
    return sorted(p for p in path.parent.glob(f"{path.name}.corrupt-*") if not p.name.endswith("-wal"))


def test_garbage_file_is_moved_aside(tmp_path: Path, problems: list[StoreProblem]) -> None:
    path = tmp_path / "state.db"
    junk = random.Random(1).randbytes(50_000)
    path.write_bytes(junk)
    with Store.open(path, on_problem=problems.append) as s:
        assert s.persistent
        s.save_bans([ban("192.0.2.1")])
        assert count_bans(s) == 1
    (p,) = problems
    (moved,) = moved_files(path)
    assert moved.read_bytes() == junk
    assert p.kind == "corrupt" and p.lost_state and not p.in_memory and p.moved_to == str(moved)
    assert p.message.startswith(f"state database {path} is corrupt (file is not a database); moved it to "
                                f"{moved.name} and started a new one")


def test_truncated_database_is_found_at_open(tmp_path: Path, problems: list[StoreProblem]) -> None:
    path = tmp_path / "state.db"
    fill(path, 20_000)
    size = path.stat().st_size
    os.truncate(path, size // 2)
    with Store.open(path, on_problem=problems.append) as s:
        assert s.persistent and count_bans(s) == 0
        assert integrity_check(s) == ["ok"]
    (p,) = problems
    assert p.kind == "corrupt" and "malformed" in p.message
    (moved,) = moved_files(path)
    assert moved.stat().st_size == size // 2


def test_salvage_figures_count_kept_dropped_and_truncated(tmp_path: Path, problems: list[StoreProblem]) -> None:
    # issue 13's state-salvage metrics: rows kept, rows dropped, bytes lost to a truncation
    path = tmp_path / "state.db"
    fill(path, 20_000)
    damage_middle(path)
    with Store.open(path, on_problem=problems.append) as s:
        kept = count_bans(s)
    p = problems[-1]
    assert 10_000 < kept < 20_000 and p.recovered_bans == kept and p.truncated_bytes == 0
    assert p.salvaged_rows >= kept + 500 and p.dropped_rows == 0  # the bans, the history, a position, a feed
    # a truncated file: the header still counts the pages that are gone (SQLite reads nothing from the file
    # itself); the salvage reads a zero-filled copy, so only the bans on the missing pages are lost
    path = tmp_path / "truncated.db"
    fill(path, 20_000)
    os.truncate(path, path.stat().st_size - 8192)
    with Store.open(path, on_problem=problems.append) as s:
        kept = count_bans(s)
    assert problems[-1].truncated_bytes == 8192
    assert kept > 15_000 and problems[-1].recovered_bans == kept  # 0 before the copy was read
    assert not list(tmp_path.glob(".*.salvage"))  # the padded copy is gone
    # a file that is not a database has no header to measure, and nothing to salvage
    other = tmp_path / "junk.db"
    other.write_bytes(random.Random(2).randbytes(50_000))
    with Store.open(other, on_problem=problems.append):
        pass
    assert (problems[-1].truncated_bytes, problems[-1].salvaged_rows, problems[-1].dropped_rows) == (0, 0, 0)


def test_salvage_figures_reach_the_metrics_as_a_scrape_shows_them() -> None:
    from nftblockd.service.metrics import Metrics

    m = Metrics()
    m.state_problem("corrupt", kept_rows=120, dropped_rows=3, truncated_bytes=8192)
    m.state_problem("corrupt", kept_rows=1)
    get = m.registry.get_sample_value
    assert get("nftblock_state_problems_total", {"kind": "corrupt"}) == 2
    assert get("nftblock_state_salvaged_rows_total", {"result": "kept"}) == 121
    assert get("nftblock_state_salvaged_rows_total", {"result": "dropped"}) == 3
    assert get("nftblock_state_truncated_bytes_total") == 8192
    assert b"nftblock_state_truncated_bytes_total 8192.0" in m.render()


def damage_middle(path: Path, pages: int = 2) -> None:
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek((size // 2) // 4096 * 4096)
        f.write(random.Random(7).randbytes(4096 * pages))


def test_damaged_database_keeps_what_can_be_read(tmp_path: Path, problems: list[StoreProblem]) -> None:
    path = tmp_path / "state.db"
    fill(path, 20_000)
    damage_middle(path)
    with Store.open(path, on_problem=problems.append) as s:
        rows = s.load_active_rows(0)
        assert 10_000 < len(rows) < 20_000  # rows on both sides of the damage
        assert {int.from_bytes(r[1], "big") for r in rows} <= set(range(1, 20_001))
        assert s.get_position("file:/var/log/auth.log") == '{"offset": 42}'
        assert s.get_feed_meta("drop") == {"etag": "x"}
        assert len(s.load_history(0)) == 500
    (p,) = problems
    assert p.kind == "corrupt" and p.recovered_bans == len(rows)
    assert f"recovered {len(rows)} bans from it" in p.message


def test_damage_found_mid_run_replaces_the_database(tmp_path: Path, problems: list[StoreProblem]) -> None:
    path = tmp_path / "state.db"
    fill(path, 20_000)
    damage_middle(path)
    with Store.open(path, on_problem=problems.append, verify=False) as s:
        assert problems == []  # not seen yet
        rows = s.load_active_rows(0)  # reads every page: meets it, replaces the file, answers from salvage
        assert 10_000 < len(rows) < 20_000
        assert problems[0].kind == "corrupt" and problems[0].lost_state
        s.save_bans([ban("192.0.2.1")])
    with Store.open(path, on_problem=no_problem) as s:
        assert count_bans(s) == len(rows) + 1
    assert len(moved_files(path)) == 1


def test_verify_later(tmp_path: Path, problems: list[StoreProblem]) -> None:
    """The restart path: open without the check, load, then verify in the background."""
    path = tmp_path / "state.db"
    fill(path, 20_000)
    with Store.open(path, on_problem=problems.append, verify=False) as s:
        assert s.verify()
    damage_middle(path)
    with Store.open(path, on_problem=problems.append, verify=False) as s:
        assert problems == []
        assert not s.verify()
        assert problems[0].kind == "corrupt" and problems[0].recovered_bans > 10_000
        assert s.verify()
        assert count_bans(s) == problems[0].recovered_bans


# --- unusable places ----------------------------------------------------------------------------------


def test_path_is_a_directory(tmp_path: Path, problems: list[StoreProblem]) -> None:
    path = tmp_path / "state.db"
    path.mkdir()
    with Store.open(path, on_problem=problems.append) as s:
        assert not s.persistent
        s.save_bans([ban("192.0.2.1")])
        assert count_bans(s) == 1
    (p,) = problems
    assert p.kind == "unwritable" and p.in_memory
    assert p.message.startswith(f"state database {path} cannot be written (it is not a regular file)")
    assert "will not survive a restart" in p.message


def test_directory_cannot_be_created(tmp_path: Path, problems: list[StoreProblem]) -> None:
    (tmp_path / "file").write_text("")
    with Store.open(tmp_path / "file" / "state.db", on_problem=problems.append) as s:
        assert not s.persistent
    assert problems[0].kind == "unwritable" and "cannot create" in problems[0].message


def test_problems_are_logged_without_a_callback(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "state.db").mkdir()
    with caplog.at_level(logging.ERROR, "nftblockd.store"), Store.open(tmp_path / "state.db") as s:
        assert s.problems and s.problems[0].kind == "unwritable"
    assert "keeping state in memory only" in caplog.text


def chattr_works(tmp_path: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    ok = subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode == 0
    subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
    return ok


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """`chattr +i`: not even root may write, create or delete in it."""
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.root
@pytest.mark.parametrize("what", ["directory", "file"])
def test_immutable_database_runs_in_memory_with_its_bans(tmp_path: Path, what: str,
                                                        problems: list[StoreProblem]) -> None:
    if not chattr_works(tmp_path):
        pytest.skip("needs root and a filesystem with chattr +i")
    path = tmp_path / "state" / "state.db"
    active = fill(path, 100)
    before = path.read_bytes()
    with immutable(path.parent if what == "directory" else path):
        with Store.open(path, on_problem=problems.append) as s:
            assert not s.persistent
            assert len(s.load_active_rows(NOW)) == active
            s.save_bans([ban("192.0.2.1")])  # works, in memory
            assert count_bans(s) == 101
        assert path.read_bytes() == before
    (p,) = problems
    assert p.kind == "unwritable" and p.in_memory and not p.lost_state and p.recovered_bans == 100
    assert str(path) in p.message and "loaded the 100 bans saved in it, read-only" in p.message


# --- crash safety -------------------------------------------------------------------------------------

CHILD = r"""
import ipaddress, random, sys
from nftblockd.events import Ban
from nftblockd.state.store import Store

path, sync, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rnd = random.Random(seed)
store = Store.open(path, synchronous=sync, on_problem=lambda p: sys.exit(p.message))
batch = int(store.get_position("batch") or -1) + 1
next_id = len(store.load_active_rows(0.0))  # ids 1..next_id are saved: every batch adds the next ones
for _ in range(100_000):
    size = rnd.randint(1, 3000)
    until = 1e12 + batch
    bans = [Ban(ipaddress.IPv4Network(next_id + k + 1), "default", until, "jail", f"b{batch % 5}", "j")
            for k in range(size)]
    bans += [Ban(ipaddress.IPv4Network(rnd.randint(1, next_id)), "default", until, "jail", "again", "j")
             for _ in range(rnd.randint(0, 50) if next_id else 0)]  # upserts of earlier bans
    print("begin", batch, flush=True)
    store.commit(save=bans, positions={"batch": str(batch)}, history=[("j", str(batch), float(batch))])
    next_id += size
    print("ack", batch, next_id, flush=True)  # the acknowledgement: only after the commit returned
    batch += 1
"""


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["full", "normal"])
def test_sigkill_loses_no_acknowledged_ban_and_duplicates_none(tmp_path: Path, sync: str) -> None:
    path = tmp_path / "state.db"
    rnd = random.Random(f"sigkill-{sync}")
    acked_batch, acked_ids = -1, 0
    for round_ in range(8):
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), sync, str(rnd.getrandbits(32))],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stderr is not None
        lines: list[str] = []
        acks = rnd.randint(1, 20)
        while line := proc.stdout.readline():  # wait for some acks, then for the next call to begin
            lines.append(line)
            acks -= line.startswith("ack")
            if acks < 0 and line.startswith("begin"):
                break
        for _ in range(rnd.randrange(1_000_000)):  # then kill it somewhere inside that call, or just after
            pass
        proc.kill()
        proc.wait()
        lines += proc.stdout.read().splitlines(keepends=True)  # acknowledged before it died: count those too
        err = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        assert any(x.startswith("ack") for x in lines), f"round {round_}: nothing acknowledged: {err}"
        for line in lines:
            if line.startswith("ack") and line.endswith("\n"):
                b, n = map(int, line.split()[1:])
                assert b == acked_batch + 1, (round_, b, acked_batch)
                acked_batch, acked_ids = b, n

        with contextlib.closing(sqlite3.connect(path)) as c:
            assert c.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            count, distinct = c.execute("SELECT count(*), count(DISTINCT blocklist || hex(target)) FROM bans"
                                        ).fetchone()
            assert count == distinct
            ids = sorted(int.from_bytes(t, "big") for (t,) in c.execute("SELECT target FROM bans"))
            position = int(c.execute("SELECT value FROM positions WHERE key = 'batch'").fetchone()[0])
            history = c.execute("SELECT count(*) FROM history").fetchone()[0]
        # every acknowledged ban is there, once; a batch committed but not acknowledged is there whole
        assert ids == list(range(1, count + 1))
        assert position in (acked_batch, acked_batch + 1)
        assert (count == acked_ids) == (position == acked_batch), (count, acked_ids, position, acked_batch)
        assert history == position + 1
        acked_batch, acked_ids = position, count  # the next child goes on from what is really there


def test_bulk_saves_are_one_row_and_unbans_leave_tombstones(tmp_path: Path) -> None:
    from nftblockd.state.store import BULK_ROWS
    now = 1_800_000_000.0
    keys = [(0x0B000000 + i).to_bytes(4, "big") for i in range(BULK_ROWS * 2)]
    with Store.open(tmp_path / "s.db", on_problem=no_problem) as s:
        s.commit(save_packed=[("default", keys, now + 3600, "cli", "bulk", "")], created=now)
        assert count_bans(s) == len(keys)
        with contextlib.closing(raw(tmp_path / "s.db")) as c:
            assert c.execute("SELECT count(*) FROM bans").fetchone()[0] == 0
            assert c.execute("SELECT count(*) FROM bulk").fetchone()[0] == 1
        s.commit(delete_packed=[("default", keys[:3])], created=now + 1)
        active = {r[1] for r in s.load_active_rows(now + 2)}
        assert keys[0] not in active and keys[3] in active and len(active) == len(keys) - 3
        # banned again later, individually and in a new bulk save: both count again
        s.commit(save_packed=[("default", [keys[0]], now + 7200, "cli", "", "")], created=now + 3)
        s.commit(save_packed=[("default", keys[1:2] + [(0x0C000000 + i).to_bytes(4, "big") for i in range(BULK_ROWS)],
                              now + 7200, "cli", "", "")], created=now + 4)
        active = {r[1] for r in s.load_active_rows(now + 5)}
        assert keys[0] in active and keys[1] in active and keys[2] not in active
        compact = s.load_active_compact(now + 5)
        assert len(compact.bulk) == 2 and compact.labels[compact.bulk[0][0]][0] == "default"
        # once the first bulk row has ended, its tombstones go too
        s.prune(now + 3601, 86400)
        with contextlib.closing(raw(tmp_path / "s.db")) as c:
            assert c.execute("SELECT count(*) FROM bulk").fetchone()[0] == 1
            assert c.execute("SELECT count(*) FROM bulk_dead").fetchone()[0] == 0
    with Store.open(tmp_path / "s.db", on_problem=no_problem) as s:
        assert len({r[1] for r in s.load_active_rows(now + 3602)}) == BULK_ROWS + 2


def test_damaged_database_keeps_its_bulk_bans(tmp_path: Path, problems: list[StoreProblem]) -> None:
    from nftblockd.state.store import BULK_ROWS
    path = tmp_path / "state.db"
    fill(path, 20_000)
    keys = [(0x0D000000 + i).to_bytes(4, "big") for i in range(BULK_ROWS)]
    with Store.open(path, on_problem=no_problem) as s:
        s.commit(save_packed=[("default", keys, NOW + 3600, "cli", "bulk", "")])
    damage_middle(path)
    with Store.open(path, on_problem=problems.append) as s:
        active = {r[1] for r in s.load_active_rows(0)}
    assert set(keys) <= active
    assert problems[0].kind == "corrupt"


def _v3_database(path: Path, rows: list[tuple[str, bytes, float | None, str]]) -> None:
    """A state database as nftblockd wrote it before per-address ends (schema 3): jail bans one row each."""
    conn = sqlite3.connect(path)
    for step in schema_mod.MIGRATIONS[:3]:
        step(conn)
    conn.execute("PRAGMA user_version = 3")
    for jail in sorted({r[3] for r in rows}):
        conn.execute("INSERT INTO labels(blocklist, origin, reason, jail) VALUES('default', 'jail', '5 failures', ?)",
                     (jail,))
    ids = dict(conn.execute("SELECT jail, id FROM labels").fetchall())
    conn.executemany("INSERT INTO bans(blocklist, target, until, label, created) VALUES(?, ?, ?, ?, ?)",
                     [(bl, t, u, ids[j], NOW - 60) for bl, t, u, j in rows])
    conn.commit()
    conn.close()


def test_row_saved_bans_are_compacted_into_bulk_rows_keeping_every_end(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    rnd = random.Random(3)
    hosts = [(0x0B000000 + i).to_bytes(4, "big") for i in range(300)]
    v6 = [(0x20010DB8 << 96 | i).to_bytes(16, "big") for i in range(20)]
    rows = [("default", t, None if i % 7 == 0 else NOW + 60 + rnd.random() * 86400, "sshd" if i % 3 else "web")
            for i, t in enumerate(hosts + v6)]
    rows += [("default", pack_target(parse_target("198.51.100.0/24")), NOW + 600, "sshd"),  # a range: stays a row
             ("default", (0x0C000000).to_bytes(4, "big"), NOW - 1, "sshd")]  # ended: dropped
    _v3_database(path, rows)
    with Store.open(path, on_problem=no_problem) as s:  # migrated to the current schema, rows untouched
        before = sorted(s.load_active_rows(NOW))
        assert len(before) == len(hosts) + len(v6) + 1
        assert s.compact_rows(NOW, min_rows=10_000) == 0  # fewer rows than asked for: nothing moves
        assert s.compact_rows(NOW, min_rows=10, chunk=100) == len(hosts) + len(v6)  # in 4 transactions
        assert sorted(s.load_active_rows(NOW)) == before
        with contextlib.closing(raw(path)) as c:
            assert c.execute("SELECT count(*) FROM bans").fetchone()[0] == 1  # the range
            # per chunk of 100 rows in key order: IPv4 of sshd and of web in each of the first three; the fourth
            # holds the ended row (dropped), the 20 IPv6 addresses (sshd, web) and the range (stays a row)
            assert c.execute("SELECT count(*) FROM bulk").fetchone()[0] == 8
        # later: one address unbanned, one banned again with a later end; a restart sees exactly that
        s.commit(delete_packed=[("default", [hosts[1]])], created=NOW + 10)
        s.commit(save_packed=[("default", [hosts[2]], NOW + 99_999, "jail", "5 failures", "sshd")], created=NOW + 11)
    with Store.open(path, on_problem=no_problem) as s:
        after = {r[1]: r[2] for r in s.load_active_rows(NOW + 12)}
        want = {r[1]: r[2] for r in before if r[1] != hosts[1]}
        want[hosts[2]] = NOW + 99_999
        assert after == want
        # ends pass one by one, not with the row
        later = NOW + 43_200
        assert {r[1] for r in s.load_active_rows(later)} == {t for t, u in want.items() if u is None or u > later}


def test_a_failed_compaction_leaves_the_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nftblockd.state import store as store_mod

    path = tmp_path / "state.db"
    _v3_database(path, [("default", (0x0B000000 + i).to_bytes(4, "big"), NOW + 600, "sshd") for i in range(50)])

    def broken(rows: list[Row]) -> dict[tuple[int, int], list[Row]]:
        raise sqlite3.OperationalError("disk I/O error")  # what a write failing half-way looks like

    with Store.open(path, on_problem=no_problem) as s:
        before = sorted(s.load_active_rows(NOW))
        monkeypatch.setattr(store_mod, "group_rows", broken)
        with pytest.raises(StoreError):
            s.compact_rows(NOW, min_rows=10)
        monkeypatch.undo()
        assert sorted(s.load_active_rows(NOW)) == before
        with contextlib.closing(raw(path)) as c:
            assert c.execute("SELECT count(*) FROM bans").fetchone()[0] == 50
            assert c.execute("SELECT count(*) FROM bulk").fetchone()[0] == 0


def test_ends_round_trip() -> None:
    from nftblockd.state.store import pack_ends, unpack_ends

    ends = [NOW + 1.5, None, NOW - 3, 0.0]
    assert unpack_ends(pack_ends(ends)) == ends and len(pack_ends(ends)) == 32
