"""The native scanning core (nftblockd/detect/_scan.c via native.py) against the pure-Python path.

Differential: every filter (built-ins in every mode, fail2ban's filter files read by nftblockd.f2b) gives
line by line the same results natively as on the Python path, over fail2ban's sample logs, the benchmarks'
generated logs and hypothesis-made hostile lines (injection shapes, overlong lines, invalid UTF-8, NUL bytes,
control characters, non-ASCII text, timestamps in DST changes); each translated regex finds the same spans
as `re` on arbitrary ASCII text. Also: the translation's refusals, the match limit on a pathological line,
the interpreter when the JIT is refused (MemoryDenyWriteExecute), and the Python path without the extension.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from unittest import mock
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nftblockd import __version__
from nftblockd.daemon.main import main as nftblockd_main
from nftblockd.detect import matcher, native
from nftblockd.detect.filterload import builtin_filters, load_filter, load_yaml_filter
from nftblockd.detect.matcher import Filter, FilterDef, MatchContext, RegexSource, compile_filter
from nftblockd.detect.rxlint import lint_regex
from tests.helpers.samples import sample_lines

ROOT = Path(__file__).resolve().parents[2]
UTC = ZoneInfo("UTC")
ZURICH = ZoneInfo("Europe/Zurich")  # has DST: hours that do not exist or happen twice
NOW = 1796205190.0  # 2026-12-02 09:53:10 UTC
F2B = Path("/etc/fail2ban/filter.d")
FILTERS = ROOT / "nftblockd" / "detect" / "filters"
MODES = {"sshd": ["normal", "ddos", "extra", "aggressive"],
         "postfix": ["normal", "rbl", "auth", "errors", "ddos", "aggressive"],
         "dovecot": ["normal", "aggressive"], "apache-auth": ["normal", "aggressive"],
         "nginx-http-auth": ["normal", "fallback", "aggressive"]}

pytestmark = pytest.mark.skipif(not native.available(), reason="the native core is not built")


def pair(definition: FilterDef, tz: object = UTC) -> tuple[Filter, Filter]:
    """(native, Python reference) for one definition."""
    return (compile_filter(definition, tz=tz),  # type: ignore[arg-type]
            compile_filter(definition, tz=tz, native=False))  # type: ignore[arg-type]


def builtin_definitions() -> Iterator[tuple[str, FilterDef]]:
    for name in builtin_filters():
        for mode in MODES.get(name, [None]):
            yield f"{name}[{mode}]", load_yaml_filter(FILTERS / f"{name}.yaml", {"mode": mode} if mode else {})


_F2B: list[Filter] = []


def f2b_filters() -> list[Filter]:
    if _F2B:
        return _F2B
    out = _F2B
    if F2B.is_dir():
        for conf in sorted(F2B.glob("*.conf")):
            if conf.stem.endswith("common"):
                continue
            try:
                out.append(load_filter(str(conf), tz=UTC))
            except ValueError:
                continue  # what nftblockd cannot load at all (conformance counts those)
    return out




def generated_lines() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from bench.authlog import burst, server_log

    lines = list(server_log(4000, seed=3, start=NOW - 86400))
    lines += list(server_log(2000, attack=0.02, seed=4, start=NOW - 3600))
    lines += burst(300, 30, seed=5, stamp="Dec  2 09:53:10").text.splitlines()
    return lines


def same(flt_native: Filter, flt_python: Filter, lines: list[str], now: float = NOW, batch: int = 500,
         stamped: bool = False) -> None:
    """Equal results in batches (as the jails scan) and one line at a time, connections included;
    `stamped`: as journal lines (no date search)."""
    cn, cp = MatchContext(), MatchContext()
    for i in range(0, len(lines), batch):
        chunk = lines[i:i + batch]
        got = flt_native.scan(chunk, now, cn, stamped=stamped)
        want = flt_python.scan(chunk, now, cp, stamped=stamped)
        if got != want:
            diff = next((g, w) for g, w in zip([*got, None], [*want, None], strict=False) if g != w)
            k = (diff[0] or diff[1])[0]  # type: ignore[index]
            raise AssertionError(f"{flt_native.name}: native {diff[0]} != python {diff[1]} on {chunk[k]!r}")
    assert len(cn) == len(cp)


# -- the translation -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("python", "pcre2"), [
    (r"^a\sb", r"^a[\s\x1c-\x1f]b"),
    (r"[\s,]+", r"[\s\x1c-\x1f,]+"),
    (r"\S+", r"[^\s\x1c-\x1f]+"),
    (r"a\vb", r"a\x0bb"),
    (r"x\Z", r"x\z"),
    (r"x{,3}", r"x{0,3}"),
    (r"[]x]\s", r"[]x][\s\x1c-\x1f]"),
    (r"[^]\s]", r"[^]\s\x1c-\x1f]"),
    (r"\\s", r"\\s"),
    (r"(?i)a(?#comment)b", r"(?i)ab"),
    (r"(?P<user>\w+)(?P=user)", r"(?P<user>\w+)(?P=user)"),
])
def test_to_pcre2(python: str, pcre2: str) -> None:
    assert native.to_pcre2(python) == pcre2


@pytest.mark.parametrize("python", [r"[\S]", r"[[:alpha:]]", r"\u00e9", r"\N{BULLET}", r"(?a)\w", r"(?x) a b",
                                    r"(?u)x", "\\é", "[a"])
def test_to_pcre2_refuses_what_it_cannot_keep_equal(python: str) -> None:
    with pytest.raises(native.Untranslatable):
        native.to_pcre2(python)


def _all_patterns() -> list[re.Pattern[str]]:
    seen: dict[str, re.Pattern[str]] = {}
    filters = [compile_filter(d, tz=UTC, native=False) for _, d in builtin_definitions()] + f2b_filters()
    for flt in filters:
        rxs = [r.rx for r in flt._rules] + [ig[0] for ig in flt._ignore_rx if ig is not None]
        if flt._pref_rx is not None:
            rxs.append(flt._pref_rx[1])
        for rx in rxs:
            if rx is not None and not lint_regex(rx.pattern):  # `re` may take exponential time on the others
                seen.setdefault(rx.pattern, rx)
    return list(seen.values())


PATTERNS = _all_patterns() if native.available() else []
COMPILED = []
for _rx in PATTERNS:
    with contextlib.suppress(native.Untranslatable):
        COMPILED.append((_rx, native.compile_pcre2(_rx.pattern, groups=dict(_rx.groupindex), count=_rx.groups)))

_PIECES = st.sampled_from([
    "Dec  2 09:53:10 ", "2026-12-02T09:53:10.123+01:00 ", "web1 ", "sshd[42]: ", "Failed password for ",
    "invalid user ", "root", " from ", "192.0.2.1", "2001:db8::7", "::ffff:192.0.2.9", "host.example",
    " port 22", " ssh2", " [preauth]", "user=", "rhost=", "client ", "[client 192.0.2.3] ", "authentication failure",
    "; logname= uid=0", '"GET / HTTP/1.1" 401 ', "error: ", "Invalid user ", "[", "]", "(", ")", ":", ";", "'",
    '"', " ", "\t", "\x0b", "\x0c", "\x1c", "\x1f", "\x00", "\x7f", "a", "Z", "0", "_", "-", "\\", "=", ",",
])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_PIECES, max_size=24).map("".join))
def test_every_translated_regex_finds_what_re_finds(text: str) -> None:
    assert len(COMPILED) >= 200 and len(COMPILED) >= 0.95 * len(PATTERNS)  # nearly every regex translates
    for rx, prx in COMPILED:
        m = rx.search(text)
        try:
            got = prx.search(text)
        except native._scan.error:  # the match limit: counted by the scanner, never taken as an answer
            continue
        want = None if m is None else tuple(None if m.span(g) == (-1, -1) else m.span(g)
                                            for g in range(rx.groups + 1))
        assert got == want, (rx.pattern, text)


# -- whole filters, line by line -------------------------------------------------------------------------


LINES = (sample_lines() + generated_lines()) if native.available() else []
# the same as journal lines: "host ident[pid]: message", the date at the head cut off (it travels beside)
_HEAD_DATE = re.compile(r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d\S*) ")
JOURNAL_LINES = [_HEAD_DATE.sub("", line) for line in LINES]


@pytest.mark.parametrize(("name", "definition"), list(builtin_definitions()), ids=lambda x: x
                         if isinstance(x, str) else "")
def test_builtin_filters_agree_on_sample_and_generated_logs(name: str, definition: FilterDef) -> None:
    nat, py = pair(definition)
    assert nat.scanner.startswith("native"), nat.scanner
    same(nat, py, LINES)
    stats = nat.native_stats
    assert stats is not None and stats["limited"] == 0
    if not nat.native_notes:  # every rule runs natively (dovecot's lint-flagged ones stay on RE2)
        assert stats["python_lines"] < stats["lines"] / 4


@pytest.mark.parametrize(("name", "definition"), list(builtin_definitions()), ids=lambda x: x
                         if isinstance(x, str) else "")
def test_builtin_filters_agree_on_stamped_lines(name: str, definition: FilterDef) -> None:
    nat, py = pair(definition)
    same(nat, py, JOURNAL_LINES, stamped=True)
    same(nat, py, LINES[:3000], stamped=True)  # a stamped line that starts with a date keeps it too
    stats = nat.native_stats
    assert stats is not None and stats["limited"] == 0
    if not nat.native_notes:  # no date search: only non-ASCII, CR/LF lines leave the native core
        assert stats["python_lines"] < stats["lines"] / 20


def test_fail2ban_filters_agree_on_sample_and_generated_logs() -> None:
    filters = f2b_filters()
    if not filters:
        pytest.skip("fail2ban's filters are not installed")
    natives = 0
    for nat in filters:
        py = compile_filter(nat.definition, tz=UTC, native=False)
        natives += nat.scanner.startswith("native")
        same(nat, py, LINES)
        same(nat, py, JOURNAL_LINES, stamped=True)
    # the others have a lint-flagged regex on RE2 where it matters (matched natively under a match limit, a
    # padded line could slip past them; RE2 answers in linear time)
    assert natives >= 0.65 * len(filters)


def test_sample_logs_in_a_zone_with_dst() -> None:
    for name in ("sshd", "recidive", "postfix"):
        nat, py = pair(load_yaml_filter(FILTERS / f"{name}.yaml"), ZURICH)
        same(nat, py, LINES, now=1124013600.0)  # fail2ban's tests' "now", 2005


# -- hostile lines ---------------------------------------------------------------------------------------

_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
_syslog = st.builds(lambda m, d, h, mi, s: f"{_MONTHS[m]} {d:2d} {h:02d}:{mi:02d}:{s:02d}",
                    st.integers(0, 11), st.integers(1, 31), st.integers(0, 23), st.integers(0, 59),
                    st.integers(0, 59))
_iso = st.builds(lambda y, mo, d, h, mi, s, f, z: f"{y}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{f}{z}",
                 st.sampled_from([2005, 2024, 2025, 2026]), st.integers(1, 12), st.integers(1, 31),
                 st.integers(0, 23), st.integers(0, 59), st.integers(0, 59),
                 st.sampled_from(["", ".5", ",123456", ".123456789"]),
                 st.sampled_from(["", "Z", "+01:00", "-0530", "+02", "+14:00"]))
# DST changes in Europe/Zurich: 2026-03-29 02:xx does not exist, 2026-10-25 02:xx happens twice
_dst = st.sampled_from(["Mar 29 02:30:00", "Oct 25 02:30:00", "Mar 29 01:59:59", "Oct 25 03:00:00",
                        "2026-03-29T02:30:00", "2026-10-25T02:30:00", "Feb 29 12:00:00", "Feb 30 12:00:00"])
_head = st.one_of(_syslog, _iso, _dst, st.just(""), st.just("garbage"))
_host = st.sampled_from(["web1 ", "", "web1 web1 "])
_prog = st.sampled_from(["sshd[1]: ", "sshd[2]: ", "sshd-session[3]: ", "sshd: ", "dovecot: ", "postfix/smtpd[9]: ",
                         "nftblockd[5]: ", "kernel: [ 12.5] "])
_msg_bits = st.sampled_from([
    "Failed password for ", "invalid user ", "root", "admin", " from ", "192.0.2.1", "192.0.2.77", "2001:db8::7",
    "192.030.0.6", "bad.example", " port 22", " ssh2", " ssh2: RSA SHA256:x", " [preauth]", "Received disconnect",
    ":11: Bye", ":3: x: Auth fail", "Connection closed by ", "Disconnected from ", "authenticating user ",
    "Disconnecting: Too many authentication failures", "Accepted password for ", "Accepted publickey for ",
    "Connection from ", "pam_unix(sshd:auth): authentication failure; logname= uid=0 euid=0 tty=ssh ruser= rhost=",
    "  user=", "Invalid user ", "maximum authentication attempts exceeded for ", "User ", " not allowed because ",
    "account is locked", " from 6.6.6.6 port 22 ssh2", "é", "\udcff", "\x00", "\x1c", "\x1f", "\x0b", "\x0c", "\t",
    "\n", "\r", " ", "  ", "x" * 300, "ssh", "sshd", "SSHD", "Ünïcödé", "\u2028", "\u00a0", "\u3000",
])
_line = st.builds(lambda h, sp, host, prog, msg, tail: f"{h}{sp}{host}{prog}{msg}{tail}",
                  _head, st.sampled_from([" ", "  ", ""]), _host, _prog,
                  st.lists(_msg_bits, max_size=10).map("".join),
                  st.sampled_from(["", "", " ", "x" * 8200, "\udcfe", " from 192.0.2.200 port 4 ssh2"]))
HOSTILE = [load_filter(spec, tz=tz) for spec, tz in (("sshd", UTC), ("sshd[mode=aggressive]", ZURICH),
                                                     ("dovecot", UTC), ("postfix", ZURICH), ("recidive", UTC))] \
    if native.available() else []
HOSTILE_PY = [compile_filter(f.definition, tz=f._dates.tz, native=False) for f in HOSTILE]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_line, max_size=16), st.sampled_from([NOW, 1124013600.0, 1774744200.0]), st.sampled_from([3, 100]))
def test_hostile_lines_agree(lines: list[str], now: float, batch: int) -> None:
    for nat, py in zip(HOSTILE, HOSTILE_PY, strict=True):
        same(nat, py, lines, now=now, batch=batch)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_line, max_size=16), st.sampled_from([3, 100]))
def test_hostile_stamped_lines_agree(lines: list[str], batch: int) -> None:
    for nat, py in zip(HOSTILE, HOSTILE_PY, strict=True):
        same(nat, py, lines, batch=batch, stamped=True)


# -- the syslog header read by hand (sysloghead, syslog_head_end in _scan.c) -----------------------------


def _without_header(spec: str, tz: ZoneInfo) -> Filter:
    """The filter as the native core ran it before it read headers by hand: the prefix regex on every line."""
    with mock.patch.object(matcher, "syslog_head", lambda text: None):
        return load_filter(spec, tz=tz)


_HEADER_SPECS = (("sshd", UTC), ("sshd[mode=aggressive]", ZURICH))
HEADER = [load_filter(spec, tz=tz) for spec, tz in _HEADER_SPECS] if native.available() else []
HEADER_PLAIN = [_without_header(spec, tz) for spec, tz in _HEADER_SPECS] if native.available() else []
HEADER_PY = [compile_filter(f.definition, tz=f._dates.tz, native=False) for f in HEADER]
# each part of "HOST NAME[PID]: MESSAGE" in its usual form and in the forms that make the regex take
# another way through the header (or none)
_header_line = st.builds(
    lambda *parts: "".join(parts),
    st.sampled_from(["Dec  2 09:53:10", "Dec  2 09:53:10 ", ""]),
    st.sampled_from([" ", "  ", "", "\t", " \t"]),
    st.sampled_from(["web1", "web-1.example.com", "h@x:1", "a_b", "", "<13>1", "<13>1 ", "[]", "[web1]", "kernel:",
                     "x y", "web1\x0b", "sshd", "@vserver_a", "w\u00e9b"]),
    st.sampled_from([" ", "  ", "\t", ""]),
    st.sampled_from(["sshd", "sshd-session", "sshd-auth", "sshd-x", "ssh", "sshdd", "(sshd)", "[sshd]", "sshd(pam)",
                     "sshd(pam)[", "kernel: [ 1.5] sshd", "@vserver_x sshd", "SSHD", "", "sshd-"]),
    st.sampled_from(["[1]", "[12345]", "[]", "[x]", "", "[1", "1]", "[1][2]"]),
    st.sampled_from([":", "", "::"]),
    st.sampled_from([" ", "  ", "\t", "", " \t", "\x0b"]),
    st.sampled_from(["", "kernel: [ 1.5] ", "kernel: [ 1.5]", "kernel:", "kern", "[ID 12 auth.info] ", "[ID",
                     "[x] ", "12 x - ", "12 x [a] ", "1 ", "error: ", "error: PAM: ", "fatal: PAM: ", "error:",
                     "fatal: x ", "errors: ", "error: PAM:"]),
    st.sampled_from(["Failed password for invalid user admin from 192.0.2.1 port 22 ssh2",
                     "Invalid user x from 192.0.2.7 port 4", "Connection closed by 192.0.2.1 port 22 [preauth]",
                     "Received disconnect from 2001:db8::7 port 22:11: Bye [preauth]", "", "x",
                     "Failed password for root from 192.0.2.9 port 1 ssh2 ", "Connection from 192.0.2.3 port 9"]))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_header_line, min_size=1, max_size=12), st.sampled_from([1, 100]))
def test_headers_read_by_hand_agree_with_the_prefix_regex(lines: list[str], batch: int) -> None:
    for nat, plain, py in zip(HEADER, HEADER_PLAIN, HEADER_PY, strict=True):
        for stamped in (False, True):
            same(nat, plain, lines, batch=batch, stamped=stamped)
            same(nat, py, lines, batch=batch, stamped=stamped)


def test_the_usual_header_is_read_by_hand_and_others_by_the_regex() -> None:
    usual = ["Dec  2 09:53:10 web1 sshd[4242]: Failed password for root from 192.0.2.9 port 1 ssh2",
             "Dec  2 09:53:10 web1 sshd-session[7]: error: PAM: Authentication failure for root from 192.0.2.9",
             "Dec  2 09:53:11 web1 sshd[4242]: Connection closed by 192.0.2.9 port 1 [preauth]"]
    other = ["Dec  2 09:53:10 web1 sshd[4242]:  Failed password for root from 192.0.2.9 port 1 ssh2",
             "Dec  2 09:53:10 web1 sshd: Failed password for root from 192.0.2.9 port 1 ssh2",
             "Dec  2 09:53:10 web1 sshd[4242]: [ID 800047 auth.info] Failed password for root from 192.0.2.9 "
             "port 1 ssh2"]
    nat, plain = HEADER[0], HEADER_PLAIN[0]
    before = nat.native_stats
    assert before is not None
    got = nat.scan(usual + other, NOW, MatchContext())
    after = nat.native_stats
    assert after is not None and after["headers"] - before["headers"] == len(usual)
    assert [i for i, _ in got] == [0, 1, 3, 4, 5]  # 2 closes the connection: no failure of its own
    assert got == plain.scan(usual + other, NOW, MatchContext())
    assert plain.native_stats is not None and plain.native_stats["headers"] == 0


# -- bounds, engines, fallbacks ----------------------------------------------------------------------------


def test_a_pathological_line_costs_bounded_work_and_is_counted() -> None:
    # forced onto `re` (no RE2), the lint-flagged rule is exponential there; natively the match limit stops it
    d = FilterDef("slow", "test", (RegexSource(r"^(\w+\s?)*from <HOST>$", "test:1"),),
                  prefix=RegexSource(r"\s*x "))
    flt = compile_filter(d, tz=UTC, engine="re")
    assert flt.scanner.startswith("native")
    line = "Dec  2 09:53:10 x " + "ab " * 100 + "from 192.0.2.1 !"
    assert flt.scan([line], NOW, None) == []
    stats = flt.native_stats
    assert stats is not None and stats["limited"] == 1
    ok = flt.scan(["Dec  2 09:53:10 x ab cd from 192.0.2.1"], NOW, None)
    assert [str(r.host) for _, r in ok] == ["192.0.2.1"]  # type: ignore[union-attr]


def test_a_rule_pcre2_cannot_run_sends_its_lines_to_the_python_path() -> None:
    d = FilterDef("mixed", "test", (RegexSource(r"^ok from <HOST>$", "t:1"),
                                    RegexSource(r"^odd [\S] from <HOST>$", "t:2")), prefix=RegexSource(r"\s*x "))
    nat, py = pair(d)
    assert nat.scanner.startswith("native") and "1 of 2 failregexes" in nat.scanner
    assert any("failregex 1" in n for n in nat.native_notes)
    lines = ["Dec  2 09:53:10 x ok from 192.0.2.1", "Dec  2 09:53:10 x odd ! from 192.0.2.2"]
    assert [str(r.host) for _, r in nat.scan(lines, NOW, None)] == ["192.0.2.1", "192.0.2.2"]  # type: ignore[union-attr]
    assert nat.native_stats == {"lines": 2, "python_lines": 1, "limited": 0, "headers": 0, "split_hits": 0,
                                "split_misses": 0}
    same(nat, py, lines)


def test_a_filter_the_native_core_cannot_take_runs_on_python_and_says_why() -> None:
    d = FilterDef("odd", "test", (RegexSource(r"^fail from <HOST>$", "t:1"),), prefix=RegexSource(r"\s*[\S]+ "))
    flt = compile_filter(d, tz=UTC)
    assert flt.scanner.startswith("python (re)") and "prefix" in flt.scanner
    line = "Dec  2 09:53:10 x fail from 192.0.2.4"
    assert [str(r.host) for _, r in flt.scan([line], NOW)] == ["192.0.2.4"]  # type: ignore[union-attr]


def test_other_datepatterns_are_found_by_the_python_side() -> None:
    d = FilterDef("custom", "test", (RegexSource(r"^\s*fail from <HOST>$", "t:1"),), datepattern="%Y/%m/%d %H:%M")
    nat, py = pair(d)
    assert nat.scanner.startswith("native") and "timestamps found by the Python side" in nat.scanner
    lines = ["2026/12/02 09:53 fail from 192.0.2.4", "fail from 192.0.2.5", "x 2026/12/02 09:53 fail from 192.0.2.6"]
    same(nat, py, lines)
    assert [str(r.host) for _, r in nat.scan(lines, NOW)] == ["192.0.2.4", "192.0.2.5"]  # type: ignore[union-attr]


def test_test_filter_says_which_engine_ran(tmp_path: Path) -> None:
    import io
    import json

    from nftblockd.detect.testfilter import run

    log = tmp_path / "auth.log"
    log.write_text("Dec  2 09:53:10 web1 sshd[1]: Invalid user x from 192.0.2.1 port 22\n")
    out = io.StringIO()
    assert run("sshd", str(log), json_output=False, out=out, now=NOW) == 0
    assert "Engine: native (PCRE2" in out.getvalue()
    out = io.StringIO()
    assert run("sshd", str(log), json_output=True, out=out, now=NOW) == 0
    doc = json.loads(out.getvalue())
    assert doc["engine"].startswith("native (PCRE2") and doc["native"]["lines"] == 1


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=ROOT, check=False)


def test_without_the_extension_everything_runs_on_the_python_path() -> None:
    proc = _run("""
        import sys
        sys.modules["nftblockd.detect._scan"] = None  # as if it had not been built
        from nftblockd.detect.filterload import load_filter
        f = load_filter("sshd")
        print(f.scanner)
        print(f.match("Dec  2 09:53:10 web1 sshd[1]: Invalid user x from 192.0.2.1 port 22", 1796205190.0).host)
    """)
    assert proc.returncode == 0, proc.stderr
    engine, host = proc.stdout.splitlines()
    assert engine.startswith("python (re): native core not built (this copy was installed without a C compiler")
    assert host == "192.0.2.1"


def test_an_extension_that_cannot_load_says_why() -> None:
    proc = _run("""
        import sys
        class Broken:  # as a built core whose libpcre2-8 is gone
            def find_spec(self, name, path=None, target=None):
                if name == "nftblockd.detect._scan":
                    raise ImportError("libpcre2-8.so.0: cannot open shared object file")
        sys.meta_path.insert(0, Broken())
        from nftblockd.detect import matcher, native
        print(native.describe())
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ("pure Python (re): native core unavailable "
                           "(libpcre2-8.so.0: cannot open shared object file)\n")


