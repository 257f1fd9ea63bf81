"""`Tracker.observe_batch` is `observe` hit by hit: the same counts, the same bans in the same order, and the
same state left behind (held by hypothesis against the plain loop), and `JailRunner.process`'s batch path
gives what its per-hit loop gives."""

from __future__ import annotations

import ipaddress
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.addr import IPAddr
from nftblockd.allowlist import Allowlist
from nftblockd.config import parse_config
from nftblockd.config.model import Escalation
from nftblockd.detect import tracker as tracker_mod
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.jails import JailRunner
from nftblockd.detect.tracker import JailPolicy, Kind, Tally, Tracker, UnknownJailError
from nftblockd.events import Ban, Hit
from nftblockd.sources.base import LineBatch, MemoryPositionStore

T0 = 1_700_000_000.0
A = ipaddress.ip_address
N = ipaddress.ip_network

_POOL = ([f"192.0.2.{i}" for i in range(1, 7)] + ["198.51.100.1", "10.0.0.1", "224.0.0.1", "0.0.0.0"]
         + ["2001:db8::1", "2001:db8::2", "2001:db8:0:1::1", "::ffff:192.0.2.1"])
_ALLOW = ["192.0.2.0/30", "192.0.2.5", "198.51.100.0/24", "2001:db8::2", "::ffff:192.0.2.6"]


def plain(tr: Tracker, jail: str, hosts: list[IPAddr], times: list[float], now: float, live: bool) -> Tally:
    """The reference: `observe` one hit at a time, tallied the way observe_batch reports it."""
    counts: Counter[Kind] = Counter()
    bans, records = [], []
    for h, t in zip(hosts, times, strict=True):
        out = tr.observe(Hit(jail, h, t), now, live=live)
        counts[out.kind] += 1
        if out.kind is Kind.BANNED:
            assert out.ban is not None and out.record is not None
            bans.append(out.ban)
            records.append(out.record)
    return Tally(dict(counts), bans, records)


def state(tr: Tracker, now: float) -> tuple[object, ...]:
    return (tr.tracked, tr.evictions, tr.evicted_several, sorted(tr.history_snapshot()), tr.banned_count(),
            tuple(tr.failures("sshd", A(h), now) for h in _POOL))


@settings(max_examples=200, deadline=None)
@given(
    maxretry=st.integers(1, 4),
    max_tracked=st.sampled_from([2, 5, 1000]),
    allowed=st.lists(st.sampled_from(_ALLOW), max_size=2),
    prefix=st.sampled_from([64, 128]),
    batches=st.lists(st.tuples(
        st.floats(0, 700),  # time since the previous batch (findtime is 600: generations rotate)
        st.booleans(),  # live
        st.lists(st.tuples(st.sampled_from(_POOL), st.floats(-800, 120)), max_size=25),  # host, time - now
    ), max_size=8),
)
def test_property_batch_is_observe_hit_by_hit(maxretry: int, max_tracked: int, allowed: list[str], prefix: int,
                                              batches: list[tuple[float, bool, list[tuple[str, float]]]]) -> None:
    def build() -> Tracker:
        return Tracker([JailPolicy("sshd", maxretry=maxretry, findtime=600.0, bantime=300.0, ipv6_prefix=prefix)],
                       Allowlist.from_networks([N(a) for a in allowed]), max_tracked=max_tracked)

    one, many = build(), build()
    now = T0
    for dt, live, hits in batches:
        now += dt
        hosts = [A(h) for h, _ in hits]
        times = [now + d for _, d in hits]
        got = many.observe_batch("sshd", hosts, times, now, live=live)
        assert got == plain(one, "sshd", hosts, times, now, live)
        assert state(many, now) == state(one, now)


def test_a_batch_of_an_unknown_jail_is_refused() -> None:
    with pytest.raises(UnknownJailError):
        Tracker([JailPolicy("sshd")]).observe_batch("nope", [A("192.0.2.1")], [T0], T0)


def test_a_burst_bans_each_attacker_once_in_order() -> None:
    tr = Tracker([JailPolicy("sshd", maxretry=3, bantime=3600.0)])
    hosts: list[IPAddr] = [A(f"192.0.2.{i}") for i in (1, 2, 3)] * 4
    got = tr.observe_batch("sshd", hosts, [T0] * len(hosts), T0, live=True)
    assert got.counts == {Kind.COUNTED: 6, Kind.BANNED: 3, Kind.ALREADY_BANNED: 3}
    assert [b.target for b in got.bans] == [N(f"192.0.2.{i}/32") for i in (1, 2, 3)]
    assert [r.target for r in got.records] == [b.target for b in got.bans]
    assert got.bans[0] == Ban(N("192.0.2.1/32"), "default", T0 + 3600.0, "jail", got.bans[0].reason, "sshd")


