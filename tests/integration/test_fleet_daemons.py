"""Fleet mode end to end: three real daemons (A, B, C), each in its own network namespace, share bans through one
real redis-server running in a fourth ("server") namespace, which each host reaches over its own veth pair.
What is checked is what the kernels hold (`nft -j`, or the set's element count for 10,000 elements).

One lab serves the whole module (starting three daemons costs seconds); the tests run in file order and use
addresses of their own, so each one's checks stay independent of the others' bans.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator

import pytest

from tests.helpers.fleetlab import FleetLab, host_addr
from tests.helpers.netns import wait_for

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (make deps)")

FLEET = "lab"


_pids = iter(range(1000, 10**6))


def failures(addr: str, n: int) -> str:
    stamp = time.strftime("%b %e %H:%M:%S")
    return "".join(f"{stamp} host sshd[{next(_pids)}]: Failed password for invalid user admin from {addr} "
                   f"port {40000 + i} ssh2\n" for i in range(n))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetLab]:
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("needs root and nft")
    lab = FleetLab(tmp_path_factory.mktemp("fleet"), fleet=FLEET).start()
    try:
        yield lab
    finally:
        lab.close()


def test_fan_out_of_cli_and_jail_bans_and_a_fleet_wide_unban(lab: FleetLab) -> None:
    a = lab.daemons["a"]
    r = a.cli("ban", "203.0.113.10", "--comment", "manual")
    assert r.returncode == 0, r.stderr
    with lab.logs["a"].open("a") as f:
        f.write(failures("203.0.113.11", 2))
    for h in ("b", "c"):
        wait_for(lambda h=h: {"203.0.113.10", "203.0.113.11"} <= lab.banned(h), 10, 0.02,  # type: ignore[misc]
                 f"A's bans on {h}")
    check = lab.daemons["b"].cli_json("check", "203.0.113.11")
    assert check["bans"][0]["origin_host"] == "a" and check["bans"][0]["origin"] == "remote"
    text = lab.daemons["c"].cli("check", "203.0.113.10").stdout
    assert "from fleet host a" in text
    # A's own bans are A's: not re-applied from the fleet, and B does not publish what it received
    assert a.cli_json("check", "203.0.113.10")["bans"][0]["origin"] == "cli"
    assert lab.fleet("b")["published"] == 0
    r = a.cli("unban", "203.0.113.10")
    assert r.returncode == 0, r.stderr
    for h in ("a", "b", "c"):
        wait_for(lambda h=h: "203.0.113.10" not in lab.banned(h), 10, 0.02, f"unban on {h}")  # type: ignore[misc]
    assert "203.0.113.11" in lab.banned("b")


def test_hostile_events_are_refused_counted_and_never_enforced(lab: FleetLab) -> None:
    now = time.time()
    good = {"v": "2", "op": "ban", "net": "203.0.113.20", "until": repr(now + 600), "origin": "evil",
            "oseq": "1", "src": "cli", "ts": "0"}
    before = lab.fleet("b")["rejected"]
    hostile = [
        good | {"net": "192.0.2.7"},  # allowlisted everywhere
        good | {"net": host_addr(2)},  # B's own address
        good | {"net": "0.0.0.0/0"},
        good | {"until": "1e300"},
        good | {"net": "203.0.113.0/8"},  # host bits
        good | {"v": "9"},
        {"garbage": "zz", "op": "ban"},
    ]
    for fields in hostile:
        lab.xadd(fields)
    lab.xadd(good)  # the marker: read after all the others
    wait_for(lambda: "203.0.113.20" in lab.banned("b"), 10, 0.02, "the marker on B")
    after = lab.fleet("b")["rejected"]
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert grew == {"allowlisted": 2, "too_wide": 1, "bad_until": 1, "host_bits": 1, "version": 2}
    kernel = lab.banned("b") | lab.banned("b", "default_net4")
    assert not {"192.0.2.7", host_addr(2), "0.0.0.0/0", "203.0.0.0/8"} & kernel
    # C refused 192.0.2.7 too (not its own addr), once it read evil's stream (a raw XADD rings no bell: C finds
    # it at its next sweep of every stream, within a second)
    wait_for(lambda: lab.fleet("c")["rejected"].get("allowlisted", 0) >= 1, 5, 0.02, "C refused it too")


def test_a_host_that_was_down_replays_10k_bans(lab: FleetLab) -> None:
    c = lab.daemons["c"]
    assert c.stop() == 0
    base = lab.count("b")
    addrs = [f"100.{64 + i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(10_000)]
    r = lab.daemons["a"].cli("ban", "-", input="\n".join(addrs) + "\n")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: lab.count("b") >= base + 10_000, 20, 0.1, "10k on B")
    c.start()
    wait_for(lambda: lab.count("c") >= base + 10_000, 20, 0.1, "10k on C after its restart")
    held = lab.banned("c")
    assert set(addrs) <= held
    assert lab.fleet("c")["replays"] >= 1


def test_server_down_bans_wait_in_the_outbox(lab: FleetLab) -> None:
    assert lab.server is not None
    lab.server.kill()
    wait_for(lambda: not lab.fleet("a")["connected"], 30, 0.05, "A notices the server is gone")
    r = lab.daemons["a"].cli("ban", "203.0.113.30")
    assert r.returncode == 0, r.stderr
    assert "203.0.113.30" in lab.banned("a")  # local protection goes on
    wait_for(lambda: lab.fleet("a")["outbox"] >= 1, 10, 0.05, "the ban waits in A's outbox")
    lab.server.start()  # the same port; empty: every host takes a snapshot, A re-asserts its own bans
    wait_for(lambda: "203.0.113.30" in lab.banned("b"), 40, 0.05, "the outbox ban on B after the restart")
    wait_for(lambda: lab.fleet("a")["outbox"] == 0, 10, 0.05, "A's outbox empty")  # counted after the publish
    assert lab.server is not None


def test_a_daemon_restart_keeps_fleet_bans(lab: FleetLab) -> None:
    # its own fleet ban, so the test runs alone too (`-k`), not only after the fan-out test
    r = lab.daemons["a"].cli("ban", "203.0.113.40")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: "203.0.113.40" in lab.banned("b"), 20, 0.02, "A's ban on B")
    b = lab.daemons["b"]
    assert b.stop() == 0
    lab.nss["b"].nft("delete", "table", "inet", "nftblock")  # a reboot: the kernel forgot everything
    b.start()  # restored from the state database before READY=1
    assert "203.0.113.40" in lab.banned("b")
    assert b.cli_json("check", "203.0.113.40")["bans"][0]["origin_host"] == "a"


def test_metrics_and_status_show_the_fleet(lab: FleetLab) -> None:
    st = lab.daemons["a"].cli_json("status")
    assert st["fleet"]["fleet"] == FLEET and st["fleet"]["host_id"] == "a"
    text = lab.daemons["c"].cli("fleet").stdout  # C replayed the 10k (B was restarted since: counters anew)
    assert "fleet lab, host c: connected to 10.210.3.1:" in text and "received ban" in text, text
    raw = lab.daemons["c"].cli("--json", "fleet").stdout
    assert json.loads(raw)["fleet"]["received"]["ban"]["applied"] >= 10_000
    lab.daemons["a"].signal(signal.SIGHUP)  # an unchanged fleet block reloads fine
    wait_for(lambda: "configuration reloaded" in lab.daemons["a"].log(), 10, 0.05, "reload")


def test_a_reload_that_changes_the_fleet_block_is_refused(lab: FleetLab) -> None:
    a = lab.daemons["a"]
    before = a.config_path.read_text()
    a.config_path.write_text(before.replace(f"  name: {FLEET}\n", f"  name: {FLEET}\n  history: 1d\n"))
    try:
        r = a.cli("reload")
        assert r.returncode == 1 and "fleet changed; restart nftblockd to apply" in r.stderr, r.stderr
        assert lab.fleet("a")["connected"]  # the running fleet mode goes on
    finally:
        a.config_path.write_text(before)


def test_the_fleet_server_is_never_banned_from_the_fleet_or_the_cli(lab: FleetLab) -> None:
    """#34 item 1: one ban of the server's address (any member's event, a CLI or jail ban) cut every host off
    the fleet. Now the addresses a host needs are on its allowlist: refused, counted, and the link stays."""
    now = time.time()
    ban = {"v": "2", "op": "ban", "net": "10.210.2.1", "until": repr(now + 600), "origin": "evil", "oseq": "1",
           "src": "cli", "ts": "0"}
    before = lab.fleet("b")["rejected"].get("allowlisted", 0)
    lab.xadd(ban)  # B's way to the server
    lab.xadd(ban | {"net": "203.0.113.231"})  # the marker
    wait_for(lambda: "203.0.113.231" in lab.banned("b"), 10, 0.02, "the marker on B")
    assert "10.210.2.1" not in lab.banned("b")
    wait_for(lambda: lab.fleet("b")["rejected"].get("allowlisted", 0) == before + 1, 5, 0.02, "counted")
    r = lab.daemons["a"].cli("ban", "10.210.1.1")  # A's own way to the server
    assert "10.210.1.1" not in lab.banned("a") and "allowlist" in (r.stdout + r.stderr).lower(), r.stdout
    assert lab.fleet("a")["connected"] and lab.fleet("b")["connected"]
