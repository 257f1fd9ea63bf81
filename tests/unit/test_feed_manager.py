"""FeedManager on the in-memory kernel: a reload's added, removed and changed feeds take effect (tasks
started and stopped, entries in and out of their blocklists), and a feed task that raises is contained
(logged, counted, shown in status, started again) while the other feeds carry on. Local `path:` feeds; no
network, no root."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from nftblockd.addr import IPNet
from nftblockd.config import Config, FeedConfig, parse_config
from nftblockd.feeds.fetch import FeedFetcher, FeedUpdate
from nftblockd.feeds.manager import FeedManager
from nftblockd.service.metrics import Metrics
from tests.helpers.apirig import ApiRig, api_rig

BLOCKLISTS = """
blocklists:
  default: {timeout: 1h}
  fa: {}
  fb: {}
allowlist_self: false
"""


def config(tmp_path: Path, **feeds: str) -> Config:
    """A config whose feeds are local files: name -> blocklist."""
    body = "".join(f"  {n}: {{path: {tmp_path}/{n}.txt, blocklist: {bl}, refresh: 1h}}\n" for n, bl in feeds.items())
    return parse_config(BLOCKLISTS + ("feeds:\n" + body if feeds else ""))


def local(f: FeedConfig, d: Path, allow: Sequence[IPNet]) -> FeedFetcher:
    return FeedFetcher(f, d, allow=allow, watch_file=False)


# Feed entries are public-looking addresses: the sanitiser refuses documentation ranges (allow_special).
def k(addr: str) -> int:
    return int(ipaddress.ip_address(addr))


def fed(rig: ApiRig, blocklist: str) -> set[int]:
    """The IPv4 addresses a blocklist's sets hold, hash or interval (feeds put hosts in the interval set)."""
    hosts = rig.fake.elements(f"{blocklist}_ip4")
    return hosts | {key >> 8 for key in rig.fake.elements(f"{blocklist}_net4") if key & 0xFF == 32}


