"""The `fleet:` block: absent is today's single host; every mistake is reported with file:line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nftblockd.config import ConfigError, FleetConfig, parse_config

REPO = Path(__file__).resolve().parents[2]

JAILS = """jails:
  sshd:
    files: [/var/log/auth.log]
    filter: sshd
"""


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_config(text, "f.yaml")
    return str(e.value).splitlines()


def test_absent_is_single_host_and_does_not_import_redis() -> None:
    code = ("import sys; from nftblockd.config import parse_config; import nftblockd.daemon.root; "
            "c = parse_config('jails: {}'); assert c.fleet is None; "
            "assert not [m for m in sys.modules if m == 'redis' or m.startswith(('redis.', 'nftblockd.fleet'))]")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env=os.environ | {"PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr


def test_minimal_and_full(tmp_path: Path) -> None:
    cfg = parse_config("fleet:\n  name: prod\n  url: redis://10.0.0.5:6379/0\n")
    f = cfg.fleet
    assert isinstance(f, FleetConfig) and f.name == "prod" and f.url == "redis://10.0.0.5:6379/0"
    assert f.host_id  # the hostname
    assert f.share_jails is None and f.share_cli and f.blocklist == "default" and f.max_ban == 7 * 86400
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    pw.chmod(0o600)
    for name in ("ca.pem", "cert.pem"):
        (tmp_path / name).write_text("x")
    key = tmp_path / "key.pem"
    key.write_text("x")
    key.chmod(0o600)
    cfg = parse_config(f"""{JAILS}fleet:
  name: prod
  host_id: web-01
  sentinel:
    hosts: [10.0.0.1:26379, "[2001:db8::1]:26379"]
    service: nftblock
  username: web-01
  password_file: {pw}
  tls: {{ca: {tmp_path}/ca.pem, cert: {tmp_path}/cert.pem, key: {key}}}
  share: {{jails: [sshd], cli: false}}
  trust: {{min_prefix_v4: 24, min_prefix_v6: 64, max_ban: 1d, rate: 100, burst: 500, allow_permanent: true}}
  history: 2d
""")
    f = cfg.fleet
    assert f is not None and f.host_id == "web-01" and f.url is None
    assert f.sentinel_hosts == (("10.0.0.1", 26379), ("2001:db8::1", 26379)) and f.sentinel_service == "nftblock"
    assert f.password_file == str(pw) and f.tls is not None and f.tls.key == str(key)
    assert f.share_jails == ("sshd",) and not f.share_cli
    assert (f.min_prefix_v4, f.min_prefix_v6, f.max_ban, f.rate, f.burst) == (24, 64, 86400.0, 100.0, 500)
    assert f.allow_permanent and f.history == 2 * 86400


def test_every_fleet_problem_with_its_line(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    pw.chmod(0o640)
    lines = _problems(f"""{JAILS}feeds:
  drop: {{url: "https://x/y", blocklist: feeds}}
blocklists:
  default: {{}}
  feeds: {{}}
fleet:
  name: "bad{{tag}}"
  host_id: "web 01"
  url: http://x
  password_file: {pw}
  share: {{jails: [nginx]}}
  blocklist: feeds
  trust: {{min_prefix_v4: 0, rate: -1}}
  history: 5s
  colour: blue
""")
    text = "\n".join(lines)
    assert "f.yaml:11: fleet.name: a fleet name is" in text
    assert "f.yaml:12: fleet.host_id: a host id is" in text
    assert "f.yaml:13: fleet.url: url must start with redis:// or rediss://" in text
    assert "f.yaml:14: fleet.password_file:" in text and "readable by group or others (mode 0640)" in text
    assert "f.yaml:15: fleet.share.jails: 'nginx' is not a jail of this config" in text
    assert "f.yaml:16: fleet.blocklist: blocklist 'feeds' is filled by feeds" in text
    assert "f.yaml:17: fleet.trust.min_prefix_v4: must be between 1 and 32, got 0" in text
    assert "f.yaml:17: fleet.trust.rate: rate must be positive" in text
    assert "f.yaml:18: fleet.history: history must be at least 1m" in text
    assert "f.yaml:19: fleet.colour: unknown key 'colour'" in text


def test_server_choice_and_secrets() -> None:
    text = "\n".join(_problems("fleet:\n  name: p\n"))
    assert "f.yaml:1: fleet: fleet needs exactly one of url: or sentinel:" in text
    text = "\n".join(_problems("fleet:\n  name: p\n  url: redis://x\n  sentinel: {hosts: [a:1], service: s}\n"))
    assert "exactly one of url: or sentinel:" in text
    text = "\n".join(_problems("fleet:\n  name: p\n  sentinel: {hosts: [nope, 'h:99999']}\n"))
    assert "fleet.sentinel: sentinel needs service:" in text
    assert "fleet.sentinel.hosts.0: expected HOST:PORT, got 'nope'" in text
    assert "fleet.sentinel.hosts.1: expected HOST:PORT" in text
    text = "\n".join(_problems("fleet:\n  name: p\n  url: redis://u:hunter2@x:6379\n"))
    assert "no password in the url" in text
    text = "\n".join(_problems("fleet:\n  name: p\n  url: rediss://x\n  password_file: /nonexistent/pw\n"
                               "  tls: {cert: /nonexistent/c}\n"))
    assert "fleet.password_file: cannot use /nonexistent/pw" in text
    assert "fleet.tls.cert: /nonexistent/c is not a readable file" in text
    assert "fleet.tls: a client certificate needs both cert: and key:" in text
    assert "f.yaml:1: fleet: fleet needs at least" in "\n".join(_problems("fleet: {}\n"))


def test_check_config_refuses_a_readable_password_file(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    pw.chmod(0o604)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"fleet:\n  name: prod\n  url: redis://127.0.0.1:1\n  password_file: {pw}\n")
    r = subprocess.run([sys.executable, "-m", "nftblockd.daemon.main", "--check-config", str(cfg)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1 and "c.yaml:4: fleet.password_file:" in r.stderr and "0604" in r.stderr
    pw.chmod(0o600)
    r = subprocess.run([sys.executable, "-m", "nftblockd.daemon.main", "--check-config", str(cfg)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr


def test_a_daemon_built_without_a_fleet_imports_no_redis() -> None:
    code = ("import sys, asyncio; from nftblockd.config import parse_config; from nftblockd.daemon.root import Daemon; "
            "d = Daemon(parse_config('allowlist_self: false\\n')); assert d.fleet is None and d.fleet_sink is None; "
            "d._build_fleet(); "
            "assert not [m for m in sys.modules if m == 'redis' or m.startswith(('redis.', 'nftblockd.fleet'))]")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env=os.environ | {"PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
