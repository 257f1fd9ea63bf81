"""JailRunner.process takes a source's LineBatch as it comes: the list of texts the matcher scans, and the
journal's per-line timestamps for lines whose text carries no time (a line without its own time counts at
its source's time, or at arrival for files)."""

from __future__ import annotations

from collections.abc import Sequence

from nftblockd.config import parse_config
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.jails import JailRunner
from nftblockd.detect.tracker import BanRecord, Tracker
from nftblockd.events import Ban, LogLine
from nftblockd.sources.base import LineBatch, MemoryPositionStore

NOW = 1_800_000_000.0
# as the journal source writes them (syslog_format): no date in the text, the time travels in LineBatch.times
LINES = [f"host sshd[{100 + i}]: Failed password for root from 192.0.2.7 port {4000 + i} ssh2" for i in range(3)]


class Sink:
    async def submit(self, bans: list[Ban], records: list[BanRecord], arrival: float) -> None:
        raise AssertionError("process() hands bans back; it does not submit")

    def submit_nowait(self, bans: list[Ban], records: list[BanRecord], arrival: float) -> bool:
        raise AssertionError("process() hands bans back; it does not submit")


def runner() -> JailRunner:
    cfg = parse_config("allowlist_self: false\njails:\n  sshd: {journal: {matches: {_SYSTEMD_UNIT: ssh.service}}, "
                       "filter: sshd, maxretry: 3, findtime: 10m, bantime: 1h}\n")
    jail = cfg.jails[0]
    return JailRunner(jail, load_filter("sshd"), Tracker.from_config(cfg), Sink(), MemoryPositionStore(),
                      sources=[])


def banned(times: Sequence[float] | None) -> tuple[int, int]:
    r = runner()
    bans, _records = r.process(LineBatch("sshd", list(LINES), None if times is None else list(times)), NOW,
                               False, 0.0)
    return len(bans), r.stats.stale


def test_the_journal_times_decide_whether_failures_count() -> None:
    assert banned([NOW - 5, NOW - 4, NOW - 3]) == (1, 0)
    # hours old (a backlog): outside findtime, so not counted, though `now` would have counted them
    assert banned([NOW - 7200, NOW - 7100, NOW - 7000]) == (0, 3)


def test_lines_without_times_count_at_arrival() -> None:
    assert banned(None) == (1, 0)


def test_a_batch_iterates_as_log_lines() -> None:
    assert list(LineBatch("a", ["x", "y"])) == [LogLine("a", "x"), LogLine("a", "y")]
    assert list(LineBatch("j", ["x"], [5.0])) == [LogLine("j", "x", 5.0)]
    assert len(LineBatch("a", ["x", "y"])) == 2
