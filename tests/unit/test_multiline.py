"""fail2ban's maxlines buffer (detect/multiline.py) and the matcher's multi-line path (matcher.Filter with
FilterDef.maxlines > 1): joined windows, lines taken out by a match, <SKIPLINES> lines kept, the last known
date, bounds. fail2ban's own four multi-line filters are scored in test_f2b_conformance.py."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.detect.matcher import MAX_LINE, FilterDef, Match, MatchContext, RegexSource, compile_filter
from nftblockd.detect.multiline import MAX_MAXLINES, BufferedLine, expand_skiplines, joined, split_match

NOW = 1_800_000_000.0
CONN = (r"^conn=(?P<_c>\d+) ACCEPT from <HOST><SKIPLINES>conn=(?P=_c) FAIL$",)


def _filter(regexes: tuple[str, ...] = CONN, maxlines: int = 5, ignore: tuple[str, ...] = (),
            prefregex: str | None = None) -> object:
    return compile_filter(FilterDef(
        name="t", source="t.conf", failregex=tuple(RegexSource(r, f"t.conf:{i}") for i, r in enumerate(regexes)),
        ignoreregex=tuple(RegexSource(r) for r in ignore), maxlines=maxlines,
        prefregex=RegexSource(prefregex) if prefregex else None))


_FILTERS: dict[int, object] = {}


def _hosts(found: list[tuple[int, object]]) -> list[tuple[int, str]]:
    return [(i, str(r.host)) for i, r in found if isinstance(r, Match)]


def test_expand_skiplines_numbers_each() -> None:
    assert expand_skiplines("a<SKIPLINES>b<SKIPLINES>c") == \
        r"a\n(?P<skiplines0>(?:(?:.*\n)*?))b\n(?P<skiplines1>(?:(?:.*\n)*?))c"
    assert expand_skiplines("plain") == "plain"


def test_split_match_keeps_lines_around_and_skipped() -> None:
    buf = [BufferedLine(t, None) for t in ("before", "conn=1 A", "other", "conn=1 F", "after")]
    m = re.search(expand_skiplines(r"^conn=1 A<SKIPLINES>conn=1 F$"), joined(buf), re.MULTILINE)
    assert m is not None
    used, rest = split_match(m, buf)
    assert [b.text for b in used] == ["conn=1 A", "conn=1 F"]
    assert [b.text for b in rest] == ["before", "other", "after"]


def test_interleaved_connections_each_get_their_own_address() -> None:
    f = _filter()
    ctx = MatchContext()
    lines = ["conn=1 ACCEPT from 192.0.2.1", "conn=2 ACCEPT from 192.0.2.2", "conn=2 FAIL", "conn=1 FAIL"]
    assert _hosts(f.scan(lines, NOW, ctx)) == [(2, "192.0.2.2"), (3, "192.0.2.1")]  # type: ignore[attr-defined]
    assert ctx.lines == []  # both matches took their lines


def test_one_line_at_a_time_is_the_same_as_a_batch() -> None:
    lines = ["conn=1 ACCEPT from 192.0.2.1", "noise", "conn=2 ACCEPT from 192.0.2.2", "conn=2 FAIL", "conn=1 FAIL"]
    batch = _hosts(_filter().scan(lines, NOW, MatchContext()))  # type: ignore[attr-defined]
    f, ctx = _filter(), MatchContext()
    single = [(i, str(r.host)) for i, line in enumerate(lines)
              if isinstance(r := f.match(line, NOW, ctx), Match)]  # type: ignore[attr-defined]
    assert batch == single == [(3, "192.0.2.2"), (4, "192.0.2.1")]


def test_lines_further_apart_than_maxlines_do_not_match() -> None:
    f = _filter(maxlines=3)
    lines = ["conn=1 ACCEPT from 192.0.2.1", "a", "b", "conn=1 FAIL"]
    assert f.scan(lines, NOW, MatchContext()) == []  # type: ignore[attr-defined]
    assert _hosts(_filter(maxlines=4).scan(lines, NOW, MatchContext())) == [(3, "192.0.2.1")]  # type: ignore[attr-defined]


def test_without_a_context_each_line_stands_alone() -> None:
    f = _filter()
    assert f.scan(["conn=1 ACCEPT from 192.0.2.1"], NOW, None) == []  # type: ignore[attr-defined]
    assert f.scan(["conn=1 FAIL"], NOW, None) == []  # type: ignore[attr-defined]


def test_a_line_without_a_date_takes_the_one_before() -> None:
    f = _filter((r"^.*\nWARNING: failed from <HOST>$",), maxlines=2)
    found = f.scan(["2026-12-03 10:00:00 org.Some warn", "WARNING: failed from 192.0.2.9"],  # type: ignore[attr-defined]
                   NOW, MatchContext())
    ((i, m),) = found
    first = f._dates.find_span("2026-12-03 10:00:00 org.Some warn", NOW)  # type: ignore[attr-defined]
    assert i == 1 and isinstance(m, Match) and str(m.host) == "192.0.2.9"
    assert m.time is not None and m.time == first[0]


def test_an_embedded_line_break_cannot_pass_for_a_line() -> None:
    f = _filter((r"^user \S+ failed\n^from <HOST>$",), maxlines=2)
    assert f.scan(["user x failed\nfrom 192.0.2.66"], NOW, MatchContext()) == []  # type: ignore[attr-defined]
    assert _hosts(f.scan(["user x failed", "from 192.0.2.6"], NOW, MatchContext())) == [(1, "192.0.2.6")]  # type: ignore[attr-defined]


def test_ignoreregex_on_the_lines_used() -> None:
    f = _filter(ignore=(r"^conn=\d+ ACCEPT from 192\.0\.2\.1$",))
    found = f.scan(["conn=1 ACCEPT from 192.0.2.1", "conn=1 FAIL"], NOW, MatchContext())  # type: ignore[attr-defined]
    ((_, m),) = found
    assert isinstance(m, Match) and m.ignored


def test_prefregex_with_maxlines_falls_back_to_line_by_line() -> None:
    f = _filter((r"^failed from <HOST>$",), prefregex=r"^app: <F-CONTENT>.+</F-CONTENT>$")
    assert any("maxlines = 5 with a prefregex" in n for n in f.notes)  # type: ignore[attr-defined]
    assert _hosts(f.scan(["app: failed from 192.0.2.3"], NOW, MatchContext())) == [(0, "192.0.2.3")]  # type: ignore[attr-defined]


@given(st.lists(st.sampled_from(["conn=1 ACCEPT from 192.0.2.1", "conn=2 ACCEPT from 2001:db8::2", "conn=1 FAIL",
                                 "conn=2 FAIL", "noise", "", "conn=3 FAIL"]), max_size=40),
       st.sampled_from([2, 3, 7, MAX_MAXLINES + 5]))
@settings(max_examples=60, deadline=None)  # no wall-clock limit in a unit test
def test_the_buffer_stays_bounded_and_batches_agree(lines: list[str], maxlines: int) -> None:
    f = _FILTERS.get(maxlines)
    if f is None:
        f = _FILTERS[maxlines] = _filter(maxlines=maxlines)
    ctx = MatchContext()
    batch = f.scan(lines, NOW, ctx)  # type: ignore[attr-defined]
    assert len(ctx.lines) <= min(maxlines, MAX_MAXLINES)
    ctx2 = MatchContext()
    single = [(i, r) for i, line in enumerate(lines) if (r := f.match(line, NOW, ctx2)) is not None]  # type: ignore[attr-defined]
    assert batch == single
    for i, r in batch:
        assert lines[i].endswith("FAIL") and isinstance(r, Match)


def test_names_and_missing_addresses_are_rejected_and_long_lines_cut() -> None:
    f = _filter((r"^conn=(?P<_c>\d+) ACCEPT from <HOST><SKIPLINES>conn=(?P=_c) FAIL$",
                 r"^conn=(?P<_c>\d+) OPEN\nconn=(?P=_c) NOADDR$"))
    found = f.scan(["conn=1 ACCEPT from host.example.org", "conn=1 FAIL", "conn=2 OPEN", "conn=2 NOADDR",  # type: ignore[attr-defined]
                    "conn=3 ACCEPT from 192.0.2.3" + " " * (MAX_LINE + 10), "conn=3 FAIL"], NOW, MatchContext())
    assert [(i, type(r).__name__, getattr(r, "reason", None)) for i, r in found] == [
        (1, "Rejected", "dns-name"), (3, "Rejected", "no-address")]  # line 4 (cut): text after the address
    g = _filter((r"^<F-NOFAIL>ok</F-NOFAIL> from <HOST>\nbye$",), maxlines=2)
    assert g.scan(["ok from 192.0.2.4", "bye"], NOW, MatchContext()) == []  # type: ignore[attr-defined]
