"""The tracker's rules, one test (or a few) per rule of the module docstring, then hypothesis properties.

Time is always an argument: T0 is an arbitrary epoch and every test moves `now` by hand.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.addr import IPNet
from nftblockd.allowlist import Allowlist
from nftblockd.config import Config, Escalation, JailConfig
from nftblockd.detect.tracker import (
    BanRecord,
    JailPolicy,
    Kind,
    LoadResult,
    Tracker,
    TrackOutcome,
    UnknownJailError,
)
from nftblockd.durations import PERMANENT, Permanent
from nftblockd.events import Ban, Hit

T0 = 1_700_000_000.0
A = ipaddress.ip_address
N = ipaddress.ip_network
H = 3600.0


def hit(jail: str, host: str, t: float) -> Hit:
    return Hit(jail=jail, host=A(host), time=t)


def sshd(**kw: object) -> JailPolicy:
    base: dict[str, object] = {"name": "sshd", "maxretry": 5, "findtime": 600.0, "bantime": H,
                               "blocklist": "bad"}
    base.update(kw)
    return JailPolicy(**base)  # type: ignore[arg-type]


def fail(tr: Tracker, host: str, times: int, now: float, jail: str = "sshd") -> TrackOutcome:
    """`times` failures at `now`; returns the last outcome."""
    out = TrackOutcome(Kind.STALE)
    for _ in range(times):
        out = tr.observe(hit(jail, host, now), now)
    return out


# -- counting and banning ----------------------------------------------------------------------------

def test_maxretry_failures_within_findtime_ban() -> None:
    tr = Tracker([sshd()])
    for i in range(4):
        assert tr.observe(hit("sshd", "192.0.2.1", T0 + i), T0 + i).kind is Kind.COUNTED
    out = tr.observe(hit("sshd", "192.0.2.1", T0 + 4), T0 + 4)
    assert out.kind is Kind.BANNED
    assert out.ban == Ban(target=N("192.0.2.1/32"), blocklist="bad", until=T0 + 4 + H, origin="jail",
                          reason="5 failures in 10m (sshd)", jail="sshd")
    assert out.record == BanRecord("sshd", N("192.0.2.1/32"), T0 + 4, T0 + 4 + H)
    assert tr.tracked == 0  # the counts were cleared by the ban


def test_failures_spread_wider_than_findtime_never_ban() -> None:
    tr = Tracker([sshd(maxretry=3)])
    for t in (0, 400, 800, 1200):  # every 600 s window holds at most two
        assert tr.observe(hit("sshd", "192.0.2.1", T0 + t), T0 + t).kind is Kind.COUNTED
    assert tr.failures("sshd", A("192.0.2.1"), T0 + 1200) == 2
    assert tr.observe(hit("sshd", "192.0.2.1", T0 + 1300), T0 + 1300).kind is Kind.BANNED


def test_offenders_are_counted_separately() -> None:
    tr = Tracker([sshd(maxretry=2)])
    assert fail(tr, "192.0.2.1", 1, T0).kind is Kind.COUNTED
    assert fail(tr, "192.0.2.2", 1, T0).kind is Kind.COUNTED
    assert tr.tracked == 2


def test_tracked_addresses_are_counted_per_jail() -> None:
    """The metric nftblock_tracker_addresses{jail}: two jails tracking 10 and 3 show 10 and 3, not 13 each."""
    tr = Tracker([sshd(), sshd(name="web")])
    for i in range(10):
        fail(tr, f"192.0.2.{i}", 1, T0)
    for i in range(3):
        fail(tr, f"198.51.100.{i}", 1, T0, jail="web")
    fail(tr, "192.0.2.0", 4, T0 + 1)  # its fifth failure: banned, no longer counted
    assert tr.tracked_by_jail() == {"sshd": 9, "web": 3}
    tr.observe(hit("sshd", "203.0.113.1", T0 + 700), T0 + 700)  # a generation later: the old ones are still held
    assert tr.tracked_by_jail() == {"sshd": 10, "web": 3} and tr.tracked == 13
    tr.observe(hit("sshd", "203.0.113.2", T0 + 1900), T0 + 1900)  # two generations later: dropped
    tr.observe(hit("web", "203.0.113.2", T0 + 1900), T0 + 1900)
    assert tr.tracked_by_jail() == {"sshd": 1, "web": 1} and tr.tracked == 2


def test_maxretry_one_bans_on_the_first_failure() -> None:
    tr = Tracker([sshd(maxretry=1)])
    assert fail(tr, "192.0.2.1", 1, T0).kind is Kind.BANNED
    assert tr.tracked == 0


def test_permanent_bantime() -> None:
    tr = Tracker([sshd(bantime=PERMANENT)])
    out = fail(tr, "192.0.2.1", 5, T0)
    assert out.ban is not None and out.ban.until is None
    assert fail(tr, "192.0.2.1", 1, T0 + 10 * 365 * 86400).kind is Kind.ALREADY_BANNED


def test_already_banned_is_cheap_and_silent() -> None:
    tr = Tracker([sshd()])
    ban = fail(tr, "192.0.2.1", 5, T0).ban
    first = tr.observe(hit("sshd", "192.0.2.1", T0 + 1), T0 + 1)
    assert first.kind is Kind.ALREADY_BANNED and first.ban == ban
    for _ in range(1000):  # a storm: the same ready-made answer every time, no new ban, no counting
        assert tr.observe(hit("sshd", "192.0.2.1", T0 + 2), T0 + 2) is first
    assert tr.tracked == 0
    assert tr.history_snapshot() == [("sshd", "192.0.2.1", T0, T0 + H)]


def test_a_ban_ends_when_until_passes_and_counting_restarts() -> None:
    tr = Tracker([sshd()])
    fail(tr, "192.0.2.1", 5, T0)
    assert fail(tr, "192.0.2.1", 1, T0 + H - 1).kind is Kind.ALREADY_BANNED
    assert fail(tr, "192.0.2.1", 1, T0 + H).kind is Kind.COUNTED  # from zero, not from the old counts
    assert tr.failures("sshd", A("192.0.2.1"), T0 + H) == 1


def test_forget_ban_returns_to_idle_but_keeps_history() -> None:
    tr = Tracker([sshd()])
    fail(tr, "192.0.2.1", 5, T0)
    assert tr.forget_ban(N("192.0.2.1/32")) == [("sshd", N("192.0.2.1/32"))]
    assert tr.banned_count() == 0
    assert fail(tr, "192.0.2.1", 4, T0 + 60).kind is Kind.COUNTED
    out = fail(tr, "192.0.2.1", 1, T0 + 60)
    assert out.kind is Kind.BANNED and out.ban is not None
    assert out.ban.until == T0 + 60 + 2 * H  # escalated: the history survived the manual unban
    assert "ban #2 escalated to 2h" in out.ban.reason


def test_forget_ban_with_forgive_drops_history_and_counts() -> None:
    tr = Tracker([sshd()])
    fail(tr, "192.0.2.1", 5, T0)
    fail(tr, "192.0.2.9", 2, T0)
    assert tr.forget_ban(N("192.0.2.1/32"), jail="sshd", forgive=True) == [("sshd", N("192.0.2.1/32"))]
    assert tr.forget_ban(N("192.0.2.9/32"), forgive=True) == [("sshd", N("192.0.2.9/32"))]
    assert tr.tracked == 0
    assert tr.history_snapshot() == []
    out = fail(tr, "192.0.2.1", 5, T0 + 60)
    assert out.ban is not None and out.ban.until == T0 + 60 + H
    assert tr.forget_ban(N("203.0.113.1/32")) == []
    with pytest.raises(UnknownJailError):
        tr.forget_ban(N("192.0.2.1/32"), jail="nope")


def test_unknown_jail_is_the_callers_fault() -> None:
    tr = Tracker([sshd()])
    with pytest.raises(UnknownJailError):
        tr.observe(hit("postfix", "192.0.2.1", T0), T0)
    with pytest.raises(UnknownJailError):
        tr.failures("postfix", A("192.0.2.1"), T0)


# -- escalation ----------------------------------------------------------------------------------------

def _ban_again(tr: Tracker, host: str, now: float, jail: str = "sshd") -> Ban:
    """Fail until banned at `now`, then lift the ban as a manual unban would; returns the ban."""
    policy_max = 1000
    for _ in range(policy_max):
        out = tr.observe(hit(jail, host, now), now)
        if out.kind is Kind.BANNED:
            assert out.ban is not None
            tr.forget_ban(out.ban.target, jail=jail)
            return out.ban
    raise AssertionError("never banned")


def test_escalation_doubles_up_to_the_cap() -> None:
    tr = Tracker([sshd(escalation=Escalation(factor=2.0, max=10 * H))])
    durations = []
    now = T0
    for _ in range(6):
        ban = _ban_again(tr, "192.0.2.1", now)
        assert ban.until is not None
        durations.append(ban.until - now)
        now += 60
    assert durations == [H, 2 * H, 4 * H, 8 * H, 10 * H, 10 * H]


def test_escalation_disabled_or_factor_one_keeps_bantime() -> None:
    for esc in (Escalation(enabled=False), Escalation(factor=1.0)):
        tr = Tracker([sshd(escalation=esc)])
        for i in range(3):
            ban = _ban_again(tr, "192.0.2.1", T0 + i)
            assert ban.until == T0 + i + H


def test_bantime_longer_than_escalation_max_is_not_shortened() -> None:
    tr = Tracker([sshd(bantime=10 * 86400.0, escalation=Escalation(max=86400.0))])
    ban = _ban_again(tr, "192.0.2.1", T0)
    assert ban.until == T0 + 10 * 86400.0
    assert _ban_again(tr, "192.0.2.1", T0 + 1).until == T0 + 1 + 10 * 86400.0


def test_escalation_is_per_jail() -> None:
    tr = Tracker([sshd(), JailPolicy("postfix", maxretry=2, bantime=H)])
    _ban_again(tr, "192.0.2.1", T0)
    _ban_again(tr, "192.0.2.1", T0 + 1)
    other = _ban_again(tr, "192.0.2.1", T0 + 2, jail="postfix")
    assert other.until == T0 + 2 + H  # two sshd bans do not lengthen the first postfix ban


def test_history_older_than_the_horizon_is_forgotten() -> None:
    tr = Tracker([sshd(history_horizon=86400.0)])
    _ban_again(tr, "192.0.2.1", T0)
    assert _ban_again(tr, "192.0.2.1", T0 + 86399).until == T0 + 86399 + 2 * H
    # the first ban left the horizon, the second is still in it
    assert _ban_again(tr, "192.0.2.1", T0 + 86401).until == T0 + 86401 + 2 * H
    assert len(tr.history_snapshot()) == 2  # banning pruned the first record already
    assert tr.sweep(T0 + 10 * 86400) == 2  # the rest is past the horizon now
    assert tr.history_snapshot() == []
    assert _ban_again(tr, "192.0.2.1", T0 + 10 * 86400).until == T0 + 10 * 86400 + H


def test_default_horizon_is_four_times_the_cap() -> None:
    tr = Tracker([sshd(escalation=Escalation(max=86400.0))])
    assert tr.horizon("sshd") == 4 * 86400.0
    with pytest.raises(UnknownJailError):
        tr.horizon("nope")
    _ban_again(tr, "192.0.2.1", T0)
    assert _ban_again(tr, "192.0.2.1", T0 + 4 * 86400 - 1).until == T0 + 4 * 86400 - 1 + 2 * H
    tr2 = Tracker([sshd(escalation=Escalation(max=86400.0))])
    _ban_again(tr2, "192.0.2.1", T0)
    assert _ban_again(tr2, "192.0.2.1", T0 + 4 * 86400 + 1).until == T0 + 4 * 86400 + 1 + H


def test_a_new_ban_never_ends_before_an_earlier_one_even_after_a_clock_step_back() -> None:
    tr = Tracker([sshd(escalation=Escalation(enabled=False))])
    first = _ban_again(tr, "192.0.2.1", T0)
    second = _ban_again(tr, "192.0.2.1", T0 - 2 * H)  # our clock was set back two hours
    assert first.until is not None and second.until == first.until


# -- history across a restart ----------------------------------------------------------------------------

def test_escalation_survives_a_restart_through_plain_rows() -> None:
    tr = Tracker([sshd()])
    _ban_again(tr, "192.0.2.1", T0)
    _ban_again(tr, "192.0.2.1", T0 + 60)
    rows = tr.history_snapshot()
    assert rows == [("sshd", "192.0.2.1", T0, T0 + H), ("sshd", "192.0.2.1", T0 + 60, T0 + 60 + 2 * H)]
    assert all(type(v) in (str, float) for row in rows for v in row)

    restarted = Tracker([sshd()])
    assert restarted.load_history(rows, T0 + 120) == LoadResult(2, 0)
    ban = _ban_again(restarted, "192.0.2.1", T0 + 120)
    assert ban.until == T0 + 120 + 4 * H


def test_records_from_outcomes_are_the_rows_to_persist() -> None:
    tr = Tracker([sshd(maxretry=1)])
    persisted = []
    for i, host in enumerate(("192.0.2.1", "2001:db8::1", "192.0.2.1")):
        out = tr.observe(hit("sshd", host, T0 + i * H), T0 + i * H)
        assert out.record is not None
        persisted.append(out.record.as_row())
    assert sorted(persisted, key=lambda r: r[2]) == tr.history_snapshot()
    assert [BanRecord.from_row(r).as_row() for r in persisted] == persisted


def test_load_history_skips_what_it_cannot_use() -> None:
    tr = Tracker([sshd()])
    rows: list[object] = [
        ("sshd", "192.0.2.1", T0, T0 + H),
        ("sshd", "192.0.2.1", T0, T0 + H),  # duplicate
        ("gone", "192.0.2.2", T0, T0 + H),  # jail no longer configured
        ("sshd", "192.0.2.3", T0 - 365 * 86400, None),  # past the horizon
        ("sshd", "not an address", T0, None),
        ("sshd", "192.0.2.4", "yesterday", None),
        ("sshd", "192.0.2.5"),
        BanRecord("sshd", N("192.0.2.6/32"), T0, None),
    ]
    assert tr.load_history(rows, T0 + 60) == LoadResult(2, 6)  # type: ignore[arg-type]
    assert {r[1] for r in tr.history_snapshot()} == {"192.0.2.1", "192.0.2.6"}


def test_note_ban_restores_banned_state_after_a_restart() -> None:
    tr = Tracker([sshd()], Allowlist.from_networks([N("10.0.0.0/8")]))
    active = Ban(N("192.0.2.1/32"), "bad", T0 + H, origin="jail", jail="sshd")
    assert tr.note_ban(active, T0)
    assert fail(tr, "192.0.2.1", 1, T0 + 1).ban == active
    assert not tr.note_ban(Ban(N("192.0.2.2/32"), "bad", T0 - 1, jail="sshd"), T0)  # already over
    assert not tr.note_ban(Ban(N("192.0.2.2/32"), "bad", None, jail="nope"), T0)
    assert not tr.note_ban(Ban(N("10.1.1.1/32"), "bad", None, jail="sshd"), T0)  # allowlisted now


def test_note_hosts_is_note_ban_for_many_ipv4_addresses() -> None:
    # the restart's bulk form against the one-by-one form: same offenders noted, same answers to later hits
    allow = Allowlist.from_networks([N("10.0.0.0/8")])
    hosts = ["192.0.2.1", "192.0.2.2", "10.1.1.1", "198.51.100.7", "192.0.2.9"]
    ends = [T0 + H, T0 - 1, None, None, T0 + 2 * H]
    one, bulk = Tracker([sshd()], allow), Tracker([sshd()], allow)
    noted = [one.note_ban(Ban(N(f"{h}/32"), "bad", u, origin="jail", reason="5 failures", jail="sshd"), T0)
             for h, u in zip(hosts, ends, strict=True)]
    keys = [int(A(h)) for h in hosts]
    assert bulk.note_hosts("sshd", keys, ends, T0, blocklist="bad", origin="jail", reason="5 failures") == sum(noted)
    assert bulk.note_hosts("nope", keys, ends, T0, blocklist="bad", origin="jail", reason="") == 0
    assert bulk.banned_count() == one.banned_count() == 3
    for h in hosts:
        assert fail(bulk, h, 1, T0 + 1) == fail(one, h, 1, T0 + 1)
    assert fail(bulk, "192.0.2.9", 1, T0 + 2).ban == Ban(N("192.0.2.9/32"), "bad", T0 + 2 * H, origin="jail",
                                                          reason="5 failures", jail="sshd")


# -- IPv6 ----------------------------------------------------------------------------------------------

def test_ipv6_hosts_are_counted_and_banned_by_their_prefix() -> None:
    tr = Tracker([sshd(ipv6_prefix=64, maxretry=3)])
    assert fail(tr, "2001:db8:1:2::1", 1, T0).kind is Kind.COUNTED
    assert fail(tr, "2001:db8:1:2::2", 1, T0).kind is Kind.COUNTED
    assert fail(tr, "2001:db8:1:3::1", 1, T0).kind is Kind.COUNTED  # another /64
    out = fail(tr, "2001:db8:1:2:ffff:ffff:ffff:ffff", 1, T0)
    assert out.kind is Kind.BANNED and out.ban is not None
    assert out.ban.target == N("2001:db8:1:2::/64")
    assert fail(tr, "2001:db8:1:2::99", 1, T0 + 1).kind is Kind.ALREADY_BANNED  # a rotated address
    assert tr.history_snapshot()[0][1] == "2001:db8:1:2::/64"


def test_ipv6_prefix_128_counts_each_address() -> None:
    tr = Tracker([sshd(maxretry=2, ipv6_prefix=128)])
    assert fail(tr, "2001:db8::1", 1, T0).kind is Kind.COUNTED
    assert fail(tr, "2001:db8::2", 1, T0).kind is Kind.COUNTED
    out = fail(tr, "2001:db8::2", 1, T0)
    assert out.ban is not None and out.ban.target == N("2001:db8::2/128")


def test_ipv4_mapped_ipv6_counts_as_ipv4() -> None:
    tr = Tracker([sshd(maxretry=2, ipv6_prefix=64)])
    fail(tr, "::ffff:192.0.2.1", 1, T0)
    out = fail(tr, "192.0.2.1", 1, T0)
    assert out.ban is not None and out.ban.target == N("192.0.2.1/32")
    assert fail(tr, "::ffff:192.0.2.1", 1, T0).kind is Kind.ALREADY_BANNED


def test_forgetting_an_address_inside_a_banned_range_ends_the_range_state() -> None:
    tr = Tracker([sshd(ipv6_prefix=64, maxretry=1)])
    fail(tr, "2001:db8::1", 1, T0)
    assert tr.forget_ban(N("2001:db8::5/128")) == [("sshd", N("2001:db8::/64"))]
    assert tr.banned_count("sshd") == 0


# -- allowlist -----------------------------------------------------------------------------------------

def test_allowlisted_hosts_are_never_counted_nor_banned() -> None:
    tr = Tracker([sshd(maxretry=1)], Allowlist.from_networks([N("198.51.100.0/24"), A("::1")]))
    out = fail(tr, "198.51.100.7", 1, T0)
    assert out == TrackOutcome(Kind.ALLOWLISTED, allow=N("198.51.100.0/24"))
    assert fail(tr, "::ffff:198.51.100.7", 1, T0).kind is Kind.ALLOWLISTED
    assert fail(tr, "::1", 1, T0).allow == N("::1/128")
    assert tr.tracked == 0 and tr.history_snapshot() == []


def test_ignoreip_is_per_jail() -> None:
    tr = Tracker([sshd(maxretry=1, ignoreip=(N("192.0.2.0/24"),)), JailPolicy("web", maxretry=1)])
    assert fail(tr, "192.0.2.1", 1, T0).kind is Kind.ALLOWLISTED
    assert fail(tr, "192.0.2.1", 1, T0, jail="web").kind is Kind.BANNED


def test_an_allowed_neighbour_shrinks_the_ipv6_offender_to_one_address() -> None:
    tr = Tracker([sshd(ipv6_prefix=64, maxretry=2)], Allowlist.from_networks([A("2001:db8::7")]))
    assert fail(tr, "2001:db8::7", 1, T0).kind is Kind.ALLOWLISTED
    assert fail(tr, "2001:db8::1", 1, T0).kind is Kind.COUNTED
    assert fail(tr, "2001:db8::2", 1, T0).kind is Kind.COUNTED  # not the same offender any more
    out = fail(tr, "2001:db8::1", 1, T0)
    assert out.ban is not None and out.ban.target == N("2001:db8::1/128")
    assert fail(tr, "2001:db8::1", 1, T0).kind is Kind.ALREADY_BANNED
    assert fail(tr, "2001:db8::7", 1, T0).kind is Kind.ALLOWLISTED
    assert fail(tr, "2001:db8:0:1::1", 2, T0).ban.target == N("2001:db8:0:1::/64")  # type: ignore[union-attr]


def test_replacing_the_allowlist_lifts_bans_it_now_protects() -> None:
    tr = Tracker([sshd(maxretry=1), JailPolicy("web", maxretry=1)])
    a = fail(tr, "192.0.2.1", 1, T0).ban
    b = fail(tr, "192.0.2.1", 1, T0, jail="web").ban
    fail(tr, "203.0.113.9", 1, T0)
    lifted = tr.replace_allowlist(Allowlist.from_networks([A("192.0.2.1")]))  # the admin's new address
    assert sorted(lifted, key=lambda x: x.jail) == [a, b]
    assert fail(tr, "192.0.2.1", 1, T0 + 1).kind is Kind.ALLOWLISTED
    assert fail(tr, "203.0.113.9", 1, T0 + 1).kind is Kind.ALREADY_BANNED


# -- time --------------------------------------------------------------------------------------------------

def test_backlog_lines_older_than_findtime_are_stale() -> None:
    tr = Tracker([sshd()])
    now = T0 + 86400
    assert tr.observe(hit("sshd", "192.0.2.1", now - 601), now).kind is Kind.STALE
    assert tr.tracked == 0


def test_backlog_lines_count_at_their_own_time() -> None:
    tr = Tracker([sshd(maxretry=3)])
    now = T0 + 86400
    # An hour of backlog read in one go. Failures 20 minutes apart: compressed onto "now" they would ban,
    # at their own times only the last one is within findtime.
    kinds = [tr.observe(hit("sshd", "192.0.2.1", now - age), now).kind for age in (2400, 1200, 0)]
    assert kinds == [Kind.STALE, Kind.STALE, Kind.COUNTED]
    # Failures within findtime ban, even read out of order.
    kinds = [tr.observe(hit("sshd", "192.0.2.2", now - age), now).kind for age in (500, 100, 450)]
    assert kinds == [Kind.COUNTED, Kind.COUNTED, Kind.BANNED]


def test_backlog_lines_from_the_future() -> None:
    tr = Tracker([sshd(maxretry=2)], max_skew=60.0)
    assert tr.observe(hit("sshd", "192.0.2.1", T0 + 3 * H), T0).kind is Kind.STALE
    assert tr.observe(hit("sshd", "192.0.2.1", T0 + 30), T0).kind is Kind.COUNTED  # within the skew: at now
    assert tr.failures("sshd", A("192.0.2.1"), T0) == 1


def test_a_live_source_with_a_clock_hours_behind_is_not_blind() -> None:
    tr = Tracker([sshd(maxretry=3)])
    for i in range(2):
        now = T0 + i
        assert tr.observe(hit("sshd", "192.0.2.1", now - 5 * H), now, live=True).kind is Kind.COUNTED
    assert tr.observe(hit("sshd", "192.0.2.1", T0 + 2 - 5 * H), T0 + 2, live=True).kind is Kind.BANNED


def test_a_live_source_with_a_clock_hours_ahead_is_not_blind() -> None:
    tr = Tracker([sshd(maxretry=2)])
    assert tr.observe(hit("sshd", "192.0.2.1", T0 + 5 * H), T0, live=True).kind is Kind.COUNTED
    out = tr.observe(hit("sshd", "192.0.2.1", T0 + 5 * H), T0 + 1, live=True)
    assert out.ban is not None and out.ban.until == T0 + 1 + H  # arrival time, not the line's


def test_live_lines_keep_their_time_within_the_skew() -> None:
    tr = Tracker([sshd(maxretry=2, findtime=30.0)], max_skew=60.0)
    # skew is capped by findtime: a live line 45 s old still counts (at arrival), never STALE
    assert tr.observe(hit("sshd", "192.0.2.1", T0 - 45), T0, live=True).kind is Kind.COUNTED
    assert tr.failures("sshd", A("192.0.2.1"), T0 + 29) == 1
    tr2 = Tracker([sshd(maxretry=2)], max_skew=60.0)
    tr2.observe(hit("sshd", "192.0.2.1", T0 - 50), T0, live=True)  # a delayed batch keeps its time
    assert tr2.failures("sshd", A("192.0.2.1"), T0 + 549) == 1
    assert tr2.failures("sshd", A("192.0.2.1"), T0 + 551) == 0


def test_our_clock_stepping_forward_forgets_partial_counts_only() -> None:
    tr = Tracker([sshd(maxretry=3)])
    fail(tr, "192.0.2.1", 2, T0)
    now = T0 + 5 * H  # NTP step
    assert fail(tr, "192.0.2.1", 1, now).kind is Kind.COUNTED
    assert fail(tr, "192.0.2.1", 2, now).kind is Kind.BANNED  # detection goes on


def test_our_clock_stepping_back_drops_future_counts() -> None:
    tr = Tracker([sshd(maxretry=3)])
    fail(tr, "192.0.2.1", 2, T0)
    now = T0 - 5 * H
    assert fail(tr, "192.0.2.1", 1, now).kind is Kind.COUNTED
    assert tr.failures("sshd", A("192.0.2.1"), now) == 1
    assert fail(tr, "192.0.2.1", 2, now).kind is Kind.BANNED


def test_a_ban_from_the_future_is_not_trusted_after_a_step_back() -> None:
    tr = Tracker([sshd(maxretry=2)], max_skew=60.0)
    first = fail(tr, "192.0.2.1", 2, T0).ban
    assert fail(tr, "192.0.2.1", 1, T0 - 30).kind is Kind.ALREADY_BANNED  # within the skew: trusted
    now = T0 - 2 * H
    assert fail(tr, "192.0.2.1", 1, now).kind is Kind.COUNTED  # counting again, not blind
    second = fail(tr, "192.0.2.1", 1, now).ban
    assert first is not None and second is not None and first.until is not None
    assert second.until is not None and second.until >= first.until


# -- memory ----------------------------------------------------------------------------------------------

def test_stale_records_go_with_their_generation() -> None:
    tr = Tracker([sshd()])
    for i in range(1000):
        tr.observe(Hit("sshd", ipaddress.IPv4Address(0x0A000000 + i), T0), T0)
    assert tr.tracked == 1000
    fail(tr, "192.0.2.1", 1, T0 + 601)  # one generation on: the old ones are not stale yet...
    assert tr.tracked == 1001
    fail(tr, "192.0.2.1", 1, T0 + 1202)  # ...two on, they are gone
    assert tr.tracked == 1
    assert tr.failures("sshd", A("192.0.2.1"), T0 + 1202) == 1  # 601 is out of the window by now


def test_a_record_touched_in_the_old_generation_survives_rotation() -> None:
    tr = Tracker([sshd(maxretry=3)])
    fail(tr, "192.0.2.9", 1, T0)  # anchors the generations: the next rotation is due at T0 + 600
    fail(tr, "192.0.2.1", 1, T0 + 400)
    fail(tr, "192.0.2.9", 1, T0 + 600)  # rotates: .1's one failure is in the older generation now
    assert fail(tr, "192.0.2.1", 1, T0 + 650).kind is Kind.COUNTED
    assert tr.failures("sshd", A("192.0.2.1"), T0 + 650) == 2
    fail(tr, "192.0.2.8", 1, T0 + 1200)  # rotates again: 650 is still within 600 s
    assert tr.failures("sshd", A("192.0.2.1"), T0 + 1200) == 1
    assert fail(tr, "192.0.2.1", 1, T0 + 1210).kind is Kind.COUNTED  # 650 + 1210: two, not yet three


def test_records_with_several_failures_are_dropped_once_their_latest_left_the_window() -> None:
    tr = Tracker([sshd(maxretry=4)])
    fail(tr, "192.0.2.1", 1, T0 + 500)
    fail(tr, "192.0.2.1", 1, T0 + 590)
    fail(tr, "192.0.2.9", 1, T0 + 700)  # rotates; .1's latest failure (590) is within 600 s
    assert tr.failures("sshd", A("192.0.2.1"), T0 + 700) == 2
    fail(tr, "192.0.2.1", 1, T0 + 1000)
    fail(tr, "192.0.2.9", 1, T0 + 1300)  # rotates; 1000 is within the window, 500 and 590 are not
    assert tr.failures("sshd", A("192.0.2.1"), T0 + 1300) == 1
    assert tr.tracked == 2  # .1 and .9
    fail(tr, "192.0.2.8", 1, T0 + 1900)  # rotates: .1's latest (1000) left the window, .9's (1300) did not
    assert tr.failures("sshd", A("192.0.2.1"), T0 + 1900) == 0
    assert tr.tracked == 2  # .9 (older generation) and .8


def test_sweep_bounds_memory_without_hits() -> None:
    tr = Tracker([sshd()])
    for i in range(100):
        tr.observe(Hit("sshd", ipaddress.IPv4Address(0x0A000000 + i), T0), T0)
    fail(tr, "192.0.2.1", 5, T0)
    assert tr.sweep(T0 + 1) == 0
    assert tr.sweep(T0 + 2 * H) == 101  # 100 stale records and one ended ban
    assert tr.tracked == 0 and tr.banned_count() == 0


def test_the_cap_evicts_the_oldest_and_counts_it() -> None:
    tr = Tracker([sshd(maxretry=2)], max_tracked=128)
    for i in range(1000):
        tr.observe(Hit("sshd", ipaddress.IPv4Address(0x0A000000 + i), T0 + i * 0.01), T0 + i * 0.01)
    assert tr.tracked <= 128
    assert tr.evictions == 1000 - tr.tracked
    now = T0 + 10
    # the newest offender is still tracked, the first one was evicted
    assert tr.observe(Hit("sshd", ipaddress.IPv4Address(0x0A000000 + 999), now), now).kind is Kind.BANNED
    assert tr.observe(Hit("sshd", ipaddress.IPv4Address(0x0A000000), now), now).kind is Kind.COUNTED


def test_the_cap_evicts_from_the_largest_jail_first() -> None:
    tr = Tracker([sshd(), JailPolicy("web")], max_tracked=64)
    for i in range(10):
        tr.observe(Hit("web", ipaddress.IPv4Address(0x0B000000 + i), T0), T0)
    for i in range(500):
        tr.observe(Hit("sshd", ipaddress.IPv4Address(0x0A000000 + i), T0), T0)
    assert all(tr.failures("web", ipaddress.IPv4Address(0x0B000000 + i), T0) == 1 for i in range(10))


def test_a_flood_of_single_failures_cannot_evict_an_offender_near_its_ban() -> None:
    # Issue 13, item 4, as measured there: 2 failures from A, 110k single failures from distinct addresses,
    # then A's third. With oldest-first eviction A was forgotten and never banned.
    tr = Tracker([sshd(maxretry=3)])  # max_tracked is the default 100,000
    a = "198.51.100.7"
    fail(tr, a, 2, T0)
    for i in range(110_000):
        t = T0 + 1 + i * 0.001
        tr.observe(Hit("sshd", ipaddress.IPv4Address(0x0A000000 + i), t), t)
    assert tr.evictions >= 10_000 and tr.evicted_several == 0 and tr.tracked <= 100_000
    assert fail(tr, a, 1, T0 + 200).kind is Kind.BANNED


def test_one_ipv6_host_walking_its_64_is_one_offender_by_default() -> None:
    tr = Tracker([sshd(maxretry=3)], max_tracked=1000)  # no ipv6_prefix: the default groups by /64
    fail(tr, "198.51.100.7", 2, T0)
    for i in range(5000):
        tr.observe(Hit("sshd", ipaddress.IPv6Address((0x2001_0DB8_0BAD << 80) | (i + 1)), T0 + 1), T0 + 1)
    assert tr.evictions == 0  # 5000 addresses, one /64: one record, banned at its third failure
    assert fail(tr, "198.51.100.7", 1, T0 + 2).kind is Kind.BANNED


def test_when_only_several_failure_records_are_left_the_farthest_from_a_ban_go_first() -> None:
    tr = Tracker([sshd(maxretry=5), JailPolicy("web", maxretry=3)], max_tracked=64)
    near = "198.51.100.7"
    fail(tr, near, 4, T0)  # one failure short of its ban
    for i in range(63):  # the rest of the cap: two failures each, three short of a ban
        fail(tr, str(ipaddress.IPv4Address(0x0A000000 + i)), 2, T0 + 1 + i)
    assert tr.tracked == 64 and tr.evictions == 0
    fail(tr, "203.0.113.1", 1, T0 + 100)  # a newcomer: room is made among the two-failure records
    assert tr.evictions == 1 and tr.evicted_several == 1
    assert tr.failures("sshd", A("10.0.0.0"), T0 + 100) == 0  # the longest quiet of the farthest from a ban
    assert fail(tr, near, 1, T0 + 100).kind is Kind.BANNED


def test_the_eviction_order_is_one_failure_records_oldest_generation_first() -> None:
    tr = Tracker([sshd(maxretry=3, findtime=100.0)], max_tracked=64)
    fail(tr, "10.9.0.0", 1, T0)  # anchors the generations: the next rotation is due at T0 + 100
    for i in range(40):
        fail(tr, str(ipaddress.IPv4Address(0x0A000000 + i)), 1, T0 + 50)
    fail(tr, "10.9.0.1", 2, T0 + 60)  # several failures: kept apart
    fail(tr, "10.9.0.2", 1, T0 + 100)  # rotates: the 41 one-failure records are the older generation now
    for i in range(21):
        fail(tr, str(ipaddress.IPv4Address(0x0B000000 + i)), 1, T0 + 101)
    assert tr.tracked == 64 and tr.evictions == 0
    fail(tr, "10.9.9.8", 1, T0 + 102)
    fail(tr, "10.9.9.9", 1, T0 + 102)
    assert tr.evictions == 2  # 10.9.0.0, then 10.0.0.0: the oldest of the older generation
    assert tr.failures("sshd", A("10.0.0.0"), T0 + 102) == 0
    assert tr.failures("sshd", A("10.0.0.1"), T0 + 102) == 1
    assert tr.failures("sshd", A("10.9.0.1"), T0 + 102) == 2
    assert tr.failures("sshd", A("11.0.0.0"), T0 + 102) == 1


# -- recidive --------------------------------------------------------------------------------------------

def recidive(**kw: object) -> JailPolicy:
    base: dict[str, object] = {"name": "recidive", "recidive": True, "maxretry": 3, "findtime": 86400.0,
                               "bantime": 7 * 86400.0, "blocklist": "long"}
    base.update(kw)
    return JailPolicy(**base)  # type: ignore[arg-type]


def _jail_ban(tr: Tracker, jail: str, host: str, now: float) -> tuple[Ban, list[TrackOutcome]]:
    ban = _ban_again(tr, host, now, jail=jail)
    return ban, tr.observe_ban(ban, now)


def test_recidive_counts_bans_across_jails() -> None:
    tr = Tracker([sshd(maxretry=1), JailPolicy("web", maxretry=1), recidive()])
    _, o1 = _jail_ban(tr, "sshd", "192.0.2.1", T0)
    _, o2 = _jail_ban(tr, "web", "192.0.2.1", T0 + H)
    assert [o.kind for o in o1 + o2] == [Kind.COUNTED, Kind.COUNTED]
    _, o3 = _jail_ban(tr, "sshd", "192.0.2.1", T0 + 2 * H)
    assert len(o3) == 1 and o3[0].kind is Kind.BANNED and o3[0].ban is not None
    assert o3[0].ban == Ban(N("192.0.2.1/32"), "long", T0 + 2 * H + 7 * 86400, origin="jail",
                            reason="3 bans in 1d (recidive)", jail="recidive")
    _, o4 = _jail_ban(tr, "sshd", "192.0.2.1", T0 + 3 * H)
    assert o4[0].kind is Kind.ALREADY_BANNED
    assert tr.observe_ban(o3[0].ban, T0 + 3 * H) == []  # never counts itself


def test_recidive_needs_its_bans_within_its_findtime() -> None:
    tr = Tracker([sshd(maxretry=1), recidive()])
    for day in range(5):
        _, out = _jail_ban(tr, "sshd", "192.0.2.1", T0 + day * 86400 * 0.6)
        assert out[0].kind is Kind.COUNTED or day >= 2
    tr2 = Tracker([sshd(maxretry=1), recidive()])
    kinds = [_jail_ban(tr2, "sshd", "192.0.2.1", T0 + d * 86400 * 0.51)[1][0].kind for d in range(3)]
    assert kinds == [Kind.COUNTED, Kind.COUNTED, Kind.COUNTED]  # first and third 1.02 d apart


def test_recidive_watch_limits_what_counts() -> None:
    tr = Tracker([sshd(maxretry=1), JailPolicy("web", maxretry=1),
                  recidive(maxretry=1, watch=frozenset({"web"}))])
    assert _jail_ban(tr, "sshd", "192.0.2.1", T0)[1] == []
    assert _jail_ban(tr, "web", "192.0.2.1", T0)[1][0].kind is Kind.BANNED
    assert tr.observe_ban(Ban(N("192.0.2.1/32"), "bad", None, origin="cli"), T0) == []  # no jail


def test_recidive_respects_allowlists_and_ipv6_grouping() -> None:
    tr = Tracker([sshd(maxretry=1, ipv6_prefix=64), recidive(maxretry=1, ipv6_prefix=48)],
                 Allowlist.from_networks([A("2001:db8:0:ff::1")]))
    _, out = _jail_ban(tr, "sshd", "2001:db8:0:1::1", T0)
    # the /48 would cover an allowed address: recidive bans just what the jail banned
    assert out[0].ban is not None and out[0].ban.target == N("2001:db8:0:1::/64")
    _, out = _jail_ban(tr, "sshd", "2001:db9:0:1::1", T0)
    assert out[0].ban is not None and out[0].ban.target == N("2001:db9::/48")
    allowed = Ban(N("2001:db8:0:ff::/64"), "bad", None, origin="jail", jail="sshd")
    assert tr.observe_ban(allowed, T0)[0].allow == N("2001:db8:0:ff::1/128")


def test_recidive_counts_survive_a_restart() -> None:
    def build() -> Tracker:
        return Tracker([sshd(maxretry=1), JailPolicy("web", maxretry=1), recidive()])

    tr = build()
    _jail_ban(tr, "sshd", "192.0.2.1", T0)
    _jail_ban(tr, "web", "192.0.2.1", T0 + 60)
    rows = tr.history_snapshot()
    restarted = build()
    restarted.load_history(rows, T0 + 120)
    _, out = _jail_ban(restarted, "sshd", "192.0.2.1", T0 + 120)
    assert out[0].kind is Kind.BANNED


def test_a_recidive_ban_in_the_history_consumes_the_bans_before_it() -> None:
    def build() -> Tracker:
        return Tracker([sshd(maxretry=1), recidive(maxretry=2)])

    tr = build()
    _jail_ban(tr, "sshd", "192.0.2.1", T0)
    _, out = _jail_ban(tr, "sshd", "192.0.2.1", T0 + 60)
    assert out[0].kind is Kind.BANNED
    restarted = build()
    restarted.load_history(tr.history_snapshot(), T0 + 120)
    _, out = _jail_ban(restarted, "sshd", "192.0.2.1", T0 + 120)
    assert out[0].kind is Kind.COUNTED  # not a second recidive ban from already-used bans


def test_recidive_configuration_errors() -> None:
    with pytest.raises(ValueError, match="not an ordinary jail"):
        Tracker([sshd(), recidive(watch=frozenset({"nope"}))])
    with pytest.raises(ValueError, match="not an ordinary jail"):
        Tracker([sshd(), recidive(), recidive(name="r2", watch=frozenset({"recidive"}))])
    with pytest.raises(ValueError, match="only for recidive"):
        sshd(watch=frozenset({"x"}))
    tr = Tracker([sshd(), recidive()])
    with pytest.raises(UnknownJailError):
        tr.observe(hit("recidive", "192.0.2.1", T0), T0)


def test_recidive_findtime_stretches_the_watched_jails_horizon() -> None:
    tr = Tracker([sshd(maxretry=1, escalation=Escalation(max=H)), recidive(findtime=30 * 86400.0)])
    _jail_ban(tr, "sshd", "192.0.2.1", T0)
    assert tr.sweep(T0 + 20 * 86400) == 0  # 4 * max would be 4 h: the record stays for recidive
    assert len(tr.history_snapshot()) == 1
    assert tr.sweep(T0 + 31 * 86400) == 1
    assert tr.history_snapshot() == []


# -- policies and construction ---------------------------------------------------------------------------

def test_policy_from_config_and_validation() -> None:
    jc = JailConfig(name="sshd", filter="sshd", files=("/var/log/auth.log",), maxretry=3, findtime=300.0,
                    bantime=PERMANENT, blocklist="bad", ignoreip=(N("10.0.0.0/8"),), ipv6_prefix=56)
    p = JailPolicy.from_config(jc)
    assert (p.name, p.maxretry, p.findtime, p.bantime, p.blocklist, p.ipv6_prefix, p.recidive) == \
        ("sshd", 3, 300.0, PERMANENT, "bad", 56, False)
    assert p.ignoreip == (N("10.0.0.0/8"),)
    assert JailPolicy.from_config(jc, recidive=True, watch=["web"]).watch == frozenset({"web"})
    for bad in ({"maxretry": 0}, {"findtime": 0.0}, {"bantime": 0.0}, {"ipv6_prefix": 8},
                {"escalation": Escalation(factor=0.5)}, {"history_horizon": -1.0}):
        with pytest.raises(ValueError):
            sshd(**bad)
    with pytest.raises(ValueError, match="unique"):
        Tracker([sshd(), sshd()])
    with pytest.raises(ValueError):
        Tracker([sshd()], max_tracked=0)


def test_tracker_from_config_protects_own_addresses_and_loopback() -> None:
    cfg = Config(file="t.yaml", allowlist=(N("10.0.0.0/8"),), jails=(
        JailConfig(name="sshd", filter="sshd", files=("x",), maxretry=1),
        JailConfig(name="off", filter="sshd", files=("x",), enabled=False),
    ))
    tr = Tracker.from_config(cfg, [A("198.51.100.5")])
    assert tr.jails == ("sshd",)
    for host in ("10.1.1.1", "198.51.100.5"):
        assert fail(tr, host, 1, T0).kind is Kind.ALLOWLISTED, host
    for host in ("127.0.0.1", "::1"):  # loopback is never-ban space as well as allowlisted
        assert fail(tr, host, 1, T0).kind is Kind.NEVER_BAN, host
    assert fail(tr, "192.0.2.1", 1, T0).kind is Kind.BANNED
    lax = Tracker.from_config(Config(file="t.yaml", allowlist_self=False, jails=cfg.jails),
                              [A("198.51.100.5")])
    assert fail(lax, "198.51.100.5", 1, T0).kind is Kind.BANNED
    assert fail(lax, "127.0.0.1", 1, T0).kind is Kind.NEVER_BAN  # even without allowlist_self


def test_policy_durations() -> None:
    p = sshd(escalation=Escalation(factor=3.0, max=20 * H))
    assert [p.duration(n) for n in range(5)] == [H, 3 * H, 9 * H, 20 * H, 20 * H]
    assert p.duration(10_000) == 20 * H  # no overflow
    assert sshd(bantime=PERMANENT).duration(3) is PERMANENT


# -- properties ------------------------------------------------------------------------------------------

_POOL_V4 = [f"192.0.2.{i}" for i in range(1, 7)] + [f"198.51.100.{i}" for i in range(1, 3)]
_POOL_V6 = ["2001:db8::1", "2001:db8::2", "2001:db8:0:1::1", "::ffff:192.0.2.1"]
_POOL = _POOL_V4 + _POOL_V6


@settings(max_examples=150, deadline=None)
@given(
    allowed=st.lists(st.sampled_from(["192.0.2.0/30", "192.0.2.5", "198.51.100.0/24", "2001:db8::2",
                                      "2001:db8::/32", "::ffff:192.0.2.6"]), max_size=3),
    steps=st.lists(st.tuples(st.sampled_from(_POOL), st.floats(0, 300)), max_size=60),
)
def test_property_never_bans_an_allowlisted_address(allowed: list[str],
                                                    steps: list[tuple[str, float]]) -> None:
    allow = Allowlist.from_networks([N(a) for a in allowed])
    tr = Tracker([sshd(maxretry=2, ipv6_prefix=64)], allow)
    now = T0
    for host, dt in steps:
        now += dt
        out = tr.observe(hit("sshd", host, now), now)
        if allow.contains(A(host)) is not None:
            assert out.kind is Kind.ALLOWLISTED
        if out.ban is not None:
            assert allow.contains(out.ban.target) is None


@dataclass
class _Model:
    """The rules restated as naively as possible: lists of times, a linear history, no generations."""

    maxretry: int
    findtime: float
    policy: JailPolicy
    times: dict[IPNet, list[float]] = field(default_factory=dict)
    until: dict[IPNet, float] = field(default_factory=dict)
    history: dict[IPNet, list[tuple[float, float | None]]] = field(default_factory=dict)

    def observe(self, target: IPNet, t: float, now: float) -> tuple[Kind, float | None]:
        if now < self.until.get(target, -math.inf):
            return Kind.ALREADY_BANNED, None
        self.until.pop(target, None)
        if t < now - self.findtime:
            return Kind.STALE, None
        times = [x for x in self.times.get(target, []) if now - self.findtime <= x] + [t]
        if len(times) < self.maxretry:
            self.times[target] = times
            return Kind.COUNTED, None
        self.times.pop(target, None)
        horizon = 4 * self.policy.cap
        past = [r for r in self.history.get(target, []) if r[0] >= now - horizon]
        d = self.policy.duration(len(past))
        until = None if isinstance(d, Permanent) else max([now + d] + [u for _, u in past if u is not None])
        self.history[target] = [*past, (now, until)]
        self.until[target] = math.inf if until is None else until
        return Kind.BANNED, until


def _target(host: str, prefix: int) -> IPNet:
    a = A(host)
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    if a.version == 4:
        return ipaddress.ip_network(a)
    return ipaddress.IPv6Network((a, prefix), strict=False)


@settings(max_examples=200, deadline=None)
@given(
    maxretry=st.integers(1, 4),
    bantime=st.sampled_from([50.0, 400.0, PERMANENT]),
    steps=st.lists(st.tuples(st.sampled_from(_POOL), st.floats(0, 250), st.floats(0, 700)), max_size=80),
)
def test_property_tracker_matches_the_naive_model(maxretry: int, bantime: float | Permanent,
                                                  steps: list[tuple[str, float, float]]) -> None:
    """Bans exactly when maxretry failures lie within findtime, never below; same ends, same escalation."""
    policy = sshd(maxretry=maxretry, findtime=600.0, bantime=bantime, ipv6_prefix=64,
                  escalation=Escalation(factor=2.0, max=1000.0))
    tr = Tracker([policy], max_tracked=10_000)
    model = _Model(maxretry, 600.0, policy)
    now = T0
    for host, dt, age in steps:
        now += dt
        t = now - age  # backlog lines of any age up to a little past findtime
        out = tr.observe(hit("sshd", host, t), now)
        kind, until = model.observe(_target(host, 64), t, now)
        assert out.kind is kind, (host, now - T0, age)
        if kind is Kind.BANNED:
            assert out.ban is not None and out.ban.until == until
            assert out.ban.target == _target(host, 64)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(_POOL_V4[:3]), st.floats(-3 * H, 2 * H), st.booleans()),
                      max_size=60))
def test_property_a_ban_never_ends_before_an_earlier_one(steps: list[tuple[str, float, bool]]) -> None:
    """Even with manual unbans and our clock jumping back and forth."""
    tr = Tracker([sshd(maxretry=2, escalation=Escalation(factor=2.0, max=4 * H))])
    last: dict[IPNet, float | None] = {}
    now = T0
    for host, dt, unban in steps:
        now += dt
        out = tr.observe(hit("sshd", host, now), now, live=True)
        if out.ban is not None and out.kind is Kind.BANNED:
            prev = last.get(out.ban.target, -math.inf)
            assert prev is not None and out.ban.until is not None and out.ban.until >= prev
            last[out.ban.target] = out.ban.until
        if unban:
            tr.forget_ban(N(host))


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(_POOL), st.floats(0, 3 * H)), max_size=40))
def test_property_history_round_trips(steps: list[tuple[str, float]]) -> None:
    def build() -> Tracker:
        return Tracker([sshd(maxretry=1, ipv6_prefix=64), recidive(maxretry=2)])

    tr = build()
    now = T0
    for host, dt in steps:
        now += dt
        out = tr.observe(hit("sshd", host, now), now)
        if out.ban is not None and out.kind is Kind.BANNED:
            tr.observe_ban(out.ban, now)
    rows = tr.history_snapshot()
    again = build()
    assert again.load_history(rows, now) == LoadResult(len(rows), 0)
    assert again.history_snapshot() == rows


# -- edges ----------------------------------------------------------------------------------------------

def test_ipv4_ranges_fed_from_elsewhere_keep_their_prefix() -> None:
    tr = Tracker([sshd(), recidive(maxretry=1, bantime=60.0)])
    wide = Ban(N("203.0.113.0/24"), "bad", None, origin="jail", jail="sshd")
    out = tr.observe_ban(wide, T0)
    assert out[0].ban is not None and out[0].ban.target == N("203.0.113.0/24")
    assert tr.observe_ban(wide, T0 + 1)[0].kind is Kind.ALREADY_BANNED
    assert tr.observe_ban(wide, T0 + 61)[0].kind is Kind.BANNED  # the recidive ban had ended
    assert tr.forget_ban(N("203.0.113.0/24"), jail="recidive") == [("recidive", N("203.0.113.0/24"))]


def test_an_ended_ban_of_a_single_ipv6_address_is_noticed() -> None:
    allow = Allowlist.from_networks([A("2001:db8::7")])
    tr = Tracker([sshd(ipv6_prefix=64, maxretry=1, bantime=60.0)], allow)
    assert fail(tr, "2001:db8::1", 1, T0).kind is Kind.BANNED
    assert fail(tr, "2001:db8::1", 1, T0 + 61).kind is Kind.BANNED  # the first one ended: a new one


def test_sweep_keeps_the_part_of_a_history_inside_the_horizon() -> None:
    tr = Tracker([sshd(maxretry=1, history_horizon=2 * H)])
    _ban_again(tr, "192.0.2.1", T0)
    _ban_again(tr, "192.0.2.1", T0 + 1.5 * H)
    assert tr.sweep(T0 + 2.5 * H) == 1
    assert [r[2] for r in tr.history_snapshot()] == [T0 + 1.5 * H]


def test_recidive_with_maxretry_one_restores_nothing_to_count() -> None:
    tr = Tracker([sshd(maxretry=1), recidive(maxretry=1)])
    assert tr.load_history([("sshd", "192.0.2.1", T0, T0 + H)], T0 + 1) == LoadResult(1, 0)
    assert tr.tracked == 0


def test_failures_of_an_untracked_offender_and_bad_rows() -> None:
    tr = Tracker([sshd()])
    assert tr.failures("sshd", N("192.0.2.0/24"), T0) == 0
    with pytest.raises(ValueError):
        BanRecord.from_row(("sshd", "192.0.2.1", T0, "tomorrow"))
    with pytest.raises(ValueError):
        Tracker([sshd()], max_skew=-1.0)


# -- never-ban space (issue 13, item 2) -----------------------------------------------------------------

@pytest.mark.parametrize("host", ["0.0.0.0", "255.255.255.255", "224.0.0.1", "240.0.0.1", "169.254.9.9",
                                  "::", "fe80::1", "ff02::1", "::ffff:224.0.0.1"])
def test_never_ban_space_is_never_counted_or_banned(host: str) -> None:
    tr = Tracker([sshd(maxretry=1, ipv6_prefix=64)])
    out = tr.observe(hit("sshd", host, T0), T0)
    assert out.kind is Kind.NEVER_BAN and out.ban is None and out.allow is not None
    assert tr.tracked == 0 and tr.banned_count() == 0


def test_never_ban_space_beside_the_allowlist_and_ignoreip() -> None:
    tr = Tracker([sshd(maxretry=1, ignoreip=(N("198.51.100.0/24"),))], Allowlist.from_networks([N("192.0.2.0/24")]))
    assert tr.observe(hit("sshd", "224.0.0.9", T0), T0).kind is Kind.NEVER_BAN
    assert tr.observe(hit("sshd", "192.0.2.9", T0), T0).kind is Kind.ALLOWLISTED
    assert tr.observe(hit("sshd", "198.51.100.9", T0), T0).kind is Kind.ALLOWLISTED
    assert tr.observe(hit("sshd", "203.0.113.9", T0), T0).kind is Kind.BANNED
    tr.replace_allowlist(Allowlist())
    assert tr.observe(hit("sshd", "0.0.0.0", T0), T0).kind is Kind.NEVER_BAN
    assert not tr.note_ban(Ban(N("224.0.0.9/32"), "bad", T0 + H, "jail", "", "sshd"), T0)


def test_an_ipv6_neighbour_of_never_ban_space_is_banned_alone() -> None:
    # ::2 is no never-ban address, but its /64 holds :: and ::1: the offender is the single address.
    tr = Tracker([sshd(maxretry=1, ipv6_prefix=64)])
    out = tr.observe(hit("sshd", "::2", T0), T0)
    assert out.kind is Kind.BANNED and out.ban is not None and out.ban.target == N("::2/128")


def test_sweep_hands_over_the_ended_bans_of_the_jails_asked_for() -> None:
    tr = Tracker([sshd(), sshd(name="web")])
    fail(tr, "192.0.2.1", 5, T0)
    fail(tr, "192.0.2.2", 5, T0, jail="web")
    fail(tr, "192.0.2.3", 5, T0 + H)  # ends an hour later
    ended: dict[str, list[Ban]] = {"sshd": []}
    assert tr.sweep(T0 + H + 1, ended) == 2
    assert [(b.jail, str(b.target)) for b in ended["sshd"]] == [("sshd", "192.0.2.1/32")]
