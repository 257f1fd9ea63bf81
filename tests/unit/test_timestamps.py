"""timestamps: the common log time forms, year inference from `now`, zones, fail2ban datepatterns, and the
syslog/ISO shortcuts checked against the templates they stand in for."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.detect.timestamps import DateParser, DatePatternError, Stamp, parse_timestamp

ZURICH = ZoneInfo("Europe/Zurich")
NOW = datetime(2026, 12, 2, 9, 53, 10, tzinfo=UTC).timestamp()


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


def at(line: str, now: float = NOW, pattern: str | None = None, tz: ZoneInfo | None = None) -> Stamp | None:
    return DateParser(pattern, tz=tz or ZoneInfo("UTC")).find(line, now)


# -- the forms logs use --------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "expected", "text"), [
    ("Dec  2 09:53:10 host sshd[1]: x", utc(2026, 12, 2, 9, 53, 10), "Dec  2 09:53:10"),
    ("Dec 02 09:53:10 host sshd[1]: x", utc(2026, 12, 2, 9, 53, 10), "Dec 02 09:53:10"),
    ("Feb 7 16:01:07 linux sshd[5106]: x", utc(2026, 2, 7, 16, 1, 7), "Feb 7 16:01:07"),
    ("2026-12-02T09:53:10+01:00 host sshd[1]: x", utc(2026, 12, 2, 8, 53, 10), "2026-12-02T09:53:10+01:00"),
    ("2026-12-02T09:53:10.123456Z host x", utc(2026, 12, 2, 9, 53, 10) + 0.123456, None),
    ("2026-12-02 09:53:10,388 fail2ban.actions: NOTICE", utc(2026, 12, 2, 9, 53, 10) + 0.388, None),
    ("2026/12/02 09:53:10 [error] 12#0: *1 user", utc(2026, 12, 2, 9, 53, 10), "2026/12/02 09:53:10"),
    ('1.2.3.4 - - [02/Dec/2026:09:53:10 +0100] "GET / HTTP/1.1" 400', utc(2026, 12, 2, 8, 53, 10),
     "02/Dec/2026:09:53:10 +0100"),
    ("[Wed Dec 02 09:53:10.123456 2026] [auth_basic:error] [client 1.2.3.4]",
     utc(2026, 12, 2, 9, 53, 10) + 0.123456, "Wed Dec 02 09:53:10.123456 2026"),
    ("1796205190.250 something happened", 1796205190.25, "1796205190.250"),
    ("[1796205190] nsd[1]: x", 1796205190.0, "1796205190"),
    ("type=USER_AUTH msg=audit(1796205190.123:42): pid=1", 1796205190.123, "1796205190.123"),
])
def test_common_forms(line: str, expected: float, text: str | None) -> None:
    stamp = at(line)
    assert stamp is not None
    assert stamp.time == pytest.approx(expected)
    if text is not None:
        assert line[stamp.start:stamp.end] == text


@pytest.mark.parametrize("line", ["", "no date in here", "sshd[1]: Failed password", "12345",
                                  "Dec 99 99:99:99 x", "\x00\xff\udcff"])
def test_no_time_gives_none(line: str) -> None:
    assert at(line) is None
    assert parse_timestamp(line, NOW) is None


def test_journal_iso_with_microseconds_and_offset() -> None:
    s = at("2015-04-16T18:02:50.321974+00:00 host sshd[2716]: pam_unix(sshd:auth)")
    assert s is not None and s.time == pytest.approx(utc(2015, 4, 16, 18, 2, 50) + 0.321974)


# -- the year comes from `now`, never from the clock ----------------------------------------------------


def test_year_is_inferred_from_now() -> None:
    assert at("Dec  2 09:53:10 h x", now=utc(2026, 12, 2, 10, 0, 0)).time == utc(2026, 12, 2, 9, 53, 10)  # type: ignore[union-attr]
    assert at("Dec  2 09:53:10 h x", now=utc(2030, 12, 2, 10, 0, 0)).time == utc(2030, 12, 2, 9, 53, 10)  # type: ignore[union-attr]


def test_a_date_ahead_of_now_is_last_years() -> None:
    # read on 2 January: 31 December is last year's; a line one day "ahead" is tolerated (zones, clocks)
    jan2 = utc(2027, 1, 2, 0, 30, 0)
    assert at("Dec 31 23:59:59 h x", now=jan2).time == utc(2026, 12, 31, 23, 59, 59)  # type: ignore[union-attr]
    assert at("Jan  2 23:00:00 h x", now=jan2).time == utc(2027, 1, 2, 23, 0, 0)  # type: ignore[union-attr]
    assert at("Jan  4 00:00:00 h x", now=jan2).time == utc(2026, 1, 4, 0, 0, 0)  # type: ignore[union-attr]


def test_february_29_belongs_to_the_last_leap_year_within_reach() -> None:
    # read in March 2025: 29 February 2025 does not exist, 2024's is the one of the last twelve months
    s = at("Feb 29 10:00:00 h x", now=utc(2025, 3, 1))
    assert s is not None and s.time == utc(2024, 2, 29, 10, 0, 0)
    assert at("Feb 29 10:00:00 h x", now=utc(2026, 3, 1)) is None  # neither 2026 nor 2025 has one


# -- zones ---------------------------------------------------------------------------------------------


def test_naive_times_are_read_in_the_given_zone() -> None:
    assert at("Jul 13 18:44:28 h x", tz=ZURICH, now=utc(2026, 8, 1)).time == utc(2026, 7, 13, 16, 44, 28)  # type: ignore[union-attr]
    assert at("Nov 13 18:44:28 h x", tz=ZURICH).time == utc(2026, 11, 13, 17, 44, 28)  # type: ignore[union-attr]


def test_explicit_offsets_ignore_the_zone() -> None:
    assert at("2026-07-13T18:44:28+00:00 h x", tz=ZURICH).time == utc(2026, 7, 13, 18, 44, 28)  # type: ignore[union-attr]
    assert at("[13/Jul/2026:18:44:28 -0400] x", tz=ZURICH).time == utc(2026, 7, 13, 22, 44, 28)  # type: ignore[union-attr]


def test_daylight_saving_changes_are_exact() -> None:
    # Europe/Zurich: 29 March 2026 02:00 -> 03:00; 25 October 2026 03:00 -> 02:00
    p = DateParser(tz=ZURICH)
    now = utc(2026, 11, 1)
    before = p.find("Mar 29 01:59:59 h x", now)
    after = p.find("Mar 29 03:00:00 h x", now)
    assert before is not None and after is not None and after.time - before.time == 1.0
    late = p.find("Oct 25 03:30:00 h x", now)
    assert late is not None and late.time == utc(2026, 10, 25, 2, 30, 0)


def test_host_zone_when_none_given() -> None:
    # the host's zone is whatever it is; only check the value is the naive local time
    s = DateParser().find("Dec  2 09:53:10 h x", NOW)
    assert s is not None
    assert datetime.fromtimestamp(s.time).replace(microsecond=0) == datetime(2026, 12, 2, 9, 53, 10)


# -- fail2ban datepatterns -----------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "line", "expected"), [
    ("^%Y-%m-%d %H:%M:%S", "2026-12-02 09:53:10 x", utc(2026, 12, 2, 9, 53, 10)),
    ("^%%Y-%%m-%%d %%H:%%M:%%S".replace("%%", "%"), "2026-12-02 09:53:10 x", utc(2026, 12, 2, 9, 53, 10)),
    ("{^LN-BEG}", "Dec  2 09:53:10 h", utc(2026, 12, 2, 9, 53, 10)),
    (r"^[^\[]*\[({DATE})", '1.2.3.4 - - [02/Dec/2026:09:53:10 +0000] "GET /"', utc(2026, 12, 2, 9, 53, 10)),
    (r"^<\d+>\d+\s+{DATE}", "<38>1 2019-07-08T17:40:16.954167-04:00 host sshd 1 - - x",
     utc(2019, 7, 8, 21, 40, 16) + 0.954167),
    ("EPOCH", "1796205190 x", 1796205190.0),
    ("{^LN-BEG}LEPOCH", "1796205190123 x", 1796205190.123),
    ("{^LN-BEG}TAI64N", "@4000000069300000 00000000 x".replace(" 00000000", "00000000"),
     float(0x69300000 - 10)),
    ("^%b %d, %ExY %I:%M:%S %p", "Dec 02, 2026 09:53:10 PM x", utc(2026, 12, 2, 21, 53, 10)),
    ("^L %d/%m/%Y - %H:%M:%S", "L 02/12/2026 - 09:53:10: x", utc(2026, 12, 2, 9, 53, 10)),
])
def test_datepatterns(pattern: str, line: str, expected: float) -> None:
    s = at(line, pattern=pattern)
    assert s is not None
    assert s.time == pytest.approx(expected)


def test_date_is_cut_out_as_fail2ban_does() -> None:
    line = '1.2.3.4 - - [02/Dec/2026:09:53:10 +0000] "GET /" 400'
    s = at(line, pattern=r"^[^\[]*\[({DATE})")
    assert s is not None and line[:s.start] + line[s.end:] == '1.2.3.4 - - [] "GET /" 400'


def test_none_pattern_never_finds_a_time() -> None:
    p = DateParser("{NONE}")
    assert p.disabled and p.find("Dec  2 09:53:10 h x", NOW) is None


def test_bad_pattern_is_an_error() -> None:
    with pytest.raises(DatePatternError):
        DateParser("^(%Y")


def test_line_begin_only_does_not_search_the_line() -> None:
    assert at('x [02/Dec/2026:09:53:10 +0000] y', pattern="{^LN-BEG}") is None
    assert at('x [02/Dec/2026:09:53:10 +0000] y') is not None


# -- shortcuts are exact -------------------------------------------------------------------------------

_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


@st.composite
def stamped_lines(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["syslog", "iso", "other"]))
    if kind == "syslog":
        day = draw(st.integers(1, 31))
        sep = draw(st.sampled_from([" ", "0", ""])) if day < 10 else ""
        hh, mm, ss = draw(st.integers(0, 23)), draw(st.integers(0, 59)), draw(st.integers(0, 61))
        head = f"{draw(st.sampled_from(_MONTHS))} {sep}{day} {hh:02d}:{mm:02d}:{ss:02d}"
    elif kind == "iso":
        y, mo, d = draw(st.integers(1995, 2040)), draw(st.integers(1, 13)), draw(st.integers(1, 31))
        hh, mm, ss = draw(st.integers(0, 23)), draw(st.integers(0, 59)), draw(st.integers(0, 60))
        head = (f"{y}-{mo:02d}-{d:02d}T{hh:02d}:{mm:02d}:{ss:02d}"
                + draw(st.sampled_from(["", ".5", ".123456", ",9"]))
                + draw(st.sampled_from(["", "Z", "+01:00", "-0400", "+05"])))
    else:
        head = draw(st.text(max_size=20))
    tail = draw(st.sampled_from([" host sshd[1]: x", " 2026 host", " .5 x", " +0100 x", " UTC x", "", " 7 x",
                                 "x", " Z x"]))
    return head + tail


FAST = DateParser(tz=ZURICH)
SLOW = DateParser(tz=ZURICH)
SLOW._fast = False  # the template order alone, without the shortcuts
OTHERS = (DateParser("{^LN-BEG}"), DateParser(r"^[^\[]*\[({DATE})"))


@settings(max_examples=300, deadline=None)
@given(stamped_lines(), st.floats(1.6e9, 2.2e9))
def test_shortcuts_agree_with_the_templates(line: str, now: float) -> None:
    assert FAST.find(line, now) == SLOW.find(line, now)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.floats(0, 4e9))
def test_never_raises(line: str, now: float) -> None:
    for p in (FAST, *OTHERS):
        p.find(line, now)


def test_memo_is_bounded_and_does_not_change_results() -> None:
    p = DateParser(tz=ZoneInfo("UTC"))
    first = p.find("Dec  2 09:53:10 h x", NOW)
    for i in range(10000):
        p.find(f"Nov {1 + i % 28:2d} {i % 24:02d}:{i % 60:02d}:{(i // 60) % 60:02d} h x", NOW)
    assert len(p._memo) <= 4096 and len(p._syslog) <= 4096
    assert p.find("Dec  2 09:53:10 h x", NOW) == first
