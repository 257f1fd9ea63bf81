"""aggregate: sanitising rules, minimal aggregation and diff, checked against integer range arithmetic."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.addr import IPNet, key_range, net_key
from nftblockd.feeds.aggregate import (
    SPECIAL_V4,
    SPECIAL_V6,
    Aggregate,
    Policy,
    Sanitised,
    aggregate,
    collapse,
    diff,
    merge_ranges,
    ranges_to_cidrs,
    sanitise,
)
from nftblockd.feeds.parse import parse_feed

DATA = Path(__file__).parent.parent / "data" / "feeds"


def net(text: str) -> IPNet:
    return ipaddress.ip_network(text)


def run(body: str, policy: Policy | None = None, allow: tuple[str, ...] = ()) -> tuple[Sanitised, list[str]]:
    parsed = parse_feed(body)
    s = sanitise(parsed.v4, parsed.v6, policy or Policy(), [net(a) for a in allow])
    return s, [str(n) for n in aggregate([s]).networks()]


# -- rules, by example --------------------------------------------------------------------------------------


def test_firehol_level1_special_ranges_are_dropped_public_kept() -> None:
    s, out = run((DATA / "firehol_level1.netset").read_text())
    assert out == ["1.10.16.0/20", "1.19.0.0/16", "2.56.192.0/22", "5.42.92.0/24", "31.24.81.0/24",
                   "45.9.148.0/23", "46.29.160.0/21", "185.11.61.104/30", "223.254.0.0/16"]
    # 0/8 10/8 100.64/10 127/8 169.254/16 172.16/12 192.0.0/24 192.0.2/24 192.168/16 198.18/15
    # 198.51.100/24 203.0.113/24; 224.0.0.0/3 is wider than /8 and refused as too broad first
    assert s.stats.special == 12 and s.stats.too_broad == 1
    assert s.stats.refused == 13 and s.stats.entries == 25


def test_a_prefix_containing_special_space_is_trimmed_not_refused() -> None:
    s, out = run("100.0.0.0/8\n")
    assert out == ["100.0.0.0/10", "100.128.0.0/9"]  # 100.64.0.0/10 (CGNAT) cut out
    assert s.stats.special_trimmed == 1 and s.stats.refused == 0


def test_ipv6_special_space() -> None:
    s, out = run("fe80::1\nfd12:3456::/32\n2001:db8::/32\n::1\n2001:db0::/28\n2a01:4f8::/32\n")
    assert out == ["2001:db0::/29", "2001:db9::/32", "2001:dba::/31", "2001:dbc::/30", "2a01:4f8::/32"]
    assert s.stats.special == 4 and s.stats.special_trimmed == 1


def test_allow_special_keeps_private_but_never_loopback() -> None:
    policy = Policy(allow_special=True)
    s, out = run("10.0.0.0/8\n127.0.0.1\n0.0.0.0/8\n::1\n::/128\nfd12:3456::/32\n", policy)
    assert out == ["10.0.0.0/8", "fd12:3456::/32"]
    assert s.stats.special == 4


@pytest.mark.parametrize("body", ["0.0.0.0/0\n", "::/0\n"])
def test_slash_zero_is_never_allowed(body: str) -> None:
    s, out = run(body, Policy(min_prefix_v4=0, min_prefix_v6=0, allow_special=True))
    assert out == [] and s.stats.too_broad == 1


def test_minimum_prefix_per_family() -> None:
    body = "2.0.0.0/7\n4.0.0.0/8\n2a02::/15\n2a00::/16\n"
    s, out = run(body)
    assert out == ["4.0.0.0/8", "2a00::/16"] and s.stats.too_broad == 2
    s, out = run(body, Policy(min_prefix_v4=16, min_prefix_v6=32))
    assert out == [] and s.stats.too_broad == 4
    s, out = run(body, Policy(min_prefix_v4=7, min_prefix_v6=15))
    assert out == ["2.0.0.0/7", "4.0.0.0/8", "2a00::/16", "2a02::/15"]
    assert s.stats.too_broad == 0


def test_allowlist_is_cut_out_of_feed_prefixes() -> None:
    s, out = run("8.8.0.0/16\n9.9.9.9\n", allow=("8.8.8.8", "9.9.9.0/24"))
    assert "9.9.9.9/32" not in out
    assert not any(net(o).overlaps(net("8.8.8.8/32")) for o in out)
    covered = sum(net(o).num_addresses for o in out)
    assert covered == 65536 - 1
    assert len(out) == 16  # 8.8.0.0/16 minus one address = one CIDR per bit
    assert s.stats.allowlisted == 1 and s.stats.allowlist_trimmed == 1


def test_allowlist_of_the_other_family_does_not_interfere() -> None:
    _, out = run("8.8.8.0/24\n", allow=("::ffff:8.8.8.8", "2001:4860::/32"))
    # ::ffff:8.8.8.8 is parsed by config into 8.8.8.8 (addr.parse_target); here it is a raw IPv6 network
    assert out == ["8.8.8.0/24"]


def test_adjacent_and_overlapping_feeds_collapse() -> None:
    a = sanitise(*_packed("1.2.3.0/25\n5.0.0.0/16\n5.0.3.0/24\n"))
    b = sanitise(*_packed("1.2.3.128/25\n5.1.0.0/16\n2a01::1\n2a01::\n"))
    agg = aggregate([a, b])
    assert [str(n) for n in agg.networks()] == ["1.2.3.0/24", "5.0.0.0/15", "2a01::/127"]
    assert [str(n) for n in agg.singles()] == []
    assert len(agg) == 3


def test_singles_and_prefixes_split() -> None:
    agg = aggregate([sanitise(*_packed("1.1.1.1\n1.1.1.3\n2.2.2.0/24\n2a01::5\n2a01:1::/48\n"))])
    assert [str(n) for n in agg.singles()] == ["1.1.1.1/32", "1.1.1.3/32", "2a01::5/128"]
    assert [str(n) for n in agg.prefixes()] == ["2.2.2.0/24", "2a01:1::/48"]


def test_empty_everything() -> None:
    assert len(aggregate([])) == 0
    assert len(aggregate([sanitise([], [])])) == 0
    assert diff([], []) == ([], [])


def test_diff_example() -> None:
    current = {net("1.2.3.0/24"), net("5.6.7.8/32"), net("2a01::/32")}
    desired = [net("1.2.3.0/24"), net("9.9.9.9/32"), net("2a02::/32")]
    to_add, to_remove = diff(current, desired)
    assert to_add == [net("9.9.9.9/32"), net("2a02::/32")]
    assert to_remove == [net("5.6.7.8/32"), net("2a01::/32")]


def test_special_tables_are_valid_networks() -> None:
    for table in (SPECIAL_V4, SPECIAL_V6):
        for cidr, what, _always in table:
            assert ipaddress.ip_network(cidr).with_prefixlen == cidr and what


def _packed(body: str) -> tuple[list[int], list[int]]:
    r = parse_feed(body)
    return r.v4, r.v6


# -- properties against integer range arithmetic ------------------------------------------------------------

# Small universes (1024 addresses each) placed on the edges of special ranges, so every example mixes
# public, special, allowlisted, adjacent and overlapping space and can be checked address by address.
WINDOW = 1024
V4_WINDOWS = [int(ipaddress.IPv4Address(a)) for a in (
    "9.255.254.0", "1.2.3.0", "100.63.254.0", "126.255.254.0", "169.253.255.0", "223.255.254.0")]
V6_WINDOWS = [int(ipaddress.IPv6Address(a)) for a in (
    "fe7f:ffff:ffff:ffff:ffff:ffff:ffff:fe00", "2001:db7:ffff:ffff:ffff:ffff:ffff:fe00", "2a01::", "::")]


def _special_addresses(version: int, allow_special: bool) -> list[tuple[int, int]]:
    table = SPECIAL_V4 if version == 4 else SPECIAL_V6
    return [key_range(net_key(net(c)), version) for c, _, always in table if always or not allow_special]


@st.composite
def window_net(draw: st.DrawFn, version: int) -> IPNet:
    bits = 32 if version == 4 else 128
    base = draw(st.sampled_from(V4_WINDOWS if version == 4 else V6_WINDOWS))
    plen = draw(st.integers(bits - 10, bits))
    addr = (base + draw(st.integers(0, WINDOW - 1))) >> (bits - plen) << (bits - plen)
    cls = ipaddress.IPv4Network if version == 4 else ipaddress.IPv6Network
    return cls((addr, plen))


def _addresses(nets: list[IPNet]) -> set[int]:
    out: set[int] = set()
    for n in nets:
        s, e = key_range(net_key(n), n.version)
        out.update(range(s, e + 1))
    return out


def _minimal(nets: list[IPNet]) -> bool:
    """collapse_addresses gives the minimal, sorted set; ours must already be it."""
    v4 = [n for n in nets if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in nets if isinstance(n, ipaddress.IPv6Network)]
    return [*ipaddress.collapse_addresses(v4), *ipaddress.collapse_addresses(v6)] == nets


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([4, 6]).flatmap(lambda v: st.tuples(
    st.just(v), st.lists(window_net(v), max_size=25), st.lists(window_net(v), max_size=4))),
    st.booleans(), st.sampled_from([0, 118, 122, 126]))
def test_aggregate_covers_exactly_input_minus_special_minus_allowlist(
        case: tuple[int, list[IPNet], list[IPNet]], allow_special: bool, min_prefix: int) -> None:
    version, entries, allow = case
    bits = 32 if version == 4 else 128
    min_p = max(1, min_prefix - (128 - bits))  # the same depth below a full address in both families
    policy = Policy(min_prefix_v4=min_p, min_prefix_v6=min_p, allow_special=allow_special)
    packed = [net_key(n) for n in entries]
    s = sanitise(packed if version == 4 else [], packed if version == 6 else [], policy, allow)
    out = aggregate([s]).networks()

    kept = [n for n in entries if n.prefixlen >= min_p]
    expected = _addresses(kept) - _addresses(allow)
    for lo, hi in _special_addresses(version, allow_special):
        expected = {a for a in expected if not lo <= a <= hi}
    assert _addresses(out) == expected
    assert _minimal(out)
    assert s.stats.too_broad == len(entries) - len(kept)
    assert s.stats.entries == len(entries)
    special = _special_addresses(version, allow_special)
    allowed = _addresses(allow)
    def is_special(a: int) -> bool:
        return any(lo <= a <= hi for lo, hi in special)

    wholly_special = [n for n in kept if all(is_special(a) for a in _addresses([n]))]
    wholly_allowed = [n for n in kept if n not in wholly_special and _addresses([n]) <= allowed]
    assert s.stats.special == len(wholly_special)
    assert s.stats.allowlisted == len(wholly_allowed)


@settings(max_examples=100, deadline=None)
@given(st.lists(window_net(4), max_size=20), st.lists(window_net(4), max_size=20),
       st.lists(window_net(4), max_size=3))
def test_union_of_feeds_equals_one_concatenated_feed(a: list[IPNet], b: list[IPNet],
                                                     allow: list[IPNet]) -> None:
    pa, pb = [net_key(n) for n in a], [net_key(n) for n in b]
    separately = aggregate([sanitise(pa, [], allow=allow), sanitise(pb, [], allow=allow)])
    together = aggregate([sanitise(pa + pb, [], allow=allow)])
    assert separately == together


_any_v4 = st.builds(lambda a, p: ipaddress.IPv4Network((a >> (32 - p) << (32 - p), p)),
                    st.integers(0, 2**32 - 1), st.integers(0, 32))
_any_v6 = st.builds(lambda a, p: ipaddress.IPv6Network((a >> (128 - p) << (128 - p), p)),
                    st.integers(0, 2**128 - 1), st.integers(0, 128))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_any_v4, _any_v6), max_size=40))
def test_collapse_matches_ipaddress(nets: list[IPNet]) -> None:
    v4 = [n for n in nets if n.version == 4]
    v6 = [n for n in nets if n.version == 6]
    assert collapse(nets) == list(ipaddress.collapse_addresses(v4)) + list(ipaddress.collapse_addresses(v6))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([32, 128]).flatmap(lambda bits: st.tuples(st.just(bits), st.lists(
    st.tuples(st.integers(0, 2**bits - 1), st.integers(0, 2**bits - 1)), max_size=8))))
def test_ranges_to_cidrs_matches_summarize_address_range(case: tuple[int, list[tuple[int, int]]]) -> None:
    bits, raw = case
    ranges = merge_ranges((min(a, b), max(a, b)) for a, b in raw)
    cls = ipaddress.IPv4Address if bits == 32 else ipaddress.IPv6Address
    expected = [n for s, e in ranges for n in ipaddress.summarize_address_range(cls(s), cls(e))]
    cidrs = ranges_to_cidrs(ranges, bits)
    got = Aggregate(cidrs, []) if bits == 32 else Aggregate([], cidrs)
    assert got.networks() == expected


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), max_size=30))
def test_merge_ranges_is_disjoint_non_adjacent_and_covers_the_same(raw: list[tuple[int, int]]) -> None:
    ranges = [(s, s + n) for s, n in raw]
    merged = merge_ranges(ranges)
    assert all(merged[i][1] + 1 < merged[i + 1][0] for i in range(len(merged) - 1))
    covered = {a for s, e in ranges for a in range(s, e + 1)}
    assert covered == {a for s, e in merged for a in range(s, e + 1)}


@settings(deadline=None)
@given(st.sets(st.one_of(_any_v4, _any_v6), max_size=30), st.sets(st.one_of(_any_v4, _any_v6), max_size=30))
def test_diff_applied_to_current_gives_desired(current: set[IPNet], desired: set[IPNet]) -> None:
    to_add, to_remove = diff(current, desired)
    assert (current - set(to_remove)) | set(to_add) == desired
    assert not set(to_add) & current
    assert set(to_remove) <= current
    assert not set(to_add) & set(to_remove)


@settings(deadline=None)
@given(st.sets(st.integers(0, 2**40), max_size=30), st.sets(st.integers(0, 2**40), max_size=30))
def test_diff_works_on_packed_ints(current: set[int], desired: set[int]) -> None:
    to_add, to_remove = diff(list(current), desired)
    assert (current - set(to_remove)) | set(to_add) == desired
    assert to_add == sorted(to_add) and to_remove == sorted(to_remove)


def test_stats_helpers() -> None:
    s, _ = run("1.2.3.0/24\n10.0.0.0/8\n8.8.8.8\n", allow=("8.8.8.8",))
    assert s.v4_addresses == 256
    assert s.stats.as_dict() == {"entries": 3, "too_broad": 0, "special": 1, "special_trimmed": 0,
                                 "allowlisted": 1, "allowlist_trimmed": 0}


def test_a_feed_owned_blocklist_keeps_everything_in_its_interval_sets_and_empties_its_hash_sets() -> None:
    """One interval lookup per family for the feed instead of a hash and an interval lookup
    (docs/datapath.md, `feedint`); the empty lists for the hash sets empty them on an upgrade."""
    from nftblockd.feeds.manager import _desired

    nets = [ipaddress.ip_network(n) for n in ("45.10.0.7/32", "91.200.0.0/24", "2a00:dead::1/128",
                                              "2a00:1450::/32")]
    agg = aggregate([sanitise([net_key(n) for n in nets if n.version == 4],
                              [net_key(n) for n in nets if n.version == 6])])
    want = _desired(agg, "fd")
    assert want == {"fd_ip4": [], "fd_net4": agg.v4, "fd_ip6": [], "fd_net6": agg.v6}
    assert sorted(want["fd_net4"]) == sorted(net_key(n) for n in nets[:2])
    assert sorted(want["fd_net6"]) == sorted(net_key(n) for n in nets[2:])
