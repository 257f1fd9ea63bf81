"""Stamped lines (the journal's): `Filter.scan(..., stamped=True)` looks for no date, as fail2ban's systemd
backend (filtersystemd.formatJournalEntry hands the journal's date to filter.processLine, which then skips
the date detector and searches the regexes in the whole "host ident[pid]: message").

Checked here on both engines: a date-like text inside a message stays in the text and never becomes the
line's time; the filter's datepattern is not consulted; the result equals a filter whose datepattern is
`{NONE}` (fail2ban's "no date in these lines", the plain general path: the reference) over fail2ban's
sample logs and the benchmark logs with their dates cut off; newlines become "\\n" as formatJournalEntry
writes them; the maxlines buffer keeps stamped lines whole; JailRunner passes the flag and the line's time.
The native core against the Python path on stamped batches: tests/unit/test_native.py.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from nftblockd.config import parse_config
from nftblockd.detect.filterload import load_filter, load_yaml_filter
from nftblockd.detect.jails import BanSink, JailRunner
from nftblockd.detect.matcher import Filter, FilterDef, Match, MatchContext, RegexSource, Rejected, compile_filter
from nftblockd.detect.tracker import JailPolicy, Tracker
from nftblockd.events import LogLine
from nftblockd.sources.base import LineBatch, MemoryPositionStore
from tests.helpers.samples import sample_lines

ROOT = Path(__file__).resolve().parents[2]
FILTERS = ROOT / "nftblockd" / "detect" / "filters"
NOW = 1796205190.0  # 2026-12-02 09:53:10 UTC
# what a file line has and a journal line has not: the date at its head (syslog or ISO)
_HEAD_DATE = re.compile(r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d\S*) ")


def engines(spec: str) -> list[Filter]:
    """The filter on the native core (when built) and on the Python path."""
    nat = load_filter(spec)
    py = load_filter(spec)
    py.disable_native()
    return [nat, py]


def matches(found: list[tuple[int, Match | Rejected]]) -> list[tuple[int, Match]]:
    """The results, every one a Match."""
    out = [(i, r) for i, r in found if isinstance(r, Match)]
    assert len(out) == len(found), found
    return out


def journal_shaped(lines: list[str]) -> list[str]:
    return [_HEAD_DATE.sub("", line) for line in lines]


def generated_lines() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from bench.authlog import server_log

    return list(server_log(3000, seed=7, start=NOW - 86400))


@pytest.mark.parametrize("flt", engines("sshd"), ids=["native", "python"])
def test_a_date_inside_a_journal_message_stays_in_the_text_and_is_not_the_time(flt: Filter) -> None:
    lines = ["web1 sshd[11]: Invalid user Dec  1 10:00:00 from 192.0.2.3 port 22",
             "web1 sshd[12]: Failed password for invalid user 2026-12-01T10:00:00 from 192.0.2.4 port 22 ssh2"]
    got = flt.scan(lines, NOW, MatchContext(), stamped=True)
    assert [(i, str(r.host), r.time, r.fields.get("user")) for i, r in got if isinstance(r, Match)] == [
        (0, "192.0.2.3", None, "Dec  1 10:00:00"), (1, "192.0.2.4", None, "2026-12-01T10:00:00")]
    # the file path cuts the first date it finds out of the line and takes it as the line's time
    filed = flt.scan(lines, NOW, MatchContext())
    assert [r.time for _, r in filed] != [None] * len(filed)


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_the_datepattern_is_not_consulted_for_stamped_lines(native: bool) -> None:
    flt = compile_filter(FilterDef(name="t", source="t.yaml", failregex=(RegexSource(r"^failed from <HOST>$"),),
                                   prefix=RegexSource(r"\s*app\[\d+\]: "), datepattern="^%Y-%m-%d %H:%M:%S"),
                         native=native)
    dated = "2026-12-01 10:00:00 app[1]: failed from 192.0.2.1"
    assert flt.scan([dated], NOW)[0][1].time is not None  # a file line: its date is read and cut out
    assert flt.scan([dated], NOW, stamped=True) == []  # a journal line: the regexes see it whole
    found = matches(flt.scan(["app[1]: failed from 192.0.2.1"], NOW, stamped=True))
    assert [(str(r.host), r.time) for _, r in found] == [("192.0.2.1", None)]


def _no_date(spec: str) -> Filter:
    """The reference: the same filter told that its lines hold no date (`{NONE}`), on the Python path."""
    flt = load_filter(spec)
    return compile_filter(dataclasses.replace(flt.definition, datepattern="{NONE}"), native=False)


@pytest.mark.parametrize("spec", ["sshd", "sshd[mode=aggressive]", "dovecot", "postfix[mode=aggressive]",
                                  "/etc/fail2ban/filter.d/sshd.conf[logtype=journal]"])
def test_stamped_lines_match_as_lines_without_a_date(spec: str) -> None:
    if spec.startswith("/") and not Path(spec.split("[")[0]).is_file():
        pytest.skip("fail2ban's filters are not installed")
    texts = [t for t in journal_shaped(sample_lines() + generated_lines()) if "\n" not in t]
    want = _no_date(spec).scan(texts, NOW, MatchContext())
    assert len([r for _, r in want if isinstance(r, Match)]) > 20  # the comparison has teeth
    for flt in engines(spec):
        assert flt.scan(texts, NOW, MatchContext(), stamped=True) == want, flt.scanner


@pytest.mark.parametrize("flt", engines("sshd"), ids=["native", "python"])
def test_a_newline_in_a_journal_message_is_written_as_fail2ban_writes_it(flt: Filter) -> None:
    # formatJournalEntry: logline.replace('\n', '\\n'); a forged second line never stands on its own
    forged = "web1 sshd[13]: hello\nweb1 sshd[13]: Failed password for root from 192.0.2.5 port 22 ssh2"
    assert flt.scan([forged], NOW, MatchContext(), stamped=True) == []
    kept = "web1 sshd[14]: Failed password for invalid user a\nb from 192.0.2.6 port 22 ssh2"
    found = matches(flt.scan([kept], NOW, MatchContext(), stamped=True))
    assert [(str(r.host), r.fields.get("user")) for _, r in found] == [("192.0.2.6", "a\\nb")]


def test_the_maxlines_buffer_keeps_stamped_lines_whole() -> None:
    flt = compile_filter(FilterDef(
        name="t", source="t.conf", maxlines=3,
        failregex=(RegexSource(r"^\S+ app\[(?P<_c>\d+)\]: accept from <HOST>"
                               r"<SKIPLINES>\S+ app\[(?P=_c)\]: fail at .*$"),)))
    lines = ["web1 app[1]: accept from 192.0.2.7", "web1 app[2]: noise",
             "web1 app[1]: fail at Dec  1 10:00:00"]
    found = matches(flt.scan(lines, NOW, MatchContext(), stamped=True))
    assert [(i, str(r.host), r.time) for i, r in found] == [(2, "192.0.2.7", None)]
    # as file lines, the date is cut out of the last line (fail2ban's file semantics) and becomes its time
    filed = matches(flt.scan(lines, NOW, MatchContext()))
    assert [(i, str(r.host)) for i, r in filed] == [(2, "192.0.2.7")] and filed[0][1].time is not None
    ctx = MatchContext()
    flt.scan(lines[:2], NOW, ctx, stamped=True)
    assert [(b.text, b.time) for b in ctx.lines] == [(lines[0], None), (lines[1], None)]


def _runner(tmp_path: Path) -> JailRunner:
    cfg = parse_config(f"""