def test_pcre2_runs_interpreted_when_executable_memory_is_refused() -> None:
    proc = _run("""
        import ctypes, sys
        if ctypes.CDLL(None).prctl(65, 1, 0, 0, 0) != 0:  # PR_SET_MDWE, as MemoryDenyWriteExecute= does
            sys.exit(77)
        from nftblockd.detect.filterload import load_filter
        f = load_filter("sshd")
        print(f.scanner)
        print(f.match("Dec  2 09:53:10 web1 sshd[1]: Invalid user x from 192.0.2.1 port 22", 1796205190.0).host)
    """)
    if proc.returncode == 77:
        pytest.skip("the kernel has no PR_SET_MDWE (Linux < 6.3)")
    assert proc.returncode == 0, proc.stderr
    engine, host = proc.stdout.splitlines()
    assert "interpreted" in engine and host == "192.0.2.1"


def test_addresses_built_natively_are_the_ones_parse_host_builds() -> None:
    # the Scanner builds plain dotted quads itself (object.__new__ + _ip); everything else is parse_host's
    import ipaddress

    from nftblockd.detect.matcher import parse_host

    assert native.IPV4_BY_SLOT is ipaddress.IPv4Address  # the check at import holds on this Python
    d = FilterDef("ids", "test", (RegexSource(r"^id <F-ID/>$", "t:1"),), prefix=RegexSource(r"\s*x "))
    nat, py = pair(d)
    texts = ["192.0.2.1", "255.255.255.255", "0.0.0.0", "192.030.0.6", "1.2.3", "1.2.3.4.5", "[192.0.2.2]",
             "192.0.2.3\x00x", "::ffff:192.0.2.4", "2001:db8::1", "300.1.1.1", "\uff11.2.3.4", "host.example"]
    lines = [f"Dec  2 09:53:10 x id {t}" for t in texts]
    same(nat, py, lines)
    for (_, r), t in zip(nat.scan(lines, NOW), texts, strict=True):
        want = parse_host(t)
        if isinstance(want, str):
            assert r.text == t and r.reason == want  # type: ignore[union-attr]
        else:
            got = r.host  # type: ignore[union-attr]
            assert type(got) is type(want) and got == want and hash(got) == hash(want)
            assert (str(got), got.packed, got.is_private) == (str(want), want.packed, want.is_private)