async def test_a_reload_starts_stops_and_syncs_feeds(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("1.2.3.4\n5.6.7.8\n")
    (tmp_path / "b.txt").write_text("9.9.9.9\n")
    async with api_rig(BLOCKLISTS) as rig:
        mgr = FeedManager(config(tmp_path, a="fa"), rig.enforcer, tmp_path / "cache", fetcher=local)
        stop = asyncio.Event()
        running = asyncio.create_task(mgr.run(stop))
        await mgr.refresh("a")
        assert fed(rig, "fa") == {k("1.2.3.4"), k("5.6.7.8")}
        assert set(mgr._tasks) == {"a"}
        task_a = mgr._tasks["a"]

        added, removed, changed = await mgr.reconfigure(config(tmp_path, b="fb"))
        assert (added, removed, changed) == (["b"], ["a"], [])
        assert task_a.done() and set(mgr._tasks) == {"b"}
        assert fed(rig, "fa") == set()  # a blocklist that lost its last feed is emptied
        assert mgr.blocklists() == {"fb"} and [f["name"] for f in mgr.status()] == ["b"]
        await mgr.refresh("b")
        assert fed(rig, "fb") == {k("9.9.9.9")}

        # a changed feed restarts: here it moves to another blocklist, from its cached copy at once
        added, removed, changed = await mgr.reconfigure(config(tmp_path, b="fa"))
        assert (added, removed, changed) == ([], [], ["b"])
        assert fed(rig, "fb") == set() and fed(rig, "fa") == {k("9.9.9.9")}
        stop.set()
        await running


class Crashing(FeedFetcher):
    """A fetcher whose loop raises an unexpected error the first `crashes` times it is run."""

    def __init__(self, f: FeedConfig, d: Path, crashes: int, runs: list[str]) -> None:
        super().__init__(f, d, watch_file=False)
        self.crashes = crashes
        self.runs = runs
        self.again = asyncio.Event()
        self.ran = asyncio.Event()

    async def run(self, on_update: Callable[[FeedUpdate], Awaitable[None]], stop: asyncio.Event) -> None:
        self.runs.append(self.name)
        self.ran.set()
        if len(self.runs) <= self.crashes:
            raise KeyError("a bug")
        self.again.set()
        await stop.wait()


async def test_a_feed_task_that_raises_is_contained_counted_shown_and_retried(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("1.2.3.4\n")
    (tmp_path / "b.txt").write_text("9.9.9.9\n")
    runs: list[str] = []
    fetchers: dict[str, FeedFetcher] = {}

    def make(f: FeedConfig, d: Path, allow: Sequence[IPNet]) -> FeedFetcher:
        fetchers[f.name] = Crashing(f, d, 2, runs) if f.name == "a" else local(f, d, allow)
        return fetchers[f.name]

    metrics = Metrics()
    rig: ApiRig
    async with api_rig(BLOCKLISTS, metrics=metrics) as rig:
        mgr = FeedManager(config(tmp_path, a="fa", b="fb"), rig.enforcer, tmp_path / "cache", metrics,
                          fetcher=make, crash_retry_base=0.001)
        stop = asyncio.Event()
        running = asyncio.create_task(mgr.run(stop))
        crashing = fetchers["a"]
        assert isinstance(crashing, Crashing)
        await crashing.again.wait()  # crashed twice, backed off, and now runs
        assert runs == ["a", "a", "a"] and mgr.crashes == {"a": 2}
        assert metrics.registry.get_sample_value("nftblock_feed_task_failures_total", {"feed": "a"}) == 2
        [a] = [f for f in mgr.status() if f["name"] == "a"]
        assert a["task_failures"] == 2 and a["error"] is None  # running again: the crash is history
        await mgr.refresh("b")  # the other feed was never disturbed
        assert fed(rig, "fb") == {k("9.9.9.9")}
        assert not running.done()
        stop.set()
        await running


async def test_status_shows_a_crashed_feed_while_it_waits_to_start_again(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("1.2.3.4\n")
    runs: list[str] = []

    made: list[Crashing] = []

    def make(f: FeedConfig, d: Path, allow: Sequence[IPNet]) -> FeedFetcher:
        made.append(Crashing(f, d, 1, runs))
        return made[-1]

    async with api_rig(BLOCKLISTS) as rig:
        mgr = FeedManager(config(tmp_path, a="fa"), rig.enforcer, tmp_path / "cache", fetcher=make,
                          crash_retry_base=3600.0)  # long enough to look at it
        stop = asyncio.Event()
        running = asyncio.create_task(mgr.run(stop))
        await made[0].ran.wait()  # it raised, and the supervisor noted it in the same step
        [a] = mgr.status()
        assert a["error"].startswith("the feed's task failed (KeyError: 'a bug')")
        assert "starting it again in 300s" in a["error"]  # the cap
        stop.set()  # stopping does not wait for the backoff
        await running


async def test_a_feed_with_actions_reports_what_each_refresh_added_and_removed(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("1.2.3.4\n5.6.7.8\n")
    cfg = parse_config(BLOCKLISTS + f"""
actions: {{n: {{type: command, argv: [/bin/true]}}}}
feeds:
  a: {{path: {tmp_path}/a.txt, blocklist: fa, refresh: 1h, actions: [n]}}
""")
    seen: list[tuple[str, list[tuple[int, int]], list[tuple[int, int]]]] = []
    async with api_rig(BLOCKLISTS) as rig:
        mgr = FeedManager(cfg, rig.enforcer, tmp_path / "cache", fetcher=local,
                          on_changes=lambda f, added, removed, now: seen.append((f.name, added, removed)))
        stop = asyncio.Event()
        running = asyncio.create_task(mgr.run(stop))
        await mgr.refresh("a")
        (tmp_path / "a.txt").write_text("1.2.3.4\n9.9.9.9\n")
        await mgr.refresh("a")
        await mgr.refresh("a")  # unchanged: nothing to report
        stop.set()
        await running
    def key(a: str) -> tuple[int, int]:
        return 4, k(a) << 8 | 32

    assert seen == [("a", [key("1.2.3.4"), key("5.6.7.8")], []), ("a", [key("9.9.9.9")], [key("5.6.7.8")])]
