"""The fleet service under server faults, against an in-memory engine (no server, no kernel): a refused
publish stays in the outbox until a write is acknowledged; the re-assert after a snapshot goes through the
outbox, so a primary that refuses writes never stops receiving; a demoted primary drops the link; a
rate-refused event is deferred and applied later, not dropped (issue #23)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence

import pytest

from nftblockd.addr import parse_target
from nftblockd.allowlist import build_allowlist
from nftblockd.fleet import service as service_mod
from nftblockd.fleet.catchup import FleetChange, ServerView, StreamId, format_id
from nftblockd.fleet.codec import FleetEvent, encode
from nftblockd.fleet.link import OPERATOR, Entry, LinkError, OwnHealth, SnapshotData, SnapshotPart
from nftblockd.fleet.rawread import RawEntries
from nftblockd.fleet.service import FleetService, parse_cursors
from tests.helpers.fleet import FakeSink, fleet_config, until
from tests.helpers.store import memory_store

NOW = 1_700_000_000.0


class MemoryEngine:
    """Every member's stream and `active` set in memory (schema 2: one of each per owner); the service under
    test is host "a" (`entries`, `active`: its own). `refuse` makes publishes fail with that LinkError."""

    def __init__(self, run_id: str = "R1", own: str = "a") -> None:
        self.run_id = run_id
        self.own = own
        self.streams: dict[str, list[Entry]] = {}
        self.actives: dict[str, dict[str, float]] = {}
        self.epoch: str | None = None
        self.server_ms = int(NOW * 1000)
        self.refuse: LinkError | None = None
        self.connected = False
        self.closes = 0
        self.refused = 0
        self.grew = asyncio.Event()
        self.seq = 0
        self.asked: list[str] = []

    @property
    def entries(self) -> list[Entry]:
        return self.streams.get(self.own, [])

    @property
    def active(self) -> dict[str, float]:
        return self.actives.setdefault(self.own, {})

    def create(self, *owners: str) -> None:
        for o in owners:
            self.streams.setdefault(o, [])

    def wipe(self, run_id: str) -> None:
        """The server restarted empty."""
        self.run_id, self.streams, self.actives, self.epoch = run_id, {}, {}, None

    def last(self, owner: str) -> StreamId:
        s = self.streams.get(owner)
        return s[-1][0] if s else (0, 0)

    async def connect(self) -> str:
        self.connected = True
        return self.run_id

    async def close(self) -> None:
        self.connected = False
        self.closes += 1
        self.grew.set()

    async def role(self) -> str:
        return "master"

    async def members(self) -> list[str]:
        return sorted(self.streams)

    async def server_views(self, cursors: Mapping[str, StreamId | None]) -> tuple[int, dict[str, ServerView]]:
        views = {}
        for o, cursor in cursors.items():
            s = self.streams.get(o, [])
            holds = any(sid == cursor for sid, _f in s)
            views[o] = ServerView(self.run_id, s[0][0] if s else None, self.last(o), 0, holds)
        return self.server_ms, views

    async def scores(self, members: Sequence[str]) -> tuple[dict[str, float], dict[str, float]]:
        self.asked = list(members)
        return {m: self.active[m] for m in members if m in self.active}, {}

    def add(self, ev: FleetEvent, ms: int, owner: str | None = None) -> None:
        self.seq += 1
        fields = {k.encode(): v.encode() for k, v in encode(ev).items()}
        o = owner or ev.origin
        self.streams.setdefault(o, []).append(((ms, self.seq), fields))
        if ev.op == "ban":
            self.actives.setdefault(o, {})[fields[b"net"].decode()] = ev.until
        self.grew.set()

    async def publish(self, events: Sequence[FleetEvent], now: float) -> None:
        if not self.connected:
            raise LinkError("not connected to the fleet server")
        if self.refuse is not None:
            self.refused += 1
            raise self.refuse
        for ev in events:
            self.add(ev, int(now * 1000), self.own)

    async def read(self, after: Mapping[str, StreamId], count: int, block_ms: int | None = None
                   ) -> list[tuple[str, Sequence[Entry]]]:
        if not self.connected:
            raise LinkError("not connected to the fleet server")

        def now() -> list[tuple[str, Sequence[Entry]]]:
            got = [(o, [e for e in self.streams.get(o, []) if e[0] > cur][:count]) for o, cur in after.items()]
            return [(o, es) for o, es in got if es]

        out = now()
        if not out:
            self.grew.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.grew.wait(), (block_ms or 50) / 1000)
            if not self.connected:
                raise LinkError("connection closed")
        return out

    async def snapshot(self, owners: Sequence[str], now: float) -> SnapshotData:
        return SnapshotData(self.run_id, {o: SnapshotPart(self.last(o), {
            k: v for k, v in self.actives.get(o, {}).items() if v > now}, {}) for o in owners})

    async def health(self, now: float) -> OwnHealth:
        own = self.streams.get(self.own)
        return OwnHealth(self.epoch, sum(1 for v in self.active.values() if v > now),
                         self.last(self.own) if own is not None else None, self.server_ms)

    async def mark_epoch(self, token: str) -> None:
        self.epoch = token

    async def reset_stream(self) -> None:
        self.streams.pop(self.own, None)

    async def announce(self) -> None:
        self.streams.setdefault(self.own, [])


class Clock:
    """The service's clock: still, or (`step`) moving on by that much each time it is read."""

    def __init__(self) -> None:
        self.t = NOW
        self.step = 0.0

    def __call__(self) -> float:
        self.t += self.step
        return self.t


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(service_mod, "retry_delay", lambda down_for: 0.01)
    monkeypatch.setattr(service_mod, "MAINTAIN_INTERVAL", 0.02)  # the checks of the server come round quickly
    monkeypatch.setattr(service_mod, "DISCOVER_INTERVAL", 0.02)
    yield


