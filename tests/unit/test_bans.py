"""The ban state's rules (bans.py docstring), without a kernel."""

from __future__ import annotations

import ipaddress
import itertools
from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from nftblockd.addr import parse_target
from nftblockd.config import parse_config
from nftblockd.ends import secs_ms
from nftblockd.events import Ban, Unban
from nftblockd.kernel.bans import BanOutcome, BanState
from nftblockd.kernel.ruleset import plan_ruleset

NOW = 1_800_000_000.0


def state() -> BanState:
    return BanState(plan_ruleset(parse_config("blocklists: {default: {}, other: {}}")))


def ban(t: str, until: float | None = NOW + 60, bl: str = "default") -> Ban:
    return Ban(parse_target(t), bl, until)


def test_single_address_goes_to_the_hash_set() -> None:
    s = state()
    ch = s.ban(ban("203.0.113.1"), NOW)
    assert ch.outcome is BanOutcome.ADDED and ch.ops[0].set_name == "default_ip4"
    assert ch.ops[0].key == int(ipaddress.IPv4Address("203.0.113.1")) and ch.ops[0].until_ms == (NOW + 60) * 1000
    assert s.ban(ban("2001:db8::1"), NOW).ops[0].set_name == "default_ip6"
    assert s.ban(ban("10.0.0.0/8"), NOW).ops[0].set_name == "default_net4"


def test_reban_never_shortens() -> None:
    s = state()
    s.ban(ban("203.0.113.1", NOW + 600), NOW)
    assert s.ban(ban("203.0.113.1", NOW + 60), NOW).outcome is BanOutcome.UNCHANGED
    ch = s.ban(ban("203.0.113.1", NOW + 6000), NOW)
    assert ch.outcome is BanOutcome.EXTENDED and ch.ops[0].existed
    assert s.ban(ban("203.0.113.1", None), NOW).outcome is BanOutcome.EXTENDED  # permanent wins
    assert s.ban(ban("203.0.113.1", NOW + 10**6), NOW).outcome is BanOutcome.UNCHANGED


def test_an_already_ended_ban_is_not_sent() -> None:
    assert state().ban(ban("203.0.113.1", NOW - 1), NOW).outcome is BanOutcome.EXPIRED


def test_range_inside_a_longer_range_is_covered() -> None:
    s = state()
    s.ban(ban("10.0.0.0/8", NOW + 600), NOW)
    ch = s.ban(ban("10.1.0.0/16", NOW + 60), NOW)
    assert ch.outcome is BanOutcome.COVERED and ch.related == (ipaddress.ip_network("10.0.0.0/8"),) and not ch.ops


def test_range_inside_a_shorter_range_is_refused() -> None:
    s = state()
    s.ban(ban("10.0.0.0/8", NOW + 60), NOW)
    ch = s.ban(ban("10.1.0.0/16", NOW + 600), NOW)
    assert ch.outcome is BanOutcome.CONFLICT and "10.0.0.0/8" in ch.message


def test_wider_range_absorbs_narrower_ones_with_the_latest_end() -> None:
    s = state()
    s.ban(ban("10.1.0.0/16", NOW + 6000), NOW)
    s.ban(ban("10.2.0.0/16", NOW + 60), NOW)
    ch = s.ban(ban("10.0.0.0/8", NOW + 600), NOW)
    assert ch.outcome is BanOutcome.ABSORBED
    dels = [op for op in ch.ops if not op.add]
    adds = [op for op in ch.ops if op.add]
    assert len(dels) == 2 and len(adds) == 1 and adds[0].until_ms == (NOW + 6000) * 1000
    assert [b.target for b in s.iter_bans()] == [ipaddress.ip_network("10.0.0.0/8")]


def test_adjacent_ranges_stay_separate_and_unban_only_its_own() -> None:
    s = state()
    s.ban(ban("10.0.0.0/24"), NOW)
    s.ban(ban("10.0.1.0/24"), NOW)
    ch = s.unban(Unban(parse_target("10.0.0.0/24"), "default"))
    assert ch.outcome is BanOutcome.REMOVED
    assert [str(b.target) for b in s.iter_bans()] == ["10.0.1.0/24"]