def test_nftblockd_version_names_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert nftblockd_main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"nftblockd {__version__}\nmatcher: {native.describe()}\n"
    assert out.splitlines()[1].startswith("matcher: native core, PCRE2 ")  # this module's tests need the core


# -- the Scanner's shortcuts against the plain version ---------------------------------------------------

_shape_chars = st.sampled_from([*"JanFebMarDecOctNov 0123456789:.-+aZ_", "\t", "\x0b", "\x1c", "\x1f", "\x00", "\x7f",
                                "\n"])
_near_syslog = st.one_of(
    st.builds(lambda ts, rest: ts + rest, _syslog, st.lists(_shape_chars, max_size=3).map("".join)),
    st.builds(lambda ts, i, c, rest: ts[:i] + c + ts[i + 1:] + rest, _syslog, st.integers(0, 14), _shape_chars,
              st.lists(_shape_chars, max_size=3).map("".join)),
    st.lists(_shape_chars, max_size=18).map("".join))


@settings(max_examples=400, deadline=None)
@given(_near_syslog)
def test_the_scanners_syslog_check_only_takes_what_fast_syslog_matches(text: str) -> None:
    # the Scanner skips its timestamp regex when this check holds: it must never hold where the regex
    # would not match "Mmm dd HH:MM:SS" (15 characters) as its first alternative
    from nftblockd.detect.timestamps import FAST_SYSLOG

    rx = native.compile_pcre2(f"(?:({FAST_SYSLOG})|(x))", anchored=True)
    if native._scan.syslog_shape(text.encode()):
        spans = rx.search(text)
        assert spans is not None and spans[0] == (0, 15) and spans[1] == (0, 15), text
        assert re.match(FAST_SYSLOG, text) is not None


