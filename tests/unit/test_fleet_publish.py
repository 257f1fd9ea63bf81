"""The fleet publisher's rounds against a fake engine and the real store: one store call per round (mark the
previous round, queue, read), what arrives during a publish is queued at once and goes with the next
MULTI (never two MULTIs at once), and events are never lost to a failing store call or a refused MULTI.
Once a round has read every pending row and the publisher knows the next oseq (`run` reads it), what comes
next is published from memory while its rows are written (`_fast_round`), never before the daemon's own
saves (`saved`), and never marked published before its rows are written. Such a round's store call goes on
behind the next round (store calls one at a time, in round order); a failed one puts its events and the next
round's back in the queue in order.
No server: `_publish_pending` is driven directly."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from nftblockd.addr import parse_target
from nftblockd.allowlist import build_allowlist
from nftblockd.fleet import service as service_module
from nftblockd.fleet.codec import FleetEvent
from nftblockd.fleet.link import LinkError
from nftblockd.fleet.service import FleetService, StoreRunner
from nftblockd.state.store import OutboxItem, OutboxRow, Store, StoreError
from tests.helpers.fleet import FakeSink, fleet_config
from tests.helpers.store import memory_store

NOW = 1_700_000_000.0


class Engine:
    """Records what is published; `hold` keeps a publish waiting until released."""

    def __init__(self) -> None:
        self.published: list[list[FleetEvent]] = []
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.out = 0  # publishes under way now
        self.most_out = 0
        self.refuse: Exception | None = None  # the next publish fails with this
        self.refuse_call: int | None = None  # ... or the n-th one (from 0)
        self.calls = 0

    async def publish(self, events: Sequence[FleetEvent], now: float) -> None:
        n, self.calls = self.calls, self.calls + 1
        if n == self.refuse_call:
            self.refuse = LinkError("NOREPLICAS")
        self.out += 1
        self.most_out = max(self.most_out, self.out)
        try:
            self.entered.set()
            if self.hold is not None:
                await self.hold.wait()
            if self.refuse is not None:
                exc, self.refuse = self.refuse, None
                raise exc
            self.published.append(list(events))
        finally:
            self.out -= 1


class CountingStore:
    """The real store, with the fleet calls counted (each is one worker-thread hop and one transaction)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls: list[str] = []
        self.fail_rounds = 0
        self.hold: threading.Event | None = None  # a round waits for it (on the store thread)
        self.fail_call: int | None = None  # the n-th round call (from 1) fails

    def fleet_round(self, published: Iterable[int], items: Iterable[OutboxItem], now: float,
                    limit: int = 10000, first: int | None = None, noted: Sequence[OutboxItem] = (),
                    noted_first: int | None = None) -> list[OutboxRow]:
        self.calls.append("round")
        if self.hold is not None:
            assert self.hold.wait(10)  # a bound on a hang
        if self.fail_rounds or self.calls.count("round") == self.fail_call:
            self.fail_rounds = max(0, self.fail_rounds - 1)
            raise StoreError("io", "s.db", "state database s.db failed (injected)")
        return self.store.fleet_round(published, items, now, limit, first, noted, noted_first)

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.store, name)

        def counted(*a: Any, **kw: Any) -> Any:
            self.calls.append(name.removeprefix("fleet_"))
            return fn(*a, **kw)

        return counted


def service(saved: Callable[[], asyncio.Future[bool]] | None = None, run_store: StoreRunner | None = None
            ) -> tuple[FleetService, Engine, CountingStore]:
    engine, store = Engine(), CountingStore(memory_store())
    svc = FleetService(fleet_config("prod", "a", "redis://127.0.0.1:1"), engine,  # type: ignore[arg-type]
                       store, FakeSink(), build_allowlist([]), clock=lambda: NOW, saved=saved, run_store=run_store)
    return svc, engine, store


def bans(*addrs: str) -> list[tuple[Any, float | None, str]]:
    return [(parse_target(a), NOW + 600, "cli") for a in addrs]


