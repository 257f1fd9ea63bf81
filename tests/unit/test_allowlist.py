"""Allowlist: exact answers from the bisect lookup, checked against a linear scan."""

from __future__ import annotations

import ipaddress
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.addr import IPNet
from nftblockd.allowlist import EMPTY, LOOPBACK, Allowlist, build_allowlist

A = ipaddress.ip_address
N = ipaddress.ip_network


def test_empty_allows_nothing() -> None:
    assert EMPTY.contains(A("1.2.3.4")) is None
    assert EMPTY.contains(N("::/0")) is None
    assert len(EMPTY) == 0
    assert A("1.2.3.4") not in EMPTY


def test_address_inside_and_outside() -> None:
    allow = Allowlist.from_networks([N("10.0.0.0/8"), N("192.168.1.0/24"), A("203.0.113.7")])
    assert allow.contains(A("10.1.2.3")) == N("10.0.0.0/8")
    assert allow.contains(A("192.168.1.255")) == N("192.168.1.0/24")
    assert allow.contains(A("192.168.2.0")) is None
    assert allow.contains(A("203.0.113.7")) == N("203.0.113.7/32")
    assert allow.contains(A("203.0.113.8")) is None
    assert allow.contains(A("9.255.255.255")) is None
    assert allow.contains(A("11.0.0.0")) is None


def test_nested_entries_answer_with_the_widest() -> None:
    allow = Allowlist.from_networks([N("10.1.2.3/32"), N("10.0.0.0/8"), N("10.1.0.0/16")])
    assert allow.contains(A("10.1.2.3")) == N("10.0.0.0/8")
    assert len(allow) == 3  # every configured entry is kept for display; only the lookup drops nesting
    assert allow.networks[0] == N("10.0.0.0/8")


def test_a_network_is_refused_when_it_overlaps_an_entry() -> None:
    allow = Allowlist.from_networks([A("2001:db8::7"), N("198.51.100.0/24")])
    # banning the /64 around an allowed address would lock it out
    assert allow.contains(N("2001:db8::/64")) == N("2001:db8::7/128")
    assert allow.contains(N("2001:db8:0:1::/64")) is None
    # a wider query covering an allowed range, and a narrower one inside it
    assert allow.contains(N("198.51.0.0/16")) == N("198.51.100.0/24")
    assert allow.contains(N("198.51.100.128/25")) == N("198.51.100.0/24")
    assert allow.contains(N("198.51.101.0/24")) is None


def test_families_do_not_mix() -> None:
    allow = Allowlist.from_networks([N("0.0.0.0/0")])
    assert allow.contains(A("1.2.3.4")) == N("0.0.0.0/0")
    assert allow.contains(A("2001:db8::1")) is None
    assert allow.contains(N("::/0")) is None


def test_ipv4_mapped_ipv6_is_normalised_both_ways() -> None:
    allow = Allowlist.from_networks([A("::ffff:192.0.2.1"), N("198.51.100.0/24")])
    assert allow.networks[0] == N("192.0.2.1/32")
    assert allow.contains(A("192.0.2.1")) == N("192.0.2.1/32")
    assert allow.contains(A("::ffff:198.51.100.9")) == N("198.51.100.0/24")
    assert allow.contains(N("::ffff:198.51.100.0/120")) == N("198.51.100.0/24")


def test_duplicates_collapse_and_in_works() -> None:
    allow = Allowlist.from_networks([A("192.0.2.1"), N("192.0.2.1/32")])
    assert len(allow) == 1
    assert A("192.0.2.1") in allow
    assert N("192.0.2.0/24") in allow
    assert "192.0.2.1" not in allow  # text is not parsed here: the caller parses, with its own errors


def test_union_and_build() -> None:
    a = Allowlist.from_networks([N("10.0.0.0/8")])
    b = a.union([A("2001:db8::1")], Allowlist.from_networks([N("192.0.2.0/24")]))
    assert set(b.networks) == {N("10.0.0.0/8"), N("2001:db8::1/128"), N("192.0.2.0/24")}
    assert a.networks == (N("10.0.0.0/8"),)  # values, never changed in place

    own = [A("198.51.100.5"), A("2001:db8:1::5")]
    built = build_allowlist([N("10.0.0.0/8")], own, include_self=True)
    for x in ("10.9.9.9", "198.51.100.5", "2001:db8:1::5", "127.0.0.1", "::1"):
        assert built.contains(A(x)) is not None, x
    assert set(LOOPBACK) <= set(built.networks)
    bare = build_allowlist([N("10.0.0.0/8")], own, include_self=False)
    assert bare.contains(A("127.0.0.1")) is None
    assert bare.contains(A("198.51.100.5")) is None


