"""`Store.commit(save_timed=...)` (single addresses each with its own end, one bulk row: a fleet catch-up of jail
bans) against the plain form it replaces: the same bans saved one row each (`save_packed`, one end per row).
What a restart reads, what an unban hides, what a later re-ban and prune leave must be the same."""

from __future__ import annotations

import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

import nftblockd.state.store as store_mod
from nftblockd.state.change import StateChange, TimedBans, timed_bans
from nftblockd.state.store import Store, pack_ends, unpack_ends

NOW = 1_790_000_000.25
# ended, ending within a ms of now, sub-ms ends, permanent, far ahead
_until = st.one_of(st.none(), st.floats(NOW - 1000, NOW + 10 * 86400),
                   st.sampled_from([NOW, NOW + 0.0005, NOW + 0.001]), st.just(4102444800.0))


def _bans(version: int) -> st.SearchStrategy[dict[int, float | None]]:
    return st.dictionaries(st.integers(0, 2 ** (32 if version == 4 else 128) - 1), _until, max_size=12)


def _rows(store: Store, at: float) -> list[tuple[str, bytes, float | None, str, str, str]]:
    return sorted(store.load_active_rows(at), key=repr)


def test_timed_bans_pack_as_bulk_rows_do() -> None:
    untils: list[float | None] = [NOW + 1.5, None, NOW + 0.001]
    t = timed_bans("default", 4, [0x0A000001, 0xFFFFFFFF, 0], untils, "remote", "fleet:b", "")
    assert t == TimedBans("default", 4, bytes.fromhex("0a000001ffffffff00000000"), pack_ends(untils), "remote",
                          "fleet:b", "")
    t6 = timed_bans("default", 6, [1, 2 ** 128 - 1], [None, NOW], "remote", "fleet:b", "")
    assert t6.keylen == 16 and t6.keys == (1).to_bytes(16, "big") + b"\xff" * 16 and unpack_ends(t6.ends) == [None, NOW]
    assert StateChange(timed_saves=[t]) and StateChange.merge([StateChange(), StateChange(timed_saves=[t])]) \
        == StateChange([], [], [], [], [], [t])


@settings(max_examples=40, deadline=None)
@given(_bans(4), _bans(6), st.integers(1, 3), st.data())
def test_timed_saves_read_back_as_the_same_bans_saved_one_row_each(
        v4: dict[int, float | None], v6: dict[int, float | None], bulk_rows: int, data: st.DataObject) -> None:
    later = NOW + data.draw(st.floats(0, 11 * 86400))
    gone4 = data.draw(st.lists(st.sampled_from(sorted(v4)), unique=True)) if v4 else []
    again = data.draw(st.sampled_from(sorted(v4))) if v4 else None
    label = ("remote", "fleet:web-02", "")
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(store_mod, "BULK_ROWS", bulk_rows), \
            Store.open(Path(tmp) / "timed.db") as timed, Store.open(Path(tmp) / "rows.db") as rows:
        timed.commit(save_timed=[timed_bans("default", v, list(d), list(d.values()), *label)
                                 for v, d in ((4, v4), (6, v6)) if d], created=NOW - 5)
        rows.commit(save_packed=[("default", [k.to_bytes(4 if v == 4 else 16, "big")], u, *label)
                                 for v, d in ((4, v4), (6, v6)) for k, u in d.items()], created=NOW - 5)
        assert _rows(timed, NOW) == _rows(rows, NOW)
        # big enough saves: one bulk row each (read at a time before every end)
        assert len(timed.load_active_compact(0).bulk) == sum(len(d) >= bulk_rows for d in (v4, v6))
        # unbans (tombstones over the bulk row), then one address banned again for longer, as its row
        for s in (timed, rows):
            s.commit(delete_packed=[("default", [k.to_bytes(4, "big") for k in gone4])], created=NOW + 1)
            if again is not None:
                s.commit(save_packed=[("default", [again.to_bytes(4, "big")], NOW + 99 * 86400, *label)],
                         created=NOW + 2)
        assert _rows(timed, NOW + 3) == _rows(rows, NOW + 3)
        assert _rows(timed, later) == _rows(rows, later)
        for s in (timed, rows):
            s.prune(later, 86400)
        assert _rows(timed, later) == _rows(rows, later)
        # a restart's read: the bulk rows keep every address's own end
        saved = timed.load_saved(NOW)
        restored = {(k, u) for _lid, _until, size, keys, ends in saved.bulk if ends is not None
                    for k, u in zip([keys[i:i + size] for i in range(0, len(keys), size)], unpack_ends(ends),
                                    strict=True)}
        assert restored <= {(k.to_bytes(4 if v == 4 else 16, "big"), u) for v, d in ((4, v4), (6, v6))
                            for k, u in d.items()}
