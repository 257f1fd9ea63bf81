"""Action runners with a fake executor and clock: bounds, skipped counts, retries, failures, pacing."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nftblockd.actions.render import ActionEvent, CommandRun, Run, WebhookPost
from nftblockd.actions.runner import (
    ActionRunner,
    RealExecutor,
    RunFailed,
    TokenBucket,
    ambient_caps,
)
from nftblockd.config import ActionConfig


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Fake:
    """Records runs; fails the first `fail` of them with `retry`."""

    def __init__(self, fail: int = 0, retry: bool = True) -> None:
        self.runs: list[Run] = []
        self.fail = fail
        self.retry = retry
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, run: Run) -> None:
        await self.gate.wait()
        self.runs.append(run)
        if self.fail:
            self.fail -= 1
            raise RunFailed("boom", retry=self.retry)


def ev(i: int) -> ActionEvent:
    return ActionEvent("ban", f"198.51.100.{i}", "sshd", "default", "jail", "r", 60.0, None, 0.0, 3)


@pytest.fixture
def clock() -> Iterator[Clock]:
    yield Clock()


async def until(pred: Callable[[], bool]) -> None:
    """Let the loop run until `pred` holds (bounded: a few hundred turns, never a clock)."""
    for _ in range(500):
        if pred():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def running(r: ActionRunner) -> asyncio.Task[None]:
    return asyncio.create_task(r.run())


async def stop(t: asyncio.Task[None]) -> None:
    t.cancel()
    await asyncio.gather(t, return_exceptions=True)


def test_token_bucket() -> None:
    b = TokenBucket(2.0, 3, 0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert b.wait(0.0) == pytest.approx(0.5)
    assert b.take(0.5) and not b.take(0.5)
    assert b.take(100.0)  # refilled, to the burst only
    assert sum(b.take(100.0) for _ in range(5)) == 2


async def test_a_flood_is_rate_limited_and_the_next_run_says_how_many_were_skipped(clock: Clock) -> None:
    fake = Fake()
    cfg = ActionConfig("n", "command", argv=("/bin/x", "{address}", "{skipped}"), rate=1.0, burst=3)
    r = ActionRunner(cfg, {}, fake, clock=clock)
    t = await running(r)
    taken = [r.submit(ev(i)) for i in range(10)]
    assert taken == [True] * 3 + [False] * 7
    await r.idle()
    assert [run.argv[1] for run in fake.runs if isinstance(run, CommandRun)] == [
        "198.51.100.0", "198.51.100.1", "198.51.100.2"]
    clock.now += 1.0
    assert r.submit(ev(20))
    await r.idle()
    assert r.stats.skipped == {"rate": 7} and r.stats.runs == 4
    assert isinstance(fake.runs[-1], CommandRun)
    skipped_seen = sum(int(run.argv[2]) for run in fake.runs if isinstance(run, CommandRun))
    assert skipped_seen == 7  # every skipped event is reported by a later run, once
    await stop(t)


async def test_a_full_queue_skips_and_stopping_counts_what_was_left(clock: Clock) -> None:
    fake = Fake()
    fake.gate.clear()  # the worker is stuck on its first run
    cfg = ActionConfig("n", "command", argv=("/bin/x",), rate=1000.0, burst=1000, queue=2)
    r = ActionRunner(cfg, {}, fake, clock=clock)
    t = await running(r)
    r.submit(ev(0))
    await until(lambda: r.queued() == 1 and r.room() == 2)  # the worker took it and waits on the gate
    assert [r.submit(ev(i)) for i in range(1, 5)] == [True, True, False, False]
    assert r.queued() == 3 and r.room() == 0
    await stop(t)
    assert r.stats.skipped == {"queue_full": 2, "stopping": 2}


async def test_failures_are_retried_with_backoff_then_counted_and_audited(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    delays: list[float] = []

    async def sleep(s: float) -> None:
        delays.append(s)

    fake = Fake(fail=10)
    cfg = ActionConfig("n", "command", argv=("/bin/x",), retries=3, retry_delay=0.5)
    r = ActionRunner(cfg, {}, fake, clock=clock, sleep=sleep)
    t = await running(r)
    with caplog.at_level(logging.INFO, "nftblockd.audit"):
        r.submit(ev(1))
        await r.idle()
    assert len(fake.runs) == 4 and delays == [0.5, 1.0, 2.0]
    assert (r.stats.runs, r.stats.failures, r.stats.retries) == (1, 1, 3)
    (line,) = [rec.getMessage() for rec in caplog.records if rec.name == "nftblockd.audit"]
    assert line == "action failed action=n event=ban address=198.51.100.1 jail=sshd attempts=4 error=boom"
    fake.fail = 1  # one failure, then success
    r.submit(ev(2))
    await r.idle()
    assert (r.stats.runs, r.stats.failures, r.stats.retries) == (2, 1, 4)
    await stop(t)


async def test_a_failure_that_cannot_get_better_is_not_retried(clock: Clock) -> None:
    fake = Fake(fail=1, retry=False)
    r = ActionRunner(ActionConfig("n", "command", argv=("/bin/x",), retries=5), {}, fake, clock=clock)
    t = await running(r)
    r.submit(ev(1))
    await r.idle()
    assert len(fake.runs) == 1 and r.stats.failures == 1 and r.stats.retries == 0
    await stop(t)


async def test_a_batching_webhook_sends_a_flood_in_few_requests(clock: Clock) -> None:
    fake = Fake()
    fake.gate.clear()
    cfg = ActionConfig("h", "webhook", url="http://127.0.0.1:1/", batch=100, rate=1.0, burst=1, queue=250)

    async def sleep(s: float) -> None:
        clock.now += s

    r = ActionRunner(cfg, {}, fake, clock=clock, sleep=sleep)
    t = await running(r)
    for i in range(300):
        r.submit(ev(i % 250))
    fake.gate.set()
    await r.idle()
    bodies = [json.loads(p.body) for p in fake.runs if isinstance(p, WebhookPost)]
    assert [len(b["events"]) for b in bodies] == [100, 100, 50]
    assert clock.now == pytest.approx(1002.0)  # one request per second after the first
    assert r.stats.skipped == {"queue_full": 50}
    assert sum(b["skipped"] for b in bodies) == 50
    await stop(t)


async def test_the_real_executor_runs_without_a_shell_and_kills_what_times_out(tmp_path: object) -> None:
    ex = RealExecutor()
    await ex(CommandRun(("/bin/true", "$(false)"), {"PATH": "/bin"}, 5.0))
    with pytest.raises(RunFailed, match="exited with status 3: oops"):
        await ex(CommandRun(("/bin/sh", "-c", "echo oops >&2; exit 3"), {}, 5.0))
    with pytest.raises(RunFailed, match="timed out"):
        await ex(CommandRun(("/bin/sh", "-c", "sleep 30 & wait"), {}, 0.2))
    with pytest.raises(RunFailed, match="cannot run") as exc:
        await ex(CommandRun(("/nonexistent/prog",), {}, 1.0))
    assert not exc.value.retry
    await ex.close()


def test_the_ambient_capability_mask_is_read_from_proc_status() -> None:
    status = "Name:\tnftblockd\nCapInh:\t0000000000001000\nCapAmb:\t0000000000001000\n"
    assert ambient_caps(status) == 0x1000 and ambient_caps("CapAmb:\t0000000000000000\n") == 0


# Run by a non-root user holding CAP_NET_ADMIN as an ambient capability, as the packaged unit's daemon does:
# the action must start with no capability at all, while the daemon keeps its own.
NO_CAPS_ACTION = """
import asyncio
from nftblockd.actions.render import CommandRun
from nftblockd.actions.runner import RealExecutor, RunFailed