async def test_a_round_is_one_store_call_and_what_comes_meanwhile_goes_next() -> None:
    svc, engine, store = service()
    assert svc.submit_bans(bans("203.0.113.1", "203.0.113.2")) == 2
    engine.hold = asyncio.Event()
    task = asyncio.create_task(svc._publish_pending())
    await engine.entered.wait()  # the first round is being published: these wait for the next
    svc.submit_bans(bans("203.0.113.3", "203.0.113.4", "203.0.113.5"))
    engine.hold.set()
    await task
    assert [[str(e.net) for e in p] for p in engine.published] == [
        ["203.0.113.1/32", "203.0.113.2/32"], ["203.0.113.3/32", "203.0.113.4/32", "203.0.113.5/32"]]
    # round 1 (queue + read), round 2 (queue + read, while round 1's MULTI is out), then both marked alone
    assert store.calls == ["round", "round", "mark_published"]
    assert store.store.fleet_outbox_size() == 0 and svc.stats.published == 5 and svc.stats.outbox == 0


async def test_what_comes_during_a_publish_is_queued_at_once_and_published_after_it() -> None:
    """A submission's store call runs while the MULTI before it is out (it waited for that MULTI before), and
    its own MULTI leaves once that one is acknowledged: never two at once."""
    svc, engine, store = service()
    svc.submit_bans(bans("203.0.113.1"))
    engine.hold = asyncio.Event()
    task = asyncio.create_task(svc._publish_pending())
    await engine.entered.wait()
    svc.submit_bans(bans("203.0.113.2", "203.0.113.3"))
    await until(lambda: store.calls == ["round", "round"])  # queued (durable) while the first MULTI is held
    assert store.store.fleet_outbox_size() == 3 and engine.published == []
    engine.hold.set()
    await task
    assert [[str(e.net) for e in p] for p in engine.published] == [
        ["203.0.113.1/32"], ["203.0.113.2/32", "203.0.113.3/32"]]
    assert engine.most_out == 1 and svc.stats.published == 3
    assert store.store.fleet_outbox_size() == 0 and store.calls == ["round", "round", "mark_published"]


async def test_a_refused_publish_leaves_what_was_read_behind_it_pending_in_order() -> None:
    svc, engine, store = service()
    svc.submit_bans(bans("203.0.113.1"))
    engine.hold = asyncio.Event()
    engine.refuse = LinkError("NOREPLICAS")
    task = asyncio.create_task(svc._publish_pending())
    await engine.entered.wait()
    svc.submit_bans(bans("203.0.113.2"))
    await until(lambda: store.calls == ["round", "round"])  # the second round read both rows
    engine.hold.set()
    with pytest.raises(LinkError):
        await task
    assert engine.published == [] and store.store.fleet_outbox_size() == 2
    await svc._publish_pending()
    assert [[str(e.net) for e in p] for p in engine.published] == [["203.0.113.1/32", "203.0.113.2/32"]]
    assert store.store.fleet_outbox_size() == 0 and svc.stats.published == 2