def test_unban_of_an_address_inside_a_range_names_the_range() -> None:
    s = state()
    s.ban(ban("10.0.0.0/8"), NOW)
    ch = s.unban(Unban(parse_target("10.1.2.3"), "default"))
    assert ch.outcome is BanOutcome.NOT_FOUND and "10.0.0.0/8" in ch.message and not ch.ops


def test_unknown_blocklist() -> None:
    assert state().ban(ban("203.0.113.1", bl="nope"), NOW).outcome is BanOutcome.UNKNOWN_SET


def test_expire_forgets_without_ops() -> None:
    s = state()
    s.ban(ban("203.0.113.1", NOW + 10), NOW)
    s.ban(ban("10.0.0.0/8", NOW + 10), NOW)
    s.ban(ban("203.0.113.2", None), NOW)
    assert s.expire(NOW + 11) == 2
    assert [str(b.target) for b in s.iter_bans()] == ["203.0.113.2/32"]
    assert s.ban(ban("10.1.0.0/16", NOW + 60), NOW).outcome is BanOutcome.ADDED  # the index forgot it too


def test_covering_for_check() -> None:
    s = state()
    s.ban(ban("10.0.0.0/8"), NOW)
    s.ban(ban("10.1.2.3", bl="other"), NOW)
    found = {(i.set_name, str(i.target)) for i in s.covering(parse_target("10.1.2.3"))}
    assert found == {("default_net4", "10.0.0.0/8"), ("other_ip4", "10.1.2.3/32")}


nets = st.builds(lambda a, p: ipaddress.IPv4Network((a, p), strict=False),
                 st.integers(0, 2**32 - 1), st.integers(8, 32))


@given(st.lists(st.tuples(nets, st.integers(1, 10**6)), max_size=40))
def test_interval_entries_never_overlap_and_every_accepted_ban_is_enforced(
        items: list[tuple[ipaddress.IPv4Network, int]]) -> None:
    s = state()
    accepted = []
    for net, dur in items:
        ch = s.ban(Ban(net, "default", NOW + dur), NOW)
        if ch.outcome is not BanOutcome.CONFLICT:
            accepted.append((net, NOW + dur))
    ranges = sorted((int(b.target.network_address), int(b.target.broadcast_address))
                    for b in s.iter_bans() if b.target.prefixlen < 32)
    for (_, e1), (s2, _) in itertools.pairwise(ranges):
        assert e1 < s2
    for net, until in accepted:
        cover = s.covering(net, "default")
        assert any(c.until is None or c.until >= until - 0.001 for c in cover), (net, cover)


def test_the_packed_end_codec_keeps_never_and_real_ends_apart() -> None:
    # issue 12: 0 means "never ends" only inside the packed value; everywhere else that end is None
    from nftblockd.kernel.bans import META_MASK, pack_end, unpack_end

    for until_ms in (None, 0, 1, 1_767_225_600_000):
        packed = pack_end(until_ms, 7)
        assert packed & META_MASK == 7
        expected = None if until_ms is None else max(1, until_ms)  # an end at the epoch is still an end
        assert unpack_end(packed) == expected
    state_ends = {u for u in (unpack_end(pack_end(None, 0)), unpack_end(pack_end(0, 0)))}
    assert state_ends == {None, 1}


@given(st.lists(st.tuples(st.integers(0, 12), st.sampled_from([None, NOW - 1, NOW, NOW + 0.0004, NOW + 5, NOW + 60,
                                                                 NOW + 60.5, NOW + 900])), max_size=30),
       st.lists(st.tuples(st.integers(0, 12), st.sampled_from([None, NOW + 5, NOW + 60, NOW + 900])), max_size=8))
