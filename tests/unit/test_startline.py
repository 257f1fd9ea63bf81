"""The start's line for the operator: the live jails with their rule, the allowlist and where to extend it."""

from __future__ import annotations

from pathlib import Path

from nftblockd.config import load_config
from nftblockd.service.startline import start_line

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_config_names_the_sshd_jail_and_the_allowlist() -> None:
    cfg = load_config(str(ROOT / "config" / "nftblockd.yaml"))
    line = start_line(cfg, "/etc/nftblockd/nftblockd.yaml")
    assert line.startswith("jails live: sshd (journal _SYSTEMD_UNIT=ssh.service: 3 in 10m ban for 1h, "
                           "escalating up to 7d)"), line
    assert "Never banned: 127.0.0.0/8, ::1 and this host's own addresses." in line
    assert "add it under allowlist: in /etc/nftblockd/nftblockd.yaml and run `systemctl reload nftblockd`" in line


def test_files_recidive_and_no_jail(tmp_path: Path) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text("allowlist: []\nallowlist_self: false\njails:\n"
                    "  web: {files: [/var/log/nginx/error.log], filter: nginx-http-auth,"
                    " escalation: {enabled: false}}\n"
                    "  recidive: {recidive: true, filter: recidive, maxretry: 5, findtime: 1d, bantime: 1w}\n")
    line = start_line(load_config(str(conf)), str(conf))
    assert "web (/var/log/nginx/error.log: 5 in 10m ban for 1h)" in line, line
    assert "recidive (bans of every jail: 5 in 1d ban for 7d" in line
    assert "Never banned: nothing." in line
    empty = tmp_path / "e.yaml"
    empty.write_text("jails: {}\n")
    assert start_line(load_config(str(empty)), str(empty)).startswith("jails live: none.")
