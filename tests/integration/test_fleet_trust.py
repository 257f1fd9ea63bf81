"""The fleet-trust tier: what a compromised member can and cannot do to the others (issues #34, #39).

One real `redis-server` over mutual TLS with the ACL users docs/fleet.md documents (tests/helpers/redis.py
`host_acl`, `operator_acl`): hosts A and B run the fleet service (fake kernel, `tests.helpers.fleet.Host`) with
their own user and certificate; C is the compromised member: its own ACL user and certificate, sending raw
commands with redis-py, never the service's code. Each test names the issue item it covers. The server and
certificates are made once per module; each test uses a fleet of its own.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import math
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, ResponseError

from nftblockd.config import FleetTLS
from nftblockd.fleet.link import Keys
from tests.helpers.certs import client_cert, make_certs
from tests.helpers.fleet import Host, fleet_config, joined, until
from tests.helpers.redis import (  # noqa: F401 (fixtures, by name)
    RedisServer,
    connections_left_open_fail_their_own_test,
    host_acl,
    operator_acl,
    redis_available,
)

pytestmark = [pytest.mark.skipif(not redis_available(), reason="needs redis-server (make deps)"),
              pytest.mark.usefixtures("connections_left_open_fail_their_own_test")]

_fleets = itertools.count()


@dataclass
class Rig:
    srv: RedisServer
    certs: dict[str, str]
    dir: Path

    def tls(self, host: str) -> FleetTLS:
        cert, key = client_cert(Path(self.certs["ca.crt"]).parent, f"h-{host}-{id(self)}")
        return FleetTLS(ca=self.certs["ca.crt"], cert=cert, key=key)

    def client(self, user: str, tls: FleetTLS) -> Redis:
        return Redis(host="127.0.0.1", port=self.srv.port, username=user, password=f"pw-{user}", ssl=True,
                     ssl_ca_certs=tls.ca, ssl_certfile=tls.cert, ssl_keyfile=tls.key)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    d = tmp_path_factory.mktemp("trust")
    c = make_certs(d / "certs")
    srv = RedisServer(d / "redis", tls_port=True, conf=(
        f"tls-cert-file {c['server.crt']}\ntls-key-file {c['server.key']}\ntls-ca-cert-file {c['ca.crt']}\n"
        "tls-auth-clients yes\nuser default on >admin ~* &* +@all\n")).start()
    try:
        yield Rig(srv, c, d)
    finally:
        srv.kill()


@dataclass
class Fleet:
    name: str
    rig: Rig
    hosts: dict[str, Host]
    c: Redis  # the compromised member, as its own ACL user with its own certificate
    admin: Redis
    keys: Keys  # C's view of the keys

    def start(self, host: str, **kw: object) -> Host:
        r = self.rig
        pw = r.dir / f"pw-{host}"
        pw.write_text(f"pw-{host}\n")
        pw.chmod(0o600)
        h = Host(fleet_config(self.name, host, r.srv.url, username=host, password_file=str(pw),
                              tls=r.tls(host), **kw)).start()
        self.hosts[host] = h
        return h


@pytest.fixture
async def fleet(rig: Rig) -> AsyncIterator[Fleet]:
    name = f"t{next(_fleets)}"
    admin_tls = FleetTLS(ca=rig.certs["ca.crt"], cert=rig.certs["client.crt"], key=rig.certs["client.key"])
    admin = Redis(host="127.0.0.1", port=rig.srv.port, username="default", password="admin", ssl=True,
                  ssl_ca_certs=admin_tls.ca, ssl_certfile=admin_tls.cert, ssl_keyfile=admin_tls.key)
    for host in ("a", "b", "c", "d"):
        await run(admin, "ACL", "SETUSER", *host_acl(name, host, f"pw-{host}"))
    await run(admin, "ACL", "SETUSER", *operator_acl(name, "op", "pw-op"))
    f = Fleet(name, rig, {}, rig.client("c", rig.tls("c")), admin, Keys.for_fleet(name, "c"))
    try:
        yield f
    finally:
        for h in f.hosts.values():
            await h.stop()
        await f.c.aclose()
        await admin.aclose()


async def run(r: Redis, *args: Any) -> Any:
    """One raw command (redis-py's execute_command is untyped)."""
    return await r.execute_command(*args)  # type: ignore[no-untyped-call]


def nets(n: int, base: str = "198.51.100.0") -> list[ipaddress.IPv4Network]:
    b = int(ipaddress.IPv4Address(base))
    return [ipaddress.IPv4Network((b + i, 32)) for i in range(n)]


def m(t: ipaddress.IPv4Network) -> str:
    """A target as a member of the sorted sets (canonical: a single address without /32)."""
    return str(t.network_address)


def fields(op: str, net: str, origin: str, until: float = 0.0, oseq: int = 1) -> dict[Any, Any]:
    return {"v": "2", "op": op, "net": net, "until": repr(until) if op == "ban" else "0", "origin": origin,
            "oseq": str(oseq), "src": "cli", "ts": str(int(time.time() * 1000))}


async def xadd_many(r: Redis, key: str, entries: list[dict[Any, Any]], id_: str = "*") -> None:
    pipe = r.pipeline(transaction=False)
    for e in entries:
        pipe.xadd(key, e, id=id_)
    await pipe.execute()


async def a_and_b_with_bans(f: Fleet, n: int, **kw: object) -> tuple[Host, Host, list[ipaddress.IPv4Network]]:
    a, b = f.start("a", **kw), f.start("b", **kw)
    await run(f.c, "XADD", f.keys.events, "MAXLEN", "0", "*", "v", "2")  # C is a member too
    await joined(a, b)
    await until(lambda: a.service.stats.members == 3 and b.service.stats.members == 3, what="C's stream followed")
    targets = nets(n)
    a.service.submit_bans([(t, time.time() + 3600, "jail:sshd") for t in targets])
    await until(lambda: all(b.sink.has(t) for t in targets), what=f"A's {n} bans on B")
    return a, b, targets


# -- least privilege -----------------------------------------------------------------------------------------


async def test_every_command_a_member_must_not_have_is_refused(fleet: Fleet) -> None:
    """#34 (counting/ACL), #39 (members hold no raw write on anyone else's keys): NOPERM, each of them."""
    a_keys = Keys.for_fleet(fleet.name, "a")
    op = f"nftblock:{{{fleet.name}}}:op"
    forbidden: list[tuple[Any, ...]] = [
        ("XADD", a_keys.events, "*", "v", "2"), ("XADD", a_keys.events, "18446744073709551615-0", "v", "2"),
        ("XTRIM", a_keys.events, "MAXLEN", "0"), ("XDEL", a_keys.events, "1-0"), ("XSETID", a_keys.events, "9-9"),
        ("DEL", a_keys.events), ("DEL", a_keys.active), ("DEL", a_keys.epoch), ("UNLINK", a_keys.active),
        ("ZREM", a_keys.active, "198.51.100.1"), ("ZADD", a_keys.unbanned, "1", "198.51.100.1"),
        ("ZADD", a_keys.active, "1", "198.51.100.1"), ("ZREMRANGEBYSCORE", a_keys.active, "-inf", "+inf"),
        ("SET", a_keys.epoch, "x"), ("EXPIRE", a_keys.active, "1"), ("PEXPIRE", a_keys.active, "1"),
        ("RENAME", a_keys.active, fleet.keys.active), ("COPY", fleet.keys.active, a_keys.active),
        ("XADD", f"{op}:events", "*", "v", "2"), ("ZADD", f"{op}:unbanned", "1", "198.51.100.1"),
        ("SET", f"nftblock:{{{fleet.name}}}:fd:sshd:198.51.100.1", "x"), ("SET", "elsewhere", "1"),
        ("EVAL", "return 1", "0"), ("FCALL", "f", "0"), ("FUNCTION", "LIST"), ("SCRIPT", "FLUSH"),
        ("FLUSHALL",), ("FLUSHDB",), ("KEYS", "*"), ("CONFIG", "GET", "*"), ("ACL", "LIST"),
        ("SHUTDOWN",), ("SWAPDB", "0", "1"), ("MIGRATE", "127.0.0.1", "1", a_keys.active, "0", "1"),
        ("RESTORE", a_keys.active, "0", "x"), ("XTRIM", fleet.keys.events, "MAXLEN", "0"),
        ("XGROUP", "CREATE", a_keys.events, "g", "$"), ("PUBLISH", "x", "y"), ("MONITOR",), ("REPLICAOF", "NO", "ONE"),
    ]
    refused = []
    for cmd in forbidden:
        with pytest.raises(NoPermissionError):
            await run(fleet.c, *cmd)
        refused.append(cmd[0])
    assert len(refused) == len(forbidden)
    # ... and what it needs works, on its own keys and reading everyone's
    await fleet.c.xadd(fleet.keys.events, fields("ban", "198.51.100.1", "c", time.time() + 60))
    assert await fleet.c.xrange(a_keys.events) == []
    await fleet.c.zadd(fleet.keys.active, {"198.51.100.1": time.time() + 60})


# -- #34 item 2: forged unbans; #39 item 2: tombstones plus ZREM ---------------------------------------------


async def test_forged_unbans_lift_nothing_but_the_forgers_own_bans(fleet: Fleet) -> None:
    """#34.2: C's unbans naming origin a, c or an invented host removed A's bans on B and in A's own kernel,
    300 at once. Now: naming a is refused (`origin`); naming c lifts only C's own bans; A and B keep all."""
    a, b, targets = await a_and_b_with_bans(fleet, 300)
    a.sink.local.update({t: a.sink.local.get(t) or _local() for t in targets})  # A's own, in its own kernel
    for origin in ("a", "c", "nobody"):
        await xadd_many(fleet.c, fleet.keys.events, [fields("unban", m(t), origin) for t in targets])
    with pytest.raises(NoPermissionError):  # and not in A's stream
        await fleet.c.xadd(Keys.for_fleet(fleet.name, "a").events, fields("unban", m(targets[0]), "a"))
    await until(lambda: sum(b.service.stats.received.values()) >= 900 + 300, what="B read C's 900 unbans")
    assert all(b.sink.has(t) for t in targets) and all(t in a.sink.local for t in targets)
    assert b.service.stats.received[("unban", "origin")] == 600  # "a" and "nobody": forged origins, counted
    assert b.service.stats.received[("unban", "applied")] == 300  # "c": its own unbans, lifting none of A's


async def test_tombstones_and_zrem_of_a_member_never_unban_its_bans(fleet: Fleet) -> None:
    """#39.2: C's tombstones for A's bans plus a ZREM of them from `active`, then a snapshot, removed 100 of
    A's own bans in A's kernel and B's. Now C cannot touch A's sets, its own tombstones lift only its own bans,
    and a snapshot never removes a ban a host made itself."""
    a, b, targets = await a_and_b_with_bans(fleet, 100)
    a_keys = Keys.for_fleet(fleet.name, "a")
    with pytest.raises(NoPermissionError):
        await fleet.c.zrem(a_keys.active, *[m(t) for t in targets])
    with pytest.raises(NoPermissionError):
        await fleet.c.zadd(a_keys.unbanned, {m(t): time.time() for t in targets})
    await fleet.c.zadd(fleet.keys.unbanned, {m(t): time.time() for t in targets})  # its own: allowed
    await fleet.c.zadd(fleet.keys.active, {m(t): time.time() + 60 for t in targets[:10]})
    await fleet.c.zrem(fleet.keys.active, *[m(t) for t in targets[:10]])
    a.sink.local.update({t: _local() for t in targets})
    # every host takes a snapshot of C (its cursor for C's stream gone, as after a trim past it)
    for h in (a, b):
        snaps = h.service.stats.snapshots
        await h.service._snapshot(["c"], "test")
        assert h.service.stats.snapshots == snaps + 1
    assert all(b.sink.has(t) for t in targets) and all(t in a.sink.local for t in targets)


def _local() -> Any:
    from nftblockd.fleet.catchup import LocalBan
    return LocalBan(time.time() - 1, time.time() + 3600)


# -- #34 item 3, #39 item 4: forged origins on bans, rate per authenticated host ----------------------------


async def test_bans_claiming_another_origin_are_refused_and_counted(fleet: Fleet) -> None:
    """#34.3: C's bans claiming origin a were enforced as A's. Now refused (`origin`) on every host; C's bans
    as C are applied as C's."""
    a, b, _targets = await a_and_b_with_bans(fleet, 1)
    await xadd_many(fleet.c, fleet.keys.events, [fields("ban", f"203.0.113.{i}", "a", time.time() + 600)
                                                 for i in range(50)])
    await fleet.c.xadd(fleet.keys.events, fields("ban", "203.0.113.99", "c", time.time() + 600))
    marker = ipaddress.ip_network("203.0.113.99/32")
    await until(lambda: b.sink.has(marker) and a.sink.has(marker), what="C's own ban applied as C's")
    assert b.sink.origin[marker] == "c"
    for h in (a, b):
        assert h.service.stats.received[("ban", "origin")] == 50
        assert not any(h.sink.has(ipaddress.ip_network(f"203.0.113.{i}/32")) for i in range(50))


async def test_the_rate_cap_binds_the_authenticated_host_however_many_origins_it_claims(fleet: Fleet) -> None:
    """#39.4: 100,000 bans over 1,000 invented origins all reached every kernel at once. Now an invented origin
    is refused, and C's own are capped at its burst (the rest deferred, as for any one host)."""
    a, b, _targets = await a_and_b_with_bans(fleet, 1, burst=500, rate=100.0)
    burst = b.cfg.burst
    n = burst + 2000
    invented = [fields("ban", str(ipaddress.IPv4Address(0x0A000000 + i)), f"h{i % 1000}", time.time() + 600)
                for i in range(5000)]
    own = [fields("ban", str(ipaddress.IPv4Address(0x0B000000 + i)), "c", time.time() + 600, i) for i in range(n)]
    for i in range(0, len(invented), 1000):
        await xadd_many(fleet.c, fleet.keys.events, invented[i:i + 1000])
    for i in range(0, n, 1000):
        await xadd_many(fleet.c, fleet.keys.events, own[i:i + 1000])
    await until(lambda: b.service.stats.received[("ban", "origin")] == 5000
                and b.service.stats.received[("ban", "applied")] + b.service.stats.deferred >= n, 30,
                what="B read C's flood")
    applied = b.service.stats.received[("ban", "applied")]
    assert burst <= applied < n and b.service.stats.deferred_total >= n - applied - 1
    # A's own ban still reaches B at once: C's deferred flood is not in its way
    x = ipaddress.ip_network("192.0.2.200/32")
    t0 = time.monotonic()
    a.service.submit_bans([(x, time.time() + 600, "jail:sshd")])
    await until(lambda: b.sink.has(x), 5, what="A's ban on B during C's flood")
    assert time.monotonic() - t0 < 2.0


# -- #39 item 1: gutted shared state heals ------------------------------------------------------------------


async def test_a_member_heals_what_the_server_lost_and_a_new_host_gets_everything(fleet: Fleet) -> None:
    """#39.1: DEL / XTRIM of the stream and DEL of `active` left a new host with 0 of 300. C can do none of
    it now (NOPERM, above); the same loss by the server itself (the admin, a restart without persistence) is
    noticed by A (epoch marker, own active count) and re-asserted without a restart: a fresh D gets all."""
    a, b, targets = await a_and_b_with_bans(fleet, 300)
    a_keys = Keys.for_fleet(fleet.name, "a")
    for cmd in (("DEL", a_keys.events), ("XTRIM", a_keys.events, "MAXLEN", "0"), ("DEL", a_keys.active)):
        with pytest.raises(NoPermissionError):
            await run(fleet.c, *cmd)
    figures = {}
    cases: list[tuple[str, list[tuple[str, ...]]]] = [
        ("active ZREM of 100", [("ZREM", a_keys.active, *[m(t) for t in targets[:100]])]),
        ("stream and active DEL", [("DEL", a_keys.events), ("DEL", a_keys.active)]),
        ("everything of A DEL", [("DEL", a_keys.events, a_keys.active, a_keys.epoch)]),
    ]
    for what, cmds in cases:
        heals = a.service.stats.heals
        t0 = time.monotonic()
        for loss in cmds:
            await run(fleet.admin, *loss)
        await until(lambda heals=heals: a.service.stats.heals > heals, 10, what=f"A noticed ({what})")  # type: ignore[misc]
        deadline = time.monotonic() + 10
        while await fleet.admin.zcard(a_keys.active) < 300:  # (polled with a bound)
            assert time.monotonic() < deadline, f"A re-asserted ({what})"
            await asyncio.sleep(0.01)
        figures[what] = time.monotonic() - t0
    d = fleet.start("d")
    await until(lambda: all(d.sink.has(t) for t in targets), what="D got all of A's 300")
    assert all(b.sink.has(t) for t in targets)
    print(f"time to heal: {figures}")


# -- #39 item 3: stream ids ---------------------------------------------------------------------------------


async def test_the_last_possible_id_stops_only_its_stream_and_is_recovered_without_a_reconnect(fleet: Fleet) -> None:
    """#39.3: one XADD with the last possible id made every later publish fail, the operator's included, and
    B stayed deaf above every new id. Now each host writes only its own stream: C's last-id entry stops C
    alone; the same written into A's stream with A's credentials (A compromised) is noticed by A at its
    next publish (stream re-created at once), and B, its cursor then ahead of A's new stream, takes a snapshot
    of it: neither reconnects."""
    a, b, _targets = await a_and_b_with_bans(fleet, 1)
    await fleet.c.xadd(fleet.keys.events, fields("ban", "203.0.113.7", "c", time.time() + 60),
                       id="18446744073709551615-18446744073709551615")
    with pytest.raises(ResponseError, match="exhausted"):
        await fleet.c.xadd(fleet.keys.events, fields("ban", "203.0.113.8", "c", time.time() + 60))
    x = ipaddress.ip_network("192.0.2.10/32")
    a.service.submit_bans([(x, time.time() + 600, "jail:sshd")])
    await until(lambda: b.sink.has(x), 5, what="A's ban on B past C's exhausted stream")
    await until(lambda: b.service.status()["stream_problems"].get("c") == "future_id", 5,
                what="B shows C's stream as broken")
    # A's own stream, written with A's credentials
    connects_a, connects_b = a.service.stats.connects, b.service.stats.connects
    a_client = fleet.rig.client("a", fleet.rig.tls("a"))
    try:
        await a_client.xadd(Keys.for_fleet(fleet.name, "a").events, fields("ban", "203.0.113.9", "a", 0.0),
                            id="18446744073709551615-18446744073709551615")
    finally:
        await a_client.aclose()
    t0 = time.monotonic()
    y = ipaddress.ip_network("192.0.2.11/32")
    a.service.submit_bans([(y, time.time() + 600, "jail:sshd")])
    await until(lambda: b.sink.has(y), 10, what="A's next ban on B after A's stream was exhausted")
    healed = time.monotonic() - t0
    assert a.service.stats.stream_resets >= 1
    assert (a.service.stats.connects, b.service.stats.connects) == (connects_a, connects_b)
    print(f"exhausted stream: A's next ban on B after {healed:.2f}s")


async def test_an_id_far_in_the_future_refuses_that_stream_alone(fleet: Fleet) -> None:
    """#39.3: a year-2286 id does not block appends, but every later entry carries it. Entries of a stream
    ahead of the server's clock are refused (`future_id`) and the stream shown, that stream alone."""
    a, b, _targets = await a_and_b_with_bans(fleet, 1)
    await fleet.c.xadd(fleet.keys.events, fields("ban", "203.0.113.21", "c", time.time() + 600),
                       id="9999999999999-0")
    await fleet.c.xadd(fleet.keys.events, fields("ban", "203.0.113.22", "c", time.time() + 600))
    await until(lambda: b.service.stats.received[("?", "future_id")] >= 2, 5, what="C's future entries refused")
    assert not b.sink.has(ipaddress.ip_network("203.0.113.21/32"))
    assert b.service.status()["stream_problems"] == {"c": "future_id"}
    x = ipaddress.ip_network("192.0.2.12/32")
    a.service.submit_bans([(x, time.time() + 600, "jail:sshd")])
    await until(lambda: b.sink.has(x), 5, what="A unaffected")
    assert math.isfinite(b.service.stats.lag_last)
