"""The restart's grouping of saved rows (state.store.group_rows) against the plain per-row grouping it replaces."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nftblockd.state.store import Row, group_rows

_rows = st.lists(st.tuples(st.integers(1, 12), st.sampled_from([b"\x01" * 4, b"\x02" * 4, b"\x03" * 16, b"\x04" * 5,
                                                                  b"\x05" * 17]),
                           st.none() | st.floats(0, 1e10)), max_size=80)


@given(_rows)
def test_group_rows_is_the_plain_grouping(rows: list[Row]) -> None:
    plain: dict[tuple[int, int], list[Row]] = {}
    for r in rows:
        plain.setdefault((r[0], len(r[1])), []).append(r)
    got = group_rows(rows)
    assert {k: list(v) for k, v in got.items()} == plain  # the same groups, each in the rows' order


_ends = st.none() | st.integers(1000, 100_000)  # ms


@given(st.dictionaries(st.tuples(st.integers(1, 4), st.sampled_from([4, 16])),
                       st.lists(st.tuples(st.integers(0, 30), _ends), max_size=25), max_size=6))
def test_drop_shadowed_keeps_the_save_that_ends_last(raw: dict[tuple[int, int], list[tuple[int, int | None]]]
                                                     ) -> None:
    from nftblockd.state.store import HostGroups, drop_shadowed

    blocklist_of = {1: "a", 2: "a", 3: "b", 4: "a"}
    groups: HostGroups = {g: ([k for k, _u in v], [u for _k, u in v]) for g, v in raw.items()}
    drop_shadowed(groups, blocklist_of)

    def last_end(pairs: list[tuple[int, int | None]]) -> dict[int, float]:
        out: dict[int, float] = {}
        for k, u in pairs:
            out[k] = max(out.get(k, 0.0), float("inf") if u is None else u)
        return out

    for fam in {(blocklist_of[g[0]], g[1]) for g in raw}:
        members = [g for g in raw if (blocklist_of[g[0]], g[1]) == fam]
        want = last_end([p for g in members for p in raw[g]])
        # every address is still there, in exactly one label's group, and that group holds its latest end
        where = {k: g for g in members for k in groups[g][0]}
        assert set(where) == set(want)
        assert all(sum(k in groups[g][0] for g in members) == 1 for k in want)
        for k, g in where.items():
            assert last_end(list(zip(*groups[g], strict=True)))[k] == want[k]
