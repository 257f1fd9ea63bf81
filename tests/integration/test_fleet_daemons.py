"""Fleet mode end to end: three real daemons (A, B, C), each in its own network namespace, share bans through one
real redis-server running in a fourth ("server") namespace, which each host reaches over its own veth pair.
What is checked is what the kernels hold (`nft -j`, or the set's element count for 10,000 elements).

One lab serves the whole module (starting three daemons costs seconds); the tests run in file order and use
addresses of their own, so each one's checks stay independent of the others' bans.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, wait_for
from tests.helpers.redis import RedisServer

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (make deps)")

FLEET = "lab"
EVENTS = f"nftblock:{{{FLEET}}}:events"
HOSTS = ("a", "b", "c")


def host_addr(i: int) -> str:
    return f"10.210.{i}.2"


def daemon_config(host: str, i: int, port: int, log: Path) -> str:
    return f"""
allowlist: [192.0.2.0/24]
reconcile: {{interval: 1h}}
blocklists: {{default: {{timeout: 1h}}}}
jails:
  sshd:
    files: ["{log}"]
    filter: sshd
    maxretry: 2
    findtime: 10m
    bantime: 1h
fleet:
  name: {FLEET}
  host_id: {host}
  url: redis://10.210.{i}.1:{port}/0
"""


@dataclass
class Lab:
    server_ns: NetNS
    server: RedisServer
    nss: dict[str, NetNS]
    daemons: dict[str, DaemonProc]
    logs: dict[str, Path]

    def banned(self, host: str, set_name: str = "default_ip4") -> set[str]:
        return set(self.nss[host].set_elements("nftblock", set_name))

    def count(self, host: str, set_name: str = "default_ip4") -> int:
        """Elements the kernel reports for a set (NFTA_SET_COUNT through `status`: cheap for 10k elements)."""
        st = self.daemons[host].cli_json("status")
        return int(next(s["elements"] for s in st["sets"] if s["name"] == set_name))

    def fleet(self, host: str) -> dict[str, Any]:
        out: dict[str, Any] = self.daemons[host].cli_json("fleet")["fleet"]
        return out

    def xadd(self, fields: dict[str, str]) -> None:
        args = [x for kv in fields.items() for x in kv]
        r = self.server_ns.run("redis-cli", "-p", str(self.server.port), "XADD", EVENTS, "*", *args)
        assert r.returncode == 0 and not r.stdout.startswith("ERR"), r.stdout + r.stderr


_pids = iter(range(1000, 10**6))


def failures(addr: str, n: int) -> str:
    stamp = time.strftime("%b %e %H:%M:%S")
    return "".join(f"{stamp} host sshd[{next(_pids)}]: Failed password for invalid user admin from {addr} "
                   f"port {40000 + i} ssh2\n" for i in range(n))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    import os

    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("needs root and nft")
    tmp = tmp_path_factory.mktemp("fleet")
    server_ns = NetNS("nbs")
    nss: dict[str, NetNS] = {}
    daemons: dict[str, DaemonProc] = {}
    server: RedisServer | None = None
    try:
        for i, h in enumerate(HOSTS, start=1):
            ns = nss[h] = NetNS(f"nbf{h}")
            server_ns.run("ip", "link", "add", f"to{h}", "type", "veth", "peer", "name", "fleet0", "netns", ns.name)
            server_ns.run("ip", "addr", "add", f"10.210.{i}.1/24", "dev", f"to{h}")
            server_ns.run("ip", "link", "set", f"to{h}", "up")
            ns.run("ip", "addr", "add", f"{host_addr(i)}/24", "dev", "fleet0")
            ns.run("ip", "link", "set", "fleet0", "up")
        server = RedisServer(tmp / "redis", ns=server_ns, bind="0.0.0.0").start()
        logs = {}
        for i, h in enumerate(HOSTS, start=1):
            logs[h] = tmp / f"{h}-auth.log"
            logs[h].write_text("")
            daemons[h] = DaemonProc(nss[h], tmp / h, daemon_config(h, i, server.port, logs[h]))
        for d in daemons.values():
            d.start()
        lab = Lab(server_ns, server, nss, daemons, logs)
        for h in HOSTS:
            wait_for(lambda h=h: lab.fleet(h)["connected"], 15, 0.05, f"{h} connected")  # type: ignore[misc]
        yield lab
    finally:
        for d in daemons.values():
            d.close()
        if server is not None:
            server.kill()
        for ns in nss.values():
            ns.delete()
        server_ns.delete()


def test_fan_out_of_cli_and_jail_bans_and_a_fleet_wide_unban(lab: Lab) -> None:
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


def test_hostile_events_are_refused_counted_and_never_enforced(lab: Lab) -> None:
    now = time.time()
    good = {"v": "1", "op": "ban", "net": "203.0.113.20", "until": repr(now + 600), "origin": "evil",
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
    assert lab.fleet("c")["rejected"].get("allowlisted", 0) >= 1  # C refused 192.0.2.7 too (not its own addr)


def test_a_host_that_was_down_replays_10k_bans(lab: Lab) -> None:
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


def test_server_down_bans_wait_in_the_outbox(lab: Lab) -> None:
    lab.server.kill()
    wait_for(lambda: not lab.fleet("a")["connected"], 30, 0.05, "A notices the server is gone")
    r = lab.daemons["a"].cli("ban", "203.0.113.30")
    assert r.returncode == 0, r.stderr
    assert "203.0.113.30" in lab.banned("a")  # local protection goes on
    wait_for(lambda: lab.fleet("a")["outbox"] >= 1, 10, 0.05, "the ban waits in A's outbox")
    lab.server.start()  # the same port; empty: every host takes a snapshot, A re-asserts its own bans
    wait_for(lambda: "203.0.113.30" in lab.banned("b"), 40, 0.05, "the outbox ban on B after the restart")
    assert lab.fleet("a")["outbox"] == 0


def test_a_daemon_restart_keeps_fleet_bans(lab: Lab) -> None:
    b = lab.daemons["b"]
    assert "203.0.113.11" in lab.banned("b")
    assert b.stop() == 0
    lab.nss["b"].nft("delete", "table", "inet", "nftblock")  # a reboot: the kernel forgot everything
    b.start()  # restored from the state database before READY=1
    assert "203.0.113.11" in lab.banned("b")
    assert b.cli_json("check", "203.0.113.11")["bans"][0]["origin_host"] == "a"


def test_metrics_and_status_show_the_fleet(lab: Lab) -> None:
    st = lab.daemons["a"].cli_json("status")
    assert st["fleet"]["fleet"] == FLEET and st["fleet"]["host_id"] == "a"
    text = lab.daemons["c"].cli("fleet").stdout  # C replayed the 10k (B was restarted since: counters anew)
    assert "fleet lab, host c: connected to 10.210.3.1:" in text and "received ban" in text, text
    raw = lab.daemons["c"].cli("--json", "fleet").stdout
    assert json.loads(raw)["fleet"]["received"]["ban"]["applied"] >= 10_000
    lab.daemons["a"].signal(signal.SIGHUP)  # an unchanged fleet block reloads fine
    wait_for(lambda: "configuration reloaded" in lab.daemons["a"].log(), 10, 0.05, "reload")
