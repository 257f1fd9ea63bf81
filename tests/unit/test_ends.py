"""nftblockd/ends.py, the ends columns the store, the ban state and the fleet sink share, against their plain
definitions (one value at a time)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from nftblockd.ends import ends_ms, last_end, pack_ends, secs_ms, unpack_ends, unpack_ends_ms

_secs = st.floats(0, 4e9, allow_nan=False) | st.integers(0, 4 * 10**9).map(float)
_ends = st.lists(st.none() | _secs, max_size=40)


@given(st.lists(_secs, max_size=40))
def test_secs_ms_is_int_of_a_thousand_times_each(untils: list[float]) -> None:
    assert secs_ms(untils) == [int(u * 1000) for u in untils]


@given(_ends)
def test_the_packed_ends_come_back_as_they_went_and_as_ms(untils: list[float | None]) -> None:
    blob = pack_ends(untils)
    assert len(blob) == 8 * len(untils)
    assert unpack_ends(blob) == untils
    assert ends_ms(untils) == [None if u is None else int(u * 1000) for u in untils]
    assert unpack_ends_ms(blob) == ends_ms(untils)
    if untils:
        assert last_end(blob) == (None if None in untils else max(u for u in untils if u is not None))


def test_an_end_whose_bytes_hold_infinitys_across_two_ends_is_not_taken_for_permanent() -> None:
    # the C-level search for +inf's bytes can hit across two ends: the slow path then finds none
    inf = pack_ends([math.inf])
    a = unpack_ends(inf[4:] + b"\0" * 4)[0]
    b = unpack_ends(b"\0" * 4 + inf[:4])[0]
    assert a is not None and b is not None
    untils: list[float | None] = [b, a]
    blob = pack_ends(untils)
    assert pack_ends([math.inf]) in blob
    assert unpack_ends(blob) == untils and unpack_ends_ms(blob) == ends_ms(untils)