async def test_a_backlog_larger_than_a_round_is_published_whole_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds of PUBLISH_BATCH rows, each published and marked before the next is read (a read cut at the
    limit, taken while its rows' MULTI was out, would read only those rows again and stop)."""
    monkeypatch.setattr(service_module, "PUBLISH_BATCH", 3)
    svc, engine, store = service()
    svc.submit_bans(bans(*(f"203.0.113.{i}" for i in range(1, 8))))
    await svc._publish_pending()
    assert [[str(e.net) for e in p] for p in engine.published] == [
        [f"203.0.113.{i}/32" for i in grp] for grp in ((1, 2, 3), (4, 5, 6), (7,))]
    assert engine.most_out == 1 and store.store.fleet_outbox_size() == 0 and svc.stats.published == 7


async def until(cond: Callable[[], bool]) -> None:
    for _ in range(1000):  # a bound on a hang, not a timing
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def test_events_taken_for_a_failing_store_call_are_kept_for_the_next() -> None:
    svc, engine, store = service()
    svc.submit_bans(bans("203.0.113.1", "203.0.113.2"))
    store.fail_rounds = 1
    with pytest.raises(StoreError):
        await svc._publish_pending()
    svc.submit_bans(bans("203.0.113.3"))
    await svc._publish_pending()
    assert [[str(e.net) for e in p] for p in engine.published] == [
        ["203.0.113.1/32", "203.0.113.2/32", "203.0.113.3/32"]]  # in submission order
    assert store.store.fleet_outbox_size() == 0


async def fast(saved: Callable[[], asyncio.Future[bool]] | None = None
               ) -> tuple[FleetService, Engine, CountingStore, asyncio.Task[None]]:
    """A publisher that knows the next oseq, its first round (one ban) published and held: the next round
    is a fast one."""
    svc, engine, store = service(saved)
    svc._online.set()
    await svc._load_oseq()
    assert store.calls == ["next_oseq"]
    store.calls.clear()
    svc.submit_bans(bans("203.0.113.1"))
    engine.hold = asyncio.Event()
    task = asyncio.create_task(svc._publish_pending())
    await engine.entered.wait()
    engine.entered.clear()
    return svc, engine, store, task


def release(engine: Engine) -> None:
    assert engine.hold is not None
    engine.hold.set()


def published(engine: Engine) -> list[list[tuple[str, int]]]:
    return [[(str(e.net), e.oseq) for e in p] for p in engine.published]


async def test_a_round_after_a_clean_read_publishes_from_memory_while_its_rows_are_written() -> None:
    svc, engine, store, task = await fast()
    store.hold = threading.Event()
    svc.submit_bans(bans("203.0.113.2", "203.0.113.3"))
    await until(lambda: store.calls == ["round", "round"])  # the second round's store call is under way
    release(engine)
    await until(lambda: len(engine.published) == 2)  # ... and its MULTI left before it was done
    assert published(engine) == [[("203.0.113.1/32", 1)], [("203.0.113.2/32", 2), ("203.0.113.3/32", 3)]]
    assert store.calls == ["round", "round"]
    store.hold.set()
    await task
    # the first MULTI marked by the second round, the second by a call of its own once its rows were written
    assert store.calls == ["round", "round", "mark_published"]
    assert store.store.fleet_outbox_size() == 0 and svc.stats.published == 3 and len(engine.published) == 2
    assert [r.oseq for r in store.store.fleet_own_active(NOW, NOW - 1)] == [1, 2, 3]


async def test_nothing_is_published_from_memory_before_the_daemons_saves_are_written() -> None:
    saves: list[asyncio.Future[bool]] = []

    def saved() -> asyncio.Future[bool]:
        saves.append(asyncio.get_running_loop().create_future())
        return saves[-1]

    svc, engine, store, task = await fast(saved)
    svc.submit_bans(bans("203.0.113.2"))
    release(engine)
    await until(lambda: bool(saves) and len(store.calls) == 2)
    await asyncio.sleep(0.01)  # (room for a wrong publish to happen: none may)
    assert len(engine.published) == 1
    saves[0].set_result(True)
    await task
    assert published(engine) == [[("203.0.113.1/32", 1)], [("203.0.113.2/32", 2)]]
    assert store.store.fleet_outbox_size() == 0


async def test_a_save_that_failed_sends_the_round_the_plain_way_after_its_rows_are_written() -> None:
    def failed() -> asyncio.Future[bool]:
        f = asyncio.get_running_loop().create_future()
        f.set_result(False)
        return f

    svc, engine, store, task = await fast(failed)
    store.hold = threading.Event()
    svc.submit_bans(bans("203.0.113.2"))
    await until(lambda: len(store.calls) == 2)
    release(engine)
    await until(lambda: svc.stats.published == 1)
    await asyncio.sleep(0.01)
    assert len(engine.published) == 1  # not from memory: waits for the store call
    store.hold.set()
    await task
    assert published(engine) == [[("203.0.113.1/32", 1)], [("203.0.113.2/32", 2)]]
    assert store.store.fleet_outbox_size() == 0 and svc.stats.published == 2


async def test_a_refused_fast_publish_leaves_its_rows_pending_and_they_go_next_time() -> None:
    svc, engine, store, task = await fast()
    engine.refuse_call = 1  # the MULTI from memory
    svc.submit_bans(bans("203.0.113.2"))
    await until(lambda: len(store.calls) == 2)
    release(engine)
    with pytest.raises(LinkError):
        await task
    # the first was acknowledged but not marked yet: both stay pending (the first goes again: harmless)
    assert published(engine) == [[("203.0.113.1/32", 1)]] and store.store.fleet_outbox_size() == 2
    await svc._publish_pending()
    assert published(engine) == [[("203.0.113.1/32", 1)], [("203.0.113.1/32", 1), ("203.0.113.2/32", 2)]]
    assert store.store.fleet_outbox_size() == 0


async def test_a_failed_store_call_of_a_fast_round_keeps_its_events_and_forgets_the_numbering() -> None:
    svc, engine, store, task = await fast()
    store.fail_rounds = 1
    svc.submit_bans(bans("203.0.113.2"))
    release(engine)
    with pytest.raises(StoreError):
        await task
    assert svc._next_oseq is None and len(svc._queue) == 1  # back in the queue; the numbers are asked again
    await svc._load_oseq()
    await svc._publish_pending()
    nets = [str(e.net) for p in engine.published for e in p]
    assert nets[0] == "203.0.113.1/32" and nets[-1] == "203.0.113.2/32"  # (perhaps twice: at least once)
    assert store.store.fleet_outbox_size() == 0
    assert [r.target for r in store.store.fleet_own_active(NOW, NOW - 1)] == ["203.0.113.1", "203.0.113.2"]


async def test_fleet_counted_bans_are_recorded_as_published_numbered_between_rounds_never_sent() -> None:
    # the count script published them: they are own published rows (for a re-assert), never a MULTI's
    svc, engine, store, task = await fast()
    svc.note_counted([(parse_target("192.0.2.77"), NOW + 600, "count:sshd")])
    svc.submit_bans(bans("203.0.113.2"))
    release(engine)
    await until(lambda: len(engine.published) == 2)
    await task
    assert published(engine) == [[("203.0.113.1/32", 1)], [("203.0.113.2/32", 2)]]
    own = store.store.fleet_own_active(NOW, NOW - 1)
    assert [(r.oseq, r.target, r.src) for r in own] == [(1, "203.0.113.1", "cli"), (2, "203.0.113.2", "cli"),
                                                        (3, "192.0.2.77", "count:sshd")]
    assert svc.stats.publish_failures == 0 and store.store.fleet_outbox_size() == 0


def targets(svc: FleetService) -> list[str]:
    return [item[1] for item in svc._queue]


def unhold(store: CountingStore) -> None:
    assert store.hold is not None
    store.hold.set()


def count(svc: FleetService, addr: str) -> None:
    svc.note_counted([(parse_target(addr), NOW + 600, "count:sshd")])


async def chained(fail_call: int | None = None, counted: bool = False
                  ) -> tuple[FleetService, Engine, CountingStore, asyncio.Task[None]]:
    """Round 2 (203.0.113.2) published from memory, its store call held; round 3 (.3) submitted, .4 after it.
    `counted`: a fleet-counted ban taken by round 2 (192.0.2.2) and one by round 3 (192.0.2.3)."""
    svc, engine, store, task = await fast()
    store.hold = threading.Event()
    store.fail_call = fail_call
    if counted:
        count(svc, "192.0.2.2")
    svc.submit_bans(bans("203.0.113.2"))
    await until(lambda: store.calls == ["round", "round"])
    release(engine)
    await until(lambda: len(engine.published) == 2)
    if counted:
        count(svc, "192.0.2.3")
    svc.submit_bans(bans("203.0.113.3"))
    await until(lambda: len(engine.published) == 3)  # round 3's MULTI left while round 2's store call is held
    svc.submit_bans(bans("203.0.113.4"))
    await asyncio.sleep(0.01)  # (room for a wrong store call to start: none may)
    assert store.calls == ["round", "round"]  # one store call at a time, in round order
    return svc, engine, store, task


async def test_a_round_leaves_from_memory_while_the_store_call_before_it_runs_and_calls_stay_in_order() -> None:
    svc, engine, store, task = await chained()
    assert published(engine) == [[("203.0.113.1/32", 1)], [("203.0.113.2/32", 2)], [("203.0.113.3/32", 3)]]
    unhold(store)
    await task
    assert published(engine)[3:] == [[("203.0.113.4/32", 4)]] and engine.most_out == 1
    assert store.calls.count("round") == 4 and store.calls[-1] == "mark_published"
    assert store.store.fleet_outbox_size() == 0 and svc.stats.published == 4
    assert [r.oseq for r in store.store.fleet_own_active(NOW, NOW - 1)] == [1, 2, 3, 4]


async def test_a_failed_store_call_puts_back_its_items_and_the_next_rounds_in_order() -> None:
    svc, engine, store, task = await chained(fail_call=2)  # round 2's store call fails: round 3's never runs
    unhold(store)
    with pytest.raises(StoreError):
        await task
    assert targets(svc) == ["203.0.113.2", "203.0.113.3", "203.0.113.4"] and svc._next_oseq is None
    assert store.calls.count("round") == 2 and svc._storing is None
    await svc._load_oseq()
    await svc._publish_pending()
    assert published(engine)[-1] == [  # (.1: acknowledged, its mark was in the failed call: again, harmless)
        ("203.0.113.1/32", 1), ("203.0.113.2/32", 2), ("203.0.113.3/32", 3), ("203.0.113.4/32", 4)]
    assert store.store.fleet_outbox_size() == 0
    assert [(r.oseq, r.target) for r in store.store.fleet_own_active(NOW, NOW - 1)] == [
        (1, "203.0.113.1"), (2, "203.0.113.2"), (3, "203.0.113.3"), (4, "203.0.113.4")]


async def test_a_failed_chained_store_call_puts_back_its_items_ahead_of_later_ones() -> None:
    svc, _, store, task = await chained(fail_call=3)  # round 2's written; round 3's fails behind it
    unhold(store)
    with pytest.raises(StoreError):
        await task
    assert targets(svc) == ["203.0.113.3", "203.0.113.4"] and svc._next_oseq is None
    await svc._load_oseq()
    await svc._publish_pending()
    assert store.store.fleet_outbox_size() == 0
    assert [(r.oseq, r.target) for r in store.store.fleet_own_active(NOW, NOW - 1)] == [
        (1, "203.0.113.1"), (2, "203.0.113.2"), (3, "203.0.113.3"), (4, "203.0.113.4")]


async def test_a_refused_multi_behind_a_running_store_call_leaves_every_row_pending_in_order() -> None:
    svc, engine, store, task = await fast()
    store.hold = threading.Event()
    svc.submit_bans(bans("203.0.113.2"))
    await until(lambda: store.calls == ["round", "round"])
    engine.refuse_call = 2  # round 3's MULTI, out while round 2's store call is held
    release(engine)
    await until(lambda: len(engine.published) == 2)
    svc.submit_bans(bans("203.0.113.3"))
    await until(lambda: engine.calls == 3)
    svc.submit_bans(bans("203.0.113.4"))
    unhold(store)
    with pytest.raises(LinkError):
        await task
    assert svc._storing is None and published(engine)[-1] == [("203.0.113.2/32", 2)]
    # .2 acknowledged and marked by round 3's store call, which ran after round 2's; .3 refused, .4 behind it
    # (.4 is written by round 4's store call if that round began before the refusal came: either way, in order)
    pending = [r.target for r in store.store.fleet_pending(NOW)] + targets(svc)
    assert pending == ["203.0.113.3", "203.0.113.4"]
    await svc._publish_pending()
    assert [n for n, _ in published(engine)[-1]] == ["203.0.113.3/32", "203.0.113.4/32"]
    assert store.store.fleet_outbox_size() == 0


async def test_a_ban_counted_between_two_chained_fast_rounds_is_numbered_with_the_round_that_takes_it() -> None:
    """Rows are numbered when a round takes them, not when its store call starts: round 3 waits for round 2's
    store call while a counted ban is noted and .4 submitted; round 3 then returns and round 4 numbers .4
    before round 3's store call starts. Numbered by that call, the counted row took the number after .4's, and
    round 4's rows (already out from memory) failed the store's "above every oseq used" check: a failed round,
    .4 put back and published again under a new number."""
    svc, engine, store, task = await chained()
    count(svc, "192.0.2.77")
    unhold(store)
    await task  # no failed round
    sent = [(net, oseq) for p in published(engine) for net, oseq in p]
    assert len(set(sent)) == len(sent) and len({n for n, _ in sent}) == len(sent)  # no event twice
    assert [n for n, _ in sent] == [f"203.0.113.{i}/32" for i in (1, 2, 3, 4)]
    own = store.store.fleet_own_active(NOW, NOW - 1)
    oseqs = [r.oseq for r in own]
    assert oseqs == sorted(set(oseqs)) and len(own) == 5  # every row numbered, distinct, in order
    assert {r.target: r.oseq for r in own}["192.0.2.77"] > dict(sent)["203.0.113.3/32"]
    assert store.store.fleet_outbox_size() == 0 and svc.stats.published == 4


@pytest.mark.parametrize("fail_call", [2, 3])
async def test_a_failed_store_call_puts_back_its_counted_bans_in_order_ahead_of_later_ones(fail_call: int) -> None:
    svc, _, store, task = await chained(fail_call=fail_call, counted=True)
    count(svc, "192.0.2.4")  # noted after both rounds took theirs
    unhold(store)
    with pytest.raises(StoreError):
        await task
    back = ["192.0.2.2", "192.0.2.3"][fail_call - 2:]
    assert [item[1] for item in svc._noted] == [*back, "192.0.2.4"] and svc._next_oseq is None
    await svc._load_oseq()
    await svc._publish_pending()
    own = store.store.fleet_own_active(NOW, NOW - 1)
    assert [r.oseq for r in own] == sorted({r.oseq for r in own})
    assert sorted(r.target for r in own if r.src == "count:sshd") == ["192.0.2.2", "192.0.2.3", "192.0.2.4"]
    assert not svc._noted and store.store.fleet_outbox_size() == 0


async def test_the_publishers_store_calls_run_on_the_one_thread_it_is_given_in_round_order() -> None:
    """The daemon gives its store thread (one worker, where the persister's ban saves run): every store call of
    the publisher runs there, one at a time, and rounds chained behind a held MULTI still publish in order,
    write every row and mark every one (a chained round waits for the call before it on the event loop, never
    on that thread, so one worker cannot deadlock)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="test-store")
    names: list[str] = []

    async def on_pool(fn: Callable[..., Any], /, *args: Any) -> Any:
        def call() -> Any:
            names.append(threading.current_thread().name)
            return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(pool, call)

    try:
        svc, engine, store = service(run_store=on_pool)
        svc._online.set()
        svc._next_oseq = 1
        svc.submit_bans(bans("203.0.113.1"))
        engine.hold = asyncio.Event()
        task = asyncio.create_task(svc._publish_pending())
        await engine.entered.wait()  # round 1's MULTI is out: what comes now goes in fast rounds behind it
        svc.submit_bans(bans("203.0.113.2"))
        await until(lambda: store.calls == ["round", "round"])
        svc.submit_bans(bans("203.0.113.3", "203.0.113.4"))
        release(engine)
        await task
        assert [oseq for p in published(engine) for _net, oseq in p] == [1, 2, 3, 4]
        assert engine.most_out == 1 and store.calls[-1] == "mark_published"
        assert store.store.fleet_outbox_size() == 0 and svc.stats.published == 4
        assert [r.oseq for r in store.store.fleet_own_active(NOW, NOW - 1)] == [1, 2, 3, 4]
        assert len(names) == len(store.calls) and all(n.startswith("test-store") for n in names)
    finally:
        pool.shutdown()
