"""Subnet escalation end to end: jail bans in a real daemon's namespace → the prefix in the kernel's interval
set; a prefix holding an allowlisted address refused, with its audit line."""

from __future__ import annotations

import functools
from pathlib import Path

from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, wait_for
from tests.integration.test_jails import append, failures


def config(log: Path) -> str:
    return f"""
allowlist: [203.0.113.50]
reconcile: {{interval: 1h}}
blocklists:
  default:
    subnet_escalation: {{threshold: 3, window: 10m, bantime: 2h, ipv4_prefix: 24, ipv6_prefix: 48}}
jails:
  sshd:
    files: ["{log}"]
    filter: sshd
    maxretry: 1
    findtime: 10m
    bantime: 1h
    ipv6_prefix: 64
"""


def test_prefix_banned_after_threshold_and_allowlisted_prefix_refused(netns: NetNS, tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.write_text("")
    d = DaemonProc(netns, tmp_path / "d", config(log)).start()
    try:
        def elements(name: str) -> set[str]:
            return set(netns.set_elements("nftblock", name))

        net4 = functools.partial(elements, "default_net4")
        net6 = functools.partial(elements, "default_net6")
        ip4 = functools.partial(elements, "default_ip4")
        # two addresses of 198.51.100.0/24 and two of the allowlisted neighbour's /24: below the threshold
        append(log, failures("198.51.100.1", 1) + failures("198.51.100.2", 1)
               + failures("203.0.113.1", 1) + failures("203.0.113.2", 1))
        wait_for(lambda: {"198.51.100.1", "198.51.100.2", "203.0.113.1", "203.0.113.2"} <= ip4(), what="jail bans")
        assert net4() == set()
        append(log, failures("198.51.100.77", 1) + failures("203.0.113.3", 1)
               + failures("2001:db8:5:1::1", 1) + failures("2001:db8:5:2::1", 1) + failures("2001:db8:5:3::9", 1))
        wait_for(lambda: "198.51.100.0/24" in net4(), what="the IPv4 prefix ban")
        wait_for(lambda: "2001:db8:5::/48" in net6(), what="the IPv6 prefix ban")
        wait_for(lambda: "203.0.113.3" in ip4(), what="the third ban in the allowlisted /24")
        wait_for(lambda: d.cli_json("status")["subnet_escalation"]["refused"] == {"allowlisted": 1},
                 what="the refusal counted")
        assert not any(e.startswith("203.0.113.") and "/" in e for e in net4())
        st = d.cli_json("status")["subnet_escalation"]
        assert st["escalated"] == 2 and st["failed"] == 0, st
        text = d.log()
        line = next(x for x in text.splitlines() if "ban jail=subnet-escalation address=198.51.100.0/24" in x)
        assert "198.51.100.1" in line and "198.51.100.2" in line and "198.51.100.77" in line, line
        refused = next(x for x in text.splitlines() if "refused subnet ban 203.0.113.0/24" in x)
        assert "203.0.113.50" in refused and "203.0.113.3" in refused, refused
        ban = next(b for b in d.cli_json("list")["bans"] if b["target"] == "198.51.100.0/24")
        assert 7000 < ban["expires_in"] <= 7200
    finally:
        d.close()
