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
