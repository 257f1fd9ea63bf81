"""Fleet counting's trust tier (#34 items 4-7), from the compromised host C's side: one real redis-server with
mutual TLS and one ACL user per host exactly as docs/fleet.md writes them (`member_acl`), C sending raw redis-py
commands with its own user and certificate, every burst written at once (not paced).

- item 4: C cannot write another host's failures, drain another host's quota, forge a crossing or write a
  decision key; every command a counting host must not have is NOPERM.
- item 5: 1,000 attackers failing once on each of three hosts, all at once: 0 missed, 0 near misses banned;
  C's flood written at once is capped at the receivers.
- item 6: failures seen while the server is cut off (SIGSTOP: a silent partition) are sent after the heal;
  counting is back within 2 s.
- item 7: the server restarted empty with a crossing host down: the other holders re-assert every counted
  ban, and a new host gets them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis

from nftblockd.config import FleetConfig, FleetTLS
from nftblockd.fleet.counter import FleetCounter
from nftblockd.fleet.counting import CountPolicy, Decided, fail_key, published_and_held
from nftblockd.fleet.countlink import CountLink
from tests.helpers.certs import make_certs
from tests.helpers.fleet import Host, fleet_config, until
from tests.helpers.redis import (  # noqa: F401 (fixtures, by name)
    RedisServer,
    connections_left_open_fail_their_own_test,
    host_acl,
    redis_available,
)

pytestmark = [pytest.mark.skipif(not redis_available(), reason="needs redis-server (make deps)"),
              pytest.mark.usefixtures("connections_left_open_fail_their_own_test")]

A = ipaddress.ip_address
POL = {"sshd": CountPolicy(maxretry=3, findtime=600.0, bantime=3600.0)}
# docs/fleet.md, "ACL": one user per host, every fleet key read-only and its own keys writable (counting adds no
# command of its own: its failure stream is one of the host's keys)
def member_acl(host: str) -> str:
    name, *rules = host_acl("prod", host, "s3cret")
    return f"user {name} {' '.join(rules)}"


@dataclass
class Trust:
    srv: RedisServer
    tls: FleetTLS
    pw: str

    def cfg(self, host: str, **kw: Any) -> FleetConfig:
        return fleet_config("prod", host, self.srv.url, tls=self.tls, username=host, password_file=self.pw, **kw)

    def client(self, user: str | None) -> Redis:
        return Redis.from_url(self.srv.url, username=user or "default", password="s3cret" if user else "admin",
                              ssl_ca_certs=self.tls.ca, ssl_certfile=self.tls.cert, ssl_keyfile=self.tls.key)


@pytest.fixture
def trust(tmp_path: Path) -> Iterator[Trust]:
    c = make_certs(tmp_path / "certs")
    users = "\n".join(member_acl(h) for h in "abcde")
    srv = RedisServer(tmp_path / "tls", tls_port=True, conf=(
        f"tls-cert-file {c['server.crt']}\ntls-key-file {c['server.key']}\ntls-ca-cert-file {c['ca.crt']}\n"
        f"tls-auth-clients yes\nuser default on >admin ~* &* +@all\n{users}\n")).start()
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    pw.chmod(0o600)
    try:
        yield Trust(srv, FleetTLS(ca=c["ca.crt"], cert=c["client.crt"], key=c["client.key"]), str(pw))
    finally:
        srv.kill()


class Counters:
    def __init__(self, t: Trust, hosts: str, **kw: Any) -> None:
        self.decided: dict[str, list[Decided]] = {h: [] for h in hosts}
        self.c = {h: FleetCounter(t.cfg(h, **kw), CountLink(t.cfg(h)), POL, self.decided[h].extend, discover=0.2)
                  for h in hosts}
        self.tasks = [asyncio.ensure_future(c.run()) for c in self.c.values()]

    async def online(self) -> None:
        n = len(self.c)
        await until(lambda: all(c.stats.connected and c.stats.members >= n for c in self.c.values()), 20,
                    what=f"connected ({[c.stats.last_error for c in self.c.values()]})")

    def banned(self, h: str) -> set[str]:
        return {str(d.net.network_address) for d in self.decided[h]}

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for c in self.c.values():
            await c.link.close()


@contextlib.asynccontextmanager
async def counters(t: Trust, hosts: str, **kw: Any) -> AsyncIterator[Counters]:
    f = Counters(t, hosts, **kw)
    try:
        await f.online()
        yield f
    finally:
        await f.close()


async def nopermed(c: Redis, *cmd: Any) -> bool:
    try:
        await c.execute_command(*cmd)  # type: ignore[no-untyped-call]
    except rexc.NoPermissionError:
        return True
    except rexc.ResponseError as exc:
        return "NOPERM" in str(exc)
    return False


async def test_item4_a_compromised_host_cannot_drain_forge_or_decide(trust: Trust) -> None:
    evil = trust.client("c")
    admin = trust.client(None)
    a_key = fail_key("prod", "a")
    attackers = [f"198.51.100.{i}" for i in range(50)]
    try:
        async with counters(trust, "abd") as f:
            # every command a counting host must not have, or not on another host's keys (reading every fleet
            # key, and deleting its own, are a member's: docs/fleet.md, "ACL")
            denied = [("XADD", a_key, "*", "v", "1", "j", "sshd", "f", "203.0.113.1*3"),
                      ("XTRIM", a_key, "MAXLEN", "0"), ("DEL", a_key), ("XDEL", a_key, "0-1"),
                      ("XGROUP", "DESTROY", a_key, "g"), ("UNLINK", a_key), ("RENAME", a_key, "x"),
                      ("EVAL", "return 1", "0"), ("EVALSHA", "0" * 40, "0"), ("FCALL", "f", "0"),
                      ("FUNCTION", "FLUSH"), ("SCRIPT", "FLUSH"),
                      ("SET", "nftblock:{prod}:fd:sshd:198.51.100.1", "x"),
                      ("HSET", "nftblock:{prod}:fcrate", "a", "0:0"), ("HINCRBY", "nftblock:{prod}:fcrate", "a", "1"),
                      ("ZADD", "nftblock:{prod}:fc:sshd:198.51.100.1", "1", "a|1"),
                      ("PEXPIRE", a_key, "1"), ("EXPIRE", a_key, "1"),
                      ("RESTORE", a_key, "0", "x"), ("COPY", fail_key("prod", "c"), a_key), ("MIGRATE", "x", "0", a_key,
                                                                                          "0", "0"),
                      ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "SET", "maxmemory", "1"), ("KEYS", "*"),
                      ("ACL", "SETUSER", "c", "+@all"), ("CLIENT", "KILL", "TYPE", "normal"),
                      ("XADD", "nftblock:{other}:h:c:fail", "*", "v", "1")]
            refused = [cmd for cmd in denied if await nopermed(evil, *cmd)]
            assert [c for c in denied if c not in refused] == []
            # C drains "its" quota and more, and forges a crossing of its choice ("seen by b, c, a, decided by
            # a"), all at once on its own stream: nothing it writes takes from a's, b's or d's buckets, and its
            # failures alone never cross (its share is fleet_maxretry - 1)
            c_key = fail_key("prod", "c")
            await evil.execute_command(  # type: ignore[no-untyped-call]
                "XADD", c_key, "*", "v", "1", "j", "sshd", "origin", "a", "seen", "b,c,a", "decided", "a",
                "f", "203.0.113.66*999")
            pipe = evil.pipeline(transaction=False)
            for i in range(200):
                pipe.execute_command("XADD", c_key, "*", "v", "1", "j", "sshd",
                                     "f", ",".join(f"10.{i}.{k // 256}.{k % 256}*1000" for k in range(500)))
            await pipe.execute()
            c_total = 200 * 500 * 1000 + 999
            await until(lambda: all(c.stats.accepted + c.stats.limited >= c_total for c in f.c.values()), 30,
                        what="C's flood read")
            assert all(not ds for ds in f.decided.values())  # not one ban from C alone
            for c in f.c.values():
                assert c.tally.seen("sshd", "203.0.113.66") == {"counting": 2, "seen_by": ["c"]}
                # each host's bucket is its own: C's flood is capped at C's (burst 1,000 + 2 s of rate)
                assert c.stats.accepted <= 1200 + 100, c.stats
            # the decision keys of the old design mean nothing: one set by the server's admin for an attacker
            await admin.set("nftblock:{prod}:fd:sshd:198.51.100.7", "a,b,d;a;3")
            for h in "abd":
                for x in attackers:
                    f.c[h].failure("sshd", A(x))
            for h in "abd":
                await until(lambda h=h: f.banned(h) >= set(attackers), 20, what=f"all 50 banned on {h}")  # type: ignore[misc]
            d = next(x for x in f.decided["a"] if str(x.net) == "198.51.100.7/32")
            assert set(d.hosts) == {"a", "b", "d"} and d.by in "abd"
            assert all(c.stats.limited <= c_total for c in f.c.values())  # none of a's, b's or d's refused
    finally:
        await evil.aclose()
        await admin.aclose()


async def test_item5_a_burst_written_at_once_is_counted_whole(trust: Trust) -> None:
    attackers = [f"198.51.{100 + i // 250}.{i % 250}" for i in range(1000)]
    near = [f"203.0.113.{i}" for i in range(100)]
    evil = trust.client("c")
    try:
        async with counters(trust, "abde") as f:
            t0 = time.monotonic()
            for h in "abd":  # every line of the attack at once, on each of the three hosts
                for x in attackers:
                    f.c[h].failure("sshd", A(x))
            for h in "ab":
                for x in near:  # 2 failures fleet-wide: never banned
                    f.c[h].failure("sshd", A(x))
            # and C floods its own stream at once, as a compromised host that does not pace itself would
            pipe = evil.pipeline(transaction=False)
            for i in range(5):
                pipe.execute_command("XADD", fail_key("prod", "c"), "*", "v", "1", "j", "sshd",
                                     "f", ",".join(f"10.{i}.{k // 256}.{k % 256}*5" for k in range(1000)))
            await pipe.execute()
            for h in "abde":
                await until(lambda h=h: len(f.banned(h)) >= 1000, 30, what=f"all banned on {h}")  # type: ignore[misc]
            took = time.monotonic() - t0
            for h in "abde":
                assert f.banned(h) == set(attackers), h  # 0 missed, 0 near misses
            a = f.c["a"].stats
            await until(lambda: a.sent == 1100, 10, what="a's near misses sent")
            assert a.dropped == a.lost == 0 and a.deferred == 100  # queued past the burst (1,000), not dropped
            # C's flood: capped at the receivers at its bucket (burst 1,000 + 2 s of rate), the rest refused
            e = f.c["e"].stats
            await until(lambda: e.accepted + e.limited >= 3 * 1000 + 2 * 100 + 25000, 10, what=f"all read at e: {e}")
            assert e.limited >= 25000 - 1300 and not f.banned("e") - set(attackers), e
            print(f"burst at once: 1,000 attackers x 3 hosts banned on 4 hosts in {took:.2f} s")
    finally:
        await evil.aclose()


async def test_item6_failures_seen_while_cut_off_are_sent_after_the_heal(trust: Trust) -> None:
    attackers = [f"198.51.100.{i}" for i in range(100)]
    async with counters(trust, "abc") as f:
        assert trust.srv.proc is not None
        pid = trust.srv.proc.pid
        os.kill(pid, signal.SIGSTOP)  # a partition: the server is silent, connections hang
        try:
            for c in f.c.values():
                c.failure("sshd", A("192.0.2.1"))  # a marker whose send notices the cut at once
            await until(lambda: not any(c.stats.connected for c in f.c.values()), 20,
                        what=f"the cut noticed ({[c.stats for c in f.c.values()]})")
            for c in f.c.values():
                for x in attackers:
                    c.failure("sshd", A(x))
        finally:
            os.kill(pid, signal.SIGCONT)
        healed = time.monotonic()
        await until(lambda: all(c.stats.connected for c in f.c.values()), 5, what="counting back")
        back = time.monotonic() - healed
        for h in "abc":
            await until(lambda h=h: f.banned(h) >= set(attackers), 10, what=f"banned on {h}")  # type: ignore[misc]
        banned = time.monotonic() - healed
        assert back < 2.0, back
        assert all(c.stats.lost == 0 for c in f.c.values())
        print(f"partition: counting back {back:.2f} s after the heal, 100 of 100 banned everywhere in {banned:.2f} s")


class Member:
    """A fleet member without a kernel: the ban service (tests/helpers/fleet.py's Host) and the counter, wired as
    daemon/fleet.py wires them (`published_and_held`)."""

    def __init__(self, t: Trust, host: str) -> None:
        self.host = Host(t.cfg(host))
        self.decided: list[Decided] = []
        self.counter = FleetCounter(t.cfg(host), CountLink(t.cfg(host)), POL, self._decided, discover=0.2)
        self.task: asyncio.Task[None] | None = None

    def _decided(self, ds: list[Decided]) -> None:
        self.decided += ds
        pub, held = published_and_held(ds, self.host.cfg.host_id)
        self.host.service.submit_bans(pub)
        self.host.service.note_counted(held)

    def start(self) -> Member:
        self.host.start()
        self.task = asyncio.ensure_future(self.counter.run())
        return self

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            await self.counter.link.close()
        await self.host.stop()


async def test_item7_every_holder_reasserts_counted_bans_after_an_empty_server(trust: Trust) -> None:
    attackers = [f"198.51.100.{i}" for i in range(60)]
    m = {h: Member(trust, h).start() for h in "abc"}
    late: Member | None = None
    try:
        await until(lambda: all(x.counter.stats.members >= 3 and x.host.service.stats.connected
                                for x in m.values()), 20, what="online")
        for x in attackers:  # once on each host, in turn: the crossing host differs between attackers
            for h in "abc":
                m[h].counter.failure("sshd", A(x))
        await until(lambda: all(len(x.decided) == 60 for x in m.values()), 20, what="decided everywhere")
        by_c = {str(d.net) for d in m["a"].decided if d.by == "c"}
        assert by_c, "some attackers crossed by c"
        await until(lambda: all(x.counter.stats.crossed == sum(1 for d in x.decided if d.by == h)
                                for h, x in m.items()), what="counted")
        await m["c"].stop()  # a crossing host down; then the server comes back empty
        trust.srv.kill()
        trust.srv.start(wipe=True)
        late = Member(trust, "e").start()  # a new host: it gets what the others re-assert
        await until(lambda: len(late.host.sink.fleet) >= 60, 30,
                    what=f"all 60 at the new host (has {len(late.host.sink.fleet)})")
        assert {str(n) for n in late.host.sink.fleet} == {f"{x}/32" for x in attackers}
        assert by_c <= {str(n) for n in late.host.sink.fleet}  # c's crossings too, from a's and b's re-assert
        assert m["a"].host.service.stats.reasserted + m["b"].host.service.stats.reasserted >= 60
    finally:
        for mem in m.values():
            await mem.stop()
        if late is not None:
            await late.stop()
