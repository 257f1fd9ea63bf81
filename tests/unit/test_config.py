"""Config errors name file, line and reason, all at once; valid configs load into dataclasses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nftblockd.config import ConfigError, examine_text, load_config, parse_config
from nftblockd.daemon.build import build_filters

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
    r = subprocess.run([sys.executable, "-m", "nftblockd.daemon.main", "--check-config", str(cfg)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1 and "c.yaml:4" in r.stderr


def test_invalid_yaml_names_the_line() -> None:
    with pytest.raises(ConfigError, match=r"y.yaml:\d+: invalid YAML"):
        parse_config("a: 1\nb: {c: 1\nd: 2\n", "y.yaml")


def test_feed_blocklists_are_not_for_jails() -> None:
    with pytest.raises(ConfigError, match="filled by feeds"):
        parse_config("blocklists: {default: {}, f: {}}\nfeeds: {x: {path: /tmp/x, blocklist: f}}\n"
                     "jails: {s: {files: [/tmp/l], filter: sshd, blocklist: f}}\n")


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nftblockd.daemon.main", "--check-config", str(path)],
                          capture_output=True, text=True, cwd=REPO)


def test_check_config_reports_everything_in_one_run_in_file_order(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""jails:
  web:
    files: [{tmp_path}/present.log]
    filter: {tmp_path}/no-such-filter.yaml
    maxretry: lots
    maxretry: 4
allowlist: [10.0.0.1/8]
log_level: chatty
log_level: info
""")
    (tmp_path / "present.log").write_text("")
    r = check_config(cfg)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    # the filter that cannot be read is reported together with the type errors, and by line
    assert [line.split(":")[1] for line in lines] == ["4", "5", "6", "7", "8", "9"], r.stderr
    assert "jails.web.filter" in lines[0] and "no-such-filter.yaml" in lines[0]
    assert "duplicate key 'maxretry' (first on line 5)" in lines[2]
    assert "'10.0.0.1/8' has host bits set" in lines[3]
    assert "duplicate key 'log_level' (first on line 8)" in lines[5]


def test_every_duplicate_key_is_a_problem_and_the_first_value_stays() -> None:
    cfg, problems = examine_text("log_level: info\njails: {}\nlog_level: debug\njails: {}\n", "d.yaml")
    assert [str(p) for p in problems] == [
        "d.yaml:3: duplicate key 'log_level' (first on line 1); this one is ignored",
        "d.yaml:4: duplicate key 'jails' (first on line 2); this one is ignored",
    ]
    assert cfg is not None and cfg.log_level == "info"


def test_a_missing_config_file_is_named_without_a_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "absent.yaml")
    assert str(e.value) == f"{tmp_path}/absent.yaml: cannot read the config: No such file or directory"
    r = check_config(tmp_path / "absent.yaml")
    assert r.returncode == 1 and ":0:" not in r.stderr and "absent.yaml: cannot read" in r.stderr


@pytest.mark.parametrize("where", ["allowlist: [{net}]",
                                   "jails: {{s: {{files: [/l], filter: sshd, ignoreip: [{net}]}}}}"])
@pytest.mark.parametrize("net", ["10.0.0.1/8", "2001:db8::1/64"])
def test_an_allowlist_entry_with_host_bits_is_refused(where: str, net: str) -> None:
    with pytest.raises(ConfigError, match="host bits set"):
        parse_config(where.format(net=net))
    ok = parse_config(where.format(net=net.replace("0.0.1/8", "0.0.0/8").replace("::1/64", "::/64")))
    assert ok.allowlist or ok.jails[0].ignoreip


def test_missing_log_files_are_warnings_not_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"jails:\n  web:\n    files:\n      - {tmp_path}/later.log\n      - {tmp_path}/nodir/*.log\n"
                   f"      - {tmp_path}/here.log\n    filter: sshd\n")
    (tmp_path / "here.log").write_text("")
    r = check_config(cfg)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"{cfg}:4: warning: jails.web.files: {tmp_path}/later.log does not exist (followed once it appears)",
        f"{cfg}:5: warning: jails.web.files: {tmp_path}/nodir/*.log: its directory {tmp_path}/nodir does not "
        "exist (followed once it appears)",
    ]
    assert r.stdout == f"{cfg}: valid (2 warnings)\n"


