"""Fleet mode against a real redis-server (client level: the enforcer is a fake, no kernel needed).

Each test starts its own server on a free loopback port with a temporary dir and kills it by PID.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import time
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import NoPermissionError

from nftblockd.allowlist import build_allowlist
from nftblockd.fleet.catchup import LocalBan
from nftblockd.fleet.link import Keys, LinkError, RedisLink
from nftblockd.state.store import Store
from tests.helpers.certs import make_certs
from tests.helpers.fleet import Host, fleet_config, joined, until
from tests.helpers.redis import (  # noqa: F401 (fixtures, by name)
    RedisServer,
    connections_left_open_fail_their_own_test,
    host_acl,
    plain_server,
    redis_available,
)

pytestmark = [pytest.mark.skipif(not redis_available(), reason="needs redis-server (make deps)"),
              pytest.mark.usefixtures("connections_left_open_fail_their_own_test")]

N = ipaddress.ip_network


def nets(n: int, base: str = "203.0.113.0") -> list[ipaddress.IPv4Network]:
    b = int(ipaddress.IPv4Address(base))
    return [ipaddress.IPv4Network((b + i, 32)) for i in range(n)]



async def test_fan_out_to_three_hosts(server: RedisServer) -> None:
    hosts = [Host(fleet_config("prod", h, server.url)).start() for h in ("a", "b", "c")]
    a, b, c = hosts
    try:
        await joined(*hosts)
        targets = nets(500)
        until_ = time.time() + 3600
        assert a.service.submit_bans([(n, until_, "jail:sshd") for n in targets]) == 500
        await until(lambda: all(len(h.sink.fleet) == 500 for h in (b, c)), what="500 bans on b and c")
        assert set(b.sink.fleet) == set(targets) and b.sink.origin[targets[0]] == "a"
        assert a.sink.fleet == {}  # own events only move the cursor
        await until(lambda: a.service.stats.received[("?", "own")] == 500, what="a reads its own")
        assert b.service.stats.received[("ban", "applied")] == 500
        # a received batch is one transaction: far fewer calls than events
        assert len(b.sink.calls) < 500
        # a's unban removes a's fleet element, never a ban b made itself (schema 2: only the operator's may)
        b.sink.local[targets[1]] = LocalBan(time.time() - 60, until_)
        a.service.submit_unbans([targets[0], targets[1]])
        await until(lambda: targets[0] not in b.sink.fleet and targets[0] not in c.sink.fleet, what="unban")
        await until(lambda: b.service.stats.received[("unban", "applied")] == 2, what="both unbans read")
        assert targets[1] in b.sink.local
        # a ban that the fleet does not share (escalation) stays home
        assert a.service.submit_bans([(N("198.51.100.1/32"), until_, "escalation")]) == 0
    finally:
        for h in hosts:
            await h.stop()


async def test_replay_after_downtime_and_snapshot_when_trimmed(server: RedisServer, tmp_path: Path) -> None:
    a = Host(fleet_config("prod", "a", server.url)).start()
    store_b = Store.open(tmp_path / "b.db")
    b = Host(fleet_config("prod", "b", server.url), store=store_b).start()
    try:
        await joined(a, b)
        first = nets(10)
        a.service.submit_bans([(n, time.time() + 3600, "cli") for n in first])
        await until(lambda: len(b.sink.fleet) == 10)
        await b.stop()
        # b is away while a bans 2,000 more: b comes back and replays from its saved cursor
        more = nets(2000, "198.51.0.0")
        a.service.submit_bans([(n, time.time() + 3600, "cli") for n in more])
        await until(lambda: a.service.stats.published == 2010, what="a published")
        sink = b.sink
        b = Host(fleet_config("prod", "b", server.url), store=store_b)
        b.sink = sink
        b.service.sink = sink
        b.start()
        await until(lambda: len(b.sink.fleet) == 2010, what="b replayed")
        assert b.service.stats.replays == 1 and b.service.stats.snapshots == 0
        await b.stop()
        # now the stream is trimmed past b's cursor while it is away: b must take the snapshot
        late = nets(5, "192.0.2.0")
        a.service.submit_bans([(n, time.time() + 3600, "cli") for n in late])
        await until(lambda: a.service.stats.published == 2015)
        r = RedisLink(fleet_config("prod", "x", server.url))
        await r.connect()
        assert r.cmd is not None
        await r.cmd.execute_command("XTRIM", Keys.for_fleet("prod", "a").events, "MAXLEN", "0")
        await r.close()
        del b.sink.fleet[first[0]]  # and one element vanished from b's kernel meanwhile
        b.sink.fleet[N("192.0.2.200/32")] = time.time() + 3600  # one the server does not hold
        b = Host(fleet_config("prod", "b", server.url), store=store_b)
        b.sink = sink
        b.service.sink = sink
        b.start()
        await until(lambda: b.service.stats.snapshots == 1, what="snapshot")
        # ... stays: only an unban (a tombstone) or its timeout ends a ban, never its absence from a server
        # that may have lost it (issue #23)
        assert set(b.sink.fleet) == set(first) | set(more) | set(late) | {N("192.0.2.200/32")}
    finally:
        await a.stop()
        await b.stop()
        store_b.close()


async def test_server_restart_with_empty_data_snapshot_and_reassert(server: RedisServer) -> None:
    a = Host(fleet_config("prod", "a", server.url)).start()
    b = Host(fleet_config("prod", "b", server.url)).start()
    try:
        await joined(a, b)
        x1, x2, y = N("203.0.113.1/32"), N("203.0.113.2/32"), N("198.51.100.9/32")
        a.service.submit_bans([(x1, time.time() + 3600, "cli"), (x2, time.time() + 3600, "cli")])
        b.service.submit_bans([(y, time.time() + 3600, "jail:sshd")])
        await until(lambda: b.sink.has(x1) and b.sink.has(x2) and a.sink.has(y))
        a.service.submit_unbans([x2])
        await until(lambda: not b.sink.has(x2))
        snaps = (a.service.stats.snapshots, b.service.stats.snapshots)
        server.kill()
        server.start(wipe=True)
        await until(lambda: (a.service.stats.snapshots, b.service.stats.snapshots) > snaps
                    and a.service.stats.snapshots > snaps[0] and b.service.stats.snapshots > snaps[1]
                    and a.service.stats.connected and b.service.stats.connected, what="both re-snapshotted")
        # each re-asserted its own active bans; the unbanned x2 did not come back
        await until(lambda: a.sink.has(y) and b.sink.has(x1), what="re-asserted bans spread again")
        assert not b.sink.has(x2) and not a.sink.has(x2)
        assert a.service.stats.reasserted == 1 and b.service.stats.reasserted == 1
        r = RedisLink(fleet_config("prod", "x", server.url))
        await r.connect()
        snap = await r.snapshot(["a", "b"], time.time())
        await r.close()
        assert set(snap.parts["a"].active) == {"203.0.113.1"} and set(snap.parts["b"].active) == {"198.51.100.9"}
    finally:
        await a.stop()
        await b.stop()


async def test_a_fleet_counted_ban_is_reasserted_by_the_host_that_decided_it(server: RedisServer) -> None:
    # the count script appended it to the stream (not a's outbox); the server restarts empty: a gives it back
    a = Host(fleet_config("prod", "a", server.url)).start()
    b = Host(fleet_config("prod", "b", server.url)).start()
    try:
        await joined(a, b)
        z = N("192.0.2.77/32")
        a.service.note_counted([(z, time.time() + 3600, "count:sshd")])
        await until(lambda: [r.target for r in a.store.fleet_own_active(time.time(), 0)] == ["192.0.2.77"],
                    what="recorded by a as its own published ban")
        assert a.service.stats.reasserted == 0 and not b.sink.has(z)  # not published by a: the script did
        snaps = a.service.stats.snapshots
        server.kill()
        server.start(wipe=True)
        await until(lambda: a.service.stats.snapshots > snaps and a.service.stats.connected, what="a re-snapshotted")
        await until(lambda: b.sink.has(z), what="the counted ban re-asserted by a")
        assert a.service.stats.reasserted == 1
    finally:
        await a.stop()
        await b.stop()


async def test_server_down_outbox_then_published(server: RedisServer, tmp_path: Path) -> None:
    offset = [0.0]
    store_a = Store.open(tmp_path / "a.db")
    a = Host(fleet_config("prod", "a", server.url), store=store_a, clock=lambda: time.time() + offset[0]).start()
    b = Host(fleet_config("prod", "b", server.url)).start()
    try:
        await joined(a, b)
        server.kill()
        await until(lambda: not a.service.stats.connected, what="a noticed")
        keep, short, gone = nets(3)
        now = time.time()
        a.service.submit_bans([(keep, now + 3600, "cli"), (short, now + 2, "cli"), (gone, now + 3600, "cli")])
        a.service.submit_unbans([gone])
        # the unban made the earlier ban of `gone` pointless: 3 rows wait (keep, short, the unban)
        await until(lambda: a.service.stats.outbox == 3, what="outbox holds them")
        assert store_a.fleet_outbox_size() == 3
        offset[0] = 10.0  # time passes: the 2-second ban is over before the server is back
        server.start()
        await until(lambda: b.sink.has(keep), what="published after restart")
        await until(lambda: a.service.stats.outbox == 0)
        assert not b.sink.has(short) and not b.sink.has(gone)
        assert a.service.stats.last_error and a.service.stats.connects >= 2
    finally:
        await a.stop()
        await b.stop()
        store_a.close()


async def test_hostile_events_are_rejected_counted_and_skipped(server: RedisServer) -> None:
    own = ipaddress.ip_address("198.51.100.10")
    b = Host(fleet_config("prod", "b", server.url, burst=5, rate=1.0),
             allow=build_allowlist([N("192.0.2.0/24")], [own])).start()
    try:
        await until(lambda: b.service.stats.connected)
        r = RedisLink(fleet_config("prod", "x", server.url))
        await r.connect()
        assert r.cmd is not None
        events = Keys.for_fleet("prod", "evil").events
        flood = Keys.for_fleet("prod", "flood").events
        for k in (events, flood):
            await r.cmd.execute_command("XADD", k, "MAXLEN", "0", "*", "v", "2")
        await until(lambda: b.service.stats.members == 3, what="b follows evil's and flood's streams")
        now = time.time()
        good = {"v": "2", "op": "ban", "net": "203.0.113.50", "until": repr(now + 600), "origin": "evil",
                "oseq": "1", "src": "cli", "ts": "0"}
        hostile = [
            good | {"net": "192.0.2.7"},  # allowlisted
            good | {"net": "198.51.100.10"},  # b's own address
            good | {"net": "0.0.0.0/0"},  # everything
            good | {"until": "1e300"},  # absurd end
            good | {"net": "203.0.113.0/8"},  # host bits
            good | {"v": "9"},  # unknown version
            {"garbage": "\x00\xff", "op": "ban"},  # no version
            good | {"origin": "bad origin"},
            good | {"until": repr(now - 5)},  # already over
            good | {"net": "203.0.113.51", "origin": "a"},  # another host's name, in evil's stream
        ]
        for fields in hostile:
            await r.cmd.xadd(events, fields)  # type: ignore[arg-type]
        await r.cmd.xadd(events, good)  # type: ignore[arg-type]
        for i in range(10):  # the origin's burst is 5: its sixth event and on wait for the cap (deferred)
            await r.cmd.xadd(flood, good | {"net": f"203.0.113.{100 + i}", "origin": "flood"})  # type: ignore
        await r.close()
        await until(lambda: sum(b.service.stats.received.values()) >= 16 and b.service.stats.deferred_total == 5,
                    what="all 21 entries read, 5 deferred")  # (>=: the deferred ones are applied at 1/s)
        assert set(b.sink.fleet) >= {N("203.0.113.50/32")} | {N(f"203.0.113.{100 + i}/32") for i in range(5)}
        rejected = b.service.status()["rejected"]
        assert rejected == {"allowlisted": 2, "too_wide": 1, "bad_until": 1, "host_bits": 1, "version": 2,
                            "malformed": 1, "expired": 1, "origin": 1}
        # the capped ones are applied as the cap refills (1/s), not dropped (issue #23)
        await until(lambda: len(b.sink.fleet) == 11, limit=20, what="the deferred bans applied")
        assert b.service.stats.deferred == 0
        assert b.service.stats.cursor != ""
    finally:
        await b.stop()


async def test_acl_user_limited_to_the_fleet_keys(server: RedisServer, tmp_path: Path) -> None:
    admin = RedisLink(fleet_config("prod", "x", server.url))
    await admin.connect()
    assert admin.cmd is not None
    for host in ("a", "b"):
        await admin.cmd.execute_command("ACL", "SETUSER", *host_acl("prod", host, f"pw-{host}"))
    await admin.close()
    pw = {}
    for host in ("a", "b"):
        p = tmp_path / f"pw-{host}"
        p.write_text(f"pw-{host}\n")
        p.chmod(0o600)
        pw[host] = str(p)
    a = Host(fleet_config("prod", "a", server.url, username="a", password_file=pw["a"])).start()
    b = Host(fleet_config("prod", "b", server.url, username="b", password_file=pw["b"])).start()
    try:
        await until(lambda: a.service.stats.connected and b.service.stats.connected,
                    what=f"connected as ACL users ({a.service.stats.last_error})")
        a.service.submit_bans([(n, time.time() + 600, "cli") for n in nets(20)])
        a.service.submit_unbans(nets(1))
        await until(lambda: len(b.sink.fleet) == 19)
        # what that user cannot do: write outside the fleet's keys, flush, list keys
        assert a.link.cmd is not None
        for cmd in (("SET", "other", "1"), ("FLUSHALL",), ("KEYS", "*"),
                    ("XADD", "nftblock:{other}:events", "*", "v", "1"), ("CONFIG", "GET", "*"),
                    ("DEL", Keys.for_fleet("prod", "b").events)):
            with pytest.raises(NoPermissionError):
                await a.link.cmd.execute_command(*cmd)
    finally:
        await a.stop()
        await b.stop()
    # a wrong password is a clear error, not a hang
    p = tmp_path / "bad"
    p.write_text("nope")
    p.chmod(0o600)
    bad = RedisLink(fleet_config("prod", "a", server.url, username="a", password_file=str(p)))
    with pytest.raises(LinkError, match=r"credentials|WRONGPASS|invalid"):
        await bad.connect()


async def test_mutual_tls(tmp_path: Path) -> None:
    from nftblockd.config import FleetTLS
    c = make_certs(tmp_path / "certs")
    srv = RedisServer(tmp_path / "tls", tls_port=True, conf=(
        f"tls-cert-file {c['server.crt']}\ntls-key-file {c['server.key']}\ntls-ca-cert-file {c['ca.crt']}\n"
        "tls-auth-clients yes\n")).start()
    try:
        tls = FleetTLS(ca=c["ca.crt"], cert=c["client.crt"], key=c["client.key"])
        a = Host(fleet_config("prod", "a", srv.url, tls=tls)).start()
        b = Host(fleet_config("prod", "b", srv.url, tls=tls)).start()
        try:
            await until(lambda: a.service.stats.connected and b.service.stats.connected,
                        what=f"TLS connect ({a.service.stats.last_error})")
            a.service.submit_bans([(n, time.time() + 600, "cli") for n in nets(5)])
            await until(lambda: len(b.sink.fleet) == 5)
        finally:
            await a.stop()
            await b.stop()
        # the CA alone (no client certificate): the server refuses the handshake
        no_cert = RedisLink(fleet_config("prod", "c", srv.url, tls=FleetTLS(ca=c["ca.crt"])))
        with pytest.raises(LinkError):
            await no_cert.connect()
        # plain text to the TLS port: refused too
        plain = RedisLink(fleet_config("prod", "c", srv.url.replace("rediss://", "redis://")))
        with pytest.raises(LinkError):
            await plain.connect()
    finally:
        srv.kill()


async def test_permanent_bans_clamped_unless_allowed(server: RedisServer) -> None:
    a = Host(fleet_config("prod", "a", server.url)).start()
    b = Host(fleet_config("prod", "b", server.url, max_ban=600.0)).start()
    c = Host(fleet_config("prod", "c", server.url, allow_permanent=True)).start()
    try:
        await until(lambda: all(h.service.stats.connected for h in (a, b, c)))
        x = N("203.0.113.77/32")
        a.service.submit_bans([(x, None, "cli")])
        await until(lambda: b.sink.has(x) and c.sink.has(x))
        assert b.sink.fleet[x] <= time.time() + 600 and c.sink.fleet[x] == math.inf
    finally:
        for h in (a, b, c):
            await h.stop()


async def test_unreachable_server_backs_off_without_flooding(caplog: pytest.LogCaptureFixture,
                                                              tmp_path: Path) -> None:
    from tests.helpers.redis import free_port
    a = Host(fleet_config("prod", "a", f"redis://127.0.0.1:{free_port()}/0"))
    caplog.set_level("DEBUG", logger="nftblockd.fleet")
    a.start()
    try:
        await until(lambda: a.service.stats.last_error != "", what="first failure")
        a.service.submit_bans([(N("203.0.113.5/32"), time.time() + 60, "cli")])
        await until(lambda: a.service.stats.outbox == 1)
        await asyncio.sleep(0)  # let the loop run
        warnings = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and "unreachable" in warnings[0].getMessage()
    finally:
        await a.stop()


@pytest.mark.slow
async def test_sentinel_failover_loses_no_acknowledged_ban(tmp_path: Path) -> None:
    primary = RedisServer(tmp_path / "p").start()
    replica = RedisServer(tmp_path / "r", conf=f"replicaof 127.0.0.1 {primary.port}").start()
    sentinels = [RedisServer(tmp_path / f"s{i}", sentinel=True, conf=(
        f"sentinel monitor svc 127.0.0.1 {primary.port} 2\nsentinel down-after-milliseconds svc 1000\n"
        "sentinel failover-timeout svc 5000\nsentinel parallel-syncs svc 1\n")).start() for i in range(3)]
    hosts_cfg = {"sentinel_hosts": tuple(("127.0.0.1", s.port) for s in sentinels), "sentinel_service": "svc"}
    a = Host(fleet_config("prod", "a", None, **hosts_cfg)).start()  # type: ignore[arg-type]
    b = Host(fleet_config("prod", "b", None, **hosts_cfg)).start()  # type: ignore[arg-type]
    try:
        await until(lambda: a.service.stats.connected and b.service.stats.connected, what="connected via Sentinel")
        assert a.service.stats.role == "master"
        targets = nets(600, "198.18.0.0")
        for i, n in enumerate(targets):
            a.service.submit_bans([(n, time.time() + 3600, "cli")])
            if i == 200:
                primary.kill()  # SIGKILL: a crash, not a shutdown
            await asyncio.sleep(0.005)  # a steady producer, not a burst
        await until(lambda: all(b.sink.has(n) for n in targets), limit=30.0,
                    what=f"every ban on b after failover ({sum(b.sink.has(n) for n in targets)} of 600)")
        await until(lambda: a.service.stats.outbox == 0, what="outbox drained")
        assert a.service.stats.connects >= 2 and b.service.stats.connects >= 2
    finally:
        await a.stop()
        await b.stop()
        for s in (*sentinels, replica, primary):
            s.kill()


async def test_grouped_publish_commands_leave_what_the_plain_ones_leave(server: RedisServer) -> None:
    """link.chunk_commands (sorted sets written once per run of bans or unbans) against the per-event form."""
    import random

    from nftblockd.fleet.codec import FleetEvent
    from nftblockd.fleet.link import chunk_commands, chunk_commands_plain

    r = RedisLink(fleet_config("fast", "x", server.url))
    await r.connect()
    assert r.cmd is not None
    rnd = random.Random(7)
    now = time.time()
    pool = nets(12)
    for trial in range(30):
        events = []
        for i in range(rnd.randrange(1, 40)):
            net = rnd.choice(pool)
            if rnd.random() < 0.3:
                events.append(FleetEvent("unban", net, 0.0, "h", i))
            else:
                end = math.inf if rnd.random() < 0.1 else now + rnd.choice((-5.0, 60.0, 600.0, 3600.0))
                events.append(FleetEvent("ban", net, end, "h", i))
        for name, make in (("fast", chunk_commands), ("plain", chunk_commands_plain)):
            k = Keys.for_fleet(f"{name}{trial}", "a")
            pipe = r.cmd.pipeline(transaction=True)
            for args in make(events, k, "0", now, 86400.0):
                pipe.execute_command(*args)
            assert not [x for x in await pipe.execute(raise_on_error=False) if isinstance(x, Exception)]
        got = {}
        for name in ("fast", "plain"):
            k = Keys.for_fleet(f"{name}{trial}", "a")
            got[name] = (await r.cmd.zrange(k.active, 0, -1, withscores=True),
                         await r.cmd.zrange(k.unbanned, 0, -1, withscores=True),
                         [f for _id, f in await r.cmd.xrange(k.events) or []])
        assert got["fast"] == got["plain"], events
    await r.close()


@pytest.mark.parametrize("via", ["url", "sentinel"])
async def test_a_client_closed_under_a_running_publish_leaves_no_connection_open(server: RedisServer,
                                                                                tmp_path: Path, via: str) -> None:
    """The receiver closes the link on an error while the publisher may be between two chunks of a publish:
    the next chunk goes through the closed client, whose pool connects again (through the Sentinels, with
    Sentinels). The link closes that client, and the Sentinel clients it asked, once more when the publish
    ends, so no socket is left behind (CI found one left each way)."""
    sentinel = None
    if via == "url":
        link = RedisLink(fleet_config("prod", "a", server.url))
    else:
        sentinel = RedisServer(tmp_path / "s", sentinel=True, conf=(
            f"sentinel monitor svc 127.0.0.1 {server.port} 1\n")).start()
        hosts = {"sentinel_hosts": (("127.0.0.1", sentinel.port),), "sentinel_service": "svc"}
        link = RedisLink(fleet_config("prod", "a", None, **hosts))  # type: ignore[arg-type]
    try:
        await _publish_across_a_close(link)
    finally:
        if sentinel is not None:
            sentinel.kill()


async def _publish_across_a_close(link: RedisLink) -> None:
    from redis.asyncio.client import Pipeline

    from nftblockd.fleet.codec import FleetEvent
    from nftblockd.fleet.link import CHUNK

    await link.connect()
    old = link.cmd
    assert old is not None
    pipelines = 0
    make_pipeline = old.pipeline

    def pipeline(transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        nonlocal pipelines
        pipe = make_pipeline(transaction, shard_hint)
        pipelines += 1
        if pipelines == 2:  # before the second chunk goes out, the link is closed
            execute = pipe.execute

            async def closing_execute(raise_on_error: bool = True) -> list[Any]:
                await link.close()
                return await execute(raise_on_error)
            pipe.execute = closing_execute  # type: ignore[method-assign]
        return pipe
    old.pipeline = pipeline  # type: ignore[method-assign]
    events = [FleetEvent("ban", n, time.time() + 600, "a", i) for i, n in enumerate(nets(CHUNK + 10))]
    await link.publish(events, time.time())  # the second chunk went out through the closed client
    assert pipelines == 2
    pools = [old.connection_pool]
    manager = getattr(old.connection_pool, "sentinel_manager", None)
    pools += [s.connection_pool for s in getattr(manager, "sentinels", ())]
    conns = [c for pool in pools for c in (*pool._available_connections, *pool._in_use_connections)]
    assert conns and not [c for c in conns if c.is_connected]
