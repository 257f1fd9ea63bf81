"""Fleet fault scenarios (issue #23), shared by the fault tier (tests/integration/test_fleet_faults.py, short
versions) and `make bench` (bench/bench_fleet_faults.py, the issue's sizes). Each returns its figures; the
caller asserts or records them.

Servers are real: redis-server and Sentinels (`redis-server --sentinel`) as child processes on free loopback
ports, killed by PID (tests/helpers/redis.py). Failover, NOREPLICAS and backlog run the real fleet service
(link, gate, catch-up, outbox in a real store) with an in-memory kernel (`TimedSink`: it also records when
each ban arrived); the empty-server and partition scenarios run real daemons in network namespaces
(tests/helpers/fleetlab.py) and look at their kernels.

What "acknowledged" means here: a ban the producing host's fleet service took (`submit_bans` counted it),
i.e. in its outbox. Nothing acknowledged may be missing on the other host at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis

from nftblockd.addr import IPNet
from nftblockd.fleet.catchup import FleetChange, LocalBan
from nftblockd.fleet.link import BLOCK_MS
from tests.helpers.certs import expired_client, make_certs
from tests.helpers.fleet import FakeSink, Host, fleet_config, until
from tests.helpers.fleetlab import FleetLab
from tests.helpers.netns import wait_for
from tests.helpers.redis import RedisServer


class TimedSink(FakeSink):
    """FakeSink that records when each apply happened and when each ban first arrived (monotonic)."""

    def __init__(self) -> None:
        super().__init__()
        self.applies: list[float] = []
        self.first: dict[IPNet, float] = {}
        self.removed: list[IPNet] = []

    async def apply_fleet(self, change: FleetChange) -> None:
        t = time.monotonic()
        before = set(self.fleet)
        await super().apply_fleet(change)
        self.applies.append(t)
        for n in self.fleet.keys() - before:
            self.first.setdefault(n, t)
        self.removed += [n for n in before if n not in self.fleet]

    async def fleet_view(self) -> tuple[Mapping[IPNet, float], Mapping[IPNet, LocalBan]]:
        return await super().fleet_view()


def nets(n: int, base: str) -> list[IPNet]:
    b = int(ipaddress.IPv4Address(base))
    return [ipaddress.IPv4Network((b + i, 32)) for i in range(n)]


def timed_host(cfg_kw: dict[str, object], host: str, clock: Callable[[], float] = time.time) -> Host:
    kw = dict(cfg_kw)
    url = str(kw.pop("url")) if "url" in kw else None
    cfg = fleet_config("prod", host, url, **kw)  # type: ignore[arg-type]
    h = Host(cfg, clock=clock, block_ms=BLOCK_MS)
    h.sink = h.service.sink = TimedSink()
    return h


def sink_of(h: Host) -> TimedSink:
    assert isinstance(h.sink, TimedSink)
    return h.sink


# -- Sentinel failover -------------------------------------------------------------------------------------

SENTINEL_CONF = ("sentinel monitor svc 127.0.0.1 {port} 2\nsentinel down-after-milliseconds svc 1000\n"
                 "sentinel failover-timeout svc 3000\nsentinel parallel-syncs svc 2\n")


@dataclass
class HA:
    """A primary, replicas and three Sentinels on loopback (ports fixed for the run, so restarts keep them)."""

    servers: list[RedisServer]
    sentinels: list[RedisServer]

    @classmethod
    def start(cls, tmp: Path, replicas: int = 2, server_conf: str = "") -> HA:
        primary = RedisServer(tmp / "n0", conf=server_conf).start()
        servers = [primary] + [RedisServer(tmp / f"n{i}", conf=f"{server_conf}\nreplicaof 127.0.0.1 {primary.port}")
                               .start() for i in range(1, replicas + 1)]
        sentinels = [RedisServer(tmp / f"s{i}", sentinel=True, conf=SENTINEL_CONF.format(port=primary.port)).start()
                     for i in range(3)]
        ha = cls(servers, sentinels)
        ha.wait_replicas(replicas)
        return ha

    def cfg(self) -> dict[str, object]:
        return {"sentinel_hosts": tuple(("127.0.0.1", s.port) for s in self.sentinels), "sentinel_service": "svc"}

    def primary_port(self) -> int:
        for s in self.sentinels:
            with contextlib.suppress(redis.RedisError, OSError), redis.Redis(port=s.port, socket_timeout=1) as r:
                addr = r.execute_command("SENTINEL", "get-master-addr-by-name", "svc")
                if addr:
                    return int(addr[1])
        raise AssertionError("no Sentinel names a primary")

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def role(self, s: RedisServer) -> str:
        with contextlib.suppress(redis.RedisError, OSError), redis.Redis(port=s.port, socket_timeout=1) as r:
            return str(r.execute_command("ROLE")[0].decode())
        return "down"

    def wait_replicas(self, n: int, limit: float = 30.0) -> None:
        def ok() -> bool:
            with contextlib.suppress(redis.RedisError, OSError), redis.Redis(port=self.primary_port(),
                                                                           socket_timeout=1) as r:
                info = r.info("replication")
                return int(info.get("connected_slaves", 0)) >= n and all(
                    info.get(f"slave{i}", {}).get("state") == "online" for i in range(n))
            return False
        wait_for(ok, limit, 0.05, f"{n} replicas online")

    def close(self) -> None:
        for s in (*self.sentinels, *self.servers):
            s.kill()


@dataclass
class FailoverFigures:
    stalls: list[float] = field(default_factory=list)  # per cycle: longest time B received nothing
    elections: list[float] = field(default_factory=list)  # per cycle: kill -> the Sentinels name a new primary
    acknowledged: int = 0
    missing: int = 0  # acknowledged on A, not on B at the end
    removed: int = 0  # bans B lost from its (fake) kernel
    refusals: int = 0  # A's publish failures (NOREPLICAS among them)
    drain: float = 0.0  # last cycle's writes accepted again -> every acknowledged ban on B
    # per cycle: every replica attached again (with min-replicas-to-write, the primary accepts writes by then
    # at the latest) -> B's first apply after it: how promptly the fleet resumes once the server lets it
    resumed: list[float] = field(default_factory=list)


async def failover(tmp: Path, cycles: int, rate: float = 200.0, *, min_replicas: bool = False,
                   drain_limit: float = 60.0) -> FailoverFigures:
    """A publishes `rate` bans/s; each cycle SIGKILLs the primary, waits for the Sentinels to name another,
    restarts the killed one (it comes back empty and is made a replica) and waits until it is online. With
    `min_replicas`, every server has `min-replicas-to-write 1`: the new primary refuses writes (NOREPLICAS)
    until a replica is attached to it."""
    conf = "min-replicas-to-write 1\nmin-replicas-max-lag 10\n" if min_replicas else ""
    ha = HA.start(tmp, 2, conf)
    a = timed_host(ha.cfg(), "a").start()
    b = timed_host(ha.cfg(), "b").start()
    fig = FailoverFigures()
    targets = nets(int(rate * (30 + 40 * cycles)), "10.64.0.0")  # more than the run can use
    produced = 0
    stop = asyncio.Event()

    async def produce() -> None:
        nonlocal produced
        t0 = time.monotonic()
        while not stop.is_set() and produced < len(targets):
            due = int((time.monotonic() - t0) * rate) + 1
            while produced < min(due, len(targets)):
                fig.acknowledged += a.service.submit_bans([(targets[produced], time.time() + 3600, "cli")])
                produced += 1
            await asyncio.sleep(0.005)

    try:
        await until(lambda: a.service.stats.connected and b.service.stats.connected, 20, "connected via Sentinel")
        prod = asyncio.create_task(produce())
        sb = sink_of(b)
        await until(lambda: len(sb.first) >= rate, 20, "steady flow to B")
        for _ in range(cycles):
            port = ha.primary_port()
            victim = ha.server(port)
            t_kill = time.monotonic()
            await asyncio.to_thread(victim.kill)
            await until(lambda: _names_other(ha, port), 30, "a new primary")  # noqa: B023 (awaited here)
            fig.elections.append(time.monotonic() - t_kill)
            await asyncio.sleep(0)
            await asyncio.to_thread(victim.start, wipe=True)
            await asyncio.to_thread(ha.wait_replicas, 2, 60)
            t_ok = time.monotonic()
            await until(lambda: sb.applies[-1] > t_ok + 0.5, 30, "flow again")  # noqa: B023 (awaited here)
            gaps = [y - x for x, y in zip(sb.applies, sb.applies[1:], strict=False) if y > t_kill - 1]
            fig.stalls.append(max(gaps, default=0.0))
            fig.resumed.append(min((x for x in sb.applies if x > t_ok), default=t_ok) - t_ok)
        stop.set()
        await prod
        t_end = time.monotonic()
        want = targets[:produced]
        with contextlib.suppress(AssertionError):
            await until(lambda: len(sb.fleet) >= len(want) and all(n in sb.fleet for n in want), drain_limit,
                        "every acknowledged ban on B")
        fig.drain = time.monotonic() - t_end
        fig.missing = sum(n not in sb.fleet for n in want)
        fig.removed = len(sb.removed)
        fig.refusals = a.service.stats.publish_failures
    finally:
        await a.stop()
        await b.stop()
        ha.close()
    return fig


def _names_other(ha: HA, port: int) -> bool:
    try:
        return ha.primary_port() != port
    except AssertionError:
        return False


# -- a backlog flushed after an outage ----------------------------------------------------------------------

@dataclass
class BacklogFigures:
    n: int
    delivered: float  # server back -> all n on B (s)
    refused: int  # B's gate refusals, for good
    deferred: int  # B's deferrals (each applied later)
    missing: int


async def backlog(tmp: Path, n: int, outage: float = 1200.0, limit: float = 120.0,
                  trust: Mapping[str, float] | None = None) -> BacklogFigures:
    """A decides `n` bans spread over the last `outage` seconds while the server is down (its outbox keeps
    them), then the server comes back: A flushes them at once. B (default trust limits: 2,000/s, burst 20,000;
    or `trust`: rate, burst) must apply every one."""
    srv = RedisServer(tmp / "r")
    srv.start()
    url = srv.url
    offset = [0.0]
    a = timed_host({"url": url}, "a", clock=lambda: time.time() - offset[0]).start()
    b = timed_host({"url": url, **(trust or {})}, "b").start()
    try:
        await until(lambda: a.service.stats.connected and b.service.stats.connected, 20, "connected")
        srv.kill()
        await until(lambda: not a.service.stats.connected, 20, "A notices")
        targets = nets(n, "10.96.0.0")
        end = time.time() + 3600
        for i, net in enumerate(targets):  # decided over the outage, as an attacked host would
            offset[0] = outage * (1 - i / n)
            a.service.submit_bans([(net, end, "jail:sshd")])
        offset[0] = 0.0
        await until(lambda: a.service.stats.outbox == n and not a.service._queue, 60, "A's outbox holds them")
        srv.start()
        t0 = time.monotonic()
        sb = sink_of(b)
        with contextlib.suppress(AssertionError):
            # (a count first: testing 30k addresses every 10 ms took half the CPU the hosts were timed on)
            await until(lambda: len(sb.fleet) >= n and all(x in sb.fleet for x in targets), limit,
                        "every backlogged ban on B")
        st = b.service.stats
        return BacklogFigures(n, time.monotonic() - t0, sum(v for (_op, r), v in st.received.items()
                                                            if r == "rate"), st.deferred_total,
                              sum(x not in sb.fleet for x in targets))
    finally:
        await a.stop()
        await b.stop()
        srv.kill()


# -- real daemons: a server restarted empty, a partition -----------------------------------------------------

@dataclass
class EmptyFigures:
    bans: int
    removed_on_b: int  # of A's bans, missing from B's kernel at the end or (by the set's count) at any poll
    polls: int
    reasserted_after: float  # A back -> all of A's bans in the server's `active` set again (s)


def empty_restart(lab: FleetLab, n: int) -> EmptyFigures:
    """A bans `n` addresses, B and C apply them. A stops (a host that is down), the server is killed and
    started empty. B's kernel is polled throughout (its set's element count: cheap; a removal lowers it, as
    nothing else is banned meanwhile), and listed in full at the end: none of A's bans may go. Then A comes
    back and re-asserts."""
    addrs = [f"10.77.{i // 256}.{i % 256}" for i in range(n)]
    a = lab.daemons["a"]
    r = a.cli("ban", "-", "--timeout", "1h", input="\n".join(addrs) + "\n")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: set(addrs) <= lab.banned("b") and set(addrs) <= lab.banned("c"), 60, 0.1, "A's bans on B, C")
    a.stop()
    assert lab.server is not None
    base = lab.count("b")
    snapshots = lab.fleet("b")["snapshots"]
    lab.server.kill()
    lab.server.start(wipe=True)
    polls = 0
    low = base
    deadline = time.monotonic() + 30
    settled_at: float | None = None
    while time.monotonic() < deadline:  # poll B's kernel until B took its snapshot of the empty server + 2 s
        low = min(low, lab.count("b"))
        polls += 1
        if settled_at is None and lab.fleet("b")["snapshots"] > snapshots:
            settled_at = time.monotonic()
        if settled_at is not None and time.monotonic() > settled_at + 2:
            break
    assert settled_at is not None, "B never took a snapshot of the empty server"
    missing = len(set(addrs) - lab.banned("b"))
    a.start()
    t0 = time.monotonic()
    wait_for(lambda: int(lab.redis_cli("ZCARD", lab.key("a", "active")).strip() or 0) >= n, 60, 0.05,
             "A re-asserted its bans")
    return EmptyFigures(n, max(missing, base - low), polls, time.monotonic() - t0)


@dataclass
class PartitionFigures:
    noticed: float  # cut -> B's status says disconnected (s)
    healed: float  # heal -> all of A's bans made meanwhile in B's kernel (s)
    bans: int
    removed_on_b: int


def _cut(lab: FleetLab, host: str, i: int, on: bool) -> None:
    """Drop everything between `host` and the server, in `host`'s own namespace (a table of the test's, never
    the machine's ruleset): silent, as a partition is, no RST."""
    ns = lab.nss[host]
    if on:
        server = f"10.210.{i}.1"
        rules = (f"table inet faultcut {{\n"
                 f" chain o {{ type filter hook output priority -10; ip daddr {server} drop; }}\n"
                 f" chain i {{ type filter hook input priority -10; ip saddr {server} drop; }}\n}}")
        ns.run("nft", "-f", "-", input=rules + "\n")
    else:
        ns.run("nft", "delete", "table", "inet", "faultcut")