def test_the_scanners_syslog_check_takes_the_usual_lines() -> None:
    for text in ("Dec  2 09:53:10 web1 sshd[1]: x", "Jan 31 23:59:59", "Feb 09 00:00:00 h", "Oct 25 02:30:00 x"):
        assert native._scan.syslog_shape(text.encode()), text
    for text in ("Dec  2 09:53:10 2026 x", "Dec  2 09:53:10.5 x", "Dec 32 09:53:10 x", "Dec  2 24:00:00 x",
                 "Dec  2 09:53:10  x", "Dec  2 09:53:10 \x1cx", "dec  2 09:53:10 x", "Dec  2 09:53:1"):
        assert not native._scan.syslog_shape(text.encode()), text


def test_a_host_repeated_from_the_previous_result_is_the_one_parse_host_gives() -> None:
    # the Scanner reuses the previous result's host when the text repeats (no memo lookup): runs of one
    # attacker, a rejected text repeated, and a text that changes back, against the Python path
    d = FilterDef("ids", "test", (RegexSource(r"^id <F-ID/>$", "t:1"),), prefix=RegexSource(r"\s*x "))
    nat, py = pair(d)
    texts = ["192.0.2.1", "192.0.2.1", "192.0.2.10", "192.0.2.1", "bad host", "bad host", "2001:db8::1",
             "2001:db8::1", "192.0.2.1", "192.0.2.1 ", "192.0.2.1"]
    lines = [f"Dec  2 09:53:10 x id {t}" for t in texts]
    same(nat, py, lines)
    same(nat, py, lines, batch=1)
    got = [r for _, r in nat.scan(lines, NOW)]
    assert got[0].host is got[1].host and got[0].host == got[3].host  # type: ignore[union-attr]


