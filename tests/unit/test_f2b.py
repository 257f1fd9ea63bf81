"""f2b: reading fail2ban filter files: INI rules, includes and .local overrides, %(...)s interpolation with
section/known/default names, [Init] and spec options, <tag> substitution, errors with file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from nftblockd.detect.f2b import read_config, read_filter
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.matcher import FilterError, Match
from tools.f2b_conformance import main

F2B = Path("/etc/fail2ban/filter.d")
NOW = 1796205190.0


def conf(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def regexes(path: Path, **opts: str) -> list[str]:
    return [r.text for r in read_filter(path, opts).failregex]


def test_ini_rules(tmp_path: Path) -> None:
    p = conf(tmp_path, "x.conf", """\
# a comment
[Definition]
; another comment
failregex = ^first <HOST>$
            ^second <HOST>$  ; an inline comment
# a comment inside the value vanishes

            ^third <HOST>$
Ignoreregex: ^ignored <HOST>$
prefregex=
""")
    d = read_filter(p)
    assert [r.text for r in d.failregex] == ["^first <HOST>$", "^second <HOST>$", "^third <HOST>$"]
    assert [r.text for r in d.ignoreregex] == ["^ignored <HOST>$"]  # keys are folded to lower case
    assert d.prefregex is None
    assert d.failregex[0].where == f"{p}:4"


def test_interpolation(tmp_path: Path) -> None:
    p = conf(tmp_path, "x.conf", """\
[DEFAULT]
_daemon = sshd
__pct = 100%%
[other]
word = from
[Definition]
pre = %(_daemon)s\\[\\d+\\]:
failregex = ^%(pre)s fail %(other/word)s <HOST> %(__pct)s$
            ^%(default/_daemon)s <HOST>$
""")
    assert regexes(p) == [r"^sshd\[\d+\]: fail from <HOST> 100%$", "^sshd <HOST>$"]


def test_interpolation_errors_say_where(tmp_path: Path) -> None:
    p = conf(tmp_path, "x.conf", "[Definition]\nfailregex = ^%(missing)s <HOST>$\n")
    with pytest.raises(FilterError, match=r"x\.conf:2: %\(missing\)s is not defined"):
        read_filter(p)
    p = conf(tmp_path, "y.conf", "[Definition]\nfailregex = ^100% <HOST>$\n")
    with pytest.raises(FilterError, match=r"y\.conf:2: '%' must be written '%%'"):
        read_filter(p)
    p = conf(tmp_path, "z.conf", "[Definition]\na = %(b)s\nb = %(a)s\nfailregex = %(a)s <HOST>\n")
    with pytest.raises(FilterError, match="deeper"):
        read_filter(p)
    p = conf(tmp_path, "w.conf", "[Init]\nfoo = 1\n")
    with pytest.raises(FilterError, match=r"no \[Definition\]"):
        read_filter(p)
    p = conf(tmp_path, "v.conf", "failregex = x\n")
    with pytest.raises(FilterError, match=r"v\.conf:1: a key before the first \[section\]"):
        read_filter(p)
    with pytest.raises(FilterError, match="no such fail2ban filter"):
        read_filter(tmp_path / "absent.conf")


def _exponential(ref: str) -> str:
    """Ten levels, each ten copies of the level below: 10**9 characters if expanded."""
    lines = ["[Definition]", "a0 = x"]
    lines += [f"a{i} = " + ref.format(f"a{i - 1}") * 10 for i in range(1, 10)]
    return "\n".join(lines) + "\n"


def test_exponential_interpolation_is_refused_with_its_line(tmp_path: Path) -> None:
    # Issue 13, item 5: such a file made test-filter run past 60 s at 280 MB; users load third-party
    # filters as they are.
    p = conf(tmp_path, "bomb.conf", _exponential("%({})s") + "failregex = ^%(a9)s <HOST>$\n")
    with pytest.raises(FilterError, match=r"bomb\.conf:12: .*expands to more than"):
        read_filter(p)


def test_exponential_tags_are_refused_with_their_line(tmp_path: Path) -> None:
    p = conf(tmp_path, "tags.conf", _exponential("<{}>") + "failregex = ^<a9> <HOST>$\n")
    with pytest.raises(FilterError, match=r"tags\.conf:12: .*expands to more than"):
        read_filter(p)


def test_includes_before_after_and_local(tmp_path: Path) -> None:
    conf(tmp_path, "common.conf", "[DEFAULT]\n_daemon = \\S*\nprefix = %(_daemon)s:\n")
    conf(tmp_path, "common.local", "[DEFAULT]\n_daemon = mine\n")
    conf(tmp_path, "late.conf", "[Definition]\nextra = ^late <HOST>$\n")
    p = conf(tmp_path, "f.conf", """\
