"""durations: the hand scanner agrees with the regular expression it replaced, on any text."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.durations import PERMANENT, Permanent, ban_end, format_duration, longest, parse_duration, parse_timeout

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def regex_duration(text: str) -> float | None:
    """The implementation before the scanner (for strings), None where it raised."""
    text = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    pos = 0
    total = 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        return None
    return total


def scanned(text: str) -> float | None:
    try:
        return parse_duration(text)
    except ValueError:
        return None


@given(st.text(alphabet="0123456789.smhdwMSHDW ٣x-", max_size=14) | st.text(max_size=8))
def test_scanner_agrees_with_the_regex(text: str) -> None:
    assert scanned(text) == regex_duration(text)


@pytest.mark.parametrize(("text", "seconds"), [
    ("600s", 600.0), ("10m", 600.0), ("1h30m", 5400.0), ("2d", 172800.0), ("1w", 604800.0), ("500ms", 0.5),
    ("1.5h", 5400.0), (" 90 ", 90.0), ("1H 30M", 5400.0), ("1m1ms", 60.001),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "1.h", "1x", "1h30", "-5s", "1..5s", ".5s", "h1"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(text)


def test_timeouts_and_formatting() -> None:
    assert parse_timeout("Permanent") is PERMANENT and parse_timeout(30) == 30.0
    with pytest.raises(ValueError, match="positive"):
        parse_timeout("0s")
    assert format_duration(3725) == "1h2m5s" and format_duration(PERMANENT) == "permanent"


def test_permanent_is_one_value_and_never_none() -> None:
    # issue 12: None meant "default" on the wire and "permanent" after decoding; a length is now never None
    import copy
    import pickle

    assert Permanent() is PERMANENT and copy.deepcopy(PERMANENT) is PERMANENT
    assert pickle.loads(pickle.dumps(PERMANENT)) is PERMANENT
    for word in ("permanent", "never", " Forever "):
        assert parse_timeout(word) is PERMANENT
    assert PERMANENT is not None and repr(PERMANENT) == "PERMANENT" and str(PERMANENT) == "permanent"


def test_ban_end_is_where_a_length_becomes_an_end() -> None:
    assert ban_end(90.0, 1000.0) == 1090.0
    assert ban_end(PERMANENT, 1000.0) is None  # events.Ban.until's "never ends"
    assert longest([60.0, 3600.0]) == 3600.0 and longest([60.0, PERMANENT]) is PERMANENT
    with pytest.raises(ValueError):
        longest([])
