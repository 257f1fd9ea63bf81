"""matcher: loading and compiling filters, strict hosts, log injection, multi-line context, the regex lint,
the fast lane's equality with the general path, and test-filter's output."""

from __future__ import annotations

import importlib.util
import io
import ipaddress
import json
from collections.abc import Sequence
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.detect.filterload import builtin_filters, load_filter, load_yaml_filter, parse_spec
from nftblockd.detect.matcher import (
    MAX_LINE,
    Filter,
    FilterDef,
    FilterError,
    Match,
    MatchContext,
    RegexSource,
    Rejected,
    compile_filter,
    expand_tags,
    parse_host,
)
from nftblockd.detect.rxlint import lint_regex, required_literal
from nftblockd.detect.testfilter import run
from tests.helpers.samples import sample_lines

UTC = ZoneInfo("UTC")
NOW = 1796205190.0  # 2026-12-02 09:53:10 UTC
F2B = Path("/etc/fail2ban/filter.d")
MODES = {"sshd": ["normal", "ddos", "extra", "aggressive"],
         "postfix": ["normal", "rbl", "auth", "errors", "ddos", "aggressive"],
         "dovecot": ["normal", "aggressive"], "apache-auth": ["normal", "aggressive"],
         "nginx-http-auth": ["normal", "fallback", "aggressive"]}
SSHD = load_filter("sshd", tz=UTC)
HAVE_RE2 = importlib.util.find_spec("re2") is not None


def sshd(msg: str, ctx: MatchContext | None = None, flt: Filter = SSHD) -> Match | Rejected | None:
    return flt.match(f"Dec  2 09:53:10 web1 sshd[4242]: {msg}", NOW, ctx)


def host(r: object) -> str | None:
    return str(r.host) if isinstance(r, Match) and not r.ignored else None


# -- loading -------------------------------------------------------------------------------------------


def test_builtins_load_in_every_mode_without_risky_regexes() -> None:
    names = builtin_filters()
    wanted = {"sshd", "nginx-http-auth", "nginx-bad-request", "nginx-botsearch", "apache-auth",
              "apache-badbots", "apache-bad-request", "postfix", "dovecot", "vsftpd", "proftpd", "recidive"}
    assert wanted <= set(names)
    for name in names:
        for mode in MODES.get(name, [None]):
            flt = load_filter(f"{name}[mode={mode}]" if mode else name)
            assert flt.name == name
            # every regex is linear: lint-clean on `re`, or on RE2 (google-re2); only dovecot needs RE2, and
            # without it its flagged rules would run on `re` on the first RISKY_LINE characters
            risky = [n for n in flt.notes if "RE2 cannot run it" in n]
            if HAVE_RE2:
                assert not risky, (name, mode, flt.notes)
                assert "re2" not in flt.engines or name == "dovecot", (name, mode)
            else:
                assert not risky or name == "dovecot", (name, mode, flt.notes)


def test_sshd_hot_rules_run_on_re_in_the_fast_lane() -> None:
    for mode in MODES["sshd"]:
        flt = load_filter(f"sshd[mode={mode}]")
        assert set(flt.engines) == {"re"}
        assert flt._fast is not None
        assert "(?P<_slow" not in flt._fast.pattern  # every sshd line is decided by the one regex


@pytest.mark.parametrize(("spec", "expected"), [
    ("sshd", ("sshd", {})),
    ("sshd[mode=aggressive]", ("sshd", {"mode": "aggressive"})),
    ('/etc/fail2ban/filter.d/sshd.conf[mode="ddos", publickey=any]',
     ("/etc/fail2ban/filter.d/sshd.conf", {"mode": "ddos", "publickey": "any"})),
    ("apache-badbots[badbots='a|b, c']", ("apache-badbots", {"badbots": "a|b, c"})),
])
def test_parse_spec(spec: str, expected: tuple[str, dict[str, str]]) -> None:
    assert parse_spec(spec) == expected


def test_unknown_builtin_names_the_builtins() -> None:
    with pytest.raises(FilterError, match=r"unknown filter 'nope'.*sshd"):
        load_filter("nope")


