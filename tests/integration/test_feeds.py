"""Feeds end to end: an HTTP server and a local file inside the daemon's namespace → the kernel's sets.

The HTTP server listens on the namespace's own loopback (its socket is created inside the namespace), so the
daemon fetches from 127.0.0.1 exactly as it would in production, and nothing leaves the namespace.
"""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, http_server, wait_for

DROP_V1 = """; an example feed, Spamhaus DROP style
45.10.0.0/24 ; SBL1
45.10.1.0/24 ; adjacent: merges into 45.10.0.0/23
45.11.0.0/16
45.11.5.0/24 ; inside the /16
91.200.0.0/24 ; its upper half is allowlisted
1.0.0.0/7 ; too broad
10.0.0.0/8 ; private: a feed must not lock out the LAN
0.0.0.0/0
77.77.77.77
2a00:1450::/32
2a00:dead::1
not-an-address
"""
# a feed-owned blocklist keeps its single addresses in its interval sets: its hash sets stay empty, without a rule
EXPECTED_V1 = {
    "feeds_net4": {"45.10.0.0/23", "45.11.0.0/16", "91.200.0.0/25", "46.1.0.0/16", "77.77.77.77"},
    "feeds_ip4": set(),
    "feeds_net6": {"2a00:1450::/32", "2a00:dead::1"},
    "feeds_ip6": set(),
}


class Feeds:
    """path -> (status, body, content type); changed by the test between fetches."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, bytes, str]] = {}

    def set(self, path: str, body: str, status: int = 200, ctype: str = "text/plain") -> None:
        self.routes[path] = (status, body.encode(), ctype)


@pytest.fixture
def server(netns: NetNS) -> Iterator[tuple[Feeds, int]]:
    feeds = Feeds()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body, ctype = feeds.routes.get(self.path, (404, b"", "text/plain"))
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with http_server(netns, Handler) as port:
        yield feeds, port


def config(port: int, local: Path) -> str:
    return f"""
allowlist: [91.200.0.128/25]
allowlist_self: false
reconcile: {{interval: 1h}}
blocklists:
  default: {{timeout: 1h}}
  feeds: {{timeout: permanent, size: 100000}}
feeds:
  drop: {{url: "http://127.0.0.1:{port}/drop.txt", refresh: 1h, blocklist: feeds, max_shrink: 0.9}}
  local: {{path: "{local}", blocklist: feeds}}
"""


def ruled_sets(ns: NetNS) -> set[str]:
    """The sets our prerouting chain's rules look up."""
    text = ns.nft("list", "chain", "inet", "nftblock", "prerouting").stdout
    return {w[1:] for w in text.split() if w.startswith("@") and not w.startswith("@allow")}


def kernel(ns: NetNS) -> dict[str, set[str]]:
    return {s: set(ns.set_elements("nftblock", s)) for s in EXPECTED_V1}


def test_feeds_load_refresh_break_and_restart(netns: NetNS, tmp_path: Path,
                                              server: tuple[Feeds, int]) -> None:
    feeds, port = server
    feeds.set("/drop.txt", DROP_V1)
    local = tmp_path / "local.txt"
    local.write_text("# our own list\n46.1.0.0/16\n")
    d = DaemonProc(netns, tmp_path / "d", config(port, local)).start()
    try:
        wait_for(lambda: kernel(netns) == EXPECTED_V1, timeout=20, what="initial feed load")
        status = {f["name"]: f for f in d.cli_json("feeds")["feeds"]}
        assert status["drop"]["entries"] > 0 and status["drop"]["error"] is None
        assert status["drop"]["last_success"] is not None and status["drop"]["next_refresh"] is not None

        # refresh with churn: the kernel holds exactly the new aggregate
        feeds.set("/drop.txt", DROP_V1.replace("45.11.0.0/16\n", "45.12.0.0/16\n"))
        r = d.cli("feeds", "refresh", "drop")
        assert r.returncode == 0, r.stderr
        expected_v2 = {**EXPECTED_V1, "feeds_net4": (EXPECTED_V1["feeds_net4"] - {"45.11.0.0/16"})
                       | {"45.11.5.0/24", "45.12.0.0/16"}}
        assert kernel(netns) == expected_v2

        # a broken refresh (server error, then an HTML page) keeps the last good set
        feeds.set("/drop.txt", "oops", status=500)
        d.cli("feeds", "refresh", "drop")
        feeds.set("/drop.txt", "<!DOCTYPE html><html><body>Service Unavailable</body></html>", ctype="text/html")
        d.cli("feeds", "refresh", "drop")
        assert kernel(netns) == expected_v2
        assert {f["name"]: f for f in d.cli_json("feeds")["feeds"]}["drop"]["error"]

        # the local file is followed with inotify
        local.write_text("46.2.0.0/16\n")
        expected_v3 = {**expected_v2, "feeds_net4": (expected_v2["feeds_net4"] - {"46.1.0.0/16"}) | {"46.2.0.0/16"}}
        wait_for(lambda: kernel(netns) == expected_v3, timeout=20, what="local file change")

        # feed-owned blocklists refuse manual bans (their sets hold exactly the feeds' entries)
        r = d.cli("ban", "--set", "feeds", "88.88.88.88")
        assert r.returncode == 1 and "feeds" in r.stderr

        # an upgrade from the layout that kept the feed's single addresses in its hash sets: the start empties
        # them (after the interval sets hold the same addresses) and their rule goes with the last element
        assert d.stop() == 0
        assert ruled_sets(netns) == {"feeds_net4", "feeds_net6"}
        netns.nft("add", "element", "inet", "nftblock", "feeds_ip4", "{ 77.77.77.77, 45.10.9.9 }")
        d.start()
        assert kernel(netns) == expected_v3 and ruled_sets(netns) == {"feeds_net4", "feeds_net6"}

        # restart after a "reboot" without network: the cached copies protect the host before READY
        assert d.stop() == 0
        netns.nft("delete", "table", "inet", "nftblock")
        feeds.routes.clear()
        d.start()
        assert kernel(netns) == expected_v3
    finally:
        d.close()