# IPv6 texts as attackers' lines carry them, and near misses: every compression, an embedded IPv4 part,
# IPv4-mapped forms, brackets, zone ids, leading zeros, too many or too few groups, stray characters
_hextet = st.one_of(st.sampled_from(["0", "1", "db8", "ffff", "FFFF", "2001", "0000", "00001", "fe80", "g1"]),
                    st.integers(0, 0xFFFF).map(lambda v: f"{v:x}"))
_v4part = st.one_of(st.sampled_from(["192.0.2.1", "1.2.3.4", "01.2.3.4", "256.1.1.1", "1.2.3", "0.0.0.0"]),
                    st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t))))


def _v6_text(groups: list[str], cut: int | None, v4: str | None, wrap: str) -> str:
    parts = list(groups)
    text = ":".join(parts) if cut is None else ":".join(parts[:cut]) + "::" + ":".join(parts[cut:])
    if v4 is not None:
        text += ("" if text.endswith(":") else ":") + v4
    return wrap.replace("X", text)


_v6 = st.one_of(
    st.builds(_v6_text, st.lists(_hextet, min_size=0, max_size=9), st.one_of(st.none(), st.integers(0, 9)),
              st.one_of(st.none(), _v4part), st.sampled_from(["X", "[X]", "[X", "X%eth0", "X:", ":X", "X::"])),
    st.builds(lambda a: str(a), st.integers(0, 2**128 - 1).map(__import__("ipaddress").IPv6Address)),
    st.integers(0, 2**32 - 1).map(lambda v: f"::ffff:{__import__('ipaddress').IPv4Address(v)}"),
    st.text(alphabet=":.0123456789abcdefABCDEFx[]%", max_size=46))