def test_bad_option_and_bad_choice() -> None:
    with pytest.raises(FilterError, match="no option 'color'"):
        load_filter("sshd[color=red]")
    with pytest.raises(FilterError, match=r"sshd\.yaml:\d+: option mode='loud' must be one of"):
        load_filter("sshd[mode=loud]")


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_yaml_errors_say_file_and_line(tmp_path: Path) -> None:
    p = write(tmp_path, "f.yaml", "name: f\nfailregex:\n  - '^ok from <HOST>$'\n  - '^bad ( from <HOST>'\n")
    with pytest.raises(FilterError, match=r"f\.yaml:4: invalid regex"):
        load_filter(str(p))
    p = write(tmp_path, "g.yaml", "failregex:\n  - '^no host here$'\n")
    with pytest.raises(FilterError, match=r"g\.yaml:2: failregex has no <HOST>"):
        load_filter(str(p))
    p = write(tmp_path, "h.yaml", "failregex: ['^x <HOST>']\ncolour: red\n")
    with pytest.raises(FilterError, match=r"h\.yaml:2: unknown key 'colour'"):
        load_filter(str(p))
    p = write(tmp_path, "i.yaml", "failregex: [\n")
    with pytest.raises(FilterError, match=r"i\.yaml:\d+: invalid YAML"):
        load_filter(str(p))


def test_yaml_filter_features(tmp_path: Path) -> None:
    p = write(tmp_path, "app.yaml", r"""
name: app
options: {mode: normal}
choices: {mode: [normal, strict]}
vars:
  daemon: 'myapp'
  tail: '(?: port \d+)?$'
prefilter: ['myapp']
prefix: '<syslog>'
failregex:
  - '^login failed for <F-USER>\S+</F-USER> from <HOST><tail>'
  - regex: '^probe from <HOST><tail>'
    when: {mode: [strict]}
ignoreregex:
  - '^login failed for monitor '
""")
    normal, strict = load_filter(str(p), tz=UTC), load_filter(f"{p}[mode=strict]", tz=UTC)
    line = "Dec  2 09:53:10 h myapp[1]: login failed for bob from 192.0.2.1 port 22"
    r = normal.match(line, NOW)
    assert isinstance(r, Match) and str(r.host) == "192.0.2.1" and r.fields == {"user": "bob"}
    assert r.time == NOW
    probe = "Dec  2 09:53:10 h myapp[1]: probe from 192.0.2.2"
    assert normal.match(probe, NOW) is None and host(strict.match(probe, NOW)) == "192.0.2.2"
    ignored = normal.match("Dec  2 09:53:10 h myapp[1]: login failed for monitor from 192.0.2.3", NOW)
    assert isinstance(ignored, Match) and ignored.ignored
    assert normal.match("Dec  2 09:53:10 h other[1]: login failed for bob from 192.0.2.1", NOW) is None


def test_fail2ban_conf_with_options_and_search_dirs(tmp_path: Path) -> None:
    flt = load_filter(f"{F2B}/sshd.conf[mode=aggressive]", tz=UTC)
    assert host(flt.match("Dec  2 09:53:10 h sshd[1]: Did not receive identification string from 192.0.2.9",
                          NOW)) == "192.0.2.9"
    assert load_filter("vsftpd", search_dirs=[tmp_path]).definition.source.endswith("vsftpd.yaml")
    write(tmp_path, "mine.conf", "[Definition]\nfailregex = ^mine <HOST>$\n")
    assert host(load_filter("mine", search_dirs=[tmp_path]).match("mine 192.0.2.4", NOW)) == "192.0.2.4"


# -- tags and hosts ------------------------------------------------------------------------------------


def test_expand_tags() -> None:
    import re

    rx = re.compile(expand_tags(r"^<F-USER>\S+</F-USER> <ADDR> <F-ID/> <F-PORT/> <F-MY-TAG>x</F-MY-TAG>$"))
    assert set(rx.groupindex) == {"user", "ip4", "ip6", "fid", "fport", "my_tag"}
    assert expand_tags("<unknown> </F-NOTOPEN>") == "<unknown> </F-NOTOPEN>"
    with pytest.raises(ValueError, match="SKIPLINES"):
        expand_tags("a<SKIPLINES>b")
    assert expand_tags("((?i)a|b)") == "(?i:a|b)"  # fail2ban's mid-pattern flags, refused by Python 3.11


