"""service/health.py: the reasons a running daemon is degraded, the metric's samples, and `nftblock status`'s
exit code and first line for them (through the real control socket and API)."""

from __future__ import annotations

import asyncio
import io
import shutil
import tempfile
from pathlib import Path

from nftblockd.cli.main import EXIT_DEGRADED, main
from nftblockd.service.health import REASONS, Degraded, assess, samples
from tests.helpers.apirig import api_rig, serve


def test_each_fact_is_one_reason_and_healthy_is_none() -> None:
    assert assess([], state_in_memory=False, state_error=None, batch_error=None) == []
    found = assess([("sshd", "no journald")], state_in_memory=True, state_error="disk I/O error",
                   batch_error="ENOBUFS")
    assert [d.reason for d in found] == ["source", "state", "batches"]
    assert found[0] == Degraded("source", "jail sshd: no journald")
    assert "runs in memory" in found[1].message  # in memory wins over a save error: nothing is saved at all
    assert assess([], state_in_memory=False, state_error="disk I/O error", batch_error=None) == [
        Degraded("state", "saving to the state database fails: disk I/O error")]


def test_the_metric_has_every_reason_from_the_start() -> None:
    assert samples([]) == [((r,), 0) for r in REASONS]
    assert samples([Degraded("batches", "x")]) == [(("source",), 0), (("state",), 0), (("batches",), 1)]


async def _status(extra: dict[str, object], *args: str) -> tuple[int, str]:
    d = Path(tempfile.mkdtemp(prefix="nbh-", dir="/tmp"))
    try:
        async with api_rig("blocklists: {default: {timeout: 1h}}\n", status_extra=lambda: extra) as rig, \
                serve(rig, d / "c.sock") as path:
            out = io.StringIO()
            code = await asyncio.to_thread(main, ["--socket", str(path), *args, "status"], stdin=io.StringIO(),
                                           stdout=out, stderr=io.StringIO(), environ={})
            return code, out.getvalue()
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def test_status_exits_3_and_says_degraded_on_its_first_line() -> None:
    code, out = await _status({"degraded": [{"reason": "state", "message": "the state database runs in memory"}]})
    assert code == EXIT_DEGRADED == 3
    first, second = out.splitlines()[:2]
    assert first.startswith("DEGRADED (state): nftblockd ")
    assert second == "degraded: state: the state database runs in memory"
    assert (await _status({"degraded": [{"reason": "state", "message": "m"}]}, "--json"))[0] == 3
    code, out = await _status({"degraded": []})
    assert code == 0 and out.startswith("nftblockd ")


async def test_the_batcher_keeps_the_last_whole_batch_failure_until_one_succeeds() -> None:
    # What `batches` in the degraded list reads: a failed transaction, not a refused element.
    from nftblockd.kernel.bans import SetOp
    from nftblockd.kernel.batcher import ApplyOutcome, Batcher, Group

    fail = [True]

    async def apply(groups: list[Group]) -> ApplyOutcome:
        if fail[0]:
            raise OSError(105, "No buffer space available")
        return ApplyOutcome({}, [], 1, set())

    b = Batcher(apply, max_ops=100, delay=0)
    stop = asyncio.Event()
    runner = asyncio.create_task(b.run(stop))
    try:
        assert b.last_error is None
        await (await b.submit([SetOp("s", 5, True, 10**12)]))
        assert b.last_error == "[Errno 105] No buffer space available"
        fail[0] = False
        await (await b.submit([SetOp("s", 6, True, 10**12)]))
        assert b.last_error is None
    finally:
        stop.set()
        await asyncio.wait_for(runner, 5)