@settings(max_examples=600, deadline=None)
@given(st.lists(_v6, min_size=1, max_size=8))
def test_ipv6_hosts_built_natively_are_the_ones_parse_host_builds(texts: list[str]) -> None:
    # the Scanner builds what inet_pton takes itself (IPv6Address by its slots, or the IPv4Address an
    # IPv4-mapped text carries); everything inet_pton refuses is parse_host's. Equal type, value, hash, text.
    from nftblockd.detect.matcher import parse_host

    assert native.IPV6_BY_SLOT is not None  # the check at import holds on this Python
    texts = [t for t in texts if t and " " not in t]
    lines = [f"Dec  2 09:53:10 x id {t}" for t in texts]
    nat, py = _ids()
    same(nat, py, lines)
    got = dict(nat.scan(lines, NOW))
    for i, t in enumerate(texts):
        want, r = parse_host(t), got.get(i)
        if r is None:  # the rule did not take the text whole (it has no address shape): nothing to compare
            continue
        if isinstance(want, str):
            assert r.reason == want, t  # type: ignore[union-attr]
        else:
            host = r.host  # type: ignore[union-attr]
            assert type(host) is type(want) and host == want and hash(host) == hash(want), t
            assert (str(host), host.packed, getattr(host, "scope_id", None)) == (str(want), want.packed, None), t


