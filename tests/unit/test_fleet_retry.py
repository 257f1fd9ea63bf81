"""The fleet's reconnect schedule: fast while an outage is young, a slow ramp to the cap for a long one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nftblockd.fleet.catchup import before, format_id
from nftblockd.fleet.retry import CAP, FAST, FIRST, FRESH, YOUNG, retry_delay


def test_a_fresh_outage_is_retried_five_times_a_second_a_young_one_twice() -> None:
    """A Sentinel failover (~2 s) must be met at once, a healed partition of a minute within ~1 s (issue #23):
    the old doubling schedule tried 0.5, 1.5, 3.5, 7.5 s after the loss, and up to 30 s apart later."""
    assert [retry_delay(t) for t in (0.0, 1.0, 3.0, 7.5, FRESH - 0.1)] == [FIRST] * 5
    assert [retry_delay(t) for t in (FRESH, 60.0, YOUNG - 0.1)] == [FAST] * 3


def test_an_old_outage_ramps_up_to_the_cap() -> None:
    assert retry_delay(YOUNG) == FAST
    assert FAST < retry_delay(YOUNG + 60) < CAP
    assert retry_delay(YOUNG + 3600) == CAP


@given(st.floats(0, 10**6), st.floats(0, 10**6))
def test_the_delay_never_shrinks_as_an_outage_ages(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert FIRST <= retry_delay(lo) <= retry_delay(hi) <= CAP


@given(st.integers(0, 2**48), st.integers(0, 2**64 - 1))
def test_before_is_the_id_just_below(ms: int, seq: int) -> None:
    sid = (ms, seq)
    prev = before(sid)
    assert prev < sid or sid == (0, 0)
    assert format_id(prev).count("-") == 1
