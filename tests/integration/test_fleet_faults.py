"""The fleet under server faults (issue #23), short versions: the issue's sizes run in `make bench`
(bench/bench_fleet_faults.py). Correctness is asserted strictly (no acknowledged ban lost, no kernel ban
removed by a server fault); times are asserted with a margin over the issue's targets for a loaded 2-core
machine, and printed exactly (`-s`, or in the failure message).

| fault                                   | target                                            |
|-----------------------------------------|---------------------------------------------------|
| Sentinel failover, primary SIGKILLed    | other hosts stall < 3 s                           |
| the same with min-replicas-to-write 1   | every acknowledged ban delivered                  |
| server restarted empty, a host down     | no kernel ban removed                             |
| a host partitioned, another bans        | noticed < 3 s; all bans < 2 s after the heal      |
| a 30k outbox flushed after an outage    | all delivered (gate defers, never drops)          |
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import faults
from tests.helpers.fleetlab import FleetLab
from tests.helpers.redis import redis_available

pytestmark = [pytest.mark.skipif(not redis_available(), reason="needs redis-server (make deps)"), pytest.mark.slow]

MARGIN = 2.0  # time targets are asserted at this multiple: the machine is shared; the figure is printed


def report(what: str, value: float, target: float) -> None:
    print(f"\nfleet fault: {what}: {value:.2f} s (target < {target:g} s, ratio {value / target:.2f})")


async def test_min_replicas_to_write_refusals_are_retried_not_lost(tmp_path: Path) -> None:
    """The Sentinel failover row and its min-replicas-to-write row at once (the plain failover's 6 cycles, and
    their < 3 s stall, run in `make bench`; test_fleet_redis.py has a plain failover too): the primary SIGKILLed
    under 200 bans/s, the new primary refusing writes (NOREPLICAS) until a replica is attached to it.

    The whole stall is printed, not asserted: with min-replicas-to-write it is mostly the server's own refusal
    window (a replica must re-sync to the new primary; one CI run saw 11.5 s, with 0 bans lost). What the fleet
    controls is asserted: nothing lost or removed, and B receives again at once when the server takes writes."""
    fig = await faults.failover(tmp_path, cycles=1, rate=200.0, min_replicas=True)
    report("failover with min-replicas-to-write 1: stall (mostly the server refusing writes)", max(fig.stalls),
           3.0)
    report("Sentinel election (kill -> new primary named)", max(fig.elections), 3.0)
    report("replicas attached again -> B receives again", max(fig.resumed), 1.0)
    print(f"fleet fault: {fig.acknowledged} acknowledged, {fig.missing} missing on B; {fig.refusals} publishes "
          f"refused and retried; drain after the producer stopped {fig.drain:.2f} s")
    assert fig.missing == 0 and fig.acknowledged > 0, fig
    assert fig.removed == 0, fig
    assert max(fig.resumed) < 1.0 * MARGIN, fig


async def test_a_backlog_flushed_after_an_outage_is_delivered(tmp_path: Path) -> None:
    # (10,000 against a receiver capped at 200/s, burst 2,000: the bench's 30,000 against the default
    # 2,000/s, burst 20,000 in a third of the time; the old gate, by server time alone, refused about three
    # quarters of it)
    fig = await faults.backlog(tmp_path, 10_000, trust={"rate": 200.0, "burst": 2000})
    print(f"\nfleet fault: {fig.n} backlogged bans: server back -> all on B in {fig.delivered:.2f} s; refused "
          f"{fig.refused} (target 0), deferred {fig.deferred}")
    assert fig.missing == 0 and fig.refused == 0, fig


async def test_credential_and_certificate_refusals_are_one_clear_line(tmp_path: Path) -> None:
    """What the operator sees for each refusal: one warning naming what to check, no traceback."""
    got = await faults.refusals(tmp_path)
    for r in got:
        print(f"\nfleet refusal: {r.case}:\n  {r.line}")
    assert len(got) == 5
    assert all(r.refused and not r.traceback for r in got), got
    hints = {"wrong fleet.tls.ca": "not trusted by fleet.tls.ca", "client certificate from another CA": "another CA",
             "expired": "expired", "no client": "requires a client certificate", "password": "credentials"}
    for key, words in hints.items():
        assert any(key in r.case and words in r.line for r in got), (key, got)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetLab]:
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("needs root and nft")
    lab = FleetLab(tmp_path_factory.mktemp("faults"), fleet="faults").start()
    try:
        yield lab
    finally:
        lab.close()


def test_a_server_restarted_empty_removes_no_kernel_ban(lab: FleetLab) -> None:
    fig = faults.empty_restart(lab, 200)
    print(f"\nfleet fault: server restarted empty, A down: {fig.removed_on_b} of {fig.bans} of A's bans left B's "
          f"kernel over {fig.polls} polls (target 0); A back -> re-asserted in {fig.reasserted_after:.2f} s")
    assert fig.removed_on_b == 0, fig


def test_a_partitioned_host_notices_fast_and_catches_up_at_the_heal(lab: FleetLab) -> None:
    fig = faults.partition(lab, 2000, 8.0)
    report("partition noticed", fig.noticed, 3.0)
    report(f"heal -> all {fig.bans} bans on the cut-off host", fig.healed, 2.0)
    assert fig.removed_on_b == 0, fig
    assert fig.noticed < 3.0 * MARGIN and fig.healed < 2.0 * MARGIN, fig