[INCLUDES]
before = common.conf
after = late.conf
[Definition]
extra = ^early <HOST>$
failregex = ^%(prefix)s <HOST>$
            %(extra)s
""")
    conf(tmp_path, "f.local", "[Definition]\nfailregex = %(known/failregex)s\n            ^local <HOST>$\n")
    # common.local overrides common.conf; late.conf (after) overrides f.conf; f.local adds to failregex
    assert regexes(p) == ["^mine: <HOST>$", "^late <HOST>$", "^local <HOST>$"]
    names = [Path(f).name for f in read_config(p).files]
    assert names == ["common.conf", "common.local", "f.conf", "late.conf", "f.local"]


def test_conf_d_directory(tmp_path: Path) -> None:
    p = conf(tmp_path, "f.conf", "[Definition]\nfailregex = ^a <HOST>$\n")
    (tmp_path / "f.d").mkdir()
    conf(tmp_path / "f.d", "10-more.conf", "[Definition]\nfailregex = ^b <HOST>$\n")
    assert regexes(p) == ["^b <HOST>$"]


def test_init_options_and_tags(tmp_path: Path) -> None:
    p = conf(tmp_path, "f.conf", """\
[Definition]
mode = normal
re-normal = ^normal <HOST>$
re-aggressive = ^aggressive <HOST>$
            <re-normal>
lt_x = ^<lt_<logtype>/word> <HOST>$
failregex = <re-<mode>>
            <lt_x>
            ^<block> <HOST>$
[Init]
block = blocked
logtype = file
[lt_file]
word = file-word
[lt_journal]
word = journal-word
""")
    assert regexes(p) == ["^normal <HOST>$", "^file-word <HOST>$", "^blocked <HOST>$"]
    assert regexes(p, mode="aggressive", logtype="journal", block="other") == [
        "^aggressive <HOST>$", "^normal <HOST>$", "^journal-word <HOST>$", "^other <HOST>$"]


def test_tags_that_are_not_options_stay(tmp_path: Path) -> None:
    p = conf(tmp_path, "f.conf", "[Definition]\nfailregex = ^<F-USER>\\S+</F-USER> from <HOST> <unknown>$\n")
    assert regexes(p) == [r"^<F-USER>\S+</F-USER> from <HOST> <unknown>$"]


def test_self_referencing_tags_are_an_error(tmp_path: Path) -> None:
    p = conf(tmp_path, "f.conf", "[Definition]\na = x<a>\nfailregex = <a> <HOST>\n")
    with pytest.raises(FilterError, match="refers to itself"):
        read_filter(p)


def test_notes_for_what_is_not_implemented(tmp_path: Path) -> None:
    p = conf(tmp_path, "f.conf", """\
[Definition]
failregex = ^one <HOST>$
            ^two <HOST>\\n<SKIPLINES>^three$
maxlines = 2
journalmatch = _SYSTEMD_UNIT=x.service
""")
    flt = load_filter(str(p))
    assert any("maxlines" in n for n in flt.notes)
    assert any("SKIPLINES" in n for n in flt.notes)
    assert any("journalmatch: _SYSTEMD_UNIT=x.service" in n for n in flt.notes)
    assert isinstance(flt.match("one 192.0.2.1", NOW), Match)


@pytest.mark.skipif(not (F2B / "sshd.conf").is_file(), reason="fail2ban's filters are not installed")
def test_debian_sshd_conf_modes() -> None:
    normal = read_filter(F2B / "sshd.conf")
    aggressive = read_filter(F2B / "sshd.conf", {"mode": "aggressive"})
    assert normal.prefregex is not None and "<F-MLFID>" in normal.prefregex.text
    assert "sshd" in normal.prefregex.text  # <_daemon> from sshd.conf's [DEFAULT], through common.conf's tags
    assert len(aggressive.failregex) > len(normal.failregex) >= 20
    assert not any("<mode>" in r.text or "<mdre-" in r.text for r in aggressive.failregex)
    # the option reaches nested tags: publickey=any drops the invalid-user-only publickey rule
    assert len(read_filter(F2B / "sshd.conf", {"publickey": "any"}).failregex) < len(normal.failregex)


@pytest.mark.skipif(not F2B.is_dir(), reason="fail2ban's filters are not installed")
def test_every_debian_filter_reads() -> None:
    failed = []
    for p in sorted(F2B.glob("*.conf")):
        if p.stem.endswith("common"):
            continue
        try:
            load_filter(str(p))
        except FilterError as exc:
            failed.append(f"{p.name}: {exc}")
    # only the multi-line filters have no single-line regex left
    assert all(any(n in f for n in ("guacamole", "mongodb-auth", "slapd")) for f in failed), failed


def test_cli_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage" in capsys.readouterr().err
