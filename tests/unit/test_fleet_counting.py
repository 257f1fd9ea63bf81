"""fleet/counting.py: offenders, keys, the entry format (outside input: hostile entries included) and the Tally's
rules (windows, the per-host rate and share caps, one ban per crossing, the same decision whatever the order of
arrival). The same Tally against a real server: tests/integration/test_fleet_count_redis.py."""

from __future__ import annotations

import ipaddress
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.fleet.counting import (
    CountPolicy,
    Item,
    Tally,
    encode_items,
    fail_key,
    fail_pattern,
    host_of_key,
    offender,
    parse_entry,
)

POL = {"sshd": CountPolicy(3, 600.0, 3600.0), "web": CountPolicy(10, 60.0, 60.0, ipv6_prefix=56)}


def fields(parts: list[str]) -> dict[bytes, bytes]:
    return {parts[i].encode(): parts[i + 1].encode() for i in range(0, len(parts), 2)}


def test_offender_is_the_address_or_the_jails_ipv6_prefix() -> None:
    assert offender(ipaddress.ip_address("198.51.100.7"), 64) == "198.51.100.7"
    assert offender(ipaddress.ip_address("::ffff:198.51.100.7"), 64) == "198.51.100.7"
    assert offender(ipaddress.ip_address("2001:db8:1:2:3::4"), 64) == "2001:db8:1:2::/64"
    assert offender(ipaddress.ip_address("2001:db8:1:2:3::4"), 48) == "2001:db8:1::/48"
    assert offender(ipaddress.ip_address("2001:db8::4"), 128) == "2001:db8::4"


def test_keys_are_under_the_hosts_own_prefix() -> None:
    assert fail_key("prod", "web-01") == "nftblock:{prod}:h:web-01:fail"
    assert host_of_key("prod", fail_key("prod", "web-01")) == "web-01"
    assert fail_pattern("prod") == "nftblock:{prod}:h:*:fail"
    for bad in ("nftblock:{prod}:h:Web:fail", "nftblock:{prod}:h::fail", "nftblock:{prod}:h:a:b:fail",
                "nftblock:{other}:h:a:fail", "nftblock:{prod}:h:a:events", "nftblock:{prod}:h:-a:fail"):
        assert host_of_key("prod", bad) is None, bad


def test_entries_round_trip_and_bad_items_are_counted() -> None:
    e = fields(encode_items("sshd", [("198.51.100.1", 1, 0), ("198.51.100.2", 3, 0), ("198.51.100.3", 1, 5000)]))
    assert parse_entry(e, POL) == ([Item("sshd", "198.51.100.1", 1), Item("sshd", "198.51.100.2", 3),
                                    Item("sshd", "198.51.100.3", 1, 5000)], 0)
    six = fields(encode_items("web", [("2001:db8:1::/56", 2, 0)]))
    assert parse_entry(six, POL) == ([Item("web", "2001:db8:1::/56", 2)], 0)
    # not canonical, wider than the jail's prefix, an address where a prefix is due, garbage counts
    raw = "1.2.3.04,2001:db8::/48,2001:db8::1,198.51.100.0/24,x,1.2.3.4*0,1.2.3.4*-1,1.2.3.4@-5,1.2.3.4*2*2,1.2.3.5"
    assert parse_entry({b"v": b"1", b"j": b"web", b"f": raw.encode()}, POL) == ([Item("web", "1.2.3.5", 1)], 9)
    # an age is capped at the window: no failure is made older than fleet_findtime
    assert parse_entry(fields(encode_items("sshd", [("1.2.3.4", 1, 10**9)])), POL) == (
        [Item("sshd", "1.2.3.4", 1, 600_000)], 0)
    assert parse_entry(fields(encode_items("nginx", [("1.2.3.4", 1, 0)])), POL) is None  # not counted here
    assert parse_entry({b"v": b"2"}, POL) is None
    assert parse_entry({b"v": b"1", b"j": b"sshd", b"f": b",".join([b"1.2.3.4"] * 2001)}, POL) == ([], 1)
    assert parse_entry({b"v": b"1", b"j": b"sshd", b"f": b"\xff"}, POL) == ([], 1)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.one_of(st.binary(max_size=4), st.sampled_from([b"v", b"j", b"f"])),
                       st.one_of(st.binary(max_size=40), st.sampled_from([b"1", b"sshd", b"web"]),
                                 st.text(max_size=40)), max_size=4))
def test_parse_entry_never_raises(f: dict[Any, Any]) -> None:
    r = parse_entry(f, POL)
    if r is not None:
        items, bad = r
        assert bad >= 0 and all(i.jail in POL and i.k > 0 for i in items)


def test_three_hosts_ban_once_and_a_near_miss_does_not() -> None:
    t = Tally(POL, 100.0, 1000)
    assert t.add("a", 1000, [Item("sshd", "1.2.3.4", 1), Item("sshd", "1.2.3.5", 1)]) == []
    assert t.add("b", 1001, [Item("sshd", "1.2.3.4", 1), Item("sshd", "1.2.3.5", 1)]) == []
    (d,) = t.add("c", 1002, [Item("sshd", "1.2.3.4", 1)])
    assert (d.jail, str(d.net), d.until, d.hosts, d.failures, d.by) == ("sshd", "1.2.3.4/32", 3601.002,
                                                                          ("a", "b", "c"), 3, "c")
    assert t.seen("sshd", "1.2.3.4")["decided"] == {"by": "c", "seen_by": ["a", "b", "c"], "count": 3}
    assert t.add("a", 2000, [Item("sshd", "1.2.3.4", 1)]) == []  # banned: skipped
    assert t.stats.skipped == 1
    assert t.seen("sshd", "1.2.3.5") == {"counting": 2, "seen_by": ["a", "b"]}