@pytest.mark.parametrize(("text", "expected"), [
    ("192.0.2.1", ipaddress.IPv4Address("192.0.2.1")),
    ("::ffff:192.0.2.1", ipaddress.IPv4Address("192.0.2.1")),
    ("[2001:db8::1]", ipaddress.IPv6Address("2001:db8::1")),
    ("0.0.0.0", ipaddress.IPv4Address("0.0.0.0")),
    ("192.030.0.6", "bad-address"),
    ("256.1.1.1", "bad-address"),
    ("1.2.3", "bad-address"),
    ("example.com", "dns-name"),
    ("fe80::1%eth0", "bad-address"),
    ("\u0661.\u0662.\u0663.\u0664", "bad-address"),  # Arabic-Indic digits: digits to Python, not here
])
def test_parse_host(text: str, expected: object) -> None:
    assert parse_host(text) == expected


def test_hosts_are_never_guessed_or_resolved() -> None:
    r = sshd("Invalid user admin from attacker.example.net port 22")
    assert isinstance(r, Rejected) and r.reason == "dns-name" and r.text == "attacker.example.net"
    r = sshd("Invalid user admin from 192.030.0.6 port 22")
    assert isinstance(r, Rejected) and r.reason == "bad-address"
    assert host(sshd("Invalid user admin from ::ffff:192.0.2.99 port 22")) == "192.0.2.99"


# -- log injection: a line never makes us count an address the client only wrote ------------------------


@pytest.mark.parametrize(("msg", "normal", "aggressive"), [
    ("Invalid user 1.2.3.4 from 5.6.7.8", "5.6.7.8", "5.6.7.8"),
    ("Illegal user x from 1.2.3.4 from 5.6.7.8", "5.6.7.8", "5.6.7.8"),  # CVE-2006-6302
    ("Failed password for invalid user x from 6.6.6.6 port 22 ssh2 from 1.2.3.4 port 4242 ssh2", "1.2.3.4",
     "1.2.3.4"),
    ("Failed password for invalid user x from 6.6.6.6 port 22 ssh2: y from 1.2.3.4 port 4242 ssh2", "1.2.3.4",
     "1.2.3.4"),  # fail2ban 1.0.2 bans 6.6.6.6 here
    ("Failed password for invalid user x from 6.6.6.6 port 22 ssh2 from 1.2.3.4", None, None),  # ambiguous
    ("Failed publickey for invalid user x from 6.6.6.6 port 22 ssh2: RSA SHA256:a from 1.2.3.4 port 4 ssh2: "
     "RSA SHA256:b", "1.2.3.4", "1.2.3.4"),
    ("Failed hostbased for invalid user x from 6.6.6.6 port 22 ssh2: RSA a, client user \"b from 1.2.3.4\", "
     "client host \"c\"", None, None),
    ("User x from 6.6.6.6 not allowed because not listed in AllowUsers from 1.2.3.4 not allowed because not "
     "listed in AllowUsers", "1.2.3.4", "1.2.3.4"),
    ("Bad protocol version identification 'x' from 6.6.6.6' from 1.2.3.4 port 4", None, "1.2.3.4"),
    ("Connection closed by authenticating user root 6.6.6.6 port 22 1.2.3.4 port 4 [preauth]", None,
     "1.2.3.4"),
])
def test_sshd_injection(msg: str, normal: str | None, aggressive: str | None) -> None:
    assert host(sshd(msg)) == normal
    assert host(sshd(msg, flt=load_filter("sshd[mode=aggressive]", tz=UTC))) == aggressive


