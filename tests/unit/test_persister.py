"""The persister: group commit in order, a failing write is a visible degraded state that is retried, and
a delete never overtakes the save before it."""

from __future__ import annotations

import asyncio

from nftblockd.addr import parse_target
from nftblockd.events import Ban
from nftblockd.state.change import StateChange
from nftblockd.state.persister import Persister, PersistStatus


def ban(t: str) -> Ban:
    return Ban(parse_target(t), "default", None)


class FlakyStore:
    def __init__(self) -> None:
        self.writes: list[StateChange] = []
        self.full = False

    async def write(self, change: StateChange) -> None:
        await asyncio.sleep(0)  # a real write yields to the loop (store thread)
        if self.full:
            raise OSError(28, "database or disk is full")
        self.writes.append(change)


async def test_changes_queued_together_share_one_transaction() -> None:
    store = FlakyStore()
    p = Persister(store.write)
    await asyncio.gather(*(p.save(StateChange([ban(f"192.0.2.{i}")])) for i in range(1, 6)))
    assert [len(w.saves) for w in store.writes] == [5]


async def test_a_delete_starts_a_new_transaction() -> None:
    store = FlakyStore()
    p = Persister(store.write)
    await asyncio.gather(p.save(StateChange([ban("192.0.2.1")])), p.save(StateChange([ban("192.0.2.2")])),
                         p.save(StateChange(deletes=[("default", parse_target("192.0.2.2"))])),
                         p.save(StateChange([ban("192.0.2.3")])))
    first, second = store.writes
    # the save of .2 is written before its delete, never merged into a transaction that deletes first
    assert [str(b.target) for b in first.saves] == ["192.0.2.1/32", "192.0.2.2/32"] and not first.deletes
    assert [str(n) for _b, n in second.deletes] == ["192.0.2.2/32"]
    assert [str(b.target) for b in second.saves] == ["192.0.2.3/32"]


async def test_a_failed_write_degrades_acknowledges_and_is_retried_in_order() -> None:
    store = FlakyStore()
    seen: list[PersistStatus] = []
    p = Persister(store.write, on_state=seen.append)
    store.full = True
    await p.save(StateChange([ban("192.0.2.1")]))  # returns: the kernel has the ban
    await p.save(StateChange(deletes=[("default", parse_target("192.0.2.1"))]))
    st = p.status()
    assert st.degraded and st.unsaved_changes == 2 and st.last_error and "full" in st.last_error
    assert seen[-1].degraded and p.failures == 2
    await p.retry()
    assert p.status().unsaved_changes == 2  # still full: nothing lost, nothing reordered
    store.full = False
    await p.retry()
    assert not p.status().degraded and p.status().unsaved_changes == 0
    assert [bool(w.saves) for w in store.writes] == [True, False]  # the save, then the delete
    assert not seen[-1].degraded


async def test_nothing_to_save_writes_nothing() -> None:
    store = FlakyStore()
    await Persister(store.write).save(StateChange())
    assert store.writes == []


async def test_submit_queues_when_called_and_resolves_once_written() -> None:
    store = FlakyStore()
    p = Persister(store.write)
    first = p.submit(StateChange([ban("192.0.2.1")]))  # queued now, before anything else runs
    second = p.save(StateChange(deletes=[("default", parse_target("192.0.2.1"))]))
    assert not first.done()
    await asyncio.gather(first, second)
    assert [len(w.saves) for w in store.writes] == [1, 0] and len(store.writes[1].deletes) == 1
    empty = p.submit(StateChange())
    assert empty.done() and len(store.writes) == 2


async def test_saved_answers_once_what_was_queued_before_it_is_written() -> None:
    store = FlakyStore()
    p = Persister(store.write)
    assert await p.saved()  # nothing queued
    p.submit(StateChange([ban("192.0.2.1")]))
    before = p.saved()
    later = p.submit(StateChange([ban("192.0.2.2")]))
    assert not before.done()
    assert await before and store.writes
    await later
    store.full = True
    p.submit(StateChange([ban("192.0.2.3")]))
    failing = p.saved()
    assert await failing is False  # the write failed: not saved (the change stays queued)
    assert await p.saved() is False  # degraded: known at once
    store.full = False
    await p.retry()
    assert await p.saved()
