"""The IO edge of actions: per action a bounded queue, a rate limit, `concurrency` workers, retries.

`ActionRunner.submit` is what the ban path calls, after the kernel commit: it never waits and never raises.
An event over the rate limit or into a full queue is dropped and counted (`skipped`, by reason); the next
run of that action carries the count (`{skipped}`, `"skipped"`, `<skipped>`), so a flood leaves a number
instead of a silence. A webhook with `batch` > 1 is paced instead: its worker takes a token per request and
sends what queued up meanwhile in one request (a flood of 10,000 bans is a few requests, not 10,000).

A failed run (exit status not 0, a timeout, an HTTP error, a connection refused) is retried `retries` times
after `retry_delay` seconds, doubling; a 4xx answer other than 408/429 is not retried (it will not get better).
What still fails is counted and written as one audit line. A run that times out has its whole process group
killed. Nothing here reads log files or the kernel; commands get an environment built from nothing
(render.py), `/` as working directory, no stdin, their own session.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: subprocesses, HTTP, per-action worker tasks)
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from nftblockd.actions.f2baction import F2bAction
from nftblockd.actions.render import ActionEvent, CommandRun, Run, WebhookPost, render
from nftblockd.config import ActionConfig
from nftblockd.service.logsetup import quote

log = logging.getLogger("nftblockd.actions")
audit_log = logging.getLogger("nftblockd.audit")

OUTPUT_KEPT = 2000  # bytes of a failed command's stderr kept for the audit line


class RunFailed(Exception):
    """A run failed; `retry` says whether trying again can help."""

    def __init__(self, message: str, *, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


class Executor(Protocol):
    """Carries out one run; raises RunFailed. The real one spawns processes and speaks HTTP; tests fake it."""

    async def __call__(self, run: Run) -> None: ...


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved. Pure: the time is an argument."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate, float(burst)
        self.tokens = float(burst)
        self.at = now

    def _fill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now

    def take(self, now: float) -> bool:
        self._fill(now)
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def wait(self, now: float) -> float:
        """Seconds until a token is there (0: now)."""
        self._fill(now)
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate


@dataclass(slots=True)
class ActionStats:
    runs: int = 0
    failures: int = 0  # runs that failed after every retry
    retries: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # by reason: rate, queue_full, stopping
    last_error: str = ""


class ActionRunner:
    def __init__(self, cfg: ActionConfig, f2b: Mapping[str, F2bAction], execute: Executor, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.cfg = cfg
        self.f2b = f2b
        self.execute = execute
        self.clock = clock
        self.sleep = sleep
        self.stats = ActionStats()
        self.paced = cfg.type == "webhook" and cfg.batch > 1  # a token per request, not per event
        self.bucket = TokenBucket(cfg.rate, cfg.burst, clock())
        self._queue: asyncio.Queue[ActionEvent] = asyncio.Queue(cfg.queue)
        self._unreported = 0  # skipped since the last run started (what its `skipped` says)
        self._busy = 0

    # -- the ban path's side: never waits, never raises ----------------------------------------------

    def accepts(self, event: str) -> bool:
        return event in self.cfg.on

    def submit(self, ev: ActionEvent) -> bool:
        if not self.paced and not self.bucket.take(self.clock()):
            self._skip("rate")
            return False
        try:
            self._queue.put_nowait(ev)
        except asyncio.QueueFull:
            self._skip("queue_full")
            return False
        return True

    def skip(self, n: int, reason: str) -> None:
        """`n` events not even offered (a flood's remainder, counted without building them)."""
        self._skip(reason, n)

    def room(self) -> int:
        """How many events submit could take now without skipping any."""
        free = self.cfg.queue - self._queue.qsize()
        if self.paced:
            return free
        self.bucket._fill(self.clock())
        return min(free, int(self.bucket.tokens))

    def _skip(self, reason: str, n: int = 1) -> None:
        sk = self.stats.skipped
        sk[reason] = sk.get(reason, 0) + n
        self._unreported += n

    def queued(self) -> int:
        return self._queue.qsize() + self._busy

    # -- workers ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        """The workers, until cancelled; what is still queued then is counted as skipped ("stopping")."""
        try:
            async with asyncio.TaskGroup() as tg:
                for i in range(self.cfg.concurrency):
                    tg.create_task(self._worker(), name=f"action-{self.cfg.name}-{i}")
        finally:
            left = self._queue.qsize()
            if left:
                self._skip("stopping", left)
                log.warning("action %s: %d queued events not run (stopping)", self.cfg.name, left)

    async def idle(self) -> None:
        """Wait until nothing is queued or running (tests and a graceful stop)."""
        await self._queue.join()

    async def _worker(self) -> None:
        q = self._queue
        while True:
            first = await q.get()
            self._busy += 1
            events = [first]
            try:
                if self.paced:
                    delay = self.bucket.wait(self.clock())
                    if delay > 0:
                        await self.sleep(delay)
                    self.bucket.take(self.clock())
                while self.paced and len(events) < self.cfg.batch and not q.empty():
                    events.append(q.get_nowait())
                skipped, self._unreported = self._unreported, 0
                for r in render(self.cfg, events, skipped, self.f2b):
                    await self._attempt(r, events)
            except Exception:  # a bug in rendering must cost this event, never the worker
                log.exception("action %s: preparing a run failed", self.cfg.name)
                self.stats.failures += 1
            finally:
                self._busy -= 1
                for _ in events:
                    q.task_done()

    async def _attempt(self, r: Run, events: Sequence[ActionEvent]) -> None:
        st = self.stats
        delay = self.cfg.retry_delay
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                st.retries += 1
                await self.sleep(delay)
                delay *= 2
            try:
                await self.execute(r)
            except RunFailed as exc:
                st.last_error = str(exc)
                if exc.retry:
                    continue
            else:
                st.runs += 1
                return
            break
        st.runs += 1
        st.failures += 1
        ev = events[0]
        more = f" (and {len(events) - 1} more events)" if len(events) > 1 else ""
        audit_log.info("action failed action=%s event=%s address=%s jail=%s attempts=%d error=%s%s", self.cfg.name,
                       ev.event, ev.address, quote(ev.jail), attempt + 1, quote(st.last_error), more,
                       extra={"action": self.cfg.name, "address": ev.address, "jail": ev.jail})


# -- the real executor ---------------------------------------------------------------------------------


SETPRIV = "/usr/bin/setpriv"


def ambient_caps(status: str) -> int:
    """The ambient capability mask in /proc/self/status text (0 when it says nothing)."""
    for line in status.splitlines():
        if line.startswith("CapAmb:"):
            return int(line.split()[1], 16)
    return 0


def cap_drop_prefix(ambient: int, setpriv_exists: bool) -> tuple[str, ...]:
    """The argv prefix that starts an action without the daemon's ambient capabilities.

    The packaged service runs as an unprivileged user holding CAP_NET_ADMIN as an *ambient* capability, and
    ambient capabilities pass to every program it runs: a mail script could then rewrite the firewall. util-
    linux's setpriv lowers them (lowering needs no privilege) before exec'ing the action. Nothing to drop
    (root without ambient capabilities, as in the tests): no prefix."""
    if ambient == 0 or not setpriv_exists:
        return ()
    return (SETPRIV, "--ambient-caps=-all", "--inh-caps=-all", "--")


class RealExecutor:
    """Processes with asyncio, requests with one aiohttp session (made on first use, closed by `close`)."""

    def __init__(self) -> None:
        self._session: object | None = None
        try:
            with open("/proc/self/status") as f:
                ambient = ambient_caps(f.read())
        except OSError:
            ambient = 0
        self.prefix = cap_drop_prefix(ambient, os.path.exists(SETPRIV))
        if ambient and not self.prefix:
            log.warning("actions inherit the daemon's ambient capabilities (%s is missing)", SETPRIV)

    async def __call__(self, run: Run) -> None:
        if isinstance(run, CommandRun):
            await self._command(run)
        else:
            await self._post(run)

    async def _command(self, run: CommandRun) -> None:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.prefix, *run.argv, env=run.env, cwd="/", stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise RunFailed(f"cannot run {run.argv[0]}: {exc.strerror or exc}", retry=False) from None
        assert proc.stderr is not None
        try:
            async with asyncio.timeout(run.timeout):
                err = await proc.stderr.read(OUTPUT_KEPT)
                while await proc.stderr.read(65536):  # the rest is read and dropped: a full pipe would block it
                    pass
                code = await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise RunFailed(f"{run.argv[0]} timed out after {run.timeout:g}s") from None
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        if code != 0:
            text = err.decode(errors="replace").strip().replace("\n", " | ")
            raise RunFailed(f"{run.argv[0]} exited with status {code}" + (f": {text}" if text else ""))

    async def _post(self, run: WebhookPost) -> None:
        import aiohttp  # a dependency of feeds already; imported only when a webhook is configured

        if self._session is None:
            self._session = aiohttp.ClientSession()
        session = self._session
        assert isinstance(session, aiohttp.ClientSession)
        try:
            async with session.post(run.url, data=run.body, headers=dict(run.headers),
                                    timeout=aiohttp.ClientTimeout(total=run.timeout), allow_redirects=False) as resp:
                await resp.read()
                if resp.status >= 300:
                    retry = resp.status >= 500 or resp.status in (408, 429)
                    raise RunFailed(f"{run.url} answered {resp.status} {resp.reason or ''}".rstrip(), retry=retry)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RunFailed(f"{run.url}: {type(exc).__name__}: {exc}".rstrip(": ")) from None

    async def close(self) -> None:
        if self._session is not None:
            import aiohttp

            assert isinstance(self._session, aiohttp.ClientSession)
            await self._session.close()
            self._session = None


__all__ = ["ActionRunner", "ActionStats", "Executor", "RealExecutor", "RunFailed", "TokenBucket", "ambient_caps",
           "cap_drop_prefix"]