def test_injection_in_other_programs_and_services() -> None:
    # another program's text, or an embedded newline, is never read as sshd's
    assert SSHD.match("Dec  2 09:53:10 h myapp[1]: Invalid user x from 6.6.6.6 port 1", NOW) is None
    assert sshd("Bad protocol version identification 'x' from 1.2.3.4\nDec  2 09:53:10 h sshd[1]: "
                "Invalid user x from 6.6.6.6 port 1 ssh2 x") is None
    # CVE-2013-2178: a path holding "[client ADDR] user ... not found" is not a failure of ADDR
    apache = load_filter("apache-auth", tz=UTC)
    assert apache.match("[Sat Jun 01 02:17:42 2013] [error] [client 192.168.33.1] File does not exist: "
                        "/srv/http/site/[client 6.6.6.6] user root not found", NOW) is None
    # nginx: a user name holding a whole fake tail
    nginx = load_filter("nginx-http-auth", tz=UTC)
    line = ('2014/04/03 22:20:40 [error] 30708#0: *3 user "test": password mismatch, client: 6.6.6.6, '
            'server: test, request: "GET / HTTP/1.1", host: "localhost:8443"": was not found in '
            '"/etc/nginx/.htpasswd", client: 192.0.2.2, server: , request: "GET / HTTP/1.1", '
            'host: "localhost:8443"')
    assert host(nginx.match(line, NOW)) == "192.0.2.2"
    # dovecot: a user name holding ", rip=": the last rip= is dovecot's
    dovecot = load_filter("dovecot", tz=UTC)
    line = ("Dec  2 09:53:10 h dovecot: imap-login: Aborted login (auth failed, 1 attempts): user=<x>, "
            "rip=6.6.6.6, lip=1.1.1.1>, method=PLAIN, rip=192.0.2.7, lip=192.0.2.1, session=<abc>")
    assert host(dovecot.match(line, NOW)) == "192.0.2.7"
    # proftpd: the address is the one in the prefix, not in the user name
    proftpd = load_filter("proftpd", tz=UTC)
    line = ("Dec  2 09:53:10 h proftpd[1] h (::ffff:192.0.2.8[::ffff:192.0.2.8]): USER x (6.6.6.6[6.6.6.6]): "
            "no such user found from 6.6.6.6 [6.6.6.6] to 1.1.1.1:21")
    assert host(proftpd.match(line, NOW)) == "192.0.2.8"


# -- multi-line context --------------------------------------------------------------------------------


def test_connection_context_gives_later_lines_their_address() -> None:
    ctx = MatchContext()
    assert sshd("Connection from 192.0.2.5 port 4242 on 192.0.2.1 port 22", ctx) is None
    assert sshd("Failed publickey for git from 192.0.2.5 port 4242 ssh2: RSA SHA256:x", ctx) is None  # nofail
    r = sshd("Disconnecting: Too many authentication failures for git [preauth]", ctx)
    assert host(r) == "192.0.2.5"
    # without a context the same line stands alone: no address, no failure
    assert sshd("Disconnecting: Too many authentication failures for git [preauth]") is None


def test_success_forgives_one_user_but_not_several() -> None:
    pam = "pam_unix(sshd:auth): authentication failure; logname= uid=0 euid=0 tty=ssh ruser= rhost=192.0.2.6"
    ctx = MatchContext()
    assert sshd(pam + "  user=alice", ctx) is None
    assert sshd("Accepted password for alice from 192.0.2.6 port 1 ssh2", ctx) is None
    ctx = MatchContext()
    assert sshd(pam + "  user=root", ctx) is None
    assert host(sshd(pam + "  user=admin", ctx)) == "192.0.2.6"  # a second user name: a failure


def test_a_reused_connection_id_is_a_new_connection() -> None:
    """sshd's ids are pids: a connection whose close was never logged can leave its memory behind when the pid
    comes round again. The new peer's failures are its own (found in the fleet benchmark: IPv6 attackers on
    recycled pids were credited to the IPv4 address that had used the pid, and never banned)."""
    lines = [
        "Failed password for root from 192.0.2.5 port 1 ssh2",  # a connection never closed
        "Failed password for root from 2001:db8::9 port 2 ssh2",  # the pid again, another peer, IPv6
        "Failed password for admin from 2001:db8::9 port 2 ssh2",  # its own second user: a failure of it
        "Failed password for root from 192.0.2.6 port 3 ssh2",  # and again, IPv4
        "Disconnecting: Too many authentication failures for root [preauth]",  # no address: the latest peer's
    ]
    want = ["192.0.2.5", "2001:db8::9", "2001:db8::9", "192.0.2.6", "192.0.2.6"]
    ctx = MatchContext()
    assert [host(sshd(x, ctx)) for x in lines] == want
    texts = [f"Dec  2 09:53:10 web1 sshd[4242]: {x}" for x in lines]
    for flt in (SSHD, load_filter("sshd", tz=UTC)):  # the batch path (native core when built) and again
        found = flt.scan(texts, NOW, MatchContext())
        assert [host(r) for _, r in found] == want
    # the same peer on its known id still folds in: a second user name of one connection is remembered
    ctx = MatchContext()
    pam = "pam_unix(sshd:auth): authentication failure; logname= uid=0 euid=0 tty=ssh ruser= rhost=192.0.2.7"
    assert sshd(pam + "  user=root", ctx) is None
    assert host(sshd(pam + "  user=admin", ctx)) == "192.0.2.7"


