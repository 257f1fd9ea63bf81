"""`nftblock ban -` through the real daemon, with input that takes both of its ways: plain address blocks sent
packed (`hosts4`, `hosts6`), the rest as text. The kernel, the answer and the saved state must be what the lines say."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS

CONFIG = """
blocklists: {default: {timeout: 1h, size: 200000}}
allowlist: [192.0.2.0/24, "2001:db8:ffff::/48"]
allowlist_self: false
reconcile: {interval: 1h}
"""


def counts(d: DaemonProc) -> dict[str, int]:
    return {s["name"]: s["elements"] for s in d.cli_json("status")["sets"]}


def test_bulk_ban_of_packed_blocks_and_text_lines(netns: NetNS, tmp_path: Path) -> None:
    # 80,000 plain lines fill the CLI's first 1 MiB block (checked at once, sent packed); the rest of the
    # input needs the line-by-line check (a comment, a range, IPv6) and repeats an address of the first block
    plain = [f"198.{18 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}" for i in range(80_000)]
    rest = ["# and a few more", "203.0.113.0/24", "2001:db8:1::7", plain[5], " 198.51.100.7  # why",
            "224.0.0.1", "192.0.2.9"]
    d = DaemonProc(netns, tmp_path / "d", CONFIG).start()
    try:
        r = d.cli("ban", "--timeout", "1h", "-", input="\n".join(plain + rest) + "\n")
        assert r.returncode == 1  # two refused: said on stderr, the rest banned
        assert r.stdout == "banned 80003 targets (for 1h)\n", r.stdout
        assert "refused 224.0.0.1: 224.0.0.1 is never banned" in r.stderr
        assert "refused 192.0.2.9: 192.0.2.9 is allowlisted (192.0.2.0/24)" in r.stderr
        want = {"default_ip4": 80_001, "default_net4": 1, "default_ip6": 1}
        assert {k: v for k, v in counts(d).items() if k in want} == want
        [ban] = d.cli_json("check", plain[-1])["bans"]
        assert 3500 < ban["expires_in"] <= 3600 and ban["origin"] == "cli"
        # saved before the answer: a reboot (the table gone) and a restart bring back every one
        assert d.stop() == 0
        netns.nft("delete", "table", "inet", "nftblock")
        d.start(timeout=60)
        assert {k: v for k, v in counts(d).items() if k in want} == want
    finally:
        d.close()


def test_bulk_ban_of_packed_ipv6(netns: NetNS, tmp_path: Path) -> None:
    # IPv6 and IPv4 lines mixed in one block (both packed), spelled several ways; an IPv4-mapped address is
    # the IPv4 address; never-banned and allowlisted ones are refused by name, as their text would be
    v6 = [f"2001:db8:{i >> 16:x}:{i & 0xFFFF:x}::1" for i in range(1, 20_001)]
    v4 = [f"198.18.{i >> 8}.{i & 255}" for i in range(1, 1001)]
    odd = ["2001:DB8:0:1:0:0:0:1", "::ffff:198.18.9.9", "::1", "2001:db8:ffff::5", "fe80::1"]
    lines = [x for i, a in enumerate(v6) for x in ((a, v4[i // 20]) if i % 20 == 0 else (a,))] + odd
    d = DaemonProc(netns, tmp_path / "d", CONFIG).start()
    try:
        r = d.cli("ban", "--timeout", "1h", "-", input="\n".join(lines) + "\n")
        assert r.returncode == 1
        assert r.stdout == "banned 21001 targets (for 1h)\n", r.stdout  # the first of odd is v6[0]
        assert "refused ::1: ::1 is never banned" in r.stderr
        assert "refused fe80::1: fe80::1 is never banned" in r.stderr
        assert "refused 2001:db8:ffff::5: 2001:db8:ffff::5 is allowlisted (2001:db8:ffff::/48)" in r.stderr
        want = {"default_ip4": 1001, "default_ip6": 20_000}
        assert {k: v for k, v in counts(d).items() if k in want} == want
        assert [b["set"] for b in d.cli_json("check", "198.18.9.9")["bans"]] == ["default_ip4"]
        [ban] = d.cli_json("check", v6[-1])["bans"]
        assert 3500 < ban["expires_in"] <= 3600 and ban["origin"] == "cli" and ban["target"] == v6[-1]
        assert v6[-1] in netns.set_elements("nftblock", "default_ip6")
        assert d.stop() == 0  # saved before the answer
        netns.nft("delete", "table", "inet", "nftblock")
        d.start(timeout=60)
        assert {k: v for k, v in counts(d).items() if k in want} == want
    finally:
        d.close()


def test_bulk_ban_into_a_set_that_fills_up(netns: NetNS, tmp_path: Path) -> None:
    """More addresses than the set holds: the rest is refused at once, named, and not saved (the kernel
    reports one refusal per message; finding 37,856 of them that way took minutes for a 300k `ban -`)."""
    config = CONFIG.replace("size: 200000}}", "size: 200000}, small: {timeout: 1h, size: 5000}}")
    d = DaemonProc(netns, tmp_path / "d", config).start()
    try:
        d.cli("ban", "--set", "small", "198.18.0.1")  # one already in: a bulk ban refreshes it
        addrs = [f"198.18.{i >> 8}.{i & 255}" for i in range(1, 8001)]
        r = d.cli("ban", "--set", "small", "--timeout", "2h", "-", input="\n".join(addrs) + "\n")
        assert r.returncode == 1
        assert r.stdout == "banned 5000 targets in blocklist small (for 2h)\n", r.stdout
        assert "is full (size 5000); raise blocklists.small.size" in r.stderr
        assert "... and 2980 more" in r.stderr, r.stderr[-300:]
        assert counts(d)["small_ip4"] == 5000
        [ban] = d.cli_json("check", "198.18.0.1")["bans"]
        assert ban["expires_in"] > 3600  # the refresh went through though the set was full
        assert d.stop() == 0  # what the kernel refused was not saved: a restart brings back 5000
        netns.nft("delete", "table", "inet", "nftblock")
        d.start(timeout=60)
        assert counts(d)["small_ip4"] == 5000
    finally:
        d.close()
