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

A fail2ban action also has a life, as in fail2ban where each jail holds its own instance of it: `start(names)`
runs its `actionstart` once for each `<name>` (jail) it serves, before its workers take events (or, with
`actionstart_on_demand`, before that jail's first ban); `stop()` runs `actionstop` for each name started (or
that a ban ran for), after the hub let the queue drain, each run bounded by the action's timeout and, at the
daemon's stop, all of them by one budget. These runs are counted and audited like the others; a failed
`actionstart` never keeps a ban's run from happening.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: subprocesses, HTTP, per-action worker tasks)
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from nftblockd.actions.f2baction import F2bAction
from nftblockd.actions.render import ActionEvent, CommandRun, Run, WebhookPost, f2b_name, render, render_f2b_life
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
                 names: Sequence[str] = (), host: str = "", clock: Callable[[], float] = time.monotonic,
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
        # the life of a fail2ban action: the `<name>`s (jails) it serves, and those started (ordered: a dict)
        self.names = tuple(names)
        self.host = host
        self.life = f2b.get(cfg.name) if cfg.type == "fail2ban" and cfg.lifecycle else None
        self._started: dict[str, None] = {}
        self._life_lock = asyncio.Lock()

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
        """actionstart for every name (unless on demand), then the workers until cancelled; what is still
        queued then is counted as skipped ("stopping")."""
        try:
            if self.life is not None and not self.life.start_on_demand:
                await self.start(self.names)
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
                # a fail2ban action takes one event at a time (only a webhook batches)
                name = f2b_name(self.life, first.jail or first.origin) if self.life is not None else None
                if name is not None and first.event == "ban" and self.life is not None and self.life.start_on_demand:
                    await self.start((name,))  # (fail2ban's unban never starts an action)
                skipped, self._unreported = self._unreported, 0
                ok = True
                for r in render(self.cfg, events, skipped, self.f2b):
                    ok = await self._attempt(r, first.event, first.jail, first.address, len(events) - 1) and ok
                if name is not None and ok and first.event == "ban":
                    self._started[name] = None  # fail2ban stops what banned even if its start failed
            except Exception:  # a bug in rendering must cost this event, never the worker
                log.exception("action %s: preparing a run failed", self.cfg.name)
                self.stats.failures += 1
            finally:
                self._busy -= 1
                for _ in events:
                    q.task_done()

    # -- a fail2ban action's life ---------------------------------------------------------------------

    async def start(self, names: Iterable[str]) -> None:
        """actionstart for each of `names` not started yet, one after the other. A name is started once its
        actionstart succeeded (or the file has none), as fail2ban marks it; a failure is counted and audited."""
        if self.life is None:
            return
        async with self._life_lock:  # on demand, two workers may want the same name at once
            for n in names:
                if n in self._started:
                    continue
                try:
                    run = render_f2b_life(self.life, self.cfg, "start", n, self.host, time.time())
                    if run is None or await self._attempt(run, "start", n):
                        self._started[n] = None
                except Exception:  # a bug here must cost this run, never the runner (nor the hub's tasks)
                    log.exception("action %s: starting for %s failed", self.cfg.name, n)
                    self.stats.failures += 1

    async def stop(self, names: Iterable[str] | None = None, budget: float | None = None) -> None:
        """actionstop for each started name of `names` (None: every one), `concurrency` at a time; with
        `budget`, all of it within that many seconds (each run's timeout shortened to what is left); a run the
        budget cuts short is killed, counted and audited. Never raises but for cancellation."""
        todo = [n for n in (list(self._started) if names is None else names) if n in self._started]
        for n in todo:
            del self._started[n]
        if self.life is None or not todo:
            return
        loop = asyncio.get_running_loop()
        end = None if budget is None else loop.time() + budget
        gate = asyncio.Semaphore(self.cfg.concurrency)

        async def one(n: str) -> None:
            try:
                assert self.life is not None
                run = render_f2b_life(self.life, self.cfg, "stop", n, self.host, time.time())
                if run is None:
                    return
                async with asyncio.timeout_at(end), gate:
                    if end is not None:
                        run = run._replace(timeout=max(0.001, min(run.timeout, end - loop.time())))
                    await self._attempt(run, "stop", n)
            except TimeoutError:
                self.stats.runs += 1
                self._failed("stop", n, "", 1, f"not done within the {budget:g}s a stop gives actions")
            except Exception:
                log.exception("action %s: stopping for %s failed", self.cfg.name, n)
                self.stats.failures += 1

        await asyncio.gather(*(one(n) for n in todo))

    # -- runs -------------------------------------------------------------------------------------------

    async def _attempt(self, r: Run, event: str, jail: str, address: str = "", more: int = 0) -> bool:
        """Run `r` with the retries; False when it failed for good (counted and audited)."""
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
                return True
            break
        st.runs += 1
        self._failed(event, jail, address, attempt + 1, st.last_error, more)
        return False

    def _failed(self, event: str, jail: str, address: str, attempts: int, error: str, more: int = 0) -> None:
        """Count a run that failed for good, and write its one audit line (a start or stop has no address)."""
        self.stats.failures += 1
        self.stats.last_error = error
        addr = f" address={address}" if address else ""
        tail = f" (and {more} more events)" if more else ""
        audit_log.info("action failed action=%s event=%s%s jail=%s attempts=%d error=%s%s", self.cfg.name, event,
                       addr, quote(jail), attempts, quote(error), tail,
                       extra={"action": self.cfg.name, "address": address or None, "jail": jail})


