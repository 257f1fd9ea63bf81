"""Store.load_saved (a restart's read: rows grouped, keys and ends in ms decoded from one SQLite aggregate) against
the plain read it replaces: `load_active_compact`'s rows, grouped in Python, each end as int(until * 1000)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import example, given, settings
from hypothesis import strategies as st

import nftblockd.state.store as store_mod
from nftblockd.state.store import Store, ends_ms, hex_ends_ms, pack_ends, unpack_ends, unpack_ends_ms

NOW = 1_790_000_000.25
LABELS = [("a", "jail", "5 failures", "sshd"), ("a", "cli", "manual", ""), ("b", "jail", "x", "recidive"),
          ("a", "jail", "y", "nginx"), ("b", "cli", "", ""), ("a", "feed", "z", "")]
# keys of every length a row may hold, with the bytes that text handling could break (0x00 ends C strings,
# 0x80-0xff are not UTF-8 on their own)
_key = st.one_of(st.binary(min_size=4, max_size=4), st.binary(min_size=16, max_size=16),
                 st.binary(min_size=5, max_size=5), st.binary(min_size=17, max_size=17),
                 st.sampled_from([b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x00\xff\x00\xff", b"\xc3\x28\x00\x80"]))
# ended, ending within a ms of now, sub-ms ends, permanent, far ahead
_until = st.one_of(st.none(), st.floats(NOW - 1000, NOW + 10 * 86400),
                   st.sampled_from([NOW, NOW + 0.0005, NOW + 0.001]), st.just(4102444800.0))
_rows = st.lists(st.tuples(st.integers(0, len(LABELS) - 1), _key, _until), max_size=60)


Hosts = dict[tuple[str, int], set[tuple[bytes, int | None]]]  # (label, key length) -> {(key, end in ms)}


def plain(store: Store) -> tuple[Hosts, list[tuple[str, bytes, float | None]]]:
    compact = store.load_active_compact(NOW)
    hosts: Hosts = {}
    others = []
    for lid, target, until in compact.rows:
        label = compact.labels[lid]
        if len(target) in (4, 16):
            hosts.setdefault((repr(label), len(target)), set()).add(
                (target, None if until is None else int(until * 1000)))
        else:
            others.append((repr(label), target, until))
    return hosts, sorted(others, key=repr)


@settings(max_examples=60, deadline=None)
@given(_rows)
@example([(0, b"\x00\x01\x02\x03", NOW + 5), (0, b"\xff\x00\xff\x00", None), (0, b"\x80" * 4, NOW - 1)])  # one group
@example([(0, b"\x01" * 4, NOW + 5), (0, b"\x02" * 16, NOW + 6), (1, b"\x03" * 5, None)])  # two groups and a range
def test_load_saved_is_the_plain_read(rows: list[tuple[int, bytes, float | None]]) -> None:
    with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "state.db") as store:
        # one row each (fewer than BULK_ROWS per save), all in one transaction: the reference below reads back
        # whatever the table holds, so which save of a repeated key won does not matter here
        store.commit(save_packed=[(LABELS[i][0], [target], until, *LABELS[i][1:]) for i, target, until in rows],
                     created=NOW - 5)
        want_hosts, want_others = plain(store)
        # one group: a WHERE; several: a GROUP BY, or one scan with a FILTER per group
        for filter_groups in (0, 100):
            with mock.patch.object(store_mod, "_FILTER_GROUPS", filter_groups):
                saved = store.load_saved(NOW)
            hosts: Hosts = {}
            for lid, size, blob, ends in saved.hosts:
                keys = [blob[i:i + size] for i in range(0, len(blob), size)]
                assert len(keys) == len(ends) and (repr(saved.labels[lid]), size) not in hosts
                hosts[(repr(saved.labels[lid]), size)] = set(zip(keys, ends, strict=True))
            assert hosts == want_hosts
            assert sorted(((repr(saved.labels[lid]), t, u) for lid, t, u in saved.others), key=repr) == want_others
            assert saved.bulk == []


def test_end_codecs() -> None:
    assert ends_ms([NOW, None, NOW + 0.0009]) == [1_790_000_000_250, None, 1_790_000_000_250]
    assert ends_ms([]) == []
    assert hex_ends_ms("") == []
    assert hex_ends_ms("000001a0c7c2a9fa" + "ffffffffffffffff") == [0x1A0C7C2A9FA, None]


@given(st.lists(st.none() | st.floats(0, 4102444800.0), max_size=50))
def test_unpack_ends_ms_is_ends_ms_of_unpack_ends(untils: list[float | None]) -> None:
    blob = pack_ends(untils)
    assert unpack_ends_ms(blob) == ends_ms(unpack_ends(blob))


def test_rows_whose_label_is_gone_are_kept(tmp_path: Path) -> None:
    # damage quick_check does not see, or a hand edit: a label row deleted under its bans
    path = tmp_path / "state.db"
    with Store.open(path) as store:
        for i, label in enumerate(LABELS[:3]):
            store.commit(save_packed=[(label[0], [bytes([10, 0, 0, i]), bytes(16)], NOW + 60, *label[1:]),
                                      (label[0], [bytes([10, 1, 0, 0, 16])], None, *label[1:])], created=NOW)
        store._run("hand edit", lambda c: c.execute("DELETE FROM labels WHERE origin = 'cli'"))
    with Store.open(path) as store:
        saved, compact = store.load_saved(NOW), store.load_active_compact(NOW)
    assert saved.labels == compact.labels and ("a", "store", "", "") in saved.labels.values()
    got = {(saved.labels[lid], size, blob, tuple(ends)) for lid, size, blob, ends in saved.hosts}
    want = {(compact.labels[lid], len(t), t, (int((NOW + 60) * 1000),)) for lid, t, _u in compact.rows
            if len(t) in (4, 16)}
    assert got == want
    assert sorted(saved.others) == sorted(r for r in compact.rows if len(r[1]) not in (4, 16))
