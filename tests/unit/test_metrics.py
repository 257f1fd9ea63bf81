"""Metrics: the per-ban histogram against prometheus_client's own, figures read at scrape time, a scrape that
survives a slow or failing refresher, and an exposition `promtool check metrics` accepts."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nftblockd.service.metrics import Metrics, PerBanHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0)


def samples(text: bytes | str, name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode() if isinstance(text, bytes) else text):
        if fam.name == name:
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def promtool() -> str | None:
    """Debian's promtool, as `make deps` extracts it next to the venv's python (or anywhere on PATH)."""
    here = Path(sys.executable).parent / "promtool"
    return str(here) if here.exists() else shutil.which("promtool")


@given(st.lists(st.tuples(st.sampled_from(["cli", "jail"]),
                          st.sampled_from([0.0, 0.001, 0.0015, 0.01, 0.5, 1.0, 3.0]),
                          st.integers(1, 5)), max_size=20))
def test_per_ban_histogram_equals_observing_each_ban_alone(obs: list[tuple[str, float, int]]) -> None:
    ours_reg, plain_reg = CollectorRegistry(), CollectorRegistry()
    ours = PerBanHistogram("lat_seconds", "h", ["origin"], BUCKETS, registry=ours_reg)
    plain = Histogram("lat_seconds", "h", ["origin"], buckets=BUCKETS, registry=plain_reg)
    for origin, value, n in obs:
        ours.observe((origin,), value, n)
        for _ in range(n):
            plain.labels(origin).observe(value)
    got = {k: v for k, v in samples(generate_latest(ours_reg), "lat_seconds").items()}
    want = {k: v for k, v in samples(generate_latest(plain_reg), "lat_seconds").items()
            if not k[0].endswith("_created")}
    assert got.keys() == want.keys()
    assert all(got[k] == pytest.approx(want[k]) for k in want)


def test_live_metrics_are_read_at_scrape_time_and_a_failing_reader_costs_only_its_samples() -> None:
    m = Metrics()
    tracked = {"sshd": 10, "web": 3}
    m.tracker_addresses.read = lambda: [((j,), n) for j, n in tracked.items()]
    s = samples(m.render(), "nftblock_tracker_addresses")
    assert s[("nftblock_tracker_addresses", (("jail", "sshd"),))] == 10  # per jail, not the sum
    assert s[("nftblock_tracker_addresses", (("jail", "web"),))] == 3
    tracked["web"] = 4
    assert samples(m.render(), "nftblock_tracker_addresses")[("nftblock_tracker_addresses", (("jail", "web"),))] == 4

    def broken() -> list[tuple[tuple[str, ...], float]]:
        raise RuntimeError("owner gone")

    m.feed_entries.read = broken
    text = m.render().decode()
    assert "nftblock_tracker_addresses{" in text and "# TYPE nftblock_feed_entries gauge" in text


async def test_a_scrape_awaits_its_refreshers_and_a_slow_one_shows_earlier_values() -> None:
    m = Metrics()
    calls = []

    async def refresh() -> None:
        calls.append(1)
        m.set_elements.labels("default_ip4", "default", "ipv4").set(len(calls))

    m.before_scrape.append(refresh)
    assert samples(await m.scrape(), "nftblock_set_elements")[
        ("nftblock_set_elements", (("blocklist", "default"), ("family", "ipv4"), ("set", "default_ip4")))] == 1
    stuck = asyncio.Event()

    async def never() -> None:
        await stuck.wait()

    m.before_scrape.append(never)
    body = await m.scrape(limit=0.05)  # a bound, not a wait for a result: the refresher never finishes
    assert samples(body, "nftblock_set_elements")[
        ("nftblock_set_elements", (("blocklist", "default"), ("family", "ipv4"), ("set", "default_ip4")))] == 2


def filled() -> Metrics:
    """A registry where every metric has at least one sample."""
    m = Metrics()
    m.set_elements.labels("default_ip4", "default", "ipv4").set(3)
    m.set_tracked.labels("default_ip4").set(3)
    m.batch_seconds.observe(0.002)
    m.batch_elements.observe(3)
    m.ban_latency.observe(("cli",), 0.004, 3)
    m.lines.labels("sshd").inc(10)
    m.lines_invalid.read = lambda: [(("sshd", "overlong"), 1), (("sshd", "invalid_utf8"), 2)]
    m.matched.labels("sshd").inc(4)
    m.ignored.labels("sshd").inc(1)
    m.failures.labels("sshd").inc(3)
    m.bans.labels("sshd", "jail").inc()
    m.unbans.labels("cli").inc()
    m.allowlist_hits.inc()
    m.netlink_errors.labels("ENFILE").inc()
    m.set_full.labels("default_ip4").inc()
    m.rebuilds.inc()
    m.drift.inc(2)
    m.feed_fetch.labels("drop", "ok").inc()
    m.feed_last_success.read = lambda: [(("drop",), 1_700_000_000.5)]
    m.feed_entries.read = lambda: [(("drop",), 1200)]
    m.tracker_addresses.read = lambda: [(("sshd",), 2)]
    m.tracker_evictions.read = lambda: [(("one",), 0), (("several",), 0)]
    m.bans_refused.labels("never_ban").inc()
    m.failures_refused.read = lambda: [(("sshd", "never_ban"), 1)]
    m.state_problem("corrupt", 10, 1, 4096)
    return m


def test_every_metric_is_named_by_the_conventions() -> None:
    text = filled().render().decode()
    types = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")}
    for name, kind in types.items():
        assert name.startswith("nftblock_"), name
        if kind == "counter":
            assert name.endswith("_total"), name
    assert types["nftblock_feed_last_success_timestamp_seconds"] == "gauge"
    assert "nftblock_lines_dropped" not in text  # sources never drop: a full queue stops reading


@pytest.mark.skipif(promtool() is None, reason="promtool not installed (make deps extracts it)")
def test_promtool_accepts_the_exposition() -> None:
    tool = promtool()
    assert tool is not None
    r = subprocess.run([tool, "check", "metrics"], input=filled().render(), capture_output=True, check=False)
    assert r.returncode == 0 and not r.stdout and not r.stderr, r.stdout + r.stderr


def test_fleet_metrics_show_what_the_fleet_service_counts_at_scrape_time() -> None:
    mx = Metrics()
    assert b"nftblock_fleet_events_total{" not in mx.render()  # no fleet: no samples
    received = {("ban", "applied"): 3, ("ban", "allowlisted"): 1}
    mx.fleet_events.read = lambda: [((op, result), n) for (op, result), n in received.items()]
    mx.fleet_connected.read = lambda: [((), 1)]
    mx.fleet_outbox.read = lambda: [((), 7)]
    mx.fleet_lag.observe(0.004)
    received[("unban", "applied")] = 1  # read when scraped, not copied before
    text = mx.render().decode()
    assert 'nftblock_fleet_events_total{op="ban",result="applied"} 3.0' in text
    assert 'nftblock_fleet_events_total{op="unban",result="applied"} 1.0' in text
    assert "nftblock_fleet_connected 1.0" in text and "nftblock_fleet_outbox 7.0" in text
    assert 'nftblock_fleet_propagation_seconds_bucket{le="0.005"} 1.0' in text