def test_ban_hosts_each_is_ban_hosts_key_by_key(bans: list[tuple[int, float | None]],
                                                held: list[tuple[int, float | None]]) -> None:
    """The fleet's bulk form with an end per key against the plain form, one `ban_hosts` call per key: the same
    state (ends and metas), the same new / extended / unchanged keys, the same kernel ends."""
    each_vs_plain(bans, held)


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10**7).map(lambda ms: NOW + ms / 1000)), min_size=1,
                max_size=30, unique_by=lambda b: b[0]),
       st.lists(st.tuples(st.integers(30, 60), st.sampled_from([None, NOW + 5, NOW + 60])), max_size=3))
def test_ban_hosts_each_of_new_keys_with_distinct_ends_is_ban_hosts_key_by_key(
        bans: list[tuple[int, float | None]], held: list[tuple[int, float | None]]) -> None:
    """A catch-up into an empty set (every key new, every end in the future: the column-at-a-time path) and
    the same with a few of its keys already held (the loop)."""
    each_vs_plain(bans, held)
    each_vs_plain(bans, held, with_ms=True)


@given(st.lists(st.tuples(st.integers(0, 12), st.integers(1, 10**7).map(lambda ms: NOW + ms / 1000)), min_size=1,
                max_size=30),
       st.lists(st.tuples(st.integers(30, 60), st.sampled_from([None, NOW + 5])), max_size=2), st.booleans())
def test_ban_hosts_each_of_new_keys_some_twice_is_ban_hosts_key_by_key(
        bans: list[tuple[int, float | None]], held: list[tuple[int, float | None]], with_ms: bool) -> None:
    """New keys with ends ahead, a key possibly twice in one call (the column path undoes its update and the
    loop decides), with the ends in ms given by the caller or not."""
    each_vs_plain(bans, held, with_ms=with_ms)


def each_vs_plain(bans: list[tuple[int, float | None]], held: list[tuple[int, float | None]],
                  with_ms: bool = False) -> None:
    base = 0xCB007100
    each, plain = state(), state()
    for s in (each, plain):
        for k, until in held:
            s.ban_hosts("default", 4, [base + k], until, NOW, origin="cli")
    untils = [u for _, u in bans]
    ms = secs_ms(cast("list[float]", untils)) if with_ms and None not in untils else None  # (as its callers)
    got = each.ban_hosts_each("default", 4, [base + k for k, _ in bans], untils, NOW,
                              origin="remote", reason="fleet:h1", ends_ms=ms)
    assert got is not None
    new: list[tuple[int, int | None]] = []
    extended: list[tuple[int, int | None]] = []
    unchanged: list[int] = []
    for k, until in bans:
        bc = plain.ban_hosts("default", 4, [base + k], until, NOW, origin="remote", reason="fleet:h1")
        assert bc is not None and bc.set_name == got.set_name
        new += [(x, bc.spec_new.until_ms) for x in bc.new]
        extended += [(x, bc.spec_extended.until_ms) for x in bc.extended]
        unchanged += bc.unchanged
    to_ms = [None if u is None else int(u * 1000) for u in got.new_untils + got.extended_untils]
    assert list(zip(got.new + got.extended, to_ms, strict=True)) == new + extended
    assert got.unchanged == unchanged
    # (the packed values hold the end and the meta index: both intern the same metas in the same order)
    assert each.sets["default_ip4"].entries == plain.sets["default_ip4"].entries
    assert ban_hosts_each_unknown() is None


def ban_hosts_each_unknown() -> object:
    return state().ban_hosts_each("nosuch", 4, [1], [None], NOW, origin="remote", reason="")


# a feed-owned interval set's keys: disjoint /24s of 198.18.0.0/15 (as the aggregate gives them) as net keys
_ranges = st.sets(st.integers(0, 511), max_size=150).map(lambda s: sorted((0xC6120000 + (i << 8)) << 8 | 24 for i in s))