def make(engine: MemoryEngine, clock: Clock, **kw: object) -> tuple[FleetService, FakeSink]:
    sink = FakeSink()
    cfg = fleet_config("prod", "a", "redis://127.0.0.1:1", **kw)
    svc = FleetService(cfg, engine, memory_store(), sink, build_allowlist([]), clock=clock,
                       cursor_interval=0.0)
    return svc, sink


async def run(svc: FleetService) -> asyncio.Task[None]:
    task = asyncio.create_task(svc.run())
    await until(lambda: svc.stats.connected, 5.0, "connected")
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def _bans(*addrs: str) -> list[tuple[object, float | None, str]]:
    return [(parse_target(a), NOW + 600, "cli") for a in addrs]


async def test_a_publish_refused_with_noreplicas_stays_in_the_outbox_until_acknowledged() -> None:
    engine, clock = MemoryEngine(), Clock()
    svc, _sink = make(engine, clock)
    task = await run(svc)
    try:
        engine.refuse = LinkError("the fleet server refused the write: not enough replicas (NOREPLICAS ...)")
        svc.submit_bans(_bans("203.0.113.1", "203.0.113.2"))  # type: ignore[arg-type]
        await until(lambda: engine.refused >= 3, 5.0, "refused publishes retried")
        assert engine.entries == [] and svc.state.fleet_outbox_size() == 2
        assert svc.stats.connected  # a refused write is not a lost server: receiving goes on
        engine.refuse = None
        await until(lambda: len(engine.entries) == 2, 5.0, "published once the server accepts writes")
        await until(lambda: svc.stats.outbox == 0, 5.0, "outbox empty")
    finally:
        await stop(task)


async def test_a_demoted_primary_drops_the_link_and_the_service_connects_again() -> None:
    engine, clock = MemoryEngine(), Clock()
    svc, _sink = make(engine, clock)
    task = await run(svc)
    try:
        engine.refuse = LinkError("the fleet server is not the primary: READONLY", not_primary=True)
        svc.submit_bans(_bans("203.0.113.1"))  # type: ignore[arg-type]
        await until(lambda: svc.stats.connects >= 2, 5.0, "reconnected after READONLY")
        engine.refuse = None
        await until(lambda: len(engine.entries) == 1, 5.0, "published to the (new) primary")
    finally:
        await stop(task)