@functools.cache
def _ids() -> tuple[Filter, Filter]:
    return pair(FilterDef("ids", "test", (RegexSource(r"^id <F-ID/>$", "t:1"),), prefix=RegexSource(r"\s*x ")))


# lines where the gate's first character keeps occurring without the rest (the Scanner's substring search
# falls back to memmem after a few false starts), against the Python path's `in`
_gate_chars = st.one_of(
    st.lists(st.sampled_from(["s", "ss", "ssh", "sshd", "x", "d", " "]), max_size=40).map("".join),
    st.builds(lambda piece, k, end: piece * k + end, st.sampled_from(["s", "ssh ", "ssh", "sh"]), st.integers(0, 24),
              st.sampled_from(["", "sshd", "ssh d", "x"])))


@settings(max_examples=300, deadline=None)
@given(st.lists(_gate_chars, min_size=1, max_size=6))
def test_the_gate_finds_what_in_finds(tails: list[str]) -> None:
    nat, py = _gated()
    lines = [f"Dec  2 09:53:10 x {t} id 192.0.2.1" for t in tails]
    same(nat, py, lines)
    for i, t in enumerate(tails):
        hit = any(r[0] == i for r in nat.scan(lines, NOW))
        assert hit == ("sshd" in f"x {t} id" or "ssh d" in f"x {t} id"), t