def partition(lab: FleetLab, n: int, seconds: float) -> PartitionFigures:
    """B is cut from the server for `seconds` while A bans `n` addresses; then the cut heals."""
    addrs = [f"10.78.{i // 256}.{i % 256}" for i in range(n)]
    before = lab.banned("b")
    i_b = lab.hosts.index("b") + 1
    wait_for(lambda: lab.fleet("b")["connected"], 15, 0.05, "B connected")
    t_cut = time.monotonic()
    _cut(lab, "b", i_b, True)
    wait_for(lambda: not lab.fleet("b")["connected"], 30, 0.05, "B notices the partition")
    noticed = time.monotonic() - t_cut
    r = lab.daemons["a"].cli("ban", "-", "--timeout", "1h", input="\n".join(addrs) + "\n")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: lab.fleet("a")["outbox"] == 0, 60, 0.05, "A published")
    rest = seconds - (time.monotonic() - t_cut)
    if rest > 0:
        time.sleep(rest)  # the partition's length is the scenario, not a wait for a condition
    _cut(lab, "b", i_b, False)
    t_heal = time.monotonic()
    want = len(before) + n
    wait_for(lambda: lab.count("b") >= want, 60, 0.02, "all of A's bans on B")
    healed = time.monotonic() - t_heal
    return PartitionFigures(noticed, healed, n, len(before - lab.banned("b")))


