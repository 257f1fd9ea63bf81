"""Prometheus metrics on a registry the daemon creates (no global registry), served by a tiny asyncio HTTP
endpoint (prometheus_client's own server polls twice a second; ours sleeps until a scrape arrives).

Names carry the `nftblock_` prefix and base units. Gauges that describe the kernel (set sizes) are read back
from the kernel periodically by the daemon, not counted here, so they show what is enforced.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("nftblockd.metrics")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_SIZE_BUCKETS = (1, 10, 100, 1000, 2500, 5000, 10000, 25000, 100000, 1000000)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.set_elements = Gauge("nftblock_set_elements", "Elements in each kernel set (read from the kernel)",
                                  ["set", "blocklist", "family"], registry=r)
        self.set_tracked = Gauge("nftblock_set_tracked_elements", "Active bans nftblockd tracks per set",
                                 ["set"], registry=r)
        self.batch_seconds = Histogram("nftblock_netlink_batch_seconds", "Time to apply one flushed batch",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_elements = Histogram("nftblock_netlink_batch_elements", "Element operations per flushed batch",
                                        buckets=_SIZE_BUCKETS, registry=r)
        self.ban_latency = Histogram("nftblock_ban_latency_seconds",
                                     "From the decision (log line, request) to the kernel's acknowledgement",
                                     ["origin"], buckets=_LATENCY_BUCKETS, registry=r)
        self.lines = Counter("nftblock_lines", "Log lines read", ["source"], registry=r)
        self.lines_invalid = Counter("nftblock_lines_invalid", "Log lines skipped (overlong, undecodable)",
                                     ["source"], registry=r)
        self.lines_dropped = Counter("nftblock_lines_dropped", "Log lines dropped by a full queue",
                                     ["source"], registry=r)
        self.matched = Counter("nftblock_lines_matched", "Lines a jail's filter matched", ["jail"], registry=r)
        self.ignored = Counter("nftblock_lines_ignored", "Lines matched but ignored (ignoreregex, bad host)",
                               ["jail"], registry=r)
        self.failures = Counter("nftblock_failures", "Failures counted by the tracker", ["jail"], registry=r)
        self.bans = Counter("nftblock_bans", "Bans applied", ["jail", "origin"], registry=r)
        self.unbans = Counter("nftblock_unbans", "Unbans applied", ["origin"], registry=r)
        self.allowlist_hits = Counter("nftblock_allowlist_hits", "Bans refused because of the allowlist",
                                      registry=r)
        self.netlink_errors = Counter("nftblock_netlink_errors", "Element operations the kernel refused",
                                      ["errno"], registry=r)
        self.set_full = Counter("nftblock_set_full", "Adds refused because a set was full", ["set"], registry=r)
        self.rebuilds = Counter("nftblock_rebuilds", "Times the table was rebuilt after outside changes",
                                registry=r)
        self.drift = Counter("nftblock_drift_repaired", "Elements re-added or removed by reconcile", registry=r)
        self.state_unsaved = Gauge("nftblock_state_unsaved_changes", "State changes enforced in the kernel but "
                                   "not yet saved to the state database (retried every 5 s)", registry=r)
        self.state_degraded = Gauge("nftblock_state_degraded", "1 while saving to the state database fails",
                                    registry=r)
        self.adopted = Counter("nftblock_adopted", "Elements found in nftblockd's sets that its state did not know "
                               "(lost state database, clock jump), adopted with their kernel timeouts", registry=r)
        self.feed_fetch = Counter("nftblock_feed_fetch", "Feed fetches by result", ["feed", "result"], registry=r)
        self.feed_age = Gauge("nftblock_feed_age_seconds", "Seconds since a feed was last loaded successfully",
                              ["feed"], registry=r)
        self.feed_entries = Gauge("nftblock_feed_entries", "Entries in a feed's last good copy", ["feed"],
                                  registry=r)
        self.tracker_addresses = Gauge("nftblock_tracker_addresses", "Addresses with failures being tracked",
                                       ["jail"], registry=r)
        self.tracker_evictions = Counter("nftblock_tracker_evictions", "Tracked addresses evicted by the cap",
                                         registry=r)
        self.up = Gauge("nftblock_up", "1 while the daemon runs", registry=r)
        self.start_time = Gauge("nftblock_start_time_seconds", "Unix time the daemon started", registry=r)
        self.up.set(1)
        self.start_time.set(time.time())

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """GET /metrics over HTTP/1.0-style single responses; anything else gets 404. Loopback by default."""

    def __init__(self, metrics: Metrics, listen: str) -> None:
        self.metrics = metrics
        host, _, port = listen.rpartition(":")
        self.host = host.strip("[]") or "127.0.0.1"
        self.port = int(port)
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, limit=16384)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 10)
            while True:  # headers: read and ignore, bounded by the stream limit
                line = await asyncio.wait_for(reader.readline(), 10)
                if line in (b"\r\n", b"\n", b""):
                    break
            parts = request.decode("latin-1").split()
            if len(parts) >= 2 and parts[0] in ("GET", "HEAD") and parts[1].split("?")[0] in ("/metrics", "/"):
                body = self.metrics.render()
                head = (f"HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE_LATEST}\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
                writer.write(head + (body if parts[0] == "GET" else b""))
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()