async def test_reassert_through_the_outbox_keeps_receiving_while_writes_are_refused() -> None:
    """After a failover to a primary that refuses writes (NOREPLICAS), the catch-up's re-assert used to raise
    and fail the catch-up: no host with own bans received anything until writes were accepted again."""
    engine, clock = MemoryEngine("R1"), Clock()
    svc, sink = make(engine, clock)
    task = await run(svc)
    svc.submit_bans(_bans("203.0.113.1", "203.0.113.2"))  # type: ignore[arg-type]
    await until(lambda: len(engine.entries) == 2 and svc.stats.outbox == 0, 5.0, "published")
    await stop(task)
    await svc.close()
    # the new primary lost both and refuses writes
    engine.wipe("R2")
    engine.refuse = LinkError("the fleet server refused the write: not enough replicas (NOREPLICAS)")
    task = await run(svc)
    try:
        assert svc.stats.reasserted == 2
        other = FleetEvent("ban", parse_target("198.51.100.7"), NOW + 600, "b", 1, "cli", int(NOW * 1000))
        engine.add(other, int(NOW * 1000))
        await until(lambda: sink.has(other.net), 5.0, "b's ban received while writes are refused")
        assert svc.state.fleet_outbox_size() == 2
        engine.refuse = None
        await until(lambda: {"203.0.113.1", "203.0.113.2"} <= set(engine.active), 5.0, "re-asserted")
    finally:
        await stop(task)


async def test_rate_refused_events_are_deferred_and_applied_later_not_dropped() -> None:
    engine, clock = MemoryEngine(), Clock()
    engine.create("b")
    svc, sink = make(engine, clock, rate=10.0, burst=5)
    task = await run(svc)
    try:
        ms = int(NOW * 1000)
        for i in range(30):  # a flood decided now: 5 at once, the rest deferred
            engine.add(FleetEvent("ban", parse_target(f"198.51.100.{i}"), NOW + 600, "b", i, "cli", ms), ms)
        await until(lambda: svc.stats.deferred_total == 25, 5.0, "deferred")
        assert len(sink.fleet) == 5 and svc.stats.deferred == 25
        assert svc.status()["rejected"] == {}
        clock.step = 0.5  # time passes: 10 tokens a second refill the bucket, 5 at most at once
        await until(lambda: len(sink.fleet) == 30, 5.0, "every deferred ban applied")
        assert svc.stats.deferred == 0 and svc.stats.received[("ban", "applied")] == 30
    finally:
        await stop(task)


async def test_a_deferred_ban_does_not_outlive_a_newer_unban() -> None:
    engine, clock = MemoryEngine(), Clock()
    engine.create("b", OPERATOR)
    svc, sink = make(engine, clock, rate=10.0, burst=1)
    task = await run(svc)
    try:
        ms = int(NOW * 1000)
        x = parse_target("198.51.100.9")
        engine.add(FleetEvent("ban", parse_target("198.51.100.1"), NOW + 600, "b", 1, "cli", ms), ms)
        engine.add(FleetEvent("ban", x, NOW + 600, "b", 2, "cli", ms), ms)  # deferred
        await until(lambda: svc.stats.deferred == 1, 5.0, "deferred")
        clock.t += 0.05  # not yet a token
        # the operator's unban (another origin: passes; a host's unban lifts only its own bans)
        engine.add(FleetEvent("unban", x, 0.0, "operator", 1, "cli", ms + 100), ms + 100, OPERATOR)
        await until(lambda: svc.stats.received[("unban", "applied")] == 1, 5.0, "unban applied")
        assert svc.stats.deferred == 0
        clock.t += 10
        await asyncio.sleep(0.3)  # (a bound on what must NOT happen: retries come every 0.2 s at most)
        assert x not in sink.fleet and math.isfinite(NOW)
    finally:
        await stop(task)


async def test_the_saved_cursor_stays_before_the_first_deferred_entry() -> None:
    engine, clock = MemoryEngine(), Clock()
    engine.create("b")
    svc, _sink = make(engine, clock, rate=10.0, burst=1)
    task = await run(svc)
    try:
        ms = int(NOW * 1000)
        for i in range(3):
            engine.add(FleetEvent("ban", parse_target(f"198.51.100.{i}"), NOW + 600, "b", i, "cli", ms), ms)
        await until(lambda: svc.stats.deferred == 2, 5.0, "deferred")
        await svc.save_cursor()
        saved = svc.state.fleet_cursor("prod")
        assert saved is not None
        cursors = parse_cursors(saved[1])
        assert cursors is not None
        assert (ms - 1, 0) <= cursors["b"] < (ms, 2)  # entries 2 and 3 were deferred: read again
    finally:
        await stop(task)