def test_context_is_bounded() -> None:
    ctx = MatchContext(max_entries=10, max_age=60.0)
    for pid in range(100):
        SSHD.match(f"Dec  2 09:53:10 web1 sshd[{pid}]: Connection from 192.0.2.{pid} port 1", NOW, ctx)
    assert len(ctx) == 10
    # entries older than max_age are forgotten: the hostless line finds nothing
    SSHD.match("Dec  2 09:53:10 web1 sshd[7777]: Connection from 192.0.2.77 port 1", NOW, ctx)
    late = SSHD.match("Dec  2 09:55:10 web1 sshd[7777]: Disconnecting: Too many authentication failures",
                      NOW + 120, ctx)
    assert late is None


# -- lint, literals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "risky"), [
    (r"^(a+)+$", True),
    (r"^(\w+\s?)*$", True),
    (r"^.* from .*x$", True),
    (r"^\d+\w+x", True),
    (r"x\S+", True),
    (r"^\S+ from \S+ port", False),
    (r"^.*b.*", False),  # a final catch-all cannot fail
    (r"^\[[^\]\"]*(?:\"[^\"]*\"[^\]\"]*)*\]", False),  # unrolled loop
    (expand_tags(r"^Invalid user <F-USER>.*</F-USER> from <HOST>(?: port \d+)?\s*$"), False),
])
def test_lint(pattern: str, risky: bool) -> None:
    assert bool(lint_regex(pattern)) is risky


@pytest.mark.skipif(not HAVE_RE2, reason="google-re2 is not installed")
def test_risky_user_regex_runs_on_re2(tmp_path: Path) -> None:
    p = write(tmp_path, "slow.yaml", "failregex: ['^(\\w+\\s?)*from <HOST>$']\n")
    flt = load_filter(str(p))
    assert flt.engines == ("re2",)
    # exponential on `re`, linear on RE2: this returns at once
    assert flt.match("a " * 5000 + "!", NOW) is None
    assert host(flt.match("ab cd from 192.0.2.1", NOW)) == "192.0.2.1"


def test_required_literal_ignores_cut_out_dates() -> None:
    assert required_literal(expand_tags(r'^<HOST> - \S+ \[\] "[^"]*" 400')) == '" 400'
    assert required_literal(r"^Failed (?:password|none) for") == "Failed "
    assert required_literal(r"(?i)^failed password") is None


def test_long_lines_are_cut() -> None:
    far = "x" * MAX_LINE + " from 192.0.2.1 port 1"
    assert sshd("Invalid user " + far) is None  # the address is beyond what is looked at
    assert host(sshd("Invalid user " + "y" * 100 + " from 192.0.2.1 port 1")) == "192.0.2.1"


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300), st.booleans())
def test_arbitrary_text_never_raises(text: str, syslog: bool) -> None:
    line = ("Dec  2 09:53:10 web1 sshd[1]: " + text) if syslog else text
    ctx = MatchContext()
    for flt in ALL_FILTERS:
        r = flt.match(line, NOW, ctx)
        assert r is None or isinstance(r, Match | Rejected)


ALL_FILTERS = [load_filter(n, tz=UTC) for n in builtin_filters()] + [load_filter(f"{F2B}/sshd.conf", tz=UTC)]


# -- the fast lane gives exactly what the general path gives --------------------------------------------