# -- refusals: credentials and certificates ------------------------------------------------------------------

class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, str, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelname, record.getMessage(), record.exc_info is not None))


@dataclass(frozen=True)
class Refusal:
    case: str
    line: str  # the one warning the daemon logs (what the operator sees in the journal)
    refused: bool  # classed as a refusal of this host (not the network)
    traceback: bool


async def refusals(tmp: Path) -> list[Refusal]:
    """One TLS server (mutual TLS) with a password, and a host configured wrong in each way the issue lists."""
    from nftblockd.config import FleetTLS
    c = make_certs(tmp / "certs")
    other = make_certs(tmp / "other")
    expired = expired_client(tmp / "certs")
    srv = RedisServer(tmp / "tls", tls_port=True, conf=(
        f"tls-cert-file {c['server.crt']}\ntls-key-file {c['server.key']}\ntls-ca-cert-file {c['ca.crt']}\n"
        "tls-auth-clients yes\nuser default on >right ~* &* +@all\n")).start()
    pw = {}
    for name, text in (("right", "right"), ("wrong", "wrong")):
        p = tmp / f"pw-{name}"
        p.write_text(text + "\n")
        p.chmod(0o600)
        pw[name] = str(p)
    good = FleetTLS(ca=c["ca.crt"], cert=c["client.crt"], key=c["client.key"])
    cases = {
        "server certificate from another CA (wrong fleet.tls.ca)": (
            FleetTLS(ca=other["ca.crt"], cert=c["client.crt"], key=c["client.key"]), "right"),
        "client certificate from another CA": (
            FleetTLS(ca=c["ca.crt"], cert=other["client.crt"], key=other["client.key"]), "right"),
        "expired client certificate": (FleetTLS(ca=c["ca.crt"], cert=expired, key=c["client.key"]), "right"),
        "no client certificate": (FleetTLS(ca=c["ca.crt"]), "right"),
        "wrong password": (good, "wrong"),
    }
    out = []
    log = logging.getLogger("nftblockd.fleet")
    try:
        for case, (tls, password) in cases.items():
            lines = _Lines()
            log.addHandler(lines)
            h = timed_host({"url": srv.url, "tls": tls, "password_file": pw[password]}, "a").start()
            try:
                await until(lambda: any(lv == "WARNING" for lv, _m, _t in lines.lines), 20, case)  # noqa: B023
            finally:
                await h.stop()
                log.removeHandler(lines)
            warning = next(m for lv, m, _t in lines.lines if lv == "WARNING")
            out.append(Refusal(case, warning, "refused this host" in warning, any(t for _l, _m, t in lines.lines)))
    finally:
        srv.kill()
    return out


