"""Coalescing (pure) and the async flush driver with a fake kernel."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from nftblockd.kernel.bans import SetOp
from nftblockd.kernel.batcher import ApplyOutcome, Batcher, Group, Pending


def test_add_then_add_keeps_the_later_end() -> None:
    p = Pending()
    p.add(SetOp("s", 1, True, 2000))
    p.add(SetOp("s", 1, True, 1000))
    assert p.ops() == [SetOp("s", 1, True, 2000)]
    p.add(SetOp("s", 1, True, 1000))
    p.add(SetOp("s", 1, True, None))
    assert p.ops()[0].until_ms is None


def test_ban_then_unban_of_a_new_element_cancels_out() -> None:
    p = Pending()
    p.add(SetOp("s", 1, True, 1000))
    p.add(SetOp("s", 1, False))
    assert len(p) == 0


def test_ban_then_unban_of_an_existing_element_deletes() -> None:
    p = Pending()
    p.add(SetOp("s", 1, True, 1000, existed=True))
    p.add(SetOp("s", 1, False))
    assert p.ops() == [SetOp("s", 1, False)]


def test_unban_then_ban_refreshes() -> None:
    p = Pending()
    p.add(SetOp("s", 1, False))
    p.add(SetOp("s", 1, True, 1000))
    assert p.ops() == [SetOp("s", 1, True, 1000, existed=True)]


ops = st.builds(SetOp, st.sampled_from(["a", "b"]), st.integers(0, 5), st.booleans(),
                st.one_of(st.none(), st.integers(1, 10**6)), st.just(""), st.booleans())


@given(st.lists(ops, max_size=60))
def test_a_batch_never_both_adds_and_deletes_one_element(seq: list[SetOp]) -> None:
    p = Pending()
    for op in seq:
        p.add(op)
    out = p.ops()
    keys = [(o.set_name, o.key) for o in out]
    assert len(keys) == len(set(keys))
    # the final op for a key reflects the last request for it (delete stays delete; add stays add)
    last = {}
    for op in seq:
        last[(op.set_name, op.key)] = op.add
    for o in out:
        assert o.add == last[(o.set_name, o.key)]


async def test_flush_on_size_and_on_delay_and_failures_reach_their_submitter() -> None:
    batches: list[list[int]] = []

    async def apply(groups: list[Group]) -> ApplyOutcome:
        batches.append([k for g in groups for k in g.keys])
        failed = {(g.set_name, k): (23, "full") for g in groups for k in g.keys if k == 99}
        return ApplyOutcome(failed, [], 1, set())

    b = Batcher(apply, max_ops=3, delay=0.01)
    stop = asyncio.Event()
    runner = asyncio.create_task(b.run(stop))
    f1 = await b.submit([SetOp("s", i, True, 10**12) for i in range(3)])
    assert await asyncio.wait_for(f1, 5) == []
    f2 = await b.submit([SetOp("s", 99, True, 10**12)])
    f3 = await b.submit([SetOp("s", 7, True, 10**12)])
    failures2, failures3 = await asyncio.wait_for(asyncio.gather(f2, f3), 5)
    assert [f.key for f in failures2] == [99] and failures3 == []
    assert [len(x) for x in batches] == [3, 2]
    big = await b.submit([SetOp("s", 1000 + i, True, 10**12) for i in range(7)])
    assert await asyncio.wait_for(big, 5) == []
    assert sum(len(x) for x in batches) == 12 and max(len(x) for x in batches) == 3
    stop.set()
    await asyncio.wait_for(runner, 5)


async def test_pending_ops_are_flushed_before_run_returns() -> None:
    seen: list[int] = []

    async def apply(groups: list[Group]) -> ApplyOutcome:
        seen.extend(k for g in groups for k in g.keys)
        return ApplyOutcome({}, [], 1, set())

    b = Batcher(apply, max_ops=100, delay=10)
    stop = asyncio.Event()
    runner = asyncio.create_task(b.run(stop))
    fut = await b.submit([SetOp("s", 5, True, 10**12)])
    stop.set()
    await asyncio.wait_for(runner, 5)
    assert fut.done() and seen == [5]


async def turns(n: int = 20) -> None:
    """Let the event loop run `n` rounds (no clock: what is ready runs, nothing waits on a timer)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_lone_op_after_idle_is_flushed_at_once_and_load_still_waits_its_window() -> None:
    # A lone `nftblock ban` waited the whole batch window (2 ms by default) for ops that were not coming.
    flushed: list[list[int]] = []
    gate = asyncio.Event()

    async def apply(groups: list[Group]) -> ApplyOutcome:
        flushed.append([k for g in groups for k in g.keys])
        await gate.wait()  # the kernel is slow: the next ops arrive while this batch is in flight
        return ApplyOutcome({}, [], 1, set())

    b = Batcher(apply, max_ops=100, delay=3600)  # a window nobody would wait for in a test
    stop = asyncio.Event()
    runner = asyncio.create_task(b.run(stop))
    first = await b.submit([SetOp("s", 1, True, 10**12)])
    await turns()
    assert flushed == [[1]]  # the batcher was idle: no window
    second = await b.submit([SetOp("s", 2, True, 10**12)])  # during the flight: load, so it waits its window
    third = await b.submit([SetOp("s", 3, True, 10**12)])
    gate.set()
    await turns()
    assert first.done() and not second.done() and flushed == [[1]]
    stop.set()  # stopping flushes what waits, in one batch
    await runner
    assert flushed == [[1], [2, 3]] and second.done() and third.done()


async def test_ops_right_after_a_flush_wait_their_window() -> None:
    flushed: list[list[int]] = []

    async def apply(groups: list[Group]) -> ApplyOutcome:
        flushed.append([k for g in groups for k in g.keys])
        return ApplyOutcome({}, [], 1, set())

    b = Batcher(apply, max_ops=100, delay=3600)
    stop = asyncio.Event()
    runner = asyncio.create_task(b.run(stop))
    first = await b.submit([SetOp("s", 1, True, 10**12)])
    await turns()
    assert first.done()
    late = await b.submit([SetOp("s", 2, True, 10**12)])  # within `delay` of the last flush: not idle
    await turns()
    assert flushed == [[1]] and not late.done()
    stop.set()
    await runner
    assert flushed == [[1], [2]]
