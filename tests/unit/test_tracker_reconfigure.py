"""Tracker.reconfigure (a reload): policies replaced, what was counted kept where it still means the same."""

from __future__ import annotations

import ipaddress

import pytest

from nftblockd.detect.tracker import JailPolicy, Kind, Tracker
from nftblockd.events import Hit

T0 = 1_900_000_000.0


def hit(jail: str, host: str, t: float = T0) -> Hit:
    return Hit(jail, ipaddress.ip_address(host), t, "")


def test_a_changed_maxretry_applies_to_the_next_failure_with_earlier_ones_counted() -> None:
    tr = Tracker([JailPolicy("sshd", maxretry=5), JailPolicy("web", maxretry=1)])
    for i in range(2):
        assert tr.observe(hit("sshd", "192.0.2.1", T0 + i), T0 + i).kind is Kind.COUNTED
    added, removed, changed = tr.reconfigure([JailPolicy("sshd", maxretry=3), JailPolicy("ftp", maxretry=1)])
    assert (added, removed, changed) == (["ftp"], ["web"], ["sshd"])
    assert tr.observe(hit("sshd", "192.0.2.1", T0 + 2), T0 + 2).kind is Kind.BANNED
    assert tr.tracked == 0  # the ban ended the counting record
    assert tr.observe(hit("ftp", "192.0.2.9"), T0).kind is Kind.BANNED


def test_bans_in_force_are_kept_so_hits_stay_already_banned() -> None:
    tr = Tracker([JailPolicy("sshd", maxretry=1)])
    assert tr.observe(hit("sshd", "192.0.2.1"), T0).kind is Kind.BANNED
    tr.reconfigure([JailPolicy("sshd", maxretry=2, bantime=7200.0)])
    assert tr.observe(hit("sshd", "192.0.2.1", T0 + 1), T0 + 1).kind is Kind.ALREADY_BANNED


def test_a_changed_ipv6_grouping_starts_that_jails_records_afresh() -> None:
    tr = Tracker([JailPolicy("sshd", maxretry=2, ipv6_prefix=128)])
    tr.observe(hit("sshd", "2001:db8::1"), T0)
    assert tr.tracked == 1
    tr.reconfigure([JailPolicy("sshd", maxretry=2, ipv6_prefix=64)])
    assert tr.tracked == 0
    assert tr.observe(hit("sshd", "2001:db8::2", T0 + 1), T0 + 1).kind is Kind.COUNTED


def test_policies_the_tracker_refuses_change_nothing() -> None:
    tr = Tracker([JailPolicy("sshd", maxretry=2)])
    tr.observe(hit("sshd", "192.0.2.1"), T0)
    with pytest.raises(ValueError):
        tr.reconfigure([JailPolicy("sshd"), JailPolicy("sshd")])
    assert tr.tracked == 1
    assert tr.observe(hit("sshd", "192.0.2.1", T0 + 1), T0 + 1).kind is Kind.BANNED