@pytest.mark.parametrize("args", [
    (N("192.0.2.1/32"), "default", T0, "jail", "3 failures in 10m (sshd)", "sshd"),
    (N("2001:db8::/64"), "web", None, "jail", "", "web"),
])
def test_the_trackers_fast_ban_is_a_ban(args: tuple[Any, ...]) -> None:
    fast, real = tracker_mod._make_ban(*args), Ban(*args)
    assert tracker_mod._make_ban is not Ban  # the fast path is in use on this Python (a fallback is silent)
    assert type(fast) is Ban and fast == real and hash(fast) == hash(real) and repr(fast) == repr(real)
    assert fast.to_dict() == real.to_dict()
    with pytest.raises(AttributeError):
        fast.until = 1.0  # type: ignore[misc]  # still frozen


CONFIG = ("allowlist_self: false\nallowlist: [192.0.2.200]\njails:\n  sshd: {files: [/nonexistent], filter: sshd, "
          "maxretry: 3, findtime: 10m, bantime: 1h}\n")


def _runner(per_hit: bool) -> tuple[JailRunner, list[object]]:
    cfg = parse_config(CONFIG)
    r = JailRunner(cfg.jails[0], load_filter("sshd"), Tracker.from_config(cfg), None,  # type: ignore[arg-type]
                   MemoryPositionStore(), sources=[])
    seen: list[object] = []
    if per_hit:  # fleet counting wants every counted failure: the per-hit loop runs
        r.on_failure = lambda jail, host: seen.append(host)
    return r, seen


@pytest.mark.parametrize("stamped", [False, True])  # True: journal batches, the time in LineBatch.times
def test_process_batch_path_gives_what_the_per_hit_loop_gives(stamped: bool) -> None:
    now = 1_800_000_000.0
    stamp = "" if stamped else "Dec  4 09:00:00 "
    lines = []
    for i in range(40):
        host = "192.0.2.200" if i % 9 == 0 else ("0.0.0.0" if i % 11 == 0 else f"198.51.100.{i % 13}")
        lines.append(f"{stamp}h sshd[{3 * i}]: Failed password for root from {host} port 22 ssh2")
        lines.append(f"{stamp}h sshd[{3 * i + 1}]: Invalid user x from 2001:db8::{i % 5} port 22")
        lines.append(f"{stamp}h sshd[{3 * i + 2}]: Failed password for root from bad.example port 22 ssh2")
        lines.append("not a log line")
    results = []
    for per_hit in (True, False):
        r, _ = _runner(per_hit)
        out: list[tuple[list[Ban], object]] = []
        for part in (lines[:50], lines[50:]):
            for live in (False, True):
                times = [now - 300 + i for i in range(len(part))] if stamped else None
                bans, records = r.process(LineBatch("sshd", list(part), times), now, live, 0.0)
                out.append((bans, records))
        results.append((out, r.stats))
    assert results[0] == results[1]
    stats = results[1][1]
    assert stats.bans and stats.allowlisted and stats.already_banned and stats.rejected and stats.failures


def test_first_offences_at_one_moment_share_nothing_an_escalation_can_change() -> None:
    # a burst's first offences share their end and history entry (one tuple per `now`); an offender who
    # comes back escalates alone, and the others' history stays what each was given
    pol = JailPolicy("sshd", maxretry=1, bantime=60.0, escalation=Escalation(enabled=True, factor=2.0, max=3600.0))
    tr = Tracker([pol])
    hosts: list[IPAddr] = [A(f"192.0.2.{i}") for i in (1, 2, 3)]
    first = tr.observe_batch("sshd", hosts, [T0] * 3, T0)
    assert [b.until for b in first.bans] == [T0 + 60.0] * 3
    later = T0 + 120.0  # the first bans ended
    again = tr.observe_batch("sshd", [hosts[1], A("192.0.2.9")], [later] * 2, later)
    assert [(str(b.target), b.until) for b in again.bans] == [("192.0.2.2/32", later + 120.0),
                                                              ("192.0.2.9/32", later + 60.0)]
    assert "escalated" in again.bans[0].reason and "escalated" not in again.bans[1].reason
    assert sorted(tr.history_snapshot()) == sorted([
        ("sshd", "192.0.2.1", T0, T0 + 60.0), ("sshd", "192.0.2.2", T0, T0 + 60.0),
        ("sshd", "192.0.2.2", later, later + 120.0), ("sshd", "192.0.2.3", T0, T0 + 60.0),
        ("sshd", "192.0.2.9", later, later + 60.0)])
    # the ALREADY_BANNED answer carries the ban, and a storm gets the same one each time
    out = tr.observe(Hit("sshd", hosts[0], T0 + 1), T0 + 1)
    assert out.kind is Kind.ALREADY_BANNED and out.ban == first.bans[0]
    assert tr.observe(Hit("sshd", hosts[0], T0 + 2), T0 + 2) is out