state_dir: {tmp_path}
allowlist_self: false
control: {{socket: {tmp_path}/control.sock}}
blocklists: {{default: {{}}}}
jails:
  sshd: {{filter: sshd, journal: {{matches: {{SYSLOG_IDENTIFIER: sshd}}}}, maxretry: 3, findtime: 600}}
""")
    j = cfg.jails[0]
    # `process` returns its bans; only the consumer loop (not run here) hands them to the sink
    no_sink = cast(BanSink, SimpleNamespace())
    return JailRunner(j, load_filter("sshd"), Tracker([JailPolicy.from_config(j)]), no_sink, MemoryPositionStore(),
                      sources=[])


def test_the_jail_takes_a_journal_lines_time_not_a_date_in_its_message(tmp_path: Path) -> None:
    # each message names a date a year old; the entries were written just now (LogLine.time)
    batch = [LogLine("sshd", f"web1 sshd[{20 + i}]: Invalid user Dec  1 10:00:0{i} from 192.0.2.8 port 22",
                     NOW - 5 + i) for i in range(3)]
    runner = _runner(tmp_path)
    bans, _records = runner.process(LineBatch.of(batch), NOW, False, 0.0)  # with their times: stamped
    assert [str(b.target) for b in bans] == ["192.0.2.8/32"]
    assert runner.stats.stale == 0
    # read as file lines, the message's date would be the time: too old to count while catching up
    runner = _runner(tmp_path)
    bans, _records = runner.process(LineBatch("sshd", [ln.text for ln in batch]), NOW, False, 0.0)
    assert bans == [] and runner.stats.stale == 3


def test_an_explicit_datepattern_changes_nothing_for_stamped_lines() -> None:
    sshd = load_yaml_filter(FILTERS / "sshd.yaml")
    with_pattern = compile_filter(dataclasses.replace(sshd, datepattern="^%b %d %H:%M:%S"))
    plain = compile_filter(sshd)
    texts = journal_shaped(generated_lines())
    assert with_pattern.scan(texts, NOW, MatchContext(), stamped=True) == \
        plain.scan(texts, NOW, MatchContext(), stamped=True)


def _fake_journal(monkeypatch: pytest.MonkeyPatch, batches: list[LineBatch]) -> None:
    class FakeJournal:
        def __init__(self, *_a: object, **_k: object) -> None: ...
        def read_all(self) -> list[LineBatch]:
            return batches
        def missing(self) -> list[str]:
            return []
    monkeypatch.setitem(sys.modules, "nftblockd.sources.journal", SimpleNamespace(JournalSource=FakeJournal))


def test_test_filter_never_puts_a_journal_time_on_the_wrong_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from io import StringIO

    from nftblockd.detect.testfilter import _journal_lines
    stamped = [LineBatch("j", ["a", "b"], [1.0, 2.0]), LineBatch("j", ["c"], [3.0])]
    _fake_journal(monkeypatch, stamped)
    assert _journal_lines([("A", "b")], None, StringIO()) == (["a", "b", "c"], [1.0, 2.0, 3.0])
    # a batch without times in the middle: the later times would shift onto earlier lines; unstamped instead
    _fake_journal(monkeypatch, [stamped[0], LineBatch("j", ["x"]), stamped[1]])
    assert _journal_lines([("A", "b")], None, StringIO()) == (["a", "b", "x", "c"], None)
