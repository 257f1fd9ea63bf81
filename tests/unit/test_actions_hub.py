"""Which actions ban and unban events reach, with the offender's lines; a flood is counted, not built."""

from __future__ import annotations

import ipaddress

from nftblockd.actions.hub import ActionHub
from nftblockd.actions.render import Run
from nftblockd.config import parse_config
from nftblockd.detect.matchmemory import MatchMemory
from nftblockd.events import Ban

CFG = """
actions:
  a: {type: command, argv: [/bin/a, "{address}"], on: [ban, unban], burst: 5, rate: 1}
  b: {type: command, argv: [/bin/b], burst: 1000, rate: 1000}
  fleetwide: {type: webhook, url: "http://127.0.0.1:1/", batch: 50}
jails:
  sshd: {filter: sshd, journal: {matches: {_SYSTEMD_UNIT: ssh.service}}, actions: [a, b]}
  web: {filter: sshd, journal: {matches: {_SYSTEMD_UNIT: nginx.service}}}
fleet: {name: f, host_id: h1, url: "redis://127.0.0.1:7001", actions: [fleetwide]}
"""
N = ipaddress.ip_network
A = ipaddress.ip_address


async def nothing(run: Run) -> None:
    return None


def hub() -> ActionHub:
    return ActionHub(parse_config(CFG), {}, nothing)


def ban(addr: str, jail: str = "sshd") -> Ban:
    return Ban(N(addr), "default", 1000.0 + 3600, "jail", "5 failures", jail)


def queued(h: ActionHub, name: str) -> list[str]:
    q = h.runners[name]._queue
    return [q._queue[i].address for i in range(q.qsize())]  # type: ignore[attr-defined]


def test_jail_bans_reach_the_jails_actions_with_their_lines() -> None:
    h = hub()
    mem = h.memory("sshd")
    assert isinstance(mem, MatchMemory) and h.memory("web") is None
    mem.add(A("192.0.2.1"), "line 1", {"user": "x"})
    mem.add(A("192.0.2.1"), "line 2", {"user": "root"})
    mem.decided(A("192.0.2.1"), N("192.0.2.1/32"))
    h.jail_bans([ban("192.0.2.1/32"), ban("192.0.2.9/32", "web")], 1000.0)
    assert queued(h, "a") == queued(h, "b") == ["192.0.2.1"]
    ev_a = h.runners["a"]._queue._queue[0]  # type: ignore[attr-defined]
    assert ev_a is h.runners["b"]._queue._queue[0]  # type: ignore[attr-defined]  # built once
    assert (ev_a.matches, ev_a.failures, ev_a.fields, ev_a.duration, ev_a.host) == (
        ("line 1", "line 2"), 2, (("user", "root"),), 3600.0, "h1")
    assert len(mem) == 0  # taken


def test_unbans_go_to_actions_that_asked_for_them() -> None:
    h = hub()
    h.unbanned([("sshd", N("192.0.2.1/32"), "default", "cli", "operator")], 1000.0)
    assert queued(h, "a") == ["192.0.2.1"] and queued(h, "b") == []


def test_a_flood_is_counted_without_building_what_is_skipped() -> None:
    h = hub()
    built: list[int] = []

    def nth(i: int) -> tuple[str, float | None, str]:
        built.append(i)
        return f"10.0.{i // 256}.{i % 256}", None, "fleet:h2"

    h.fleet_bans(100_000, nth, "default", 1000.0)
    r = h.runners["fleetwide"]
    assert len(built) == r.cfg.queue == 1000  # the queue's worth; the rest only counted
    assert r.stats.skipped == {"queue_full": 99_000}
    h.jail_bans([ban(f"192.0.2.{i}/32") for i in range(10)], 1000.0)
    assert len(queued(h, "a")) == 5 and h.runners["a"].stats.skipped == {"rate": 5}
    assert len(queued(h, "b")) == 10


def test_match_memory_is_bounded() -> None:
    m = MatchMemory(max_hosts=2, max_lines=3)
    for i in range(5):
        m.add(A("192.0.2.1"), f"l{i}", {})
    m.add(A("192.0.2.2"), "x", {})
    m.add(A("192.0.2.3"), "y", {})  # forgets .1, seen longest ago
    m.decided(A("192.0.2.1"), N("192.0.2.1/32"))
    assert m.take(N("192.0.2.1/32")) is None
    m.add(A("2001:db8::1"), "v6", {})
    m.decided(A("2001:db8::2"), N("2001:db8::/64"))  # counted per /64 like the jail
    got = m.take(N("2001:db8::/64"))
    assert got is not None and got.lines == ("v6",) and got.failures == 1
    for i in range(5):
        m.add(A("192.0.2.9"), f"l{i}", {})
    m.decided(A("192.0.2.9"), N("192.0.2.9/32"))
    got = m.take(N("192.0.2.9/32"))
    assert got is not None and got.lines == ("l2", "l3", "l4") and got.failures == 5


async def test_a_reload_replaces_changed_actions_and_stops_removed_ones() -> None:
    import asyncio

    h = hub()
    task = asyncio.create_task(h.run())
    for _ in range(50):  # the runners' tasks start
        await asyncio.sleep(0)
    old_a, old_b = h.runners["a"], h.runners["b"]
    tasks = dict(h._tasks)
    assert set(tasks) == {"a", "b", "fleetwide"}
    changed = h.configure(parse_config(CFG.replace("burst: 5", "burst: 7").replace(
        "  fleetwide: {type: webhook, url: \"http://127.0.0.1:1/\", batch: 50}\n", "").replace(
        "actions: [fleetwide]", "")), {})
    assert sorted(changed) == ["a", "fleetwide"]
    assert h.runners["b"] is old_b and h.runners["a"] is not old_a and h.runners["a"].cfg.burst == 7
    assert h.runners["a"].stats is old_a.stats  # counters do not restart
    for _ in range(50):
        await asyncio.sleep(0)
    assert tasks["a"].cancelled() and tasks["fleetwide"].cancelled() and not tasks["b"].done()
    assert set(h._tasks) == {"a", "b"} and not h._tasks["a"].done()
    assert h.fleet_actions == []
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert all(t.done() for t in h._tasks.values())
