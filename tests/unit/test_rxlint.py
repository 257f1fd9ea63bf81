"""rxlint.exponential_risk: the catastrophic shapes an operator is warned about (issue 33), and what must not be
flagged: the shipped filters and fail2ban's stock ones (real shapes, not toys)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from nftblockd.config import load_config
from nftblockd.daemon.build import compile_filters, regex_warnings
from nftblockd.detect.filterload import builtin_filters, load_filter
from nftblockd.detect.matcher import FilterError, UnsupportedRegex, expand_tags
from nftblockd.detect.rxlint import exponential_risk

F2B = Path("/etc/fail2ban/filter.d")


@pytest.mark.parametrize("pattern", [
    r"^(a+)+$", r"^(a*)*$", r"^(\w+\s?)+$", r"^([a-z]+)*$", r"^(.*)*$", r"^x(?:(a+)+)?$", r"^(\d+)*x (?P<ip4>\S+)",
    r"^(?:(?:\d+)+x)?", r"(?i)^(A+)+$",
])
def test_nested_repeats_over_overlapping_atoms_are_flagged(pattern: str) -> None:
    assert exponential_risk(pattern) is not None


@pytest.mark.parametrize("pattern", [
    r"^(a+b)+$",  # each round ends in b: one way to split
    r"^(?:, arg\d+=\S*)*, relay=",  # sendmail-reject: the tail \S* cannot take the next round's space
    r"^(?:a++)+$", r"^(?>a+)+$",  # possessive and atomic repeats never give back
    r"^\s*(\S+\s+)*$", r"^a+b+$", r"^(a|b)+$", r"^(ab|a)*c$", r"[", "x{99999999999}",
    r"^(?:a?)+$",  # rounds of at most one character: one way to split
    r"^(?:(?=a)a+)+$",  # a lookaround in the body: left to lint_regex and RE2
])
def test_linear_shapes_and_broken_patterns_are_not_flagged(pattern: str) -> None:
    assert exponential_risk(pattern) is None


def _sources(spec: str) -> list[str]:
    try:
        d = load_filter(spec).definition
    except FilterError:  # a -common.conf include or a filter that needs options: not a filter of its own
        return []
    out = []
    for src in (*d.failregex, *d.ignoreregex, *(x for x in (d.prefregex, d.prefix) if x is not None)):
        with contextlib.suppress(UnsupportedRegex):
            out.append(expand_tags(src.text))
    return out


def test_no_shipped_or_stock_fail2ban_regex_is_flagged() -> None:
    specs = [*builtin_filters(), *(str(p) for p in sorted(F2B.glob("*.conf")))]
    patterns = [p for s in specs for p in _sources(s)]
    assert len(patterns) > 200  # fail2ban's filter.d is there (make deps installs it)
    assert [p for p in patterns if exponential_risk(p)] == []


def _config(tmp_path: Path, regex: str) -> Path:
    (tmp_path / "f.yaml").write_text(f"failregex:\n  - '{regex}'\n")
    (tmp_path / "x.log").touch()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"jails:\n  x:\n    filter: {tmp_path}/f.yaml\n    files: [{tmp_path}/x.log]\n")
    return cfg


def test_a_catastrophic_user_regex_is_a_warning_at_the_jails_filter_line(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path, "^(a+)+ <HOST>$"))
    warnings = regex_warnings(cfg, compile_filters(cfg)[0])
    assert [(w.line, w.warning, w.where) for w in warnings] == [(3, True, "jails.x.filter")]
    assert "(exponential)" in warnings[0].reason and f"{tmp_path}/f.yaml:2" in warnings[0].reason


def test_a_regex_python_cannot_compile_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    # OverflowError and RecursionError escaped `except re.error` before: a traceback from --check-config.
    for regex in ("<HOST> a{99999999999}", "<HOST> " + "(" * 3000 + ")" * 3000):
        (tmp_path / "f.yaml").write_text(f"failregex:\n  - '{regex}'\n")
        with pytest.raises(FilterError, match=r"f\.yaml:2: invalid regex"):
            load_filter(str(tmp_path / "f.yaml"), engine="re")


def test_the_daemon_refuses_a_filter_that_does_not_compile_without_a_traceback(tmp_path: Path) -> None:
    # It fails while building its filters, before any kernel, socket or state work.
    cfg = _config(tmp_path, "^(<HOST>")
    r = subprocess.run([sys.executable, "-m", "nftblockd.daemon.main", "-c", str(cfg)], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert f"{cfg}:3: jails.x.filter: {tmp_path}/f.yaml:2: invalid regex" in r.stderr
