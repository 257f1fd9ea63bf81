"""fleet/counter.py with a fake server: batching, pacing to the rate cap (queued, never dropped), failures kept
through an outage and sent after it (within the window), the members' streams read and counted."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nftblockd.fleet.counter import FleetCounter
from nftblockd.fleet.counting import CountPolicy, Decided, fail_key, parse_entry
from nftblockd.fleet.countlink import Read
from nftblockd.fleet.link import LinkError
from tests.helpers.fleet import fleet_config, until

A = ipaddress.ip_address
POL = {"sshd": CountPolicy(3, 600.0, 3600.0, ipv6_prefix=64)}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeServer:
    """Streams by key; IDs from `ms` (the server's clock, moved by the test)."""

    def __init__(self) -> None:
        self.streams: dict[str, list[tuple[str, dict[bytes, bytes]]]] = {}
        self.ms = 5_000_000
        self.seq = 0
        self.up = True
        self.gate = asyncio.Event()
        self.gate.set()
        self.appends: list[list[list[str]]] = []
        self.new = asyncio.Event()

    async def connect(self) -> int:
        if not self.up:
            raise LinkError("refused")
        return self.ms

    async def close(self) -> None:
        pass

    def xadd(self, key: str, fields: Sequence[str]) -> str:
        self.seq += 1
        sid = f"{self.ms}-{self.seq}"
        self.streams.setdefault(key, []).append((sid, {fields[i].encode(): fields[i + 1].encode()
                                                       for i in range(0, len(fields), 2)}))
        self.new.set()
        return sid

    async def append(self, key: str, entries: Sequence[Sequence[str]], trim_minid: str | None) -> str:
        await self.gate.wait()
        if not self.up:
            raise LinkError("gone")
        self.appends.append([list(e) for e in entries])
        return [self.xadd(key, e) for e in entries][-1]

    async def members(self, pattern: str, limit: int, valid: Callable[[str], bool]) -> list[str]:
        if not self.up:
            raise LinkError("gone")
        return sorted(k for k in self.streams if valid(k))[:limit]

    async def read(self, cursors: Mapping[str, str], count: int, block_ms: int) -> Read:
        def after(sid: str, cur: str) -> bool:
            return tuple(map(int, sid.split("-"))) > tuple(map(int, cur.split("-")))

        for _ in range(2):
            if not self.up:
                raise LinkError("gone")
            out = [(k, [e for e in self.streams.get(k, []) if after(e[0], c)][:count]) for k, c in cursors.items()]
            out = [(k, es) for k, es in out if es]
            if out:
                return out
            self.new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.new.wait(), 0.05)
        return []


def counter(srv: FakeServer, clock: Clock, host: str = "a", pol: Mapping[str, CountPolicy] = POL, **kw: Any
            ) -> tuple[FleetCounter, list[Decided]]:
    got: list[Decided] = []
    c = FleetCounter(fleet_config("prod", host, "redis://x", **kw), srv, pol, got.extend, clock=clock,
                     discover=0.0)
    return c, got


def sent_items(srv: FakeServer) -> list[list[str]]:
    out = []
    for call in srv.appends:
        for e in call:
            f = {e[i].encode(): e[i + 1].encode() for i in range(0, len(e), 2)}
            r = parse_entry(f, POL)
            if r is not None:
                out.append([f"{i.offender}*{i.k}@{i.age_ms}" for i in r[0]])
    return out


