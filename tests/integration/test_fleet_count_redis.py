"""Fleet counting against a real redis-server (client level: no kernel, no daemon, no ACL; the ACL and TLS are
the trust tier's, test_fleet_count_trust.py): streams found, counted by every host alike, one ban per
crossing, near misses and IPv6 prefixes, the age trim of a host's own stream."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

import pytest
from redis.asyncio import Redis

from nftblockd.fleet.counter import FleetCounter
from nftblockd.fleet.counting import CountPolicy, Decided, fail_key
from nftblockd.fleet.countlink import CountLink
from tests.helpers.fleet import fleet_config, until
from tests.helpers.redis import (  # noqa: F401 (fixtures, by name)
    RedisServer,
    connections_left_open_fail_their_own_test,
    plain_server,
    redis_available,
)

pytestmark = [pytest.mark.skipif(not redis_available(), reason="needs redis-server (make deps)"),
              pytest.mark.usefixtures("connections_left_open_fail_their_own_test")]

A = ipaddress.ip_address
POL = {"sshd": CountPolicy(maxretry=3, findtime=600.0, bantime=3600.0)}


class Fleet:
    def __init__(self, server: RedisServer, hosts: tuple[str, ...], **kw: Any) -> None:
        self.decided: dict[str, list[Decided]] = {h: [] for h in hosts}
        self.counters = {h: FleetCounter(fleet_config("prod", h, server.url, **kw), CountLink(
            fleet_config("prod", h, server.url)), POL, self.decided[h].extend, discover=0.2) for h in hosts}
        self.tasks = [asyncio.ensure_future(c.run()) for c in self.counters.values()]

    async def online(self) -> None:
        n = len(self.counters)
        await until(lambda: all(c.stats.connected and c.stats.members >= n for c in self.counters.values()),
                    what="connected")

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for c in self.counters.values():
            await c.link.close()


async def test_every_host_decides_each_crossing_once_with_the_same_end(server: RedisServer) -> None:
    f = Fleet(server, ("a", "b", "c", "d"))
    r = Redis.from_url(server.url)
    try:
        await f.online()
        attackers = [A(f"198.51.100.{i}") for i in range(200)]
        for h in ("a", "b", "c"):  # 200 attackers, once on each of three hosts, all at once
            for x in attackers:
                f.counters[h].failure("sshd", x)
        await until(lambda: all(len(ds) == 200 for ds in f.decided.values()), what="decided everywhere")
        ends = {h: {(str(d.net), d.until, d.by) for d in ds} for h, ds in f.decided.items()}
        assert ends["a"] == ends["b"] == ends["c"] == ends["d"]  # d saw nothing itself: it decides the same
        assert all(d.failures == 3 and sorted(d.hosts) == ["a", "b", "c"] for d in f.decided["d"])
        assert sum(c.stats.crossed for c in f.counters.values()) == 200  # one crossing host per ban
        # a failure of a banned offender is skipped, not counted again
        f.counters["a"].failure("sshd", attackers[0])
        await until(lambda: f.counters["d"].stats.skipped == 1, what="skipped")
        assert all(len(ds) == 200 for ds in f.decided.values())
        # nothing but the hosts' own streams on the server: no shared counting key
        keys = sorted(k.decode() if isinstance(k, bytes) else k for k in await r.keys("*"))
        assert keys == sorted(fail_key("prod", h) for h in "abcd")
    finally:
        await r.aclose()
        await f.close()


async def test_near_miss_ipv6_prefix_and_check(server: RedisServer) -> None:
    f = Fleet(server, ("a", "b"))
    try:
        await f.online()
        f.counters["a"].failure("sshd", A("198.51.100.1"))
        f.counters["b"].failure("sshd", A("198.51.100.1"))  # 2 of 3: no ban
        f.counters["a"].failure("sshd", A("2001:db8:1:2::1"))
        f.counters["b"].failure("sshd", A("2001:db8:1:2::99"))  # the same /64
        f.counters["a"].failure("sshd", A("2001:db8:1:2:ffff::5"))
        await until(lambda: len(f.decided["a"]) == 1 and len(f.decided["b"]) == 1, what="the /64 banned")
        assert str(f.decided["b"][0].net) == "2001:db8:1:2::/64"
        await until(lambda: f.counters["b"].stats.accepted == 5, what="all counted at b")
        seen = await f.counters["b"].seen(ipaddress.ip_network("198.51.100.1/32"))
        assert seen["sshd"]["counting"] == 2 and sorted(seen["sshd"]["seen_by"]) == ["a", "b"], seen
        seen6 = await f.counters["a"].seen(ipaddress.ip_network("2001:db8:1:2::7/128"))
        assert sorted(seen6["sshd"]["decided"]["seen_by"]) == ["a", "b"] and seen6["sshd"]["decided"]["count"] == 3
    finally:
        await f.close()
