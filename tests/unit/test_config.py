"""Config errors name file, line and reason, all at once; valid configs load into dataclasses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nftblockd.config import ConfigError, load_config, parse_config
from nftblockd.daemon import build_filters

REPO = Path(__file__).resolve().parents[2]


def test_example_config_is_valid() -> None:
    cfg = load_config(REPO / "config" / "nftblockd.yaml")
    assert cfg.table == "nftblock" and {b.name for b in cfg.blocklists} == {"default", "feeds"}
    assert build_filters(cfg).keys() == {"sshd"}


def test_every_problem_is_reported_with_its_line() -> None:
    text = """blocklists:
  default: {timeout: 1h}
jails:
  sshd:
    files: [/var/log/auth.log]
    filter: sshd
    maxretry: lots
    findtime: 10 parsecs
    blocklist: nope
allowlist: [10.0.0.300]
bogus: 1
"""
    with pytest.raises(ConfigError) as e:
        parse_config(text, "x.yaml")
    lines = str(e.value).splitlines()
    assert "x.yaml:7: jails.sshd.maxretry: expected int, got 'lots'" in lines
    assert any(line.startswith("x.yaml:8: jails.sshd.findtime:") for line in lines)
    assert any(line.startswith("x.yaml:9: jails.sshd.blocklist: unknown blocklist") for line in lines)
    assert any(line.startswith("x.yaml:10: allowlist.0:") for line in lines)
    assert any(line.startswith("x.yaml:11: bogus: unknown key") for line in lines)


def test_bad_filter_is_a_config_error_at_the_filter_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nfailregex: ['^Failed password for (\\w+) from']\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"jails:\n  web:\n    files: [/tmp/x.log]\n    filter: {bad}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:4: jails.web.filter:"):
        build_filters(load_config(cfg))
    r = subprocess.run([sys.executable, "-m", "nftblockd.daemon_main", "--check-config", str(cfg)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1 and "c.yaml:4" in r.stderr


def test_invalid_yaml_names_the_line() -> None:
    with pytest.raises(ConfigError, match=r"y.yaml:\d+: invalid YAML"):
        parse_config("a: 1\nb: {c: 1\nd: 2\n", "y.yaml")


def test_feed_blocklists_are_not_for_jails() -> None:
    with pytest.raises(ConfigError, match="filled by feeds"):
        parse_config("blocklists: {default: {}, f: {}}\nfeeds: {x: {path: /tmp/x, blocklist: f}}\n"
                     "jails: {s: {files: [/tmp/l], filter: sshd, blocklist: f}}\n")