def test_one_host_alone_cannot_cross_its_share_is_fleet_maxretry_minus_one() -> None:
    t = Tally(POL, 100.0, 1000)
    assert t.add("c", 1000, [Item("sshd", "1.2.3.4", 1000)]) == []  # a flood of one offender from C alone
    assert t.seen("sshd", "1.2.3.4") == {"counting": 2, "seen_by": ["c"]}
    (d,) = t.add("a", 1001, [Item("sshd", "1.2.3.4", 1)])  # one honest failure completes it
    assert d.hosts == ("c", "a") and d.failures == 3


def test_the_window_is_the_servers_time_and_an_age_moves_a_failure_back() -> None:
    t = Tally(POL, 100.0, 1000)
    t.add("a", 0, [Item("sshd", "1.2.3.4", 1)])
    t.add("b", 300_000, [Item("sshd", "1.2.3.4", 1)])
    assert t.add("c", 600_000, [Item("sshd", "1.2.3.4", 1)]) == []  # the first is 600 s older: out
    assert t.add("a", 700_000, [Item("sshd", "1.2.3.4", 1)])
    # sent after a partition: written at 2,000 s, seen 500 s earlier, it counts with failures near 1,900 s
    t.add("a", 2_000_000, [Item("sshd", "9.9.9.9", 1, 500_000)])
    assert t.add("b", 1_900_000 + 100_000, [Item("sshd", "9.9.9.9", 1)]) == []
    (d,) = t.add("c", 2_000_002, [Item("sshd", "9.9.9.9", 1)])
    assert d.failures == 3 and d.hosts == ("a", "b", "c")
    # seen 600 s (the cap) before it was written: out of the others' window
    t.add("a", 3_000_000, [Item("sshd", "8.8.8.8", 1, 600_000)])
    t.add("b", 3_000_001, [Item("sshd", "8.8.8.8", 1)])
    assert t.add("c", 3_000_002, [Item("sshd", "8.8.8.8", 1)]) == []


def test_the_rate_cap_is_per_authenticated_host_on_the_servers_clock() -> None:
    t = Tally(POL, 10.0, 5)  # capacity 5 + 2 s of rate = 25
    t.add("c", 0, [Item("sshd", f"10.0.0.{i}", 1) for i in range(40)])
    assert (t.stats.accepted, t.stats.limited) == (25, 15)
    t.add("a", 0, [Item("sshd", f"10.0.1.{i}", 1) for i in range(25)])  # C's flood took nothing of A's
    assert (t.stats.accepted, t.stats.limited) == (50, 15)
    t.add("c", 1000, [Item("sshd", f"10.0.2.{i}", 1) for i in range(20)])  # 1 s later: 10 more
    assert (t.stats.accepted, t.stats.limited) == (60, 25)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 2_000_000), st.sampled_from(["x1", "x2"]),
                          st.integers(1, 3)), max_size=40), st.randoms(use_true_random=False))
def test_every_host_decides_the_same_whatever_the_order_of_streams(entries: list[tuple[str, int, str, int]],
                                                                   rnd: Any) -> None:
    """Each host's stream is read in its order, but streams interleave differently on each reader."""
    pol = {"sshd": CountPolicy(3, 600.0, 60.0)}
    by_host: dict[str, list[tuple[int, Item]]] = {}
    for h, ms, off, k in entries:
        by_host.setdefault(h, []).append((ms, Item("sshd", f"10.0.0.{off[1]}", k)))
    for v in by_host.values():
        v.sort(key=lambda e: e[0])

    def run(order: list[str]) -> list[tuple[str, float, str]]:
        t = Tally(pol, 1000.0, 1000)
        pos = dict.fromkeys(by_host, 0)
        out = []
        for h in order:
            ms, it = by_host[h][pos[h]]
            pos[h] += 1
            out += [(str(d.net), d.until, d.by) for d in t.add(h, ms, [it])]
        return sorted(out)

    def merged() -> list[str]:
        return [h for h, _ms, _o, _k in sorted(entries, key=lambda e: e[1])]

    def shuffled() -> list[str]:
        seq = [h for h, v in by_host.items() for _ in v]
        rnd.shuffle(seq)
        return seq

    # the same decisions as long as the streams are read within a window of each other; in time order exactly
    a, b = run(merged()), run(merged())
    assert a == b
    if all(abs(x[1] - y[1]) < 1000 for x in entries for y in entries):  # everything inside one window
        assert [x[0] for x in run(shuffled())] == [x[0] for x in a]


def test_memory_is_bounded_least_recent_first() -> None:
    t = Tally(POL, 1e6, 10**6, max_offenders=100)
    t.add("a", 0, [Item("sshd", f"10.0.{i // 256}.{i % 256}", 1) for i in range(150)])
    assert len(t) == 100 and t.stats.evicted == 50
    assert t.seen("sshd", "10.0.0.0") == {} and t.seen("sshd", "10.0.0.149")["counting"] == 1
