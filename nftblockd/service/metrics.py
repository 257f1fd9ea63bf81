"""Prometheus metrics on a registry the daemon creates (no global registry), served by a tiny asyncio HTTP
endpoint (prometheus_client's own server polls twice a second; ours sleeps until a scrape arrives).

Names carry the `nftblock_` prefix and base units. A scrape shows the state at the moment of the scrape:

- Counters and histograms are counted where the event happens (a batch flushed, a ban acknowledged).
- Figures another component owns (tracked addresses per jail, skipped log lines, a feed's last success) are
  `Live` metrics: read from their owner while the scrape is being rendered, never copied on a timer.
- Kernel set sizes need a netlink round trip on the kernel thread: the daemon registers an async hook in
  `before_scrape`, which every scrape awaits (bounded by SCRAPE_REFRESH_LIMIT; past it the scrape shows the
  values of the previous refresh rather than fail).

Nothing here touches the kernel or a file, and nothing reads another component's state except through the
callables it was given. No `lines_dropped` metric: a source never drops a line, a full queue stops it
reading (its file offset or journal cursor makes waiting safe), see sources/base.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString as _untyped_go_float

log = logging.getLogger("nftblockd.metrics")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_SIZE_BUCKETS = (1, 10, 100, 1000, 2500, 5000, 10000, 25000, 100000, 1000000)
SCRAPE_REFRESH_LIMIT = 2.0  # seconds a scrape waits for the kernel's set sizes (Prometheus' default timeout: 10)

Sample = tuple[tuple[str, ...], float]  # label values, value
_go_float: Callable[[float], str] = _untyped_go_float  # how prometheus_client spells a bucket bound


def _nothing() -> Iterable[Sample]:
    return ()


class Live:
    """A gauge or counter whose samples are read from their owner at scrape time: `read` returns
    (label values, value) pairs. The owner keeps the figure (a plain int); nobody has to remember to copy it.
    A failing `read` costs its own samples, not the scrape."""

    def __init__(self, kind: Literal["gauge", "counter"], name: str, documentation: str,
                 labelnames: Sequence[str] = (), *, registry: CollectorRegistry) -> None:
        self.kind = kind
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.read: Callable[[], Iterable[Sample]] = _nothing
        self._failing = False
        registry.register(self)

    def _family(self) -> GaugeMetricFamily | CounterMetricFamily:
        if self.kind == "gauge":
            return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> list[Metric]:
        fam = self._family()
        try:
            for labels, value in self.read():
                fam.add_metric(list(labels), value)
        except Exception:
            if not self._failing:  # once per failure streak: a scrape every 15 s must not flood the log
                log.exception("metrics: reading %s failed; it is left out of scrapes until it works", self.name)
            self._failing = True
            return [self._family()]
        self._failing = False
        return [fam]


class PerBanHistogram:
    """A histogram that takes `count` equal observations in one call.

    All bans of one request are acknowledged by the same kernel transaction, so they share one latency;
    observing them one by one would cost a call per ban during a burst of thousands. Same buckets, `le`
    rule (value <= bound) and exposition as prometheus_client's Histogram (tested against it).
    Not thread-safe: the event loop is its only writer.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float], *,
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.bounds = (*(float(b) for b in buckets), math.inf)
        self._data: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}
        registry.register(self)

    def observe(self, labels: tuple[str, ...], value: float, count: int = 1) -> None:
        if count <= 0:
            return
        d = self._data.get(labels)
        if d is None:
            d = self._data[labels] = ([0] * len(self.bounds), [0.0])
        d[0][bisect_left(self.bounds, value)] += count
        d[1][0] += value * count

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> list[Metric]:
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, (counts, total) in self._data.items():
            cumulative = itertools.accumulate(counts)
            fam.add_metric(list(labels), [(_go_float(b), c) for b, c in zip(self.bounds, cumulative,
                                                                                 strict=True)], total[0])
        return [fam]


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        # async refreshers every scrape awaits first (the daemon's kernel set sizes)
        self.before_scrape: list[Callable[[], Awaitable[None]]] = []
        self._refresh_failing = False
        self.set_elements = Gauge(
            "nftblock_set_elements", "Elements in each kernel set, read from the kernel at scrape time "
            "(NFTA_SET_COUNT; on kernels that do not report it, the elements the kernel acknowledged)",
            ["set", "blocklist", "family"], registry=r)
        self.set_tracked = Gauge("nftblock_set_tracked_elements", "Active bans nftblockd tracks per set",
                                 ["set"], registry=r)
        self.batch_seconds = Histogram("nftblock_netlink_batch_seconds", "Time to apply one flushed batch",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_elements = Histogram("nftblock_netlink_batch_elements", "Element operations per flushed batch",
                                        buckets=_SIZE_BUCKETS, registry=r)
        self.ban_latency = PerBanHistogram(
            "nftblock_ban_latency_seconds", "Per ban: from its cause (the log line read, the request received) "
            "to the kernel's acknowledgement of the transaction that carried it",
            ["origin"], _LATENCY_BUCKETS, registry=r)
        self.lines = Counter("nftblock_lines", "Log lines read", ["source"], registry=r)
        self.lines_invalid = Live(
            "counter", "nftblock_lines_invalid", "Log lines that were not read as written: reason overlong "
            "(longer than the line limit, skipped), invalid_utf8 (undecodable bytes replaced, then matched), nul (NUL "
            "bytes removed, then matched) or "
            "bad_time (a journal entry's source time not a number: journald's receive time used)",
            ["source", "reason"], registry=r)
        self.matched = Counter("nftblock_lines_matched", "Lines a jail's filter matched", ["jail"], registry=r)
        self.ignored = Counter("nftblock_lines_ignored", "Lines matched but ignored (ignoreregex, bad host)",
                               ["jail"], registry=r)
        self.failures = Counter("nftblock_failures", "Failures counted by the tracker", ["jail"], registry=r)
        self.bans = Counter("nftblock_bans", "Bans applied", ["jail", "origin"], registry=r)
        self.unbans = Counter("nftblock_unbans", "Unbans applied", ["origin"], registry=r)
        self.allowlist_hits = Counter("nftblock_allowlist_hits", "Bans refused because of the allowlist",
                                      registry=r)
        self.bans_refused = Counter(
            "nftblock_bans_refused", "Bans not applied, by reason: never_ban (unspecified, multicast, link-local, "
            "reserved... space), allowlisted, kernel (the kernel refused the element: a full set, an errno), "
            "overlap (inside a range that ends sooner), unknown_set (the blocklist went away), host_bits (a control-"
            "socket target with host bits set: refused, never widened)", ["reason"],
            registry=r)
        self.failures_refused = Live(
            "counter", "nftblock_failures_refused", "Failures a jail saw from an address it never counts: reason "
            "allowlisted (the allowlist or the jail's ignoreip) or never_ban (never-ban space)", ["jail", "reason"],
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
        self.degraded = Live(
            "gauge", "nftblock_degraded", "1 while the daemon is degraded for this reason: source (a log source "
            "that can never deliver, e.g. a journal jail without journald), state (bans not saved: the state "
            "database in memory, or saving fails), batches (the last kernel batch failed); every reason is there "
            "at 0 from the start", ["reason"], registry=r)
        self.control_closed = Live(
            "counter", "nftblock_control_closed", "Control connections the daemon closed, by reason: idle (sent "
            "nothing for the idle timeout), evicted (the longest idle, to make room for a newcomer), over_budget "
            "(its unfinished request took those of all connections over the bound; docs/limits.md)", ["reason"],
            registry=r)
        self.state_problems = Counter(
            "nftblock_state_problems", "Problems the state database had and nftblockd worked around, by kind "
            "(corrupt: salvaged and replaced; unwritable, locked...: kept in memory)", ["kind"], registry=r)
        self.state_salvaged_rows = Counter(
            "nftblock_state_salvaged_rows", "Rows read from a corrupt state database: result kept (written to "
            "the new one) or dropped (unreadable as a row of the schema)", ["result"], registry=r)
        self.state_truncated_bytes = Counter(
            "nftblock_state_truncated_bytes", "Bytes a corrupt state database was shorter than its own header "
            "said (a truncated file): what they held is lost from the file, and adopted from the kernel", registry=r)
        self.adopted = Counter("nftblock_adopted", "Elements found in nftblockd's sets that its state did not know "
                               "(lost state database, clock jump), adopted with their kernel timeouts", registry=r)
        self.feed_fetch = Counter("nftblock_feed_fetch", "Feed fetches by result", ["feed", "result"], registry=r)
        self.feed_task_failures = Counter(
            "nftblock_feed_task_failures", "Times a feed's task raised an unexpected error (a bug, not a failed "
            "fetch) and was started again after a backoff", ["feed"], registry=r)
        self.feed_last_success = Live(
            "gauge", "nftblock_feed_last_success_timestamp_seconds",
            "Unix time the copy of a feed in force was fetched (or confirmed unchanged)", ["feed"], registry=r)
        self.feed_entries = Live("gauge", "nftblock_feed_entries", "Entries in a feed's copy in force", ["feed"],
                                 registry=r)
        self.feed_entries_refused = Live(
            "gauge", "nftblock_feed_entries_refused", "Entries of a feed's copy in force that were refused, by "
            "reason: invalid (not an address or CIDR), markup (a stray markup line), host_bits (a CIDR with host "
            "bits set: never widened to its network)", ["feed", "reason"], registry=r)
        self.tracker_addresses = Live("gauge", "nftblock_tracker_addresses",
                                      "Addresses (IPv6: prefixes) with failures being counted, per jail", ["jail"],
                                      registry=r)
        self.tracker_evictions = Live(
            "counter", "nftblock_tracker_evictions", "Counting records dropped because the tracker's cap was "
            "reached: failures one (a record with one failure) or several (a record nearer a ban: the cap is "
            "under attack)", ["failures"], registry=r)
        # fleet mode (docs/fleet.md): read from the fleet service at scrape time; no samples without a fleet
        self.fleet_events = Live("counter", "nftblock_fleet_events",
                                 "Fleet events received, by op and result (applied, own, or the reason it was "
                                 "refused)", ["op", "result"], registry=r)
        self.fleet_lag = Histogram("nftblock_fleet_propagation_seconds", "Per received batch of fleet bans: from "
                                   "the origin's publish to this host's kernel commit (needs synchronised clocks)",
                                   buckets=_LATENCY_BUCKETS, registry=r)
        self.fleet_publish_failures = Live("counter", "nftblock_fleet_publish_failures",
                                           "Attempts to publish to the fleet server that failed (retried)",
                                           registry=r)
        self.fleet_outbox = Live("gauge", "nftblock_fleet_outbox",
                                 "Own bans and unbans waiting in the outbox to be published", registry=r)
        self.fleet_snapshots = Live("counter", "nftblock_fleet_snapshots",
                                    "Catch-ups by snapshot (server restarted or failed over, cursor trimmed)",
                                    registry=r)
        self.fleet_connected = Live("gauge", "nftblock_fleet_connected", "1 while connected to the fleet server",
                                    registry=r)
        self.fleet_count_failures = Live(
            "counter", "nftblock_fleet_count_failures", "Fleet counting: failures this host sent (deferred: after "
            "waiting for its rate cap; lost: older than fleet_findtime when the server came back; dropped: too many "
            "waited) and what became of all members' failures counted here (accepted, limited by their host's rate "
            "cap, skipped as already banned, malformed)",
            ["result"], registry=r)
        self.fleet_count_decisions = Live("counter", "nftblock_fleet_count_decisions",
                                          "Fleet-counted bans this host's count calls decided", registry=r)
        self.subnet_escalations = Live("counter", "nftblock_subnet_escalations",
                                       "Prefix bans decided by subnet escalation", registry=r)
        self.subnet_refused = Live("counter", "nftblock_subnet_refused", "Subnet escalations refused, by reason "
                                   "(allowlisted, never_ban)", ["reason"], registry=r)
        self.fleet_service_failures = Counter(
            "nftblock_fleet_service_failures", "Times the fleet service stopped on an unexpected error (a bug, a "
            "state database that fails; not the server going away, which it handles itself) and was started "
            "again after a backoff", registry=r)
        # actions (docs/actions.md): read from each action's runner at scrape time
        self.action_runs = Live("counter", "nftblock_action_runs", "Action runs by result: ok, or failed after "
                                "every retry (each failure also writes an audit line)", ["action", "result"],
                                registry=r)
        self.action_retries = Live("counter", "nftblock_action_retries", "Action runs tried again after a failure",
                                   ["action"], registry=r)
        self.action_skipped = Live("counter", "nftblock_action_skipped", "Events an action did not run for, by "
                                   "reason: rate (over its rate limit), queue_full, stopping (queued at shutdown); "
                                   "the next run carries the count", ["action", "reason"], registry=r)
        self.action_queue = Live("gauge", "nftblock_action_queue", "Events queued or running per action",
                                 ["action"], registry=r)
        self.up = Gauge("nftblock_up", "1 while the daemon runs", registry=r)
        self.start_time = Gauge("nftblock_start_time_seconds", "Unix time the daemon started", registry=r)
        self.up.set(1)
        self.start_time.set(time.time())

    def state_problem(self, kind: str, kept_rows: int = 0, dropped_rows: int = 0,
                      truncated_bytes: int = 0) -> None:
        """One state.db.StoreProblem (passed as numbers: this module imports nothing from state/)."""
        self.state_problems.labels(kind).inc()
        self.state_salvaged_rows.labels("kept").inc(kept_rows)
        self.state_salvaged_rows.labels("dropped").inc(dropped_rows)
        self.state_truncated_bytes.inc(truncated_bytes)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def scrape(self, limit: float = SCRAPE_REFRESH_LIMIT) -> bytes:
        """Run the refreshers (bounded by `limit` seconds), then render."""
        if self.before_scrape:
            try:
                async with asyncio.timeout(limit):
                    for refresh in self.before_scrape:
                        await refresh()
            except Exception as exc:  # TimeoutError included: the previous values are shown
                if not self._refresh_failing:
                    log.warning("metrics: refreshing before a scrape failed (%s); showing earlier values",
                                exc or type(exc).__name__)
                self._refresh_failing = True
            else:
                self._refresh_failing = False
        return self.render()


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
                body = await self.metrics.scrape()
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