def test_ingress_device_names_are_checked_each_with_its_line() -> None:
    cfg, problems = examine_text("chain:\n  ingress:\n    - eth0\n    - a/b\n    - eth0\n    - 12\n"
                                 "    - abcdefghijklmnop\n    - \"has space\"\n    - veth-1.2\n", "i.yaml")
    assert [str(p) for p in problems] == [
        "i.yaml:4: chain.ingress.1: 'a/b' is not a valid interface name (no '/', ':', or whitespace; not . or ..)",
        "i.yaml:5: chain.ingress.2: 'eth0' is listed twice",
        "i.yaml:6: chain.ingress.3: an interface name is a string, got 12",
        "i.yaml:7: chain.ingress.4: interface name 'abcdefghijklmnop' must be 1 to 15 bytes long",
        "i.yaml:8: chain.ingress.5: 'has space' is not a valid interface name (no '/', ':', or whitespace; "
        "not . or ..)",
    ]
    assert cfg is not None and cfg.chain.ingress == ("eth0", "veth-1.2")


def test_a_missing_ingress_device_is_a_warning_at_its_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("chain:\n  ingress: [lo, nosuch0]\n")
    r = check_config(cfg)
    assert r.returncode == 0, r.stderr
    assert r.stderr == (f"{cfg}:2: warning: chain.ingress: device 'nosuch0' does not exist now (its ingress chain "
                        "is attached when it appears)\n")
    assert r.stdout == f"{cfg}: valid (1 warning)\n"


def test_values_compare_by_meaning_not_by_position() -> None:
    """A reload compares blocklists, jails and feeds: a comment added above must not change them."""
    text = ("blocklists: {default: {timeout: 1h}, f: {}}\nfeeds: {x: {path: /tmp/x, blocklist: f}}\n"
            "jails: {s: {files: [/tmp/l], filter: sshd}}\n")
    a, b = parse_config(text), parse_config("# a comment\n\n" + text)
    assert a.blocklists[0].line != b.blocklists[0].line
    assert (a.blocklists, a.jails, a.feeds, a.chain, a.table) == (b.blocklists, b.jails, b.feeds, b.chain, b.table)
    c = parse_config(text.replace("timeout: 1h", "timeout: 2h"))
    assert c.blocklists != a.blocklists


def test_zero_and_overlong_durations_are_refused_with_their_line(tmp_path: Path) -> None:
    # Issue 13, item 5: `findtime: 0` passed --check-config, then the daemon exited with a traceback.
    cfg = tmp_path / "c.yaml"
    cfg.write_text("reconcile: {interval: 0}\njails:\n  sshd:\n    files: [/var/log/auth.log]\n    filter: sshd\n"
                   "    findtime: 0\n    bantime: 1.0e+308\n    escalation: {max: 99999d}\n"
                   "feeds:\n  f:\n    path: /tmp/f\n    blocklist: fb\n    refresh: 0s\n"
                   "blocklists: {default: {}, fb: {timeout: 10000000000000000000000000000000}}\n")
    r = subprocess.run([sys.executable, "-m", "nftblockd.daemon.main", "--check-config", str(cfg)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert any(line.startswith(f"{cfg}:1: reconcile.interval: must be longer than 0") for line in lines), lines
    assert any(line.startswith(f"{cfg}:6: jails.sshd.findtime: must be longer than 0") for line in lines), lines
    assert any(line.startswith(f"{cfg}:7: jails.sshd.bantime: a ban timeout is at most 3650d") for line in lines)
    assert any(line.startswith(f"{cfg}:8: jails.sshd.escalation.max: must be at most 3650d") for line in lines)
    assert any(line.startswith(f"{cfg}:13: feeds.f.refresh: must be longer than 0") for line in lines), lines
    assert any(line.startswith(f"{cfg}:14: blocklists.fb.timeout: a ban timeout is at most") for line in lines)


def test_unknown_keys_are_listed_up_to_a_bound_then_counted() -> None:
    # 200k unknown keys made 200k problems (12-21 s, 344 MB), each repeating the known keys.
    from nftblockd.config.reader import MAX_UNKNOWN_KEYS

    text = "jails:\n  x:\n" + "".join(f"    k{i}: 1\n" for i in range(2000))
    _cfg, problems = examine_text(text, "c.yaml")
    unknown = [p for p in problems if "unknown key" in p.reason]
    assert len(unknown) == MAX_UNKNOWN_KEYS + 1
    assert str(unknown[-1]) == (f"c.yaml:{3 + MAX_UNKNOWN_KEYS}: jails.x.k{MAX_UNKNOWN_KEYS}: unknown key "
                                f"'k{MAX_UNKNOWN_KEYS}' and {2000 - MAX_UNKNOWN_KEYS - 1} more after it (only the "
                                f"first {MAX_UNKNOWN_KEYS} of a mapping are listed one by one)")
