"""The fleet publisher's rounds against a fake engine and the real store: one store call per round (mark the
previous round, queue, read), what arrives during a publish goes with the next round, and events are never
lost to a failing store call. No server: `_publish_pending` is driven directly."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from nftblockd.addr import parse_target
from nftblockd.allowlist import build_allowlist
from nftblockd.fleet.codec import FleetEvent
from nftblockd.fleet.service import FleetService
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

    async def publish(self, events: Sequence[FleetEvent], now: float) -> None:
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        self.published.append(list(events))


class CountingStore:
    """The real store, with the fleet calls counted (each is one worker-thread hop and one transaction)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls: list[str] = []
        self.fail_rounds = 0

    def fleet_round(self, published: Iterable[int], items: Iterable[OutboxItem], now: float,
                    limit: int = 10000) -> list[OutboxRow]:
        self.calls.append("round")
        if self.fail_rounds:
            self.fail_rounds -= 1
            raise StoreError("io", "s.db", "state database s.db failed (injected)")
        return self.store.fleet_round(published, items, now, limit)

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.store, name)

        def counted(*a: Any, **kw: Any) -> Any:
            self.calls.append(name.removeprefix("fleet_"))
            return fn(*a, **kw)

        return counted


def service() -> tuple[FleetService, Engine, CountingStore]:
    engine, store = Engine(), CountingStore(memory_store())
    svc = FleetService(fleet_config("prod", "a", "redis://127.0.0.1:1"), engine,  # type: ignore[arg-type]
                       store, FakeSink(), build_allowlist([]), clock=lambda: NOW)
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
    # round 1 (queue + read), round 2 (mark round 1 + queue + read), then round 2 marked alone: 3 calls
    assert store.calls == ["round", "round", "mark_published"]
    assert store.store.fleet_outbox_size() == 0 and svc.stats.published == 5 and svc.stats.outbox == 0


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