def test_thousands_of_entries_match_a_linear_scan() -> None:
    rng = random.Random(7)
    nets: list[IPNet] = []
    for _ in range(5000):
        plen = rng.choice((8, 16, 20, 24, 28, 32))
        nets.append(ipaddress.IPv4Network((rng.getrandbits(32), plen), strict=False))
    allow = Allowlist.from_networks(nets)
    spans = [(int(n.network_address), int(n.broadcast_address), n.prefixlen) for n in nets]
    for _ in range(400):
        x = rng.getrandbits(32)
        got = allow.contains(ipaddress.IPv4Address(x))
        covering = [plen for first, last, plen in spans if first <= x <= last]
        if covering:
            assert got is not None and ipaddress.IPv4Address(x) in got
            assert got.prefixlen == min(covering)
        else:
            assert got is None


# -- properties ----------------------------------------------------------------------------------------

def _v4_nets() -> st.SearchStrategy[ipaddress.IPv4Network]:
    # A small address space (10.0.0.0/20) so that entries and queries actually collide.
    return st.builds(lambda a, p: ipaddress.IPv4Network((0x0A000000 | a, p), strict=False),
                     st.integers(0, 4095), st.integers(20, 32))


def _v6_nets() -> st.SearchStrategy[ipaddress.IPv6Network]:
    return st.builds(lambda a, p: ipaddress.IPv6Network(((0x20010DB8 << 96) | (a << 100), p), strict=False),
                     st.integers(0, 255), st.integers(32, 128))


_nets = st.one_of(_v4_nets(), _v6_nets())


@settings(max_examples=150, deadline=None)
@given(entries=st.lists(_nets, max_size=30), queries=st.lists(_nets, min_size=1, max_size=30))
def test_lookup_equals_linear_overlap_scan(entries: list[IPNet], queries: list[IPNet]) -> None:
    allow = Allowlist.from_networks(entries)
    for q in queries:
        overlapping = [e for e in entries if e.version == q.version and e.overlaps(q)]
        got = allow.contains(q)
        if not overlapping:
            assert got is None
        else:
            assert got is not None and got in entries
            assert got.overlaps(q)


@settings(max_examples=100, deadline=None)
@given(entries=st.lists(_nets, max_size=30), a=st.integers(0, 4095))
def test_an_address_is_allowed_iff_some_entry_contains_it(entries: list[IPNet], a: int) -> None:
    allow = Allowlist.from_networks(entries)
    addr = ipaddress.IPv4Address(0x0A000000 | a)
    assert (allow.contains(addr) is not None) == any(addr in e for e in entries)


def _wide_nets() -> st.SearchStrategy[IPNet]:
    # Entries of any width anywhere (a /3 spans many of the bulk test's /16 prefixes, a /32 one), and near the
    # prefix boundaries the bulk test's table is cut at.
    return st.one_of(
        st.builds(lambda a, p: ipaddress.IPv4Network((a, p), strict=False), st.integers(0, 2**32 - 1),
                  st.integers(0, 32)),
        st.builds(lambda a, p: ipaddress.IPv6Network((a, p), strict=False), st.integers(0, 2**128 - 1),
                  st.integers(0, 128)),
        _nets)


def _keys(version: int, entries: list[IPNet]) -> st.SearchStrategy[list[int]]:
    top = 2**32 - 1 if version == 4 else 2**128 - 1
    edges = [int(x) + d for e in entries if e.version == version
             for x in (e.network_address, e.broadcast_address) for d in (-1, 0, 1)]
    near = [k for k in edges if 0 <= k <= top]
    return st.lists(st.integers(0, top) | (st.sampled_from(near) if near else st.integers(0, top)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.data(), st.lists(_wide_nets(), max_size=12), st.sampled_from([4, 6]))
def test_hosts_among_is_contains_range_per_key(data: st.DataObject, entries: list[IPNet], version: int) -> None:
    # the bulk test (a /16 prefix table, then the bisect) against the plain per-key lookup it replaces
    allow = Allowlist.from_networks(entries)
    keys = data.draw(_keys(version, entries))
    assert allow.hosts_among(version, keys) == [k for k in keys if allow.contains_range(version, k, k) is not None]
    assert EMPTY.hosts_among(version, keys) == []


@settings(max_examples=100, deadline=None)
@given(st.lists(_wide_nets(), max_size=12), st.lists(st.integers(0, 2**24 - 1), max_size=200),
       st.sampled_from([10, 127, 192]))
def test_hosts_among_many_keys_in_one_touched_octet(entries: list[IPNet], low: list[int], octet: int) -> None:
    # most keys in a first octet some entry touches: the /16 table for all of them, not a find per key
    allow = Allowlist.from_networks([*entries, ipaddress.ip_network(f"{octet}.210.3.1/32")])
    keys = [octet << 24 | k for k in low]
    assert allow.hosts_among(4, keys) == [k for k in keys if allow.contains_range(4, k, k) is not None]
