"""A table named like ours that someone else wrote rules into is refused, not silently taken over; our own
leftover table (kept after a stop) is adopted as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, wait_for

CONFIG = "blocklists: {default: {timeout: 1h}}\nallowlist_self: false\njails: {}\n"


def test_an_admins_table_of_our_name_is_refused_and_left_alone(netns: NetNS, tmp_path: Path) -> None:
    netns.run("nft", "-f", "-", input="table inet nftblock {\n chain prerouting {"
              " type filter hook prerouting priority raw; policy accept;\n"
              "  ip saddr 198.51.100.0/24 counter drop comment \"admin: lab network\"\n }\n}\n")
    before = netns.nft("list", "table", "inet", "nftblock").stdout
    d = DaemonProc(netns, tmp_path / "d", CONFIG)
    with pytest.raises(AssertionError, match="exited"):
        d.start(timeout=20)
    try:
        log = d.log()
        assert "already exists and holds rules nftblockd did not write" in log
        assert "admin: lab network" in log and "`table:` in the config" in log
        assert netns.nft("list", "table", "inet", "nftblock").stdout == before
    finally:
        d.close()


def test_our_own_leftover_table_is_taken_back(netns: NetNS, tmp_path: Path) -> None:
    d = DaemonProc(netns, tmp_path / "d", CONFIG).start()
    try:
        assert d.cli("ban", "203.0.113.5").returncode == 0
        assert d.stop() == 0  # the table stays (persist), no longer owned
        d.start()
        assert "203.0.113.5" in netns.set_elements("nftblock", "default_ip4")
    finally:
        d.close()


def test_an_address_added_at_runtime_is_protected_at_once(netns: NetNS, tmp_path: Path) -> None:
    d = DaemonProc(netns, tmp_path / "d", CONFIG.replace("allowlist_self: false", "allowlist_self: true")).start()
    try:
        assert d.cli("ban", "203.0.113.77").returncode == 0  # not ours yet: bannable
        netns.run("ip", "addr", "add", "203.0.113.77/32", "dev", "lo")
        wait_for(lambda: d.cli_json("check", "203.0.113.77")["allowlisted"], timeout=10,
                 what="the new address to be allowlisted")
        # the kernel's allowlist set (evaluated before every blocklist) holds it: its traffic is accepted
        assert "203.0.113.77" in netns.set_elements("nftblock", "allow_net4")
        assert d.cli("ban", "203.0.113.77").returncode == 1  # and no new ban is taken
        netns.run("ip", "addr", "del", "203.0.113.77/32", "dev", "lo")
        wait_for(lambda: not d.cli_json("check", "203.0.113.77")["allowlisted"], timeout=10,
                 what="a removed address to lose its protection")
        assert "203.0.113.77" not in netns.set_elements("nftblock", "allow_net4")
    finally:
        d.close()