# -- the real executor ---------------------------------------------------------------------------------


def ambient_caps(status: str) -> int:
    """The ambient capability mask in /proc/self/status text (0 when it says nothing)."""
    for line in status.splitlines():
        if line.startswith("CapAmb:"):
            return int(line.split()[1], 16)
    return 0


PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4  # <linux/prctl.h>


def clear_ambient_caps() -> None:
    """Empty the calling thread's ambient capability set; raises OSError.

    The packaged service runs as an unprivileged user holding CAP_NET_ADMIN as an *ambient* capability, and
    ambient capabilities pass to every program it runs: a mail script could then rewrite the firewall. With
    the ambient set empty, an exec'd program of a non-root user gets no capability: its permitted set is what
    its file grants, and `NoNewPrivileges=` (set by the unit) makes exec ignore file capabilities. The
    daemon's own effective and permitted sets stay: ambient capabilities only matter at exec.

    This is prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL): lowering needs no privilege, and prctl is in
    the unit's `@system-service`, where capset(2), which setpriv uses, is `@privileged` and refused.
    Capabilities are per thread and a child is forked from the calling thread: the executor calls this in
    the thread that spawns, before each spawn (one system call)."""
    import ctypes  # the C library's prctl: Python's os module has none

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class RealExecutor:
    """Processes with asyncio, requests with one aiohttp session (made on first use, closed by `close`)."""

    def __init__(self) -> None:
        self._session: object | None = None
        try:
            with open("/proc/self/status") as f:
                ambient = ambient_caps(f.read())
        except OSError:
            ambient = 0
        self.drop_ambient = ambient != 0  # nothing to drop (root without ambient capabilities, as in tests)

    async def __call__(self, run: Run) -> None:
        if isinstance(run, CommandRun):
            await self._command(run)
        else:
            await self._post(run)

    async def _command(self, run: CommandRun) -> None:
        if self.drop_ambient:
            try:
                clear_ambient_caps()
            except OSError as exc:  # never run an action with the firewall's capability
                raise RunFailed(f"cannot run {run.argv[0]}: lowering the ambient capabilities failed: "
                                f"{exc.strerror}", retry=False) from None
        try:
            proc = await asyncio.create_subprocess_exec(
                *run.argv, env=run.env, cwd="/", stdin=asyncio.subprocess.DEVNULL,
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
           "clear_ambient_caps"]
