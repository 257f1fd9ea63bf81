"""Fleet counting against a real redis-server (client level: no kernel, no daemon): the script's rules."""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from nftblockd.allowlist import build_allowlist
from nftblockd.fleet.codec import FleetEvent, decode
from nftblockd.fleet.counter import FleetCounter
from nftblockd.fleet.counting import CountPolicy, Decided, count_key
from nftblockd.fleet.countlink import CountLink
from nftblockd.fleet.gate import Gate, TrustLimits
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
            fleet_config("prod", h, server.url)), POL, self.decided[h].extend) for h in hosts}
        self.tasks = [asyncio.ensure_future(c.run()) for c in self.counters.values()]

    async def online(self) -> None:
        await until(lambda: all(c.stats.connected for c in self.counters.values()), what="connected")

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for c in self.counters.values():
            await c.link.close()

    def all_decided(self) -> list[Decided]:
        return [d for ds in self.decided.values() for d in ds]


async def raw(server: RedisServer) -> Redis:
    return Redis.from_url(server.url)


async def test_one_ban_per_crossing_even_when_hosts_cross_at_once(server: RedisServer) -> None:
    f = Fleet(server, ("a", "b", "c", "d"))
    r = await raw(server)
    try:
        await f.online()
        # 200 attackers, one failure each on every host, all at once: each is crossed by some host, exactly once
        attackers = [A(f"198.51.100.{i}") for i in range(200)]
        for c in f.counters.values():
            for a in attackers:
                c.failure("sshd", a)
        await until(lambda: sum(c.stats.accepted + c.stats.skipped for c in f.counters.values()) == 800,
                    what="all counted")
        got = f.all_decided()
        assert sorted(str(d.net) for d in got) == sorted(f"{a}/32" for a in attackers)
        assert all(d.failures == 3 and len(d.hosts) == 3 and d.until > 0 for d in got)
        # each ban is in the stream once, origin the decider, and it passes another host's gate
        entries = cast("list[tuple[bytes, dict[bytes, bytes]]]", await r.xrange("nftblock:{prod}:events"))
        assert len(entries) == 200
        gate = Gate(TrustLimits(), build_allowlist([]))
        for sid, fields in entries[:5]:
            ev = decode(fields)
            assert isinstance(ev, FleetEvent) and ev.src == "count:sshd" and ev.origin in "abcd"
            assert fields[b"seen"].count(b",") == 2
            assert not hasattr(gate.check(ev, ev.until - 3000, int(sid.split(b"-")[0]) / 1000), "reason")
        # and in the active set; the count keys are gone, the decision keys expire with the ban
        assert await r.zcard("nftblock:{prod}:active") == 200
        assert await r.exists(count_key("prod", "sshd", "198.51.100.7")) == 0
        ttl = await r.pttl("nftblock:{prod}:fd:sshd:198.51.100.7")
        assert 3_500_000 < ttl <= 3_600_000
        # a failure of a banned offender is not counted again (host a may have skipped some already: whichever
        # host's call comes after an offender's crossing skips its failure, and the hosts' calls interleave)
        skipped = f.counters["a"].stats.skipped
        f.counters["a"].failure("sshd", attackers[0])
        await until(lambda: f.counters["a"].stats.skipped == skipped + 1, what="skipped")
        assert len(f.all_decided()) == 200
    finally:
        await r.aclose()
        await f.close()


async def test_near_miss_and_ipv6_prefix(server: RedisServer) -> None:
    f = Fleet(server, ("a", "b"))
    try:
        await f.online()
        f.counters["a"].failure("sshd", A("198.51.100.1"))
        f.counters["b"].failure("sshd", A("198.51.100.1"))  # 2 of 3: no ban
        f.counters["a"].failure("sshd", A("2001:db8:1:2::1"))
        f.counters["b"].failure("sshd", A("2001:db8:1:2::99"))  # the same /64
        f.counters["a"].failure("sshd", A("2001:db8:1:2:ffff::5"))
        await until(lambda: len(f.all_decided()) == 1, what="the /64 banned")
        assert str(f.all_decided()[0].net) == "2001:db8:1:2::/64"
        seen = await f.counters["b"].seen(ipaddress.ip_network("198.51.100.1/32"))
        # hosts in the order the server took their failures: a's and b's calls may arrive either way round
        assert seen["sshd"]["counting"] == 2 and sorted(seen["sshd"]["seen_by"]) == ["a", "b"], seen
        seen6 = await f.counters["a"].seen(ipaddress.ip_network("2001:db8:1:2::7/128"))
        assert sorted(seen6["sshd"]["decided"]["seen_by"]) == ["a", "b"] and seen6["sshd"]["decided"]["count"] == 3
    finally:
        await f.close()


