"""Fleet counting end to end: three real daemons and a real redis-server (tests/helpers/fleetlab.py). An attacker
that fails once on each host (fleet_maxretry 3, local maxretry 5) is banned in every host's kernel, each host
deciding it from every member's failure stream; one that failed twice fleet-wide is not. Subnet escalation
from fleet bans rides along: three attackers of one /24,
each caught by the fleet count, make every host ban the /24."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.helpers.fleetlab import FleetLab
from tests.helpers.netns import wait_for
from tests.integration.test_fleet_daemons import failures

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (make deps)")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetLab]:
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("needs root and nft")
    lab = FleetLab(tmp_path_factory.mktemp("fleetcount"), fleet="cnt", maxretry=5,
                   jail_extra="fleet_maxretry: 3",
                   blocklists="{default: {timeout: 1h, subnet_escalation: {threshold: 3, bantime: 2h}}}").start()
    try:
        yield lab
    finally:
        lab.close()


def write(lab: FleetLab, host: str, text: str) -> None:
    with lab.logs[host].open("a") as f:
        f.write(text)


def test_distributed_attacker_banned_everywhere_and_near_miss_not(lab: FleetLab) -> None:
    for h in ("a", "b", "c"):
        write(lab, h, failures("198.51.100.20", 1))
    write(lab, "a", failures("198.51.100.21", 1))
    write(lab, "b", failures("198.51.100.21", 1))  # 2 fleet-wide: a near miss
    for h in ("a", "b", "c"):
        wait_for(lambda h=h: "198.51.100.20" in lab.banned(h), 10, 0.02, f"the attacker banned on {h}")  # type: ignore[misc]
    # the near miss's failures were counted (the marker: every host's failures reached the server)
    wait_for(lambda: all(lab.fleet(h)["counting"]["accepted"] == 5 for h in ("a", "b", "c")), 10, 0.05,
             "all five failures counted on every host")
    for h in ("a", "b", "c"):
        assert "198.51.100.21" not in lab.banned(h)
    # every host decided the ban itself; one host's failure crossed the line (that host published it)
    assert all(lab.fleet(h)["counting"]["decided"] == 1 for h in ("a", "b", "c"))
    crossed = [h for h in ("a", "b", "c") if lab.fleet(h)["counting"]["crossed"] == 1]
    assert len(crossed) == 1
    decider = crossed[0]
    # the crossing host's audit line names the hosts that saw it (the others may have had its published ban
    # first, as a fleet ban, before their own tally read the crossing failure)
    line = next(x for x in lab.daemons[decider].log().splitlines() if "address=198.51.100.20 " in x and " ban " in x)
    assert "seen by" in line and all(x in line for x in ("a", "b", "c")), line
    other = next(h for h in ("a", "b", "c") if h != decider)
    chk = lab.daemons[other].cli_json("check", "198.51.100.20")
    assert sorted(chk["fleet_count"]["sshd"]["decided"]["seen_by"]) == ["a", "b", "c"]
    assert chk["fleet_count"]["sshd"]["decided"]["by"] == decider
    text = lab.daemons[other].cli("check", "198.51.100.21").stdout
    assert "2 failures of 198.51.100.21 in the window, seen by " in text, text
    assert text.rstrip().endswith(("seen by a, b", "seen by b, a")), text
    assert "counting (on)" in lab.daemons["c"].cli("fleet").stdout


def test_server_gone_local_detection_goes_on_and_counting_resumes(lab: FleetLab) -> None:
    assert lab.server is not None and lab.server_ns is not None
    lab.server.kill()
    write(lab, "a", failures("198.51.101.30", 5))  # local maxretry alone
    wait_for(lambda: "198.51.101.30" in lab.banned("a"), 10, 0.02, "a local ban without the server")
    lab.server.start()  # back without its data (the lab's server keeps none)
    # the counted ban of the first test: every host holds it as its own published ban and re-asserts it
    ns, port = lab.server_ns, str(lab.server.port)
    for h in ("a", "b", "c"):  # each in its own `active` (schema 2: per-host keys)
        wait_for(lambda h=h: ns.run("redis-cli", "-p", port, "ZSCORE", f"nftblock:{{cnt}}:h:{h}:active",  # type: ignore[misc]
                                    "198.51.100.20").stdout.strip() != "", 40, 0.1, f"{h} re-asserted the counted ban")
    for h in ("a", "b", "c"):
        wait_for(lambda h=h: lab.fleet(h)["counting"]["connected"], 40, 0.1, f"{h} counting again")  # type: ignore[misc]
    for h in ("a", "b", "c"):
        write(lab, h, failures("198.51.101.31", 1))
    for h in ("a", "b", "c"):
        wait_for(lambda h=h: "198.51.101.31" in lab.banned(h), 10, 0.02, f"counted ban on {h}")  # type: ignore[misc]


def test_subnet_escalation_from_fleet_counted_bans_on_every_host(lab: FleetLab) -> None:
    for i in (1, 2, 3):
        for h in ("a", "b", "c"):
            write(lab, h, failures(f"198.51.102.{i}", 1))
    for h in ("a", "b", "c"):
        wait_for(lambda h=h: "198.51.102.0/24" in lab.banned(h, "default_net4"), 10, 0.02,  # type: ignore[misc]
                 f"the /24 on {h}")
        assert lab.daemons[h].cli_json("status")["subnet_escalation"]["escalated"] == 1