@given(_ranges, _ranges, st.sets(st.integers(0, 511), max_size=5))
def test_apply_delta_leaves_the_set_as_replace_set_does(old: list[int], new: list[int], ended: set[int]) -> None:
    """`apply_delta` (a refresh that diffed itself) against the plain `replace_set`, small edits of the
    interval index and bulk ones (marked stale) alike: same entries, same look-ups, same keys deleted."""
    plain, delta = state(), state()
    for s in (plain, delta):
        s.replace_set("default_net4", old, None)
        s.sets["default_net4"].reindex()  # an index in force, edited in place by a small change
    for i in ended:  # dropped by the feed, and ended meanwhile: the sweep took them out of the state
        key = (0xC6120000 + (i << 8)) << 8 | 24
        if key not in new:
            for s in (plain, delta):
                s.sets["default_net4"].entries.pop(key, None)
    added, removed = sorted(set(new) - set(old)), sorted(set(old) - set(new))
    _a, plain_removed, _k = plain.replace_set("default_net4", new, 3600.0)
    gone = delta.apply_delta("default_net4", added, removed, [], 3600.0)
    p, d = plain.sets["default_net4"], delta.sets["default_net4"]
    assert d.entries == p.entries and set(d.entries) == set(new)
    assert sorted(gone) == sorted(plain_removed)  # what was held, so what the kernel is asked to delete
    for i in range(0, 512, 7):
        first = (0xC6120000 + (i << 8)) + 5
        assert d.containing(first, first) == p.containing(first, first)
    assert d.inside(0xC6120000, 0xC613FFFF) == p.inside(0xC6120000, 0xC613FFFF)


@given(st.lists(st.tuples(_ranges, st.booleans(), st.booleans()), min_size=1, max_size=4))
def test_deferred_refreshes_read_as_eager_ones(steps: list[tuple[list[int], bool, bool]]) -> None:
    """A run of feed refreshes by `apply_delta` (a large one's additions and renewals wait for the first
    reader of `entries`), read between some of them and not others, against the plain `replace_set` run:
    every read, look-up, unban and expiry answers the same, and each refresh deletes the same keys."""
    plain, delta = state(), state()
    held: list[int] = []
    for i, (new, renew, read) in enumerate(steps):
        until = NOW + 60 * (i + 1)
        added, removed = sorted(set(new) - set(held)), sorted(set(held) - set(new))
        renewed = sorted(set(new) & set(held)) if renew else []
        _a, plain_removed, _k = plain.replace_set("default_net4", new, until, refresh=renew)
        gone = delta.apply_delta("default_net4", added, removed, renewed, until)
        assert sorted(gone) == sorted(plain_removed)
        held = new
        if read:
            p, d = plain.sets["default_net4"], delta.sets["default_net4"]
            assert d.entries == p.entries
            first = 0xC6120000 + 5
            assert d.containing(first, first) == p.containing(first, first)
            assert d.inside(0xC6120000, 0xC613FFFF) == p.inside(0xC6120000, 0xC613FFFF)
    target = ipaddress.ip_network(f"{ipaddress.IPv4Address(0xC6120000 + 0x100)}/24")
    assert [b.target for b in delta.covering(parse_target(str(target)), "default")] == \
        [b.target for b in plain.covering(parse_target(str(target)), "default")]
    assert delta.unban(Unban(parse_target(str(target)), "default")).outcome == \
        plain.unban(Unban(parse_target(str(target)), "default")).outcome
    assert delta.expire(NOW + 90) == plain.expire(NOW + 90)
    assert delta.sets["default_net4"].entries == plain.sets["default_net4"].entries


def test_a_large_refresh_leaves_its_additions_to_the_first_reader() -> None:
    """The dict work of a bulk refresh happens at the first read, not in `apply_delta`."""
    s = state()
    keys = [(0xC6120000 + (i << 8)) << 8 | 24 for i in range(100)]
    s.apply_delta("default_net4", keys, [], [], None)
    entries = s.sets["default_net4"]
    assert entries.held == {} and entries.stale
    assert sorted(entries.entries) == keys and entries.pending == []