async def main() -> None:
    ex = RealExecutor()
    check = ("grep -q '^CapAmb:.0000000000000000$' /proc/self/status"
             " && grep -q '^CapPrm:.0000000000000000$' /proc/self/status")
    try:
        await ex(CommandRun(("/bin/sh", "-c", check), {}, 5.0))
    except RunFailed as exc:
        print("action has capabilities:", exc)
    print("daemon", [l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1])
    try:
        await ex(CommandRun(("/nonexistent/prog",), {}, 1.0))
    except RunFailed as exc:
        print("missing", exc.retry, exc)
    await ex.close()

asyncio.run(main())
"""


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="giving a user an ambient capability needs root")
def test_actions_start_without_the_daemons_ambient_capability() -> None:
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=+net_admin",
                           "--ambient-caps=+net_admin", "--bounding-set=-all,+net_admin", sys.executable, "-c",
                           NO_CAPS_ACTION], capture_output=True, text=True, check=False, timeout=60,
                          env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])}, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert "action has capabilities" not in proc.stdout, proc.stdout
    assert "daemon 0000000000001000" in proc.stdout, proc.stdout  # the daemon keeps CAP_NET_ADMIN
    assert "missing False cannot run /nonexistent/prog: No such file" in proc.stdout, proc.stdout