# -- a host publishing under another host's name -------------------------------------------------------------

@dataclass
class SpoofFigures:
    n: int
    applied_on_b: int  # the impostor's bans B enforces (as the real owner's)
    applied_on_a: int  # ... and A, the host whose name was used
    own_seen_by_a: int  # entries A counted as its own
    published_by_a: int
    unban_applied_on_b: bool  # an unban of A's real ban, forged under A's name, removed it on B


async def spoof(tmp: Path, n: int = 100) -> SpoofFigures:
    """Host M is configured with A's host id (a stolen or copied config, or a hostile host with write access):
    what B and A do with its bans, and with its unban of one of A's real bans."""
    srv = RedisServer(tmp / "r").start()
    a = timed_host({"url": srv.url}, "a").start()
    b = timed_host({"url": srv.url}, "b").start()
    m = timed_host({"url": srv.url}, "a").start()  # the impostor: A's name
    try:
        await until(lambda: all(h.service.stats.connected for h in (a, b, m)), 20, "connected")
        real = nets(1, "10.55.0.0")[0]
        a.service.submit_bans([(real, time.time() + 3600, "cli")])
        await until(lambda: real in sink_of(b).fleet, 10, "A's real ban on B")
        fake = nets(n, "10.56.0.0")
        m.service.submit_bans([(x, time.time() + 3600, "cli") for x in fake])
        await until(lambda: m.service.stats.outbox == 0 and m.service.stats.published >= n, 10, "M published")
        m.service.submit_unbans([real])
        with contextlib.suppress(AssertionError):
            await until(lambda: real not in sink_of(b).fleet, 5, "forged unban")
        await until(lambda: sum(x in sink_of(b).fleet for x in fake) == n, 10, "B applied them")
        own = sum(v for (_op, r), v in a.service.stats.received.items() if r == "own")
        return SpoofFigures(n, sum(x in sink_of(b).fleet for x in fake), sum(x in sink_of(a).fleet for x in fake),
                            own, a.service.stats.published, real not in sink_of(b).fleet)
    finally:
        for h in (a, b, m):
            await h.stop()
        srv.kill()


__all__ = ["HA", "BacklogFigures", "EmptyFigures", "FailoverFigures", "PartitionFigures", "Refusal", "SpoofFigures",
           "TimedSink", "backlog", "empty_restart", "failover", "partition", "refusals", "spoof"]
