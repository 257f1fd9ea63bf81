"""The never-ban table: the addresses issue 13 found bannable are refused with a reason, ranges that overlap
never-ban space are refused, ordinary and merely special space is not, and the fast paths agree with
`ipaddress` arithmetic."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.feeds import aggregate
from nftblockd.neverban import (
    NEVER_BAN,
    SPECIAL_V4,
    SPECIAL_V6,
    never_ban_keys,
    never_ban_range,
    never_ban_reason,
)

N = ipaddress.ip_network


@pytest.mark.parametrize(("target", "expected"), [
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("255.255.255.255", "limited broadcast"),
    ("224.0.0.1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("fe80::1", "link-local"),
    ("ff02::1", "multicast"),
    ("0.0.0.0/8", "this network"),
    ("169.254.1.1", "link-local"),
    ("127.0.0.1", "loopback"),
    ("::1", "loopback"),
    ("::ffff:224.0.0.1", "multicast"),  # IPv4-mapped is read as IPv4
])
def test_the_addresses_found_bannable_are_refused_with_a_reason(target: str, expected: str) -> None:
    reason = never_ban_reason(N(target))
    assert reason is not None and expected in reason
    assert not reason.startswith("it overlaps")


@pytest.mark.parametrize("target", [
    "203.0.113.7", "198.51.100.0/24", "10.1.2.3", "192.168.0.0/16", "100.64.0.1", "2001:db8::1",
    "2001:db8::/32", "fd00::1", "1.0.0.0/8", "223.255.255.255", "fe00::1", "fec0::1", "::2",
])
def test_ordinary_and_special_space_may_be_banned(target: str) -> None:
    assert never_ban_reason(N(target)) is None


@pytest.mark.parametrize(("target", "inside"), [
    ("192.0.0.0/2", "multicast"), ("0.0.0.0/0", "this network"), ("::/0", "unspecified"),
    ("fe00::/7", "link-local"), ("::/64", "unspecified"), ("169.254.0.0/15", "link-local"),
])
def test_a_range_overlapping_never_ban_space_is_refused_whole(target: str, inside: str) -> None:
    reason = never_ban_reason(N(target))
    assert reason is not None and reason.startswith("it overlaps") and inside in reason


def test_addresses_as_well_as_networks() -> None:
    assert never_ban_reason(ipaddress.ip_address("224.0.0.5")) == never_ban_reason(N("224.0.0.5/32"))


def test_bulk_filter_picks_exactly_the_never_ban_keys() -> None:
    keys = [int(ipaddress.IPv4Address(a)) for a in (
        "0.0.0.0", "1.2.3.4", "127.0.0.9", "169.254.3.3", "169.253.0.1", "224.0.0.1", "223.1.1.1",
        "255.255.255.255", "203.0.113.7")]
    got = never_ban_keys(4, keys)
    assert [str(ipaddress.IPv4Address(k)) for k in got] == [
        "0.0.0.0", "127.0.0.9", "169.254.3.3", "224.0.0.1", "255.255.255.255"]
    v6 = [int(ipaddress.IPv6Address(a)) for a in ("::", "::1", "fe80::1", "2001:db8::1", "ff05::2")]
    assert len(never_ban_keys(6, v6)) == 4


def test_the_feed_sanitiser_uses_the_same_table() -> None:
    assert aggregate.SPECIAL_V4 is SPECIAL_V4 and aggregate.SPECIAL_V6 is SPECIAL_V6
    never = {N(c) for table in (SPECIAL_V4, SPECIAL_V6) for c, _, n in table if n}
    assert never == set(NEVER_BAN)


def _slow(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    return any(n.version == net.version and n.overlaps(net) for n in NEVER_BAN)


@given(st.integers(0, 2**32 - 1), st.integers(0, 32))
def test_v4_ranges_agree_with_ipaddress(addr: int, plen: int) -> None:
    net = ipaddress.IPv4Network((addr >> (32 - plen) << (32 - plen), plen))
    first = int(net.network_address)
    assert (never_ban_range(4, first, int(net.broadcast_address)) is not None) == _slow(net)
    if plen == 32:
        assert (never_ban_keys(4, [first]) != []) == _slow(net)


@given(st.sampled_from([0, 1, 0xFE80 << 112, 0xFF02 << 112, 0x2001_0DB8 << 96, 0xFEC0 << 112]),
       st.integers(0, 2**40), st.integers(0, 128))
def test_v6_ranges_agree_with_ipaddress(base: int, offset: int, plen: int) -> None:
    addr = (base + offset) % 2**128
    net = ipaddress.IPv6Network((addr >> (128 - plen) << (128 - plen), plen))
    assert (never_ban_range(6, int(net.network_address), int(net.broadcast_address)) is not None) == _slow(net)


@given(st.lists(st.integers(0, 2**32 - 1) | st.sampled_from(
    [0, 1, 0x7F000001, 0x7EFFFFFF, 0x80000000, 0xA9FE0000, 0xA9FDFFFF, 0xE0000000, 0xDFFFFFFF, 0xFFFFFFFF]),
    max_size=60))
def test_bulk_filter_is_the_per_key_check_in_order(keys: list[int]) -> None:
    # the vectorised first-octet pass (addr.flagged) against never_ban_range per key; an iterator works too
    want = [k for k in keys if never_ban_range(4, k, k) is not None]
    assert never_ban_keys(4, keys) == want
    assert never_ban_keys(4, iter(keys)) == want


@given(st.lists(st.integers(0, 2**128 - 1) | st.sampled_from([0, 1, 2, (1 << 120) - 1, 1 << 120, 0xFE7F << 112,
                                                               (0xFE80 << 112) - 1, 0xFE80 << 112, 0xFEC0 << 112,
                                                               0xFF << 120, 2**128 - 1]), max_size=60))
def test_bulk_filter_v6_is_the_per_key_check_in_order(keys: list[int]) -> None:
    # the two-comparison suspect pass against never_ban_range per key
    assert never_ban_keys(6, keys) == [k for k in keys if never_ban_range(6, k, k) is not None]
