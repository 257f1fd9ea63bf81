"""Fetch one threat feed (HTTP(S) or a local file), keep its last good copy on disk, guard against breakage.

This module is an IO edge: it talks HTTP (aiohttp), reads files, watches them with inotify and writes the
cache. It must not touch the kernel, aggregate across feeds or decide what is installed: it hands each new,
good copy of a feed — parsed and sanitised — to the daemon as a `FeedUpdate`, and the daemon unions feeds
(`aggregate.aggregate`) and diffs them against the kernel.

The rules a `FeedFetcher` keeps:

- **A bad body is never applied, not even in part.** A transport error, a non-200 status, a body over
  `max_size` (compressed or decompressed; reading stops at the cap), a corrupt gzip stream or a body that is
  not a list (HTML error page, mostly garbage: see `feedparse`) is an error: the last good copy stays in force
  and `status().error` says why.
- **Transient errors are retried with exponential backoff** (5xx, 408, 429, timeouts, refused or reset
  connections): `retry_base`, doubling, capped at the refresh interval, with jitter. Anything else (404, HTML,
  too big…) waits for the next regular refresh: retrying sooner would not change the answer.
- **Shrink guard.** A copy that is empty, or has fewer than `(1 - max_shrink)` times the entries of the last
  good copy, is held as *pending*, not applied; `status().pending_shrink` shows it until an operator calls
  `accept()` (`nftblock feeds accept NAME`), or the feed recovers by itself. Held copies are not cached:
  after a restart the shrink is simply detected again.
- **An empty answer is not a fresh list** (no entries: an empty body, only comments) unless the feed's
  `allow_empty` says the list may be empty; then it is applied at once, shrink guard or not. Otherwise it is
  held as above when a copy is in force, and an error when none is; either way it is not a successful
  fetch, so it never resets the age `max_stale` measures.
- **max_stale** withdraws the copy in force (once) when no fetch has succeeded for that long: after a
  failed fetch, and after one whose copy the shrink guard holds (a feed that keeps answering an empty or
  shrunk list confirms nothing). A 304, an unchanged file and an applied copy are successes.
- **The last good copy is on disk** in `cache_dir` as `NAME.body` (the decompressed body) and
  `NAME.meta.json` (source, ETag, Last-Modified, fetched-at, entries, sha256 of the body), each written
  atomically (tmp + fsync + rename, then the directory fsynced). `load_cache()` reads it back at start, so a
  host that reboots without network is protected by the lists it had. A cache whose source differs from the
  configured one is ignored.
- **Conditional requests**: the validators of the last good copy are sent (`If-None-Match`,
  `If-Modified-Since`); a 304 means "still the good copy" and `fetch()` returns None. A local file is
  "unchanged" while its (inode, size, mtime) are. Validators are only sent when a good copy is loaded, so a
  304 can never leave us with nothing.
- **Refresh**: `run()` refreshes every `refresh` seconds ± `jitter`; after a restart with a fresh cache it
  waits for the cache to age rather than hitting the feed at every restart. `stop` cuts a fetch in flight
  short: shutdown never waits for a feed that hangs. A local file is also followed
  with inotify (asyncinotify, on its directory: `CLOSE_WRITE`, `MOVED_TO`, `ATTRIB` of its name), so an
  edited or atomically replaced file is picked up at once; `refresh_now()` does the same for the CLI.

Time comes from an injected `Clock` (wall time for the status, `sleep` for the schedule); randomness for the
jitter from an injected callable. HTTP timeouts are real time: they bound real IO.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: HTTP and file fetches with timeouts, on the event loop)
import contextlib
import email.utils
import errno
import hashlib
import json
import logging
import os
import random
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import aiohttp

from nftblockd import __version__, boundedread
from nftblockd.addr import IPNet
from nftblockd.boundedread import BoundedReadError
from nftblockd.config import FeedConfig
from nftblockd.durations import PERMANENT, BanLength, format_duration
from nftblockd.feeds.aggregate import Policy, Sanitised, SanitiseStats, sanitise
from nftblockd.feeds.parse import FeedFormatError, ParseResult, ParseStats, parse_feed

__all__ = [
    "Clock",
    "FeedCounters",
    "FeedError",
    "FeedFetcher",
    "FeedStatus",
    "FeedUpdate",
    "PendingShrink",
    "SystemClock",
    "backoff_delay",
    "jittered",
    "retry_after",
]

log = logging.getLogger("nftblockd.feed")

USER_AGENT = f"nftblockd/{__version__} (threat feed fetcher)"
CACHE_VERSION = 1
_CHUNK = 64 * 1024
_GZIP_MAGIC = b"\x1f\x8b"
_TRANSIENT_STATUS = frozenset({408, 425, 429})
Origin = Literal["fetch", "cache", "accepted", "withdrawn"]


# -- seams --------------------------------------------------------------------------------------------------


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock time, epoch seconds."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


# -- values -------------------------------------------------------------------------------------------------


_STALE_MARGIN = 0.001  # seconds past max_stale at which the loop wakes to withdraw (the limit itself is allowed)


class FeedError(Exception):
    """Fetching or reading a feed failed. `transient`: the source may answer differently soon (retry).
    `retry_after`: seconds the server asked us to wait (its Retry-After header), if it said."""

    def __init__(self, feed: str, message: str, *, transient: bool, retry_after: float | None = None) -> None:
        super().__init__(f"feed {feed}: {message}")
        self.feed = feed
        self.reason = message
        self.transient = transient
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class FeedUpdate:
    """A new good copy of one feed, to be unioned into its blocklist."""

    name: str
    blocklist: str
    parsed: ParseResult
    sanitised: Sanitised
    origin: Origin
    fetched_at: float
    ban_timeout: BanLength = PERMANENT  # FeedConfig.ban_timeout: PERMANENT = entries stay until the feed drops them
    # defer_removals: the copy this one replaced, kept in force one more refresh (its entries are unioned in)
    deferred: Sanitised | None = None


@dataclass(frozen=True, slots=True)
class PendingShrink:
    """A fetched copy held back by the shrink guard."""

    last_good: int  # entries in the copy still in force
    entries: int  # entries in the held copy
    since: float  # first seen (epoch)


@dataclass(frozen=True, slots=True)
class FeedCounters:
    fetch_ok: int = 0  # new good copies fetched
    not_modified: int = 0  # 304s and unchanged files
    errors: int = 0
    shrink_held: int = 0  # fetches held back by the shrink guard
    withdrawn: int = 0  # times max_stale withdrew the feed's entries
    invalid: int = 0  # invalid entries in the copy in force
    markup: int = 0  # stray markup lines skipped in the copy in force (feeds.parse)
    host_bits: int = 0  # entries refused in the copy in force: host bits set (never widened)
    refused: int = 0  # entries of the copy in force refused by sanitising (too broad, special, allowlisted)


@dataclass(frozen=True, slots=True)
class FeedStatus:
    name: str
    blocklist: str
    source: str
    entries: int  # in the good copy in force (0 if none)
    last_success: float | None  # when the copy in force was fetched (or confirmed by a 304)
    last_attempt: float | None
    next_refresh: float | None
    error: str | None
    etag: str | None
    last_modified: str | None
    pending_shrink: PendingShrink | None
    counters: FeedCounters
    parse: ParseStats | None = None  # of the copy in force
    sanitise: SanitiseStats | None = None


def jittered(delay: float, jitter: float, rand: Callable[[], float]) -> float:
    """`delay` plus or minus `jitter * delay`, uniformly (rand() in [0, 1): 0.5 means no change)."""
    return max(0.0, delay * (1.0 + jitter * (2.0 * rand() - 1.0)))


def backoff_delay(failures: int, base: float, cap: float) -> float:
    """Delay after `failures` consecutive transient errors: `base`, 2 `base`, 4 `base`... at most `cap`."""
    return float(min(cap, base * 2.0 ** min(max(failures - 1, 0), 32)))


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds a Retry-After header value asks for (delay-seconds or an HTTP-date), or None if absent or
    unreadable. Never negative."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(min(int(text), 10**9))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


# -- internal state -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Copy:
    """A fetched body and what came with it."""

    body: bytes
    etag: str | None = None
    last_modified: str | None = None
    file_sig: tuple[int, int, int] | None = None


@dataclass(slots=True)
class _Good:
    etag: str | None
    last_modified: str | None
    file_sig: tuple[int, int, int] | None
    fetched_at: float
    entries: int
    parse: ParseStats
    sanitise: SanitiseStats


@dataclass(slots=True)
class _Pending:
    copy: _Copy
    parsed: ParseResult
    sanitised: Sanitised
    since: float


@dataclass(slots=True)
class _Counts:
    fetch_ok: int = 0
    not_modified: int = 0
    errors: int = 0
    shrink_held: int = 0
    withdrawn: int = 0


# -- the fetcher --------------------------------------------------------------------------------------------




class FeedFetcher:
    """Fetches one feed per `FeedConfig`; see the module docstring for the rules.

    `allow`: networks never to block (the config allowlist and the host's own addresses). `session`: an
    aiohttp session to share between feeds; by default one is opened per fetch, which at feed refresh rates
    costs nothing and leaves nothing to close. `trust_env`: honour HTTPS_PROXY / NO_PROXY like curl does.
    `retry_base`: the first retry delay after a transient error. `watch_file`: follow a `path:` feed with
    inotify while `run()` runs.
    """

    def __init__(self, cfg: FeedConfig, cache_dir: str | os.PathLike[str], *, allow: Sequence[IPNet] = (),
                 clock: Clock | None = None, rand: Callable[[], float] = random.random,
                 session: aiohttp.ClientSession | None = None, trust_env: bool = True,
                 retry_base: float = 30.0, watch_file: bool = True) -> None:
        if (cfg.url is None) == (cfg.path is None):
            raise ValueError(f"feed {cfg.name}: exactly one of url and path is needed")
        # The body is decoded here (size cap on the compressed bytes, then on the decoded ones). A per-request
        # auto_decompress= needs aiohttp >= 3.9; Debian 12 has 3.8, so it is the session's setting.
        if session is not None and session.auto_decompress:
            raise ValueError("a shared session must be created with auto_decompress=False")
        self.cfg = cfg
        self.cache_dir = Path(cache_dir)
        self._allow = tuple(allow)
        self._policy = Policy(cfg.min_prefix_v4, cfg.min_prefix_v6, cfg.allow_special)
        self._clock: Clock = clock or SystemClock()
        self._rand = rand
        self._session = session
        self._trust_env = trust_env
        self._retry_base = retry_base
        self._watch_file = watch_file
        self._good: _Good | None = None
        self._current: tuple[ParseResult, Sanitised] | None = None  # the copy in force, as last handed over
        self._deferred: Sanitised | None = None  # defer_removals: the copy before it, still in force
        self._withdrawn = False  # max_stale withdrew the entries; a successful fetch brings them back
        self._pending: _Pending | None = None
        self._accepted = False
        self._counts = _Counts()
        self._error: str | None = None
        self._last_attempt: float | None = None
        self._next_refresh: float | None = None
        self._wake = asyncio.Event()
        # One fetch at a time, held until its copy is handed over (on_update done): run() and a CLI refresh may
        # meet, and a refresh that found the copy "unchanged" because run() had just taken it must not answer
        # before that copy is enforced.
        self._lock = asyncio.Lock()

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def source(self) -> str:
        return self.cfg.url or self.cfg.path or ""

    @property
    def body_path(self) -> Path:
        return self.cache_dir / f"{self.cfg.name}.body"

    @property
    def meta_path(self) -> Path:
        return self.cache_dir / f"{self.cfg.name}.meta.json"

    # -- operator-facing ------------------------------------------------------------------------------------

    def status(self) -> FeedStatus:
        g, p, c = self._good, self._pending, self._counts
        return FeedStatus(
            name=self.cfg.name,
            blocklist=self.cfg.blocklist,
            source=self.source,
            entries=g.entries if g else 0,
            last_success=g.fetched_at if g else None,
            last_attempt=self._last_attempt,
            next_refresh=self._next_refresh,
            error=self._error,
            etag=g.etag if g else None,
            last_modified=g.last_modified if g else None,
            pending_shrink=PendingShrink(g.entries if g else 0, p.parsed.entries, p.since) if p else None,
            counters=FeedCounters(
                fetch_ok=c.fetch_ok, not_modified=c.not_modified, errors=c.errors, shrink_held=c.shrink_held,
                withdrawn=c.withdrawn,
                invalid=g.parse.invalid if g else 0,
                markup=g.parse.markup if g else 0,
                host_bits=g.parse.host_bits if g else 0,
                refused=g.sanitise.refused if g else 0,
            ),
            parse=g.parse if g else None,
            sanitise=g.sanitise if g else None,
        )

    def accept(self) -> bool:
        """Accept the copy held by the shrink guard: the next `fetch()` (at once, under `run()`) applies it.

        Returns False when nothing is held.
        """
        if self._pending is None:
            return False
        self._accepted = True
        self._wake.set()
        return True

    def refresh_now(self) -> None:
        """Make `run()` fetch at once instead of waiting for the next refresh."""
        self._wake.set()

    def set_allowlist(self, allow: Sequence[IPNet]) -> None:
        """Networks never to block, from the next copy on (config reload, the host's addresses changed).

        The copy in force is not re-sanitised here: the daemon does that from `FeedUpdate.parsed` with
        `aggregate.sanitise(parsed.v4, parsed.v6, fetcher.policy, allow)`, without fetching again.
        """
        self._allow = tuple(allow)

    @property
    def policy(self) -> Policy:
        return self._policy

    # -- cache ---------------------------------------------------------------------------------------------

    async def load_cache(self) -> FeedUpdate | None:
        """Read the last good copy from disk (at start); None if there is none or it is unusable."""
        try:
            loaded = await asyncio.to_thread(self._read_cache)
        except (OSError, ValueError, FeedFormatError) as exc:
            self._error = f"the cached copy is unusable: {exc}"
            log.warning("feed %s: the cached copy in %s is unusable (%s); waiting for a fetch",
                        self.cfg.name, self.cache_dir, exc)
            return None
        if loaded is None:
            return None
        meta, copy, parsed, sanitised = loaded
        stamp = meta.get("fetched_at")
        fetched_at = float(stamp) if isinstance(stamp, int | float) else 0.0
        age = self._clock.time() - fetched_at
        if self.cfg.max_stale is not None and age > self.cfg.max_stale:
            self._error = (f"the cached copy is {format_duration(age)} old (max_stale "
                           f"{format_duration(self.cfg.max_stale)}); not applied, waiting for a fetch")
            log.warning("feed %s: %s", self.cfg.name, self._error)
            return None
        self._good = _Good(copy.etag, copy.last_modified, copy.file_sig, fetched_at, parsed.entries,
                           parsed.stats, sanitised.stats)
        log.info("feed %s: loaded the cached copy from %s (%d entries)", self.cfg.name,
                 time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(fetched_at)), parsed.entries)
        return self._update(parsed, sanitised, "cache", fetched_at)

    def _read_cache(self) -> tuple[dict[str, object], _Copy, ParseResult, Sanitised] | None:
        try:
            meta_text = self.meta_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        meta = json.loads(meta_text)
        if not isinstance(meta, dict) or meta.get("version") != CACHE_VERSION:
            raise ValueError(f"unknown cache format in {self.meta_path}")
        if meta.get("source") != self.source:
            log.info("feed %s: the cached copy is of %s, not %s; ignoring it", self.cfg.name,
                     meta.get("source"), self.source)
            return None
        body = self.body_path.read_bytes()
        etag, last_modified, sig = meta.get("etag"), meta.get("last_modified"), meta.get("file_sig")
        if hashlib.sha256(body).hexdigest() != meta.get("sha256"):
            # A crash between the two renames: the body is newer than its metadata but was good when
            # written. Use it, and drop the validators so the next fetch is unconditional.
            etag = last_modified = sig = None
        parsed, sanitised = self._process(body)
        copy = _Copy(
            body,
            etag if isinstance(etag, str) else None,
            last_modified if isinstance(last_modified, str) else None,
            (int(sig[0]), int(sig[1]), int(sig[2])) if isinstance(sig, list) and len(sig) == 3 else None,
        )
        return meta, copy, parsed, sanitised

    def _write_cache(self, copy: _Copy, entries: int, fetched_at: float) -> None:
        self.cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        meta = {
            "version": CACHE_VERSION, "name": self.cfg.name, "source": self.source, "format": self.cfg.format,
            "etag": copy.etag, "last_modified": copy.last_modified,
            "file_sig": list(copy.file_sig) if copy.file_sig else None,
            "fetched_at": fetched_at, "entries": entries, "size": len(copy.body),
            "sha256": hashlib.sha256(copy.body).hexdigest(),
        }
        _atomic_write(self.body_path, copy.body)
        _atomic_write(self.meta_path, (json.dumps(meta, indent=1) + "\n").encode())
        _fsync_dir(self.cache_dir)

    # -- one fetch -----------------------------------------------------------------------------------------

    async def fetch(self) -> FeedUpdate | None:
        """One attempt. A new good copy, or None (not modified, unchanged, or held by the shrink guard).

        Raises FeedError; the copy in force is untouched and `status().error` says why.
        """
        async with self._lock:
            return await self._fetch()

    async def fetch_now(self, on_update: Callable[[FeedUpdate], Awaitable[None]]) -> FeedUpdate | None:
        """A fetch outside the schedule (`nftblock feeds refresh`): as `fetch`, and a new copy is handed to
        `on_update` before any other fetch of this feed starts; so is one that `run()` is handing over."""
        async with self._lock:
            update = await self._fetch()
            if update is not None:
                await on_update(update)
            return update

    async def _fetch(self) -> FeedUpdate | None:
        now = self._clock.time()
        self._last_attempt = now
        if self._accepted and self._pending is not None:
            held, self._pending, self._accepted = self._pending, None, False
            log.warning("feed %s: operator accepted the shrunk copy (%d entries)", self.cfg.name,
                        held.parsed.entries)
            return await self._commit(held.copy, held.parsed, held.sanitised, now, "accepted")
        try:
            copy = await (self._get_http() if self.cfg.url else self._get_file())
            if copy is None:
                self._counts.not_modified += 1
                self._error = None
                self._clear_pending()  # the source is back to the copy in force
                if self._good is not None:
                    self._good.fetched_at = now
                if self._deferred is not None and self._current is not None:
                    # A refresh confirmed the copy in force: what it dropped may go now (defer_removals).
                    parsed, sanitised = self._current
                    return self._update(parsed, sanitised, "fetch", now)
                return None
            try:
                parsed, sanitised = await asyncio.to_thread(self._process, copy.body)
            except FeedFormatError as exc:
                raise FeedError(self.cfg.name, str(exc), transient=False) from None
            if parsed.entries == 0 and not self.cfg.allow_empty and self._good is None:
                # with a copy in force, the shrink guard holds it instead (and `feeds accept` can apply it)
                raise FeedError(self.cfg.name, "the answer has no entries; not applied (allow_empty: true if this "
                                "list may be empty)", transient=False)
        except FeedError as exc:
            self._counts.errors += 1
            self._error = exc.reason
            log.warning("%s; keeping the last good copy%s", exc,
                        f" ({self._good.entries} entries)" if self._good else "")
            raise
        if self._shrunk(parsed.entries):
            return self._hold(copy, parsed, sanitised, now)
        self._clear_pending()
        self._counts.fetch_ok += 1
        return await self._commit(copy, parsed, sanitised, now, "fetch")

    def _clear_pending(self) -> None:
        self._pending = None
        self._accepted = False

    def _process(self, body: bytes) -> tuple[ParseResult, Sanitised]:
        parsed = parse_feed(body, self.cfg.format, self.cfg.column)
        return parsed, sanitise(parsed.v4, parsed.v6, self._policy, self._allow)

    def _shrunk(self, entries: int) -> bool:
        if self._good is None or self._good.entries == 0 or (entries == 0 and self.cfg.allow_empty):
            return False
        return entries == 0 or entries < (1.0 - self.cfg.max_shrink) * self._good.entries

    def _hold(self, copy: _Copy, parsed: ParseResult, sanitised: Sanitised, now: float) -> FeedUpdate | None:
        assert self._good is not None
        since = self._pending.since if self._pending else now
        self._pending = _Pending(copy, parsed, sanitised, since)
        self._counts.shrink_held += 1
        self._error = (
            f"the feed shrank from {self._good.entries} to {parsed.entries} entries (more than "
            f"{self.cfg.max_shrink:.0%}); keeping the last good copy until an operator runs "
            f"`nftblock feeds accept {self.cfg.name}`"
        )
        log.warning("feed %s: %s", self.cfg.name, self._error)
        return None

    async def _commit(self, copy: _Copy, parsed: ParseResult, sanitised: Sanitised, now: float,
                      origin: Origin) -> FeedUpdate:
        self._good = _Good(copy.etag, copy.last_modified, copy.file_sig, now, parsed.entries, parsed.stats,
                           sanitised.stats)
        self._error = None
        try:
            await asyncio.to_thread(self._write_cache, copy, parsed.entries, now)
        except OSError as exc:
            # The copy is good and is applied; only its survival across a restart is at risk.
            self._error = f"cannot write the cache in {self.cache_dir}: {exc}"
            log.error("feed %s: %s", self.cfg.name, self._error)
        st, ss = parsed.stats, sanitised.stats
        log.info("feed %s: %d entries (%d invalid, %d markup lines skipped, %d refused with host bits set, %d refused: "
                 "%d too broad, %d special, %d allowlisted)", self.cfg.name, st.entries, st.invalid, st.markup,
                 st.host_bits, ss.refused, ss.too_broad, ss.special, ss.allowlisted)
        return self._update(parsed, sanitised, origin, now)

    def _update(self, parsed: ParseResult, sanitised: Sanitised, origin: Origin, at: float) -> FeedUpdate:
        cfg = self.cfg
        deferred = None
        if cfg.defer_removals and origin in ("fetch", "accepted") and self._current is not None \
                and self._current[1] is not sanitised:
            deferred = self._current[1]  # the copy this one replaces stays in force one more refresh
        self._current = (parsed, sanitised)
        self._deferred = deferred
        self._withdrawn = origin == "withdrawn"
        return FeedUpdate(cfg.name, cfg.blocklist, parsed, sanitised, origin, at, cfg.ban_timeout, deferred)

    def _withdraw_if_stale(self) -> FeedUpdate | None:
        """max_stale: the copy in force is too old and no fetch succeeds: withdraw its entries (once)."""
        limit = self.cfg.max_stale
        g = self._good
        if limit is None or g is None or self._withdrawn:
            return None
        now = self._clock.time()
        if now - g.fetched_at <= limit:
            return None
        age = format_duration(now - g.fetched_at)
        log.error("feed %s: no successful fetch for %s (max_stale %s); withdrawing its %d entries", self.cfg.name,
                  age, format_duration(limit), g.entries)
        self._good = None  # the next fetch is unconditional: a 304 must not leave the feed empty
        self._clear_pending()  # a held copy was held against the copy withdrawn here
        self._error = f"withdrawn: no successful fetch for {age} (max_stale {format_duration(limit)})"
        self._counts.withdrawn += 1
        empty = ParseResult([], [], ParseStats())
        return self._update(empty, sanitise([], [], self._policy, self._allow), "withdrawn", now)

    # -- transports ------------------------------------------------------------------------------------------

    def _fail(self, message: str, *, transient: bool) -> FeedError:
        return FeedError(self.cfg.name, message, transient=transient)

    async def _get_http(self) -> _Copy | None:
        assert self.cfg.url is not None
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "gzip, deflate"}
        if self._good is not None:
            if self._good.etag:
                headers["If-None-Match"] = self._good.etag
            if self._good.last_modified:
                headers["If-Modified-Since"] = self._good.last_modified
        timeout = aiohttp.ClientTimeout(total=self.cfg.timeout)
        cap = self.cfg.max_size
        async with contextlib.AsyncExitStack() as stack:
            session = self._session
            if session is None:
                session = await stack.enter_async_context(
                    aiohttp.ClientSession(trust_env=self._trust_env, auto_decompress=False))
            try:
                async with session.get(self.cfg.url, headers=headers, timeout=timeout, max_redirects=5) as resp:
                    if resp.status == 304 and self._good is not None:
                        return None
                    if resp.status != 200:
                        transient = resp.status >= 500 or resp.status in _TRANSIENT_STATUS
                        what = f"HTTP {resp.status} {resp.reason or ''}".rstrip()
                        wait = retry_after(resp.headers.get("Retry-After"), self._clock.time())
                        if wait is not None:
                            what += f" (the server asks to retry after {wait:.0f}s)"
                        raise FeedError(self.cfg.name, what, transient=transient, retry_after=wait)
                    if resp.content_length is not None and resp.content_length > cap:
                        raise self._fail(f"the body is {resp.content_length} bytes, over max_size {cap}",
                                         transient=False)
                    raw = bytearray()
                    async for chunk in resp.content.iter_chunked(_CHUNK):
                        raw += chunk
                        if len(raw) > cap:
                            raise self._fail(f"the body is over max_size {cap} bytes; rejected whole",
                                             transient=False)
                    encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
                    etag = resp.headers.get("ETag")
                    last_modified = resp.headers.get("Last-Modified")
            except TimeoutError:
                raise self._fail(f"no complete answer within {self.cfg.timeout:g}s", transient=True) from None
            except aiohttp.ClientResponseError as exc:
                raise self._fail(f"bad HTTP response: {exc.message}", transient=True) from None
            except (aiohttp.ClientError, OSError) as exc:
                raise self._fail(f"cannot fetch {self.cfg.url}: {exc or type(exc).__name__}",
                                 transient=True) from None
        body = self._decode(raw, encoding)  # type: ignore[arg-type]  # no copy of the raw body into bytes
        return _Copy(body, etag, last_modified)

    async def _get_file(self) -> _Copy | None:
        assert self.cfg.path is not None
        path = Path(self.cfg.path)
        try:
            st = await asyncio.to_thread(os.stat, path)
        except OSError as exc:
            raise self._fail(f"cannot read {path}: {exc.strerror}", transient=False) from None
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._good is not None and self._good.file_sig == sig:
            return None
        if st.st_size > self.cfg.max_size:
            raise self._fail(f"{path} is {st.st_size} bytes, over max_size {self.cfg.max_size}",
                             transient=False)
        try:
            raw = await asyncio.to_thread(_read_capped, path, self.cfg.max_size)
        except OSError as exc:
            raise self._fail(f"cannot read {path}: {exc.strerror}", transient=False) from None
        if raw is None:
            raise self._fail(f"{path} grew over max_size {self.cfg.max_size} bytes while being read",
                             transient=False)
        return _Copy(self._decode(raw, "identity"), file_sig=sig)

    def _decode(self, raw: bytes, encoding: str) -> bytes:
        """Undo Content-Encoding, then a gzip body (`.gz` lists), each capped at max_size."""
        cap = self.cfg.max_size
        if encoding in ("gzip", "x-gzip", "deflate"):
            raw = self._inflate(raw, cap)
        elif encoding not in ("identity", ""):
            raise self._fail(f"unsupported Content-Encoding {encoding!r}", transient=False)
        if raw[:2] == _GZIP_MAGIC:
            raw = self._inflate(raw, cap)
        return raw

    def _inflate(self, data: bytes, cap: int) -> bytes:
        """The inflated body (a bytearray, not copied again into bytes), at most `cap` bytes.

        Output comes _CHUNK bytes at a time into one buffer, so a bomb costs at most cap + _CHUNK bytes on top
        of the compressed input (asking zlib for cap + 1 bytes at once, then copying them, cost twice cap).
        """
        out = bytearray()
        rest: bytes = data
        try:
            while rest:
                # wbits 47: gzip or zlib header, detected; raw deflate is tried if both fail
                d = zlib.decompressobj(47)
                try:
                    self._inflate_member(d, rest, out, cap)
                except zlib.error:
                    if out:
                        raise
                    d = zlib.decompressobj(-15)
                    self._inflate_member(d, rest, out, cap)
                if not d.eof:
                    raise self._fail("the compressed body is truncated", transient=True)
                rest = d.unused_data
                if rest and rest[:2] != _GZIP_MAGIC:  # padding after the last gzip member
                    if rest.strip(b"\x00"):
                        raise self._fail("garbage after the compressed body", transient=False)
                    break
        except zlib.error as exc:
            raise self._fail(f"corrupt compressed body: {exc}", transient=False) from None
        return out  # type: ignore[return-value]  # a bytearray serves every use of a body

    def _inflate_member(self, d: zlib._Decompress, data: bytes, out: bytearray, cap: int) -> None:
        buf = data
        while not d.eof:
            chunk = d.decompress(buf, _CHUNK)
            buf = d.unconsumed_tail
            if not chunk and not buf:
                return  # input exhausted before the end of the stream: the caller says "truncated"
            out += chunk
            if len(out) > cap:
                raise self._fail(f"the body inflates to over max_size {cap} bytes; rejected whole",
                                 transient=False)

    # -- the loop -------------------------------------------------------------------------------------------

    async def run(self, on_update: Callable[[FeedUpdate], Awaitable[None]], stop: asyncio.Event) -> None:
        """Fetch on schedule until `stop` is set, handing every new good copy to `on_update`."""
        # The watcher lives exactly as long as this call; a TaskGroup here would wrap the caller's
        # exceptions from on_update in an ExceptionGroup.
        watcher = asyncio.create_task(self._watch()) if self.cfg.path and self._watch_file else None
        try:
            await self._loop(on_update, stop)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher

    async def _loop(self, on_update: Callable[[FeedUpdate], Awaitable[None]], stop: asyncio.Event) -> None:
        failures = 0
        delay = self._first_delay()
        unconfirmed = False  # the last fetch did not succeed (an error, or a copy the shrink guard holds)
        while not stop.is_set():
            self._next_refresh = self._clock.time() + delay
            await self._wait(delay, stop, on_update, unconfirmed)
            if stop.is_set():
                break
            unconfirmed = True
            async with self._lock:  # until the copy is handed over (see __init__)
                fetching = asyncio.ensure_future(self._fetch())
                stopping = asyncio.ensure_future(stop.wait())
                try:
                    await asyncio.wait({fetching, stopping}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopping.cancel()
                if not fetching.done():
                    # Stopping: a fetch that hangs must not hold the daemon's shutdown for its whole timeout
                    # (issue 13 measured 28.8 s). The copy in force stays; the next start fetches again.
                    fetching.cancel()
                    try:
                        await fetching
                    except asyncio.CancelledError:
                        task = asyncio.current_task()
                        if task is not None and task.cancelling():
                            raise  # we are being cancelled ourselves, not only the fetch
                    break
                try:
                    update = fetching.result()
                except FeedError as exc:
                    if exc.transient:
                        failures += 1
                        delay = jittered(backoff_delay(failures, self._retry_base, self.cfg.refresh),
                                         self.cfg.jitter, self._rand)
                    else:
                        failures = 0
                        delay = self._interval()
                    delay = max(delay, self._honoured(exc.retry_after))
                    withdrawn = self._withdraw_if_stale()
                    if withdrawn is not None:
                        await on_update(withdrawn)
                    continue
                failures = 0
                delay = self._interval()
                unconfirmed = self._pending is not None
                if update is not None:
                    await on_update(update)
                elif unconfirmed:  # held by the shrink guard: not a successful fetch either
                    withdrawn = self._withdraw_if_stale()
                    if withdrawn is not None:
                        await on_update(withdrawn)
        self._next_refresh = None

    def _honoured(self, asked: float | None) -> float:
        """How much of a server's Retry-After to wait: all of it, up to max_retry_after (default: refresh)."""
        if asked is None:
            return 0.0
        cap = self.cfg.refresh if self.cfg.max_retry_after is None else self.cfg.max_retry_after
        return min(asked, cap)

    def _interval(self) -> float:
        return jittered(self.cfg.refresh, self.cfg.jitter, self._rand)

    def _first_delay(self) -> float:
        """Local files are checked at once; a URL whose cached copy is still fresh waits for it to age."""
        if self._good is None or self.cfg.path is not None:
            return 0.0
        age = self._clock.time() - self._good.fetched_at
        return max(0.0, self.cfg.refresh - age)

    async def _wait(self, delay: float, stop: asyncio.Event, on_update: Callable[[FeedUpdate], Awaitable[None]],
                    unconfirmed: bool) -> None:
        """Pause until the next fetch is due. After a fetch that did not succeed, a max_stale deadline that
        falls first is kept on time: the copy in force is withdrawn then, not at the next fetch after it (a
        server's Retry-After, a long refresh), and without fetching early."""
        due = self._clock.time() + delay
        stale = self._stale_at() if unconfirmed else None
        if stale is not None and stale < due:
            if await self._pause(stale - self._clock.time(), stop):
                return  # stopping, or woken for a fetch now
            async with self._lock:
                withdrawn = self._withdraw_if_stale()
                if withdrawn is not None:
                    await on_update(withdrawn)
        await self._pause(due - self._clock.time(), stop)

    def _stale_at(self) -> float | None:
        """When max_stale withdraws the copy in force unless a fetch succeeds first (just past the limit,
        which `_withdraw_if_stale` holds to with `>`), or None (no limit, nothing in force, withdrawn)."""
        limit, g = self.cfg.max_stale, self._good
        if limit is None or g is None or self._withdrawn:
            return None
        return g.fetched_at + limit + _STALE_MARGIN

    async def _pause(self, delay: float, stop: asyncio.Event) -> bool:
        """Sleep `delay` seconds, or less if `stop` or a wake-up (refresh_now, accept, inotify) comes; True
        when it was cut short so."""
        woken = self._wake.is_set()
        if not woken and delay > 0:
            sleeping = asyncio.ensure_future(self._clock.sleep(delay))
            waiters = [sleeping, asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            try:
                done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                woken = sleeping not in done
            finally:
                for w in waiters:
                    w.cancel()
                await asyncio.gather(*waiters, return_exceptions=True)
        self._wake.clear()
        return woken or stop.is_set()

    async def _watch(self) -> None:
        """Follow the local file with inotify on its directory; any change wakes the loop."""
        from asyncinotify import Inotify, Mask  # imported here: URL-only deployments never need inotify

        assert self.cfg.path is not None
        path = Path(self.cfg.path)
        try:
            with Inotify() as inotify:
                inotify.add_watch(path.parent, Mask.CLOSE_WRITE | Mask.MOVED_TO | Mask.ATTRIB)
                async for event in inotify:
                    if event.name is not None and event.name.name == path.name:
                        self._wake.set()
        except OSError as exc:
            log.warning("feed %s: cannot watch %s (%s); it is re-read every %gs instead", self.cfg.name,
                        path.parent, exc, self.cfg.refresh)


# -- small file helpers -------------------------------------------------------------------------------------


def _read_capped(path: Path, cap: int) -> bytes | None:
    """The file's bytes, or None if it holds more than `cap` (never more than cap + 1 bytes are read); a
    FIFO or a device is refused (BoundedReadError, an OSError) rather than waited on or read forever."""
    try:
        return boundedread.read_bytes(path, cap)
    except BoundedReadError as exc:
        if exc.errno == errno.EFBIG:
            return None
        raise


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