async def test_a_failover_to_a_server_holding_the_cursor_replays_and_reasserts_only_what_it_lacks() -> None:
    """A promoted replica holds the stream (same entry ids) but may lack the last writes: no snapshot (its
    cost grows with every active ban, on every host), a replay from the cursor, and a re-assert of own bans
    the new primary lacks, asked for by name."""
    engine, clock = MemoryEngine("R1"), Clock()
    engine.create("b")
    svc, sink = make(engine, clock)
    task = await run(svc)
    svc.submit_bans(_bans("203.0.113.1", "203.0.113.2"))  # type: ignore[arg-type]
    await until(lambda: len(engine.entries) == 2 and svc.stats.outbox == 0, 5.0, "published")
    engine.add(FleetEvent("ban", parse_target("198.51.100.6"), NOW + 600, "b", 1, "cli", int(NOW * 1000)),
               int(NOW * 1000))
    await until(lambda: svc._cursors.get("b") == engine.last("b"), 5.0, "cursor at b's last entry")
    await stop(task)
    await svc.close()
    engine.run_id = "R2"  # promoted: the same stream, but the last ban's sorted-set write was lost
    del engine.active["203.0.113.2"]
    task = await run(svc)
    try:
        assert svc.stats.snapshots == 1 and svc.stats.replays == 1 and svc.stats.reasserted == 1
        assert sorted(engine.asked) == ["203.0.113.1", "203.0.113.2"]
        await until(lambda: "203.0.113.2" in engine.active, 5.0, "the lost ban re-asserted")
        other = FleetEvent("ban", parse_target("198.51.100.7"), NOW + 600, "b", 1, "cli", int(NOW * 1000))
        engine.add(other, int(NOW * 1000))
        await until(lambda: sink.has(other.net), 5.0, "following the new primary")
    finally:
        await stop(task)


async def test_the_periodic_cursor_save_runs_beside_the_loop_and_never_past_the_saved_bans() -> None:
    """The receive loop does not wait for a cursor save (the queued ban saves and a commit); the save holds
    the position it was started at, not one a batch applied meanwhile moved to (its saves are not settled)."""
    engine, clock = MemoryEngine(), Clock()
    engine.create("b")
    svc, sink = make(engine, clock)
    held = asyncio.Event()
    saves: list[str] = []
    settle_calls = 0

    async def settled() -> None:  # the sink's saves: held until the test lets them go
        nonlocal settle_calls
        settle_calls += 1
        await held.wait()

    sink.settled = settled  # type: ignore[method-assign]
    real_set = svc.state.set_fleet_cursor

    def set_cursor(fleet: str, run_id: str, last_id: str) -> None:
        saves.append(last_id)
        real_set(fleet, run_id, last_id)

    svc.state.set_fleet_cursor = set_cursor  # type: ignore[method-assign]
    held.set()  # the start's snapshot saves its cursor inline
    task = await run(svc)
    try:
        held.clear()
        settle_calls = 0
        saves.clear()
        ms = int(NOW * 1000)
        engine.add(FleetEvent("ban", parse_target("198.51.100.1"), NOW + 600, "b", 1, "cli", ms), ms)
        await until(lambda: settle_calls >= 1, 5.0, "a cursor save waiting for the first batch's saves")
        first = engine.last("b")
        engine.add(FleetEvent("ban", parse_target("198.51.100.2"), NOW + 600, "b", 2, "cli", ms + 1), ms + 1)
        # applied while the save waits: the loop was not held by it
        await until(lambda: parse_target("198.51.100.2") in sink.fleet, 5.0, "the second batch applied")
        assert saves == []
        held.set()
        await until(lambda: len(saves) >= 2, 5.0, "both positions saved, in order")
        saved = [parse_cursors(t) for t in saves]
        assert saved[0] is not None and saved[-1] is not None
        assert saved[0]["b"] == first and saved[-1]["b"] == engine.last("b")
    finally:
        held.set()
        await stop(task)


class RawEngine(MemoryEngine):
    """Reads come as the link hands them (`RawEntries`: ids parsed when read), `bad` ids put in place of the
    entries' own at those stream positions (the server could not have sent them: a broken server or proxy)."""

    def __init__(self) -> None:
        super().__init__()
        self.bad: dict[StreamId, bytes] = {}

    async def read(self, after: Mapping[str, StreamId], count: int, block_ms: int | None = None
                   ) -> list[tuple[str, Sequence[Entry]]]:
        return [(o, RawEntries([[self.bad.get(sid, format_id(sid).encode()), [x for kv in f.items() for x in kv]]
                                for sid, f in out])) for o, out in await super().read(after, count, block_ms)]


