"""Split rules (native.split_rule, run_rule in _scan.c): a failregex `^A(?P<user>.*)L B` answered by A, a
search for L from the right and B, instead of PCRE2 backtracking over the user field a character at a time.

The split must give exactly what the whole regex gives: checked against the Python path (`re` on the whole
regex) over lines made of the pieces that make the split take each of its ways: several L in a line, B failing
at the rightmost L, A's first way leaving no L that fits (the whole regex then runs), limits on the message.
"""

from __future__ import annotations

import re
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nftblockd.detect import native
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.matcher import Filter, FilterDef, MatchContext, RegexSource, compile_filter

pytestmark = pytest.mark.skipif(not native.available(), reason="the native core is not built")

UTC = ZoneInfo("UTC")
NOW = 1796205190.0  # 2026-12-02 09:53:10 UTC


@pytest.mark.parametrize(("pattern", "parts"), [
    (r"^Failed (?:password|none) for (?:invalid user |)(?P<user>.*) from (?P<ip4>\d+\.\d+) port \d+$",
     (r"^Failed (?:password|none) for (?:invalid user |)", " from ", r"(?P<ip4>\d+\.\d+) port \d+$")),
    (r"^(?P<f>Disconnecting) user (?P<user>.*) (?P<ip4>\S+)$", (r"^(?P<f>Disconnecting) user ", " ", r"(?P<ip4>\S+)$")),
    (r"^a (?P<user>.*) fromm* x$", (r"^a ", " from", r"m* x$")),  # "m*": the last m is repeated, not literal
    (r"^a [(](?P<user>.*) from x$", (r"^a [(]", " from x", "$")),  # a "(" in a class opens no group
])
def test_split_rule_cuts_at_the_user_field(pattern: str, parts: tuple[str, str, str]) -> None:
    assert native.split_rule(re.compile(pattern)) == parts


@pytest.mark.parametrize("pattern", [
    r"^a (?P<user>.*) from x|y$",  # a top-level alternation
    r"^(?:a (?P<user>.*) from x)$",  # the user field inside a group
    r"^a (?P<u2>b)(?P<user>.*) from (?P=u2)$",  # a back-reference
    r"^a (b)(?P<user>.*) from x$",  # an unnamed group: caught when the parts are compiled (see below)
    r"(?i)^a (?P<user>.*) from x$",  # an inline flag
    r"a (?P<user>.*) from x$",  # not anchored
    r"^a (?P<user>.*)\s+from x$",  # no literal text after the field
])
def test_split_rule_refuses_what_it_cannot_keep_equal(pattern: str) -> None:
    got = native.split_rule(re.compile(pattern))
    if got is not None:  # (only the unnamed group passes split_rule itself)
        assert native._split(re.compile(pattern)) is None


def test_split_rule_refuses_ignorecase() -> None:
    assert native.split_rule(re.compile(r"^a (?P<user>.*) from x$", re.IGNORECASE)) is None


# rules whose split takes each way: B that refuses the rightmost L ("port" must follow), A with a second way
# that only the whole regex finds (`(?: from|)`: its first way eats the L the match needs), L a single space
_RULES = (
    RegexSource(r"^Failed (?:password|none) for (?:invalid user |)<F-USER>.*</F-USER> from <HOST> port \d+(?: ssh2|)$",
                "t:1"),
    RegexSource(r"^go(?: from|)<F-USER>.*</F-USER> from <HOST>$", "t:2"),
    RegexSource(r"^Disconnecting (?:invalid|authenticating) user <F-USER>.*</F-USER> <HOST> port \d+(?: \[preauth\]|)$",
                "t:3"),
    RegexSource(r"^User <F-USER>.*</F-USER> from <HOST> not allowed because (?:a|b)$", "t:4"),
    RegexSource(r"^Accepted for <F-USER>.*</F-USER> from <HOST>(?:: .*|)$", "t:5"),
)
_DEF = FilterDef("split", "test", _RULES, prefix=RegexSource(r"\s*\S+ \S+: "))
_NAT = compile_filter(_DEF, tz=UTC) if native.available() else None
_PY = compile_filter(_DEF, tz=UTC, native=False)