def test_fast_lane_equals_general_path(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.authlog import server_log
    from bench.bench_matcher import synthetic

    synthetic(tmp_path / "auth.log", 3000, seed=5)
    lines = sample_lines() + (tmp_path / "auth.log").read_text().splitlines()
    lines += list(server_log(3000, seed=5, start=NOW - 86400))
    filters = Path(__file__).resolve().parents[2] / "nftblockd" / "detect" / "filters"
    checked = 0
    modes_of: dict[str, Sequence[str | None]] = {n: [None] for n in builtin_filters()}
    modes_of.update(MODES)
    for name, modes in modes_of.items():
        for mode in modes:
            d = load_yaml_filter(filters / f"{name}.yaml", {"mode": mode} if mode else {})
            # the Python paths (the native core has its own differential tests: test_native.py)
            fast = compile_filter(d, tz=UTC, native=False)
            slow = compile_filter(d, tz=UTC, fast=False, native=False)
            if fast._fast is None:
                continue
            cf, cs = MatchContext(), MatchContext()
            expected = []
            for i, line in enumerate(lines):
                want = slow.match(line, NOW, cs)
                assert fast.match(line, NOW, cf) == want, (name, mode, line)
                if want is not None:
                    expected.append((i, want))
            # the batch API the jails use gives the same, in one call
            assert fast.scan(lines, NOW, MatchContext()) == expected, (name, mode)
            checked += 1
    assert checked >= 8


# -- filters built from definitions directly -----------------------------------------------------------


def test_compile_filter_from_a_definition() -> None:
    d = FilterDef(name="t", source="test", failregex=(RegexSource(r"^bad login from <HOST>$", "test:1"),),
                  ignoreregex=(RegexSource(r"^bad login from 192\.0\.2\.9$", "test:2"),))
    flt = compile_filter(d)
    assert host(flt.match("bad login from 192.0.2.1", NOW)) == "192.0.2.1"
    ig = flt.match("bad login from 192.0.2.9", NOW)
    assert isinstance(ig, Match) and ig.ignored and ig.time is None
    with pytest.raises(FilterError, match="no usable failregex"):
        compile_filter(FilterDef(name="t", source="test", failregex=(RegexSource("^a<SKIPLINES>b <HOST>"),)))


# -- test-filter ---------------------------------------------------------------------------------------


def test_run_json(tmp_path: Path) -> None:
    log = write(tmp_path, "auth.log", "Dec  2 09:53:10 h sshd[1]: Invalid user a from 192.0.2.1 port 1\n"
                                      "Dec  2 09:53:11 h CRON[2]: noise\n"
                                      "Dec  2 09:53:12 h sshd[3]: Invalid user b from host.example port 1\n")
    out = io.StringIO()
    assert run("sshd", str(log), json_output=True, out=out, now=NOW) == 0
    doc = json.loads(out.getvalue())
    assert doc["lines"] == 3 and doc["matched"] == 1 and doc["ignored"] == 0 and doc["rejected"] == 1
    assert doc["lines_per_second"] > 0
    assert doc["matches"][0]["line"] == 1 and doc["matches"][0]["host"] == "192.0.2.1"
    assert doc["matches"][0]["time"].startswith("2026-12-02T")


def test_run_text_and_errors(tmp_path: Path) -> None:
    log = write(tmp_path, "auth.log", "Dec  2 09:53:10 h sshd[1]: Invalid user a from 192.0.2.1 port 1\n")
    out, err = io.StringIO(), io.StringIO()
    assert run("sshd", str(log), json_output=False, out=out, now=NOW) == 0
    assert "192.0.2.1" in out.getvalue() and "lines/s" in out.getvalue()
    assert run("nope", str(log), json_output=False, out=out, err=err) == 1
    assert err.getvalue().count("\n") == 1 and "unknown filter" in err.getvalue()
    err = io.StringIO()
    assert run("sshd", str(tmp_path / "missing.log"), json_output=True, out=out, err=err) == 1
    assert "cannot read" in err.getvalue()


SSHD_YAML = Path(__file__).resolve().parents[2] / "nftblockd" / "detect" / "filters" / "sshd.yaml"
SSHD_GENERAL = compile_filter(load_yaml_filter(SSHD_YAML), tz=UTC, fast=False, native=False)
SSHD_FAST = compile_filter(load_yaml_filter(SSHD_YAML), tz=UTC, native=False)
_SSHD_BITS = st.sampled_from([
    "Dec  2 09:53:10 web1 sshd[1]: ", "Dec  2 09:53:11 web1 sshd-session[2]: ", "2026-12-02T09:53:10Z web1 sshd[3]: ",
    "Failed password for ", "invalid user ", "root", " from ", "192.0.2.1", "2001:db8::7", "host.example",
    " port 22", " ssh2", " [preauth]", "Received disconnect from ", ":11: Bye", "Connection closed by ",
    "Disconnecting: Too many authentication failures", "Accepted password for ", "\n", "\r", "\udcff", " ",
])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_SSHD_BITS, max_size=8).map("".join), max_size=12))
def test_scan_equals_the_general_path_line_by_line(lines: list[str]) -> None:
    # the batch fast lane and the general path, one line at a time, keep connections the same way
    one_by_one = []
    ctx = MatchContext()
    for i, line in enumerate(lines):
        r = SSHD_GENERAL.match(line, NOW, ctx)
        if r is not None:
            one_by_one.append((i, r))
    assert SSHD_FAST.scan(lines, NOW, MatchContext()) == one_by_one
    assert SSHD.scan(lines, NOW, MatchContext()) == one_by_one  # the native core, when built