async def test_batches_fold_repeats_and_the_members_streams_decide() -> None:
    srv, clock = FakeServer(), Clock()
    c, got = counter(srv, clock)
    task = asyncio.ensure_future(c.run())
    try:
        await until(lambda: c.stats.connected and fail_key("prod", "a") in srv.streams, what="connected")
        srv.gate.clear()  # the server is slow: failures gather meanwhile
        c.failure("sshd", A("198.51.100.1"))
        await asyncio.sleep(0.01)
        for _ in range(3):
            c.failure("sshd", A("198.51.100.2"))
        c.failure("sshd", A("2001:db8::1"))
        c.failure("sshd", A("2001:db8::2"))  # the same /64
        c.failure("other", A("198.51.100.3"))  # a jail without fleet counting: ignored
        srv.gate.set()
        await until(lambda: c.stats.sent == 6, what="all sent")
        assert sent_items(srv)[-2:] == [["198.51.100.1*1@0"], ["198.51.100.2*3@0", "2001:db8::/64*2@0"]]
        # a's failures alone never cross (its share is 2); one of b's does, and every reader decides it
        srv.xadd(fail_key("prod", "b"), ["v", "1", "j", "sshd", "f", "198.51.100.2"])
        await until(lambda: len(got) == 1, what="decided")
        assert (str(got[0].net), got[0].hosts, got[0].by) == ("198.51.100.2/32", ("a", "b"), "b")
        assert c.stats.decided == 1 and c.stats.crossed == 0 and c.stats.members == 2
        seen = await c.seen(ipaddress.ip_network("2001:db8::9/128"))
        assert seen == {"sshd": {"counting": 2, "seen_by": ["a"]}}
        # a malformed entry on b's stream is counted, not counted as failures
        srv.xadd(fail_key("prod", "b"), ["v", "1", "j", "sshd", "f", "198.51.100.0/24,1.2.3.4"])
        await until(lambda: c.stats.malformed == 1, what="malformed")
        assert c.stats.accepted == 6 + 1 + 1  # a's six, b's crossing one and its good one
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_members_future_ids_and_junk_keys_are_not_counted() -> None:
    # a member may XADD explicit ids to its own streams and create keys under its own prefix: an id far ahead of
    # the server's clock would end a ban decades on, and junk keys must not crowd the others out of discovery
    srv, clock = FakeServer(), Clock()
    c, got = counter(srv, clock)
    srv.streams["nftblock:{prod}:h:c:x1:fail"] = []  # not a host's failure stream
    task = asyncio.ensure_future(c.run())
    try:
        await until(lambda: c.stats.connected and fail_key("prod", "a") in srv.streams, what="connected")
        far = f"{srv.ms + 10 * 365 * 86400 * 1000}-0"
        srv.streams.setdefault(fail_key("prod", "c"), []).append(
            (far, {b"v": b"1", b"j": b"sshd", b"f": b"198.51.100.9*2"}))
        srv.xadd(fail_key("prod", "b"), ["v", "1", "j", "sshd", "f", "198.51.100.9"])
        await until(lambda: c.stats.future == 1 and c.stats.accepted >= 1, what="read")
        assert got == [] and c.stats.members == 3  # a, b, c: not the junk key
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_burst_over_the_rate_cap_is_queued_and_sent_whole() -> None:
    srv, clock = FakeServer(), Clock()
    c, _got = counter(srv, clock, count_rate=100.0, count_burst=1000)
    task = asyncio.ensure_future(c.run())
    try:
        await until(lambda: c.stats.connected and fail_key("prod", "a") in srv.streams, what="connected")
        for i in range(2500):
            c.failure("sshd", A(f"10.0.{i // 256}.{i % 256}"))
        await until(lambda: c.stats.sent == 1000, what="the burst")
        await asyncio.sleep(0.05)
        assert c.stats.sent == 1000 and c.status()["pending"] == 1500  # the cap holds the rest, it drops nothing
        clock.t += 15.0  # 15 s later: the bucket is full again (1,000), not more
        await until(lambda: c.stats.sent == 2000, what="the next burst")
        await asyncio.sleep(0.05)
        assert c.stats.sent == 2000
        clock.t += 5.0
        await until(lambda: c.stats.sent == 2500, what="the rest sent")
        assert c.stats.deferred == 1500 and c.stats.dropped == 0 and c.stats.lost == 0
        # what waited 15 s carries its age: it counts at the time it was seen
        assert sent_items(srv)[-1][0].endswith("@20000")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_failures_seen_while_cut_off_are_sent_after_the_heal_within_the_window() -> None:
    srv, clock = FakeServer(), Clock()
    c, _got = counter(srv, clock, pol={"sshd": CountPolicy(3, 60.0, 3600.0)})
    task = asyncio.ensure_future(c.run())
    try:
        await until(lambda: c.stats.connected, what="connected")
        srv.up = False
        srv.new.set()
        await until(lambda: not c.stats.connected, what="noticed")
        c.failure("sshd", A("198.51.100.4"))  # seen early in the cut: out of the window at the heal
        clock.t += 50.0
        c.failure("sshd", A("198.51.100.5"))
        clock.t += 20.0
        srv.up = True
        await until(lambda: c.stats.connected, 5, what="back")  # the ban link's schedule: 0.2 s / 0.5 s
        await until(lambda: c.stats.sent == 1, what="sent after the heal")
        assert c.stats.lost == 1 and sent_items(srv)[-1] == ["198.51.100.5*1@20000"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