@functools.cache
def _gated() -> tuple[Filter, Filter]:
    return pair(FilterDef("gated", "test", (RegexSource(r"^[shdx ]*id <HOST>$", "t:1"),),
                          prefix=RegexSource(r"\s*x "), prefilter=("sshd", "ssh d")))


def test_a_connections_stored_text_that_is_not_str_leaves_no_error_behind() -> None:
    # The Scanner reuses the previous result's host when the text repeats; its test once asked the length of
    # the previous text without checking it was a str, leaving TypeError set when it was not (a connection's
    # stored address is whatever the Python side put there), and the next line's memo lookup then failed.
    nat = compile_filter(FilterDef("mlbytes", "test", (RegexSource(
        r"^c<F-MLFID>\d+</F-MLFID> (?:from <HOST>|user (?P<user>\w+))$", "t:1"),), prefix=RegexSource(r"\s*x ")))
    assert nat.scanner.startswith("native"), nat.scanner
    ctx = MatchContext()
    assert nat.scan(["Dec  2 09:53:10 x c1 user bob"], NOW, ctx) == []  # remembered: no address yet
    odd = b"192.0.2.7"  # not a str
    ctx._conns["1"].ip4 = odd  # type: ignore[assignment]
    host = ipaddress.IPv4Address("192.0.2.7")
    nat._hosts[odd] = host  # type: ignore[index]  # the memo answers for it: the Scanner's host is that one
    got = nat.scan(["Dec  2 09:53:10 x c1 user bob", "Dec  2 09:53:10 x c2 from 192.0.2.1"], NOW, ctx)
    assert [(i, r.host) for i, r in got] == [(0, host), (1, ipaddress.IPv4Address("192.0.2.1"))]  # type: ignore[union-attr]


def test_the_scanner_refuses_address_types_that_are_not_types(monkeypatch: pytest.MonkeyPatch) -> None:
    # the Scanner builds addresses by allocating through ipv4_type / ipv6_type: anything but a type (or None)
    # is refused when it is built, not cast and called on the first address line
    made: list[tuple[object, ...]] = []
    real = native._scan.Scanner

    def recording(*a: object) -> object:
        made.append(a)
        return real(*a)

    monkeypatch.setattr(native._scan, "Scanner", recording)
    compile_filter(FilterDef("ids", "test", (RegexSource(r"^id <F-ID/>$", "t:1"),), prefix=RegexSource(r"\s*x ")))
    (args,) = made
    v6 = len(args) - 3  # then the syslog header's names and tail texts
    assert args[v6] is native.IPV6_BY_SLOT and args[v6 - 2] is native.IPV4_BY_SLOT
    real(*args[:v6], None, *args[v6 + 1:])  # None: parse_host builds them
    for odd in (42, "IPv6Address", ipaddress.IPv6Address("::1")):
        with pytest.raises(TypeError, match="must be a type or None"):
            real(*args[:v6], odd, *args[v6 + 1:])
        with pytest.raises(TypeError, match="must be a type or None"):
            real(*args[:-3], odd, *args[-2:])
