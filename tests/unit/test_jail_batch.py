"""JailRunner.process takes a source's LineBatch as it comes: the list of texts the matcher scans, and the
journal's per-line timestamps for lines whose text carries no time (a line without its own time counts at
its source's time, or at arrival for files)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from nftblockd.config import parse_config
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.jails import JailRunner, _new_hit
from nftblockd.detect.tracker import BanRecord, JailPolicy, Tracker
from nftblockd.events import Ban, Hit, LogLine
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


def test_the_fast_hit_is_the_plain_hit() -> None:
    host = ipaddress.ip_address("192.0.2.7")
    fast = _new_hit(Hit, ("sshd", host, 5.0, "line"))
    assert fast == Hit("sshd", host, 5.0, "line") and type(fast) is Hit
    assert (fast.jail, fast.host, fast.time, fast.line) == ("sshd", host, 5.0, "line")


def test_no_recidive_jail_no_escalation_and_with_one_the_second_ban_escalates() -> None:
    cfg = parse_config("allowlist_self: false\njails:\n  sshd: {journal: {matches: {_SYSTEMD_UNIT: ssh.service}}, "
                       "filter: sshd, maxretry: 1}\n")
    ban = Ban(ipaddress.ip_network("192.0.2.7/32"), "default", NOW + 60, "jail", "r", "sshd")
    assert Tracker.from_config(cfg).escalations(ban, NOW) == []
    rec = JailPolicy("recidive", recidive=True, maxretry=2, findtime=86400.0, bantime=86400.0)
    tracker = Tracker.from_config(cfg, extra=[rec])
    assert tracker.escalations(ban, NOW) == []
    assert [b.jail for b, _r in tracker.escalations(ban, NOW + 1)] == ["recidive"]


def test_a_batch_of_log_lines_keeps_their_times_only_when_every_line_has_one() -> None:
    assert LineBatch.of([LogLine("j", "x", 5.0), LogLine("j", "y", 6.0)]) == LineBatch("j", ["x", "y"], [5.0, 6.0])
    assert LineBatch.of([LogLine("f", "x"), LogLine("f", "y", 6.0)]) == LineBatch("f", ["x", "y"], None)
    assert list(LineBatch.of([])) == []