def _ban(addr: str) -> FleetEvent:
    return FleetEvent("ban", parse_target(addr), NOW + 600, "b", 1, "cli", int(NOW * 1000))


@pytest.mark.parametrize("bad_at", [0, 1, 2])  # of three entries read together: first, middle, last
async def test_an_entry_with_a_stream_id_the_server_could_not_send_is_counted_and_skipped(bad_at: int) -> None:
    """`RawEntries` parses ids only when they are read, in the receive loop: a bad one is counted (`bad_id`)
    and its entry skipped, the others of the read applied; the loop goes on (after one it cannot move past,
    the last of a read, it reconnects: no spin on the same read)."""
    engine, clock = RawEngine(), Clock()
    engine.create("b")
    svc, sink = make(engine, clock)
    task = await run(svc)
    try:
        evs = [_ban(f"198.51.100.{i}") for i in range(3)]
        for ev in evs:
            engine.add(ev, int(NOW * 1000))
        engine.bad[engine.streams["b"][bad_at][0]] = b"not-an-id"
        good = [ev for i, ev in enumerate(evs) if i != bad_at]
        await until(lambda: all(sink.has(ev.net) for ev in good), 5.0, "the others applied")
        await until(lambda: svc.stats.received[("?", "bad_id")] >= 1, 5.0, "counted")
        later = _ban("198.51.100.9")
        engine.add(later, int(NOW * 1000))
        await until(lambda: sink.has(later.net), 5.0, "the loop goes on")
        assert not sink.has(evs[bad_at].net) and not task.done()
        assert svc.stats.received[("ban", "applied")] == 3
    finally:
        await stop(task)


class LoggingEngine(MemoryEngine):
    """Logs each read as it is asked for (its task has started: with a server, the request is sent)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, StreamId]] = []

    async def read(self, after: Mapping[str, StreamId], count: int, block_ms: int | None = None
                   ) -> list[tuple[str, Sequence[Entry]]]:
        self.log.append(("read", after.get("b", (0, 0))))
        return await super().read(after, count, block_ms)


async def test_the_next_read_is_asked_for_before_a_batch_is_applied() -> None:
    """The receive loop sends the read after a batch before applying it, so the server prepares the next reply
    while this host applies (sent only at the apply's first wait, the read waited behind the apply's own work:
    ~15 ms of every 10k batch of a catch-up)."""
    engine, clock = LoggingEngine(), Clock()
    engine.create("b")
    svc, sink = make(engine, clock)
    applied = sink.apply_fleet

    async def apply_fleet(change: FleetChange) -> None:
        engine.log.append(("apply", engine.last("b")))
        await applied(change)

    sink.apply_fleet = apply_fleet  # type: ignore[method-assign]
    task = await run(svc)
    try:
        ms = int(NOW * 1000)
        engine.add(FleetEvent("ban", parse_target("198.51.100.1"), NOW + 600, "b", 1, "cli", ms), ms)
        await until(lambda: sink.has(parse_target("198.51.100.1")), 5.0, "the batch applied")
        last = engine.last("b")
        assert ("apply", last) in engine.log
        assert engine.log.index(("read", last)) < engine.log.index(("apply", last))
    finally:
        await stop(task)


async def test_a_lost_epoch_is_healed_without_a_reconnect_and_the_hook_told() -> None:
    """#39 item 1: the server lost this host's state (its epoch marker and `active` gone): the own bans are
    re-asserted while the link stays up, and `on_heal` (fleet counting's hook) hears of it."""
    engine, clock = MemoryEngine(), Clock()
    heard: list[str] = []

    async def on_heal(why: str) -> None:
        heard.append(why)

    svc, _sink = make(engine, clock)
    svc.on_heal = on_heal
    task = await run(svc)
    try:
        svc.submit_bans(_bans("203.0.113.1", "203.0.113.2"))  # type: ignore[arg-type]
        await until(lambda: len(engine.active) == 2 and svc.stats.outbox == 0, 5.0, "published")
        await until(lambda: svc.state.fleet_own_active(NOW, 0) != [], 5.0, "marked published")
        engine.epoch = None
        engine.active.clear()
        await until(lambda: len(engine.active) == 2, 5.0, "re-asserted")
        assert svc.stats.heals == 1 and svc.stats.connects == 1 and heard == ["epoch marker gone"]
    finally:
        await stop(task)
