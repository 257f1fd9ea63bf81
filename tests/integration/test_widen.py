"""Issue 33, end to end: a target with host bits set is never widened, on the feed path and on a raw
control-socket request, with the real daemon in a private namespace and the kernel read back with `nft -j`.

Before the fix the feed's `45.67.89.10/9` was in the kernel as 45.0.0.0/9 (8.4 million addresses) and
`2001:db8:f3::1/17` as 2001::/17; a raw `ban` of `198.51.100.77/24` banned 198.51.100.0/24.
"""

from __future__ import annotations

import re
from pathlib import Path

from nftblockd.control.client import ControlClient
from tests.helpers.daemon import DaemonProc, scrape
from tests.helpers.netns import NetNS, wait_for

PORT = 9469  # inside the test's own namespace: nothing else listens there

FEED = """# one typo per family, among good entries
45.67.89.10/9
2001:db8:f3::1/17
45.10.0.0/24
77.77.77.77
2a00:1450::/32
"""


def elements(ns: NetNS, blocklist: str) -> set[str]:
    return {e for kind in ("ip4", "ip6", "net4", "net6")
            for e in ns.set_elements("nftblock", f"{blocklist}_{kind}")}


def sample(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}{{{re.escape(want)}}} (\S+)$", text, re.M)
    assert m, f"{name}{{{want}}} not in the scrape"
    return float(m.group(1))


def test_host_bits_are_refused_on_the_feed_and_control_paths(netns: NetNS, tmp_path: Path) -> None:
    feed = tmp_path / "feed.txt"
    feed.write_text(FEED)
    d = DaemonProc(netns, tmp_path / "d", f"""
allowlist_self: false
reconcile: {{interval: 1h}}
metrics: {{listen: '127.0.0.1:{PORT}'}}
blocklists:
  default: {{timeout: 1h}}
  feeds: {{timeout: permanent}}
feeds:
  local: {{path: "{feed}", blocklist: feeds}}
""").start()
    try:
        good = {"45.10.0.0/24", "77.77.77.77", "2a00:1450::/32"}
        wait_for(lambda: "77.77.77.77" in elements(netns, "feeds"), timeout=20, what="the feed loaded")
        assert elements(netns, "feeds") == good  # not 45.0.0.0/9 nor 2001::/17
        (st,) = d.cli_json("feeds")["feeds"]
        assert st["counters"]["host_bits"] == 2 and st["entries"] == 3

        with ControlClient(d.socket) as c:  # raw requests: the CLI refuses these before sending
            r = c.call("ban", {"targets": ["198.51.100.77/24", "2001:db8:f3::1/17", "203.0.113.9"]})
        assert r["applied"] == ["203.0.113.9"]
        assert {x["target"] for x in r["refused"]} == {"198.51.100.77/24", "2001:db8:f3::1/17"}
        assert all(x["code"] == "invalid_address" and "host bits set" in x["message"] for x in r["refused"])
        assert elements(netns, "default") == {"203.0.113.9"}

        text = scrape(netns, PORT)
        assert sample(text, "nftblock_feed_entries_refused", feed="local", reason="host_bits") == 2
        assert sample(text, "nftblock_bans_refused_total", reason="host_bits") == 2
    finally:
        d.close()