_bits = st.sampled_from([
    "Failed password for ", "Failed none for ", "invalid user ", "go", "go from", "Disconnecting invalid user ",
    "Disconnecting authenticating user ", "User ", " not allowed because a", " not allowed because c", "root",
    "a b", " from ", " from", "from ", " ", "  ", "192.0.2.1", "192.0.2.77", "2001:db8::7", "::ffff:192.0.2.4",
    "host.example", "[192.0.2.5]", " port 22", " port ", " ssh2", " [preauth]", "x", "1", ".", ":", "",
    "Accepted for ", ": see", "[",
])


def _same(lines: list[str]) -> None:
    assert _NAT is not None
    got = _NAT.scan(lines, NOW, MatchContext())
    want = _PY.scan(lines, NOW, MatchContext())
    assert got == want


# a rule's start, then segments "user bits, L, a host, what may follow": several candidate L with a host after
# each, so that more than one may fit and the rightmost must win (t:5's `(?:: .*|)` lets B fit at several;
# its start and the ": x" that makes it so are drawn more often)
_start = st.sampled_from(["Failed password for ", "Failed none for invalid user ", "go", "go from",
                          "Disconnecting invalid user ", "User ", "Accepted for ", "Accepted for ", "Accepted for ",
                          ""])
_segment = st.builds(lambda *p: "".join(p), st.sampled_from(["", "a", "a b", ": x", "["]),
                     st.sampled_from([" from ", " ", " from"]),
                     st.sampled_from(["192.0.2.1", "192.0.2.9", "2001:db8::7", "h.example", "["]),
                     st.sampled_from(["", ": x", ": x", " port 22", " port 22 ssh2", " not allowed because a",
                                      " port 7 [preauth]"]))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_bits, max_size=9).map(lambda b: "Dec  2 09:53:10 web1 sshd[1]: " + "".join(b)),
                min_size=1, max_size=12))
def test_split_rules_find_what_the_whole_regex_finds(lines: list[str]) -> None:
    _same(lines)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.builds(lambda a, b: "Dec  2 09:53:10 web1 sshd[1]: " + a + "".join(b), _start,
                          st.lists(_segment, max_size=4)), min_size=1, max_size=12))
def test_split_rules_take_the_rightmost_candidate_as_the_whole_regex(lines: list[str]) -> None:
    _same(lines)


def test_each_way_of_the_split_is_taken() -> None:
    assert _NAT is not None
    head = "Dec  2 09:53:10 web1 sshd[1]: "
    cases = {
        # the rightmost " from " is followed by no host: the one before it is the match
        "Accepted for a from 192.0.2.1: see from [": ("a", "192.0.2.1"),
        # both " from " fit: the greedy field takes the rightmost
        "Accepted for a from 192.0.2.1: x from 192.0.2.9": ("a from 192.0.2.1: x", "192.0.2.9"),
        "Failed password for a from b from 192.0.2.1 port 22": ("a from b", "192.0.2.1"),
        # A's first way ("go from") leaves no " from ": the whole regex finds the second way, user ""
        "go from 192.0.2.2": ("", "192.0.2.2"),
        "Disconnecting invalid user a b 192.0.2.3 port 7 [preauth]": ("a b", "192.0.2.3"),
        "User root from 2001:db8::7 not allowed because b": ("root", "2001:db8::7"),
    }
    lines = [head + m for m in cases]
    before = _NAT.native_stats
    got = _NAT.scan(lines, NOW, MatchContext())
    after = _NAT.native_stats
    assert [(r.fields.get("user"), str(r.host)) for _, r in got] == list(cases.values())  # type: ignore[union-attr]
    assert before is not None and after is not None
    assert after["split_hits"] - before["split_hits"] == 5 and after["split_misses"] - before["split_misses"] == 1
    _same(lines)


def test_the_sshd_filter_answers_its_usual_failures_by_the_split() -> None:
    flt: Filter = load_filter("sshd")
    lines = ["Dec  2 09:53:10 web1 sshd[7]: Failed password for invalid user admin from 192.0.2.1 port 22 ssh2",
             "Dec  2 09:53:10 web1 sshd[8]: Invalid user admin from 2001:db8::1 port 22"]
    before = flt.native_stats
    assert len(flt.scan(lines, NOW, MatchContext())) == 2
    after = flt.native_stats
    assert before is not None and after is not None and after["split_hits"] - before["split_hits"] == 2