async def test_a_host_is_rate_limited_and_foreign_members_cannot_cross(server: RedisServer) -> None:
    f = Fleet(server, ("evil", "good"), count_rate=0.001, count_burst=4)
    r = await raw(server)
    try:
        await f.online()
        evil = f.counters["evil"]
        for i in range(10):  # 10 failures of 10 offenders: only the burst (4) is counted
            evil.failure("sshd", A(f"198.51.100.{i}"))
        await until(lambda: evil.stats.accepted + evil.stats.limited == 10, what="evil's batch")
        assert evil.stats.accepted == 4 and evil.stats.limited == 6
        # members written around the script (garbage) do not make a crossing: removed and counted
        key = count_key("prod", "sshd", "203.0.113.9")
        await r.zadd(key, {"junk member": 1e15, "x|y": 1e15, "nohost|": 1e15})
        f.counters["good"].failure("sshd", A("203.0.113.9"))
        await until(lambda: f.counters["good"].stats.malformed == 3, what="malformed counted")
        assert f.all_decided() == []
        assert await r.zcard(key) == 1
    finally:
        await r.aclose()
        await f.close()


async def test_server_down_then_counting_resumes(server: RedisServer) -> None:
    f = Fleet(server, ("a", "b", "c"))
    try:
        await f.online()
        server.kill()
        for c in f.counters.values():
            c.failure("sshd", A("198.51.100.1"))
        await until(lambda: not any(c.stats.connected for c in f.counters.values()), what="all noticed")
        server.start()
        await until(lambda: all(c.stats.connected for c in f.counters.values()), 30, what="reconnected")
        assert sum(c.stats.lost for c in f.counters.values()) == 3  # counted on the wrong clock: dropped
        for c in f.counters.values():
            c.failure("sshd", A("198.51.100.1"))
        await until(lambda: len(f.all_decided()) == 1, what="banned after the restart")
    finally:
        await f.close()


async def test_the_documented_acl_is_enough(server: RedisServer, tmp_path: Path) -> None:
    """docs/fleet.md's ACL line plus the counting commands: counting, deciding and `check` work with it."""
    acl = ("+xadd +xread +xrange +xrevrange +xinfo|stream +xtrim +zadd +zrem +zrange +zrangebyscore "
           "+zremrangebyscore +zmscore +multi +exec +discard +ping +hello +info +role "
           "+evalsha +eval +time +hget +hset +hincrby +exists +zcard +set +get +del +pexpire")
    r = await raw(server)
    pw = tmp_path / "pw"
    pw.write_text("s3cret")
    pw.chmod(0o600)
    try:
        for h in ("a", "b", "c"):
            await r.execute_command("ACL", "SETUSER", h, "on", ">s3cret", "resetkeys", "~nftblock:{prod}:*",
                                    "resetchannels", "-@all", *acl.split())
        f = Fleet(server, ("a", "b", "c"), username=None)
        for h, c in f.counters.items():
            c.link = CountLink(fleet_config("prod", h, server.url, username=h, password_file=str(pw)))
        await f.online()
        for c in f.counters.values():
            c.failure("sshd", A("198.51.100.1"))
        await until(lambda: len(f.all_decided()) == 1, what="decided under the ACL")
        seen = await f.counters["a"].seen(ipaddress.ip_network("198.51.100.1/32"))
        assert sorted(seen["sshd"]["decided"]["seen_by"]) == ["a", "b", "c"]
        await f.close()
    finally:
        await r.aclose()
