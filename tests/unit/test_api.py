"""ControlAPI, the control socket's command handler, on a real Enforcer over the in-memory kernel
(tests/helpers/apirig.py): what each command answers, what it refuses with which code, and what the kernel
sets hold afterwards. Requests are the dicts the server decodes; the clock is frozen."""

from __future__ import annotations

import asyncio
import errno as E
import ipaddress
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd import __version__
from nftblockd.addr import split_hosts
from nftblockd.control.api import BULK_THRESHOLD
from nftblockd.control.protocol import ControlError
from nftblockd.control.server import Peer
from tests.helpers.apirig import NOW, ApiRig, FakeFeeds, api_rig

CONFIG = """
blocklists:
  default: {timeout: 1h}
  web: {timeout: 10m}
  small: {timeout: 10m, size: 2}
  feedlist: {}
allowlist: [10.0.0.0/8, 2001:db8:ffff::/48]
allowlist_self: false
"""
PEER = Peer(pid=1, uid=0, gid=0)
FEEDS = [{"name": "spamhaus", "entries": 1234, "last_success": NOW - 60, "next_refresh": NOW + 3540,
          "error": None}]


@pytest.fixture
async def rig() -> AsyncIterator[ApiRig]:
    async with api_rig(CONFIG, feeds=FakeFeeds(FEEDS, owned={"feedlist"})) as r:
        yield r


async def call(rig: ApiRig, cmd: str, **args: Any) -> dict[str, Any]:
    return await rig.api(cmd, args, PEER)


async def refused_with(rig: ApiRig, cmd: str, **args: Any) -> tuple[str, str]:
    with pytest.raises(ControlError) as exc:
        await call(rig, cmd, **args)
    return exc.value.code, exc.value.message


def k(addr: str) -> int:
    return int(ipaddress.ip_address(addr))


def v4(i: int) -> str:
    return str(ipaddress.IPv4Address(0xC6120000 + i))  # 198.18.0.0/15: benchmarking space, not allowlisted


def v6(i: int) -> str:
    return str(ipaddress.IPv6Address(0x20010DB8000100000000000000000000 + i))


# --- ban ------------------------------------------------------------------------------------------------


async def test_ban_takes_the_blocklist_default_and_reaches_the_kernel(rig: ApiRig) -> None:
    r = await call(rig, "ban", targets=["203.0.113.7"], comment="by hand")
    assert r == {"applied": ["203.0.113.7"], "refused": []}
    elem = rig.fake.sets["default_ip4"][k("203.0.113.7")]
    assert (elem.until_ms, elem.comment) == (int((NOW + 3600) * 1000), "by hand")
    [info] = rig.bans().values()
    assert (info.blocklist, info.until, info.origin, info.reason) == ("default", NOW + 3600, "cli", "by hand")


async def test_ban_with_a_timeout_a_set_and_permanently(rig: ApiRig) -> None:
    r = await call(rig, "ban", targets=["203.0.113.7", "2001:DB8::1"], timeout="90s", set="web")
    assert r["applied"] == ["203.0.113.7", "2001:db8::1"]  # canonical, whatever the spelling
    assert rig.fake.sets["web_ip6"][k("2001:db8::1")].until_ms == int((NOW + 90) * 1000)
    r = await call(rig, "ban", targets=["198.51.100.0/24"], timeout="permanent")
    assert r["applied"] == ["198.51.100.0/24"] and rig.bans()["198.51.100.0/24", "default"].until is None
    assert len(rig.fake.sets["default_net4"]) == 1


async def test_timeout_default_and_permanent_reach_the_kernel_as_asked(rig: ApiRig) -> None:
    # issue 12: "default" (or null) takes the blocklist's length; "permanent" is an element without a timeout
    await call(rig, "ban", targets=["203.0.113.1"], timeout="default", set="web")
    await call(rig, "ban", targets=["203.0.113.2"], timeout=None, set="web")
    await call(rig, "ban", targets=["203.0.113.3"], timeout="forever", set="web")
    web = rig.fake.sets["web_ip4"]
    assert web[k("203.0.113.1")].until_ms == web[k("203.0.113.2")].until_ms == int((NOW + 600) * 1000)
    assert web[k("203.0.113.3")].until_ms is None and rig.bans()["203.0.113.3", "web"].until is None


async def test_a_permanent_blocklist_default_is_permanent_on_both_paths() -> None:
    config = CONFIG.replace("web: {timeout: 10m}", "web: {timeout: permanent}")
    async with api_rig(config) as r:
        await r.api("ban", {"targets": ["203.0.113.1"], "set": "web"}, PEER)
        await r.api("ban", {"targets": [v4(i) for i in range(BULK_THRESHOLD)], "set": "web"}, PEER)
        assert all(e.until_ms is None for e in r.fake.sets["web_ip4"].values())
        assert len(r.fake.sets["web_ip4"]) == BULK_THRESHOLD + 1


async def test_ban_refuses_a_cidr_with_host_bits_never_widens_it(rig: ApiRig) -> None:
    """Issue 33: a raw control-socket `ban` of `198.51.100.77/24` banned 198.51.100.0/24."""
    r = await call(rig, "ban", targets=["198.51.100.77/24", "2001:db8:f3::1/17", "198.51.100.0/24"])
    assert r["applied"] == ["198.51.100.0/24"]
    assert [(x["target"], x["code"]) for x in r["refused"]] == [
        ("198.51.100.77/24", "invalid_address"), ("2001:db8:f3::1/17", "invalid_address")]
    assert all("host bits set" in x["message"] and x["target"] in x["message"] for x in r["refused"])
    assert set(rig.fake.sets["default_net4"]) and not rig.fake.sets.get("default_net6")
    r = await call(rig, "unban", targets=["198.51.100.9/24"])
    assert r["removed"] == [] and "host bits set" in r["refused"][0]["message"]
    assert rig.bans()["198.51.100.0/24", "default"]  # not unbanned by a widened target either


async def test_a_reban_never_shortens_and_a_covered_range_gets_a_note(rig: ApiRig) -> None:
    await call(rig, "ban", targets=["198.51.100.0/24"], timeout="2h")
    r = await call(rig, "ban", targets=["198.51.100.0/25"], timeout="1h")
    assert r == {"applied": ["198.51.100.0/25"], "refused": [],
                 "notes": [{"target": "198.51.100.0/25", "message": "already covered by 198.51.100.0/24"}]}
    assert len(rig.fake.sets["default_net4"]) == 1  # nothing sent for a covered range
    r = await call(rig, "ban", targets=["198.51.100.0/24"], timeout="10m")
    assert r["applied"] == ["198.51.100.0/24"]
    assert rig.bans()["198.51.100.0/24", "default"].until == NOW + 7200


async def test_a_wider_range_absorbs_narrower_ones(rig: ApiRig) -> None:
    await call(rig, "ban", targets=["198.51.100.0/26", "198.51.100.64/26"])
    r = await call(rig, "ban", targets=["198.51.100.0/24"])
    assert r["notes"] == [{"target": "198.51.100.0/24", "message": "replaces 198.51.100.0/26, 198.51.100.64/26"}]
    assert list(rig.bans()) == [("198.51.100.0/24", "default")]
    assert len(rig.fake.sets["default_net4"]) == 1


async def test_per_target_objects_carry_their_own_timeout_reason_and_jail(rig: ApiRig) -> None:
    # import-fail2ban's shape: more than BULK_THRESHOLD targets, each with its own remaining time
    items = [{"target": v4(i), "timeout": 100 + i, "jail": "sshd", "reason": f"r{i}"} for i in range(80)]
    r = await call(rig, "ban", targets=items, origin="fail2ban", set="web")
    assert r["applied"] == [v4(i) for i in range(80)] and r["refused"] == []
    info = rig.bans()[v4(79), "web"]
    assert (info.until, info.origin, info.jail, info.reason) == (NOW + 179, "fail2ban", "sshd", "r79")
    assert rig.fake.sets["web_ip4"][k(v4(5))].until_ms == int((NOW + 105) * 1000)


# --- ban refusals ---------------------------------------------------------------------------------------


async def test_allowlisted_and_invalid_targets_are_refused_one_by_one(rig: ApiRig) -> None:
    r = await call(rig, "ban", targets=["10.1.2.3", "bogus", "203.0.113.7", "10.0.0.0/7", "fe80::1%eth0"])
    assert r["applied"] == ["203.0.113.7"]
    assert [(x["target"], x["code"]) for x in r["refused"]] == [
        ("bogus", "invalid_address"), ("fe80::1%eth0", "invalid_address"),
        ("10.1.2.3", "allowlisted"), ("10.0.0.0/7", "allowlisted")]
    assert r["refused"][2]["message"] == "10.1.2.3 is allowlisted (10.0.0.0/8); never banned"
    assert rig.in_kernel("default_ip4") == {"203.0.113.7"} and rig.fake.elements("default_net4") == set()


async def test_an_unknown_blocklist_fails_the_whole_request(rig: ApiRig) -> None:
    assert await refused_with(rig, "ban", targets=["203.0.113.7"], set="nope") == (
        "unknown_set", "unknown set 'nope' (blocklists: default, web, small, feedlist)")
    assert await refused_with(rig, "list", set="nope") == (
        "unknown_set", "unknown set 'nope' (blocklists: default, web, small, feedlist)")
    assert (await refused_with(rig, "unban", targets=["203.0.113.7"], set="nope"))[0] == "unknown_set"
    assert rig.fake.transactions == []


async def test_a_feed_owned_blocklist_takes_no_manual_bans_but_can_be_read(rig: ApiRig) -> None:
    assert await refused_with(rig, "ban", targets=["203.0.113.7"], set="feedlist") == (
        "unknown_set", "blocklist 'feedlist' is managed by feeds; ban into another blocklist")
    assert await call(rig, "list", set="feedlist") == {"bans": []}


async def test_a_full_set_refuses_the_adds_beyond_its_size(rig: ApiRig) -> None:
    r = await call(rig, "ban", targets=["203.0.113.1", "203.0.113.2", "203.0.113.3"], set="small")
    assert r["applied"] == ["203.0.113.1", "203.0.113.2"]
    assert r["refused"] == [{"target": "203.0.113.3", "code": "unavailable",
                             "message": "set small_ip4 is full (size 2); raise blocklists.small.size"}]
    assert rig.bans("small").keys() == {("203.0.113.1", "small"), ("203.0.113.2", "small")}  # forgotten


@pytest.mark.parametrize(("errno", "message"), [
    (E.ENOMEM, "the kernel refused it: Cannot allocate memory (injected)"),
    (E.EEXIST, "overlaps a range already in set default_net4 (injected)"),
    (E.EINVAL, "the kernel refused it: Invalid argument (injected)"),
])
async def test_a_kernel_error_on_one_element_refuses_that_target_only(rig: ApiRig, errno: int,
                                                                      message: str) -> None:
    rig.fake.fail[("default_net4", (k("198.51.100.0") << 8) | 24)] = errno
    r = await call(rig, "ban", targets=["198.51.100.0/24", "203.0.113.0/24"])
    assert r["applied"] == ["203.0.113.0/24"]
    assert r["refused"] == [{"target": "198.51.100.0/24", "code": "unavailable", "message": message}]
    assert list(rig.bans()) == [("203.0.113.0/24", "default")]  # the state forgot the refused one
    assert rig.enforcer.counters.kernel_errors == {errno: 1}


async def test_a_set_deleted_behind_our_back_refuses_its_targets(rig: ApiRig) -> None:
    rig.fake.outside_change(drop_set="default_ip4")
    r = await call(rig, "ban", targets=["203.0.113.7", "2001:db8::7"])
    assert r["applied"] == ["2001:db8::7"]
    assert r["refused"] == [{"target": "203.0.113.7", "code": "unavailable", "message":
                             "the kernel refused it: No such file or directory (no set default_ip4)"}]


# --- bulk ban (the CLI's stdin path) --------------------------------------------------------------------


def stdin_request(targets: list[str], timeout: float | str | None = 172800.0, set: str | None = None,
                  ) -> dict[str, Any]:
    """What `nftblock ban [--timeout T] [--set S] -` sends: one request, targets as plain strings."""
    return {"targets": targets, "timeout": timeout, "set": set, "comment": ""}


def test_split_hosts_separates_plain_addresses_from_the_rest() -> None:
    keys, texts, rest = split_hosts(["192.0.2.1", "2001:db8::1", "192.0.2.0/24", "bogus", "::ffff:192.0.2.9",
                                     "01.2.3.4"])
    assert keys[4] == [k("192.0.2.1"), k("192.0.2.9")] and keys[6] == [k("2001:db8::1")]
    assert texts[4][k("192.0.2.9")] == "::ffff:192.0.2.9"  # answers echo the caller's spelling
    assert rest == [2, 3, 5]


async def test_bulk_ban_lands_hosts_in_one_transaction_and_the_rest_one_by_one(rig: ApiRig) -> None:
    hosts4 = [v4(i) for i in range(300)]
    hosts6 = [v6(i) for i in range(100)]
    others = ["198.51.100.0/24", "2001:db8:2::/48", "bogus", "10.9.9.9", "2001:db8:ffff::1"]
    assert len(hosts4) >= BULK_THRESHOLD
    r = await rig.api("ban", stdin_request(hosts4 + hosts6 + others), PEER)
    assert sorted(r["applied"]) == sorted([*hosts4, *hosts6, "198.51.100.0/24", "2001:db8:2::/48"])
    assert sorted((x["target"], x["code"]) for x in r["refused"]) == [
        ("10.9.9.9", "allowlisted"), ("2001:db8:ffff::1", "allowlisted"), ("bogus", "invalid_address")]
    assert rig.in_kernel("default_ip4") == set(hosts4) and rig.in_kernel("default_ip6") == set(hosts6)
    assert len(rig.fake.sets["default_net4"]) == len(rig.fake.sets["default_net6"]) == 1
    # the 400 single addresses went in one kernel transaction; the two ranges in the next
    assert [sum(len(g.keys) for g in t) for t in rig.fake.transactions] == [400, 2]
    elem = rig.fake.sets["default_ip6"][k(hosts6[0])]
    assert elem.until_ms == int((NOW + 172800) * 1000)
    assert rig.bans()[hosts4[0], "default"].origin == "cli"


async def test_bulk_allowlist_refusals_name_the_entry_like_single_ones(rig: ApiRig) -> None:
    r = await rig.api("ban", stdin_request([v4(i) for i in range(BULK_THRESHOLD)] + ["10.9.9.9"]), PEER)
    assert r["refused"] == [{"target": "10.9.9.9", "code": "allowlisted",
                             "message": "10.9.9.9 is allowlisted (10.0.0.0/8); never banned"}]


async def test_bulk_ban_again_extends_or_keeps_and_counts_all_as_applied(rig: ApiRig) -> None:
    hosts = [v4(i) for i in range(BULK_THRESHOLD)]
    await rig.api("ban", stdin_request(hosts[:32], timeout="1h"), PEER)
    r = await rig.api("ban", stdin_request(hosts, timeout="2h"), PEER)
    assert sorted(r["applied"]) == sorted(hosts) and r["refused"] == []
    assert {e.until_ms for e in rig.fake.sets["default_ip4"].values()} == {int((NOW + 7200) * 1000)}
    r = await rig.api("ban", stdin_request(hosts, timeout="1h"), PEER)  # shorter: nothing to send
    sent = len(rig.fake.transactions)
    assert sorted(r["applied"]) == sorted(hosts) and len(rig.fake.transactions) == sent


async def test_bulk_ban_into_a_full_set_refuses_the_overflow(rig: ApiRig) -> None:
    hosts = [v4(i) for i in range(BULK_THRESHOLD)]
    r = await rig.api("ban", stdin_request(hosts, set="small"), PEER)
    assert len(r["applied"]) == 2 and len(r["refused"]) == BULK_THRESHOLD - 2
    assert {x["code"] for x in r["refused"]} == {"unavailable"}
    assert r["refused"][0]["message"] == "set small_ip4 is full (size 2); raise blocklists.small.size"
    assert set(r["applied"]) == rig.in_kernel("small_ip4")
    assert len(rig.bans("small")) == 2  # the refused ones are forgotten
    assert rig.enforcer.counters.set_full == BULK_THRESHOLD - 2


async def test_bulk_ban_kernel_errors_are_per_address(rig: ApiRig) -> None:
    hosts = [v4(i) for i in range(BULK_THRESHOLD)]
    rig.fake.fail[("default_ip4", k(hosts[7]))] = E.ENOMEM
    r = await rig.api("ban", stdin_request(hosts), PEER)
    assert sorted(r["applied"]) == sorted(hosts[:7] + hosts[8:])
    assert r["refused"] == [{"target": hosts[7], "code": "unavailable",
                             "message": "the kernel refused it: Cannot allocate memory (injected)"}]
    assert (hosts[7], "default") not in rig.bans()


async def test_bulk_ban_with_many_ranges_bans_them_in_chunks(rig: ApiRig) -> None:
    ranges = [f"198.18.{i}.0/24" for i in range(BULK_THRESHOLD + 10)]
    r = await rig.api("ban", stdin_request(ranges), PEER)
    assert sorted(r["applied"]) == sorted(ranges) and r["refused"] == []
    assert len(rig.fake.sets["default_net4"]) == len(ranges)


# --- unban ----------------------------------------------------------------------------------------------


async def test_unban_from_every_blocklist_or_one(rig: ApiRig) -> None:
    await call(rig, "ban", targets=["203.0.113.7"])
    await call(rig, "ban", targets=["203.0.113.7", "203.0.113.8"], set="web")
    r = await call(rig, "unban", targets=["203.0.113.8"], set="default")
    assert r == {"removed": [], "not_found": ["203.0.113.8"]}
    r = await call(rig, "unban", targets=["203.0.113.7", "203.0.113.9"])
    assert r == {"removed": ["203.0.113.7"], "not_found": ["203.0.113.9"]}
    assert rig.in_kernel("default_ip4") == set() and rig.in_kernel("web_ip4") == {"203.0.113.8"}


async def test_unban_explains_an_address_inside_a_banned_range_and_refuses_garbage(rig: ApiRig) -> None:
    await call(rig, "ban", targets=["198.51.100.0/24"])
    r = await call(rig, "unban", targets=["198.51.100.0/25", "nope"])
    assert r == {"removed": [], "not_found": ["198.51.100.0/25"],
                 "messages": {"198.51.100.0/25": "198.51.100.0/25 is not banned itself; it lies inside "
                                                 "198.51.100.0/24"},
                 "refused": [{"target": "nope", "code": "invalid_address",
                              "message": r["refused"][0]["message"]}]}
    assert len(rig.fake.sets["default_net4"]) == 1


async def test_bulk_unban(rig: ApiRig) -> None:
    hosts = [v4(i) for i in range(BULK_THRESHOLD)]
    await rig.api("ban", stdin_request([*hosts, "198.51.100.0/24"]), PEER)
    absent = [v4(i) for i in range(1000, 1010)]
    r = await call(rig, "unban", targets=hosts[:50] + absent + ["198.51.100.0/24"])
    assert sorted(r["removed"]) == sorted([*hosts[:50], "198.51.100.0/24"])
    assert sorted(r["not_found"]) == sorted(absent)
    assert rig.in_kernel("default_ip4") == set(hosts[50:]) and rig.fake.elements("default_net4") == set()


async def test_reply_counts_answers_with_counts_and_the_failures_only(rig: ApiRig) -> None:
    # what `nftblock ban -` asks for: the same bans as a full reply, without every target echoed back
    hosts = [v4(i) for i in range(BULK_THRESHOLD + 6)]
    others = ["198.51.100.0/24", "bogus", "10.9.9.9", "127.0.0.1"]
    rig.fake.fail[("default_ip4", k(hosts[3]))] = E.ENOMEM
    r = await rig.api("ban", {**stdin_request(hosts + others), "reply": "counts"}, PEER)
    assert r["applied_count"] == len(hosts) - 1 + 1 and "applied" not in r
    assert sorted((x["target"], x["code"]) for x in r["refused"]) == [
        ("10.9.9.9", "allowlisted"), ("127.0.0.1", "never_ban"), (hosts[3], "unavailable"),
        ("bogus", "invalid_address")]
    assert rig.in_kernel("default_ip4") == set(hosts) - {hosts[3]}
    # a re-ban counts as applied, as in a full reply; a few targets (one by one) are counted too
    r = await rig.api("ban", {**stdin_request(hosts[:BULK_THRESHOLD]), "reply": "counts"}, PEER)
    assert r == {"applied_count": BULK_THRESHOLD - 1, "refused": [r["refused"][0]]}
    r = await rig.api("ban", {"targets": ["203.0.113.1", "bogus"], "reply": "counts"}, PEER)
    assert (r["applied_count"], [(x["target"], x["code"]) for x in r["refused"]]) == (
        1, [("bogus", "invalid_address")])
    r = await rig.api("unban", {"targets": [*hosts, "203.0.113.1", "203.0.113.2"], "reply": "counts"}, PEER)
    assert r == {"removed_count": len(hosts), "not_found": [hosts[3], "203.0.113.2"]}
    r = await rig.api("unban", {"targets": ["198.51.100.0/24"], "reply": "counts"}, PEER)
    assert r == {"removed_count": 1, "not_found": []}


def packed(hosts: list[str]) -> str:
    """`hosts4` as `nftblock ban -` sends it: the addresses packed 4 bytes each, base64."""
    import base64

    return base64.b64encode(b"".join(ipaddress.IPv4Address(h).packed for h in hosts)).decode()


async def test_packed_hosts_are_banned_as_their_text_would_be(rig: ApiRig) -> None:
    # `hosts4` (what `nftblock ban -` sends for plain IPv4 lines) against the same addresses as strings, into
    # two blocklists: the same answer, state and kernel; duplicates, across both fields too, count once
    hosts = [v4(i) for i in range(BULK_THRESHOLD + 6)]
    others = ["198.51.100.0/24", "bogus", hosts[5]]
    bad = ["10.9.9.9", "127.0.0.1", "127.0.0.1"]
    rig.fake.fail[("default_ip4", k(hosts[3]))] = E.ENOMEM
    rig.fake.fail[("web_ip4", k(hosts[3]))] = E.ENOMEM
    for reply in ("counts", "full"):
        as_text = await rig.api("ban", {**stdin_request(hosts + bad + others, set="web"), "reply": reply}, PEER)
        as_packed = await rig.api("ban", {**stdin_request(others), "hosts4": packed(hosts + bad + hosts[:2]),
                                          "reply": reply}, PEER)
        if reply == "full":
            as_text["applied"].sort()
            as_packed["applied"].sort()
        as_text["refused"].sort(key=str)
        as_packed["refused"].sort(key=str)
        assert as_packed == as_text
    assert as_packed["refused"] and as_packed["applied"]
    assert rig.in_kernel("default_ip4") == rig.in_kernel("web_ip4") == set(hosts) - {hosts[3]}
    assert {t for t, _bl in rig.bans()} >= set(hosts) - {hosts[3]}
    # alone, with no `targets` at all, and with few addresses: still the bulk path
    r = await rig.api("ban", {"hosts4": packed(["203.0.113.9"]), "timeout": "2h", "comment": "scan",
                              "reply": "counts"}, PEER)
    assert r == {"applied_count": 1, "refused": []}
    ban = rig.bans()["203.0.113.9", "default"]
    assert (ban.until, ban.reason) == (NOW + 7200, "scan")


def packed6(hosts: list[str]) -> str:
    """`hosts6` as `nftblock ban -` sends it: the addresses packed 16 bytes each, base64."""
    import base64

    return base64.b64encode(b"".join(ipaddress.IPv6Address(h).packed for h in hosts)).decode()


# IPv6 as `ban -` meets it: plain ones, allowlisted (2001:db8:ffff::/48), never banned (loopback, link-local,
# multicast, unspecified), IPv4-mapped (plain, allowlisted, never banned: read as the IPv4 address), the
# deprecated IPv4-compatible form (an IPv6 address), and one the kernel refuses (see FAILS6)
_V6_POOL = ["2001:db8:1::1", "2001:db8:1::2", "2a00:1450:4001::200e", "2001:db8:ffff::9", "::1", "fe80::1",
            "ff02::1", "::", "::ffff:198.18.0.7", "::ffff:10.1.2.3", "::ffff:127.0.0.1", "::ffff:198.18.0.8",
            "::1.2.3.4", "2001:db8:1::dead"]
_FAILS6 = "2001:db8:1::dead"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_V6_POOL), st.integers(0, 300).map(v6)), max_size=90),
       st.lists(st.integers(0, 40).map(v4), max_size=8), st.sampled_from(["counts", "full"]))
def test_packed_ipv6_is_banned_as_its_text_would_be(hosts: list[str], hosts4: list[str], reply: str) -> None:
    # `hosts6` (what `nftblock ban -` sends for plain IPv6 lines, alongside `hosts4`) against the same
    # addresses as strings, each into a rig of its own: the same answer (applied, refused with code and
    # message), the same kernel elements in every set, the same saved bans (the text takes the one-by-one
    # path below BULK_THRESHOLD targets and the bulk path from there: both are held to)
    async def run(request: dict[str, Any]) -> tuple[dict[str, Any], dict[str, set[str]], dict[Any, Any]]:
        async with api_rig(CONFIG) as rig:
            rig.fake.fail[("default_ip6", k(_FAILS6))] = E.ENOMEM
            await rig.seed(v6(1), until=NOW + 60)  # an existing ban, extended
            r = await rig.api("ban", {**request, "reply": reply}, PEER)
            for key in ("applied", "refused"):
                if isinstance(r.get(key), list):
                    r[key].sort(key=str)
            kernel = {s.name: rig.in_kernel(s.name) for s in rig.plan.sets if s.name.endswith(("ip4", "ip6"))}
            saved = {t: (b.until, b.origin, b.reason) for t, b in rig.bans().items()}
            return r, kernel, saved

    if not hosts and not hosts4:
        return
    # the text as an older `nftblock ban -` sends it: canonical (a mapped address as IPv4), duplicates dropped
    texts = [str(a.ipv4_mapped or a) for a in map(ipaddress.IPv6Address, hosts)]
    as_text = asyncio.run(run(stdin_request(list(dict.fromkeys(hosts4 + texts)))))
    packed_args: dict[str, Any] = {"hosts6": packed6(hosts)} if hosts else {}
    if hosts4:
        packed_args["hosts4"] = packed(hosts4)
    as_packed = asyncio.run(run({**stdin_request([]), "targets": None, **packed_args}))
    assert as_packed == as_text


async def test_packed_ipv6_that_is_not_packed_addresses_is_refused(rig: ApiRig) -> None:
    for hosts6 in (packed(["192.0.2.1"]), "not base64!", 12, packed6(["2001:db8::1"])[:-4]):
        assert await refused_with(rig, "ban", hosts6=hosts6) == (
            "bad_request", "ban: 'hosts6' must be base64 of IPv6 addresses, 16 bytes each")
    assert await refused_with(rig, "ban", hosts6=packed6(["2001:db8::1"]), targets=[{"target": "192.0.2.2"}]) == (
        "bad_request", "ban: 'hosts6' takes the request's timeout, comment and jail: its 'targets' must be strings")
    assert rig.in_kernel("default_ip6") == set()


async def test_packed_hosts_that_are_not_packed_addresses_are_refused(rig: ApiRig) -> None:
    for hosts4 in ("AAAA", "not base64!", 12, "QUJDREVG"):  # 3 bytes; garbage; a number; 6 bytes
        assert await refused_with(rig, "ban", hosts4=hosts4) == (
            "bad_request", "ban: 'hosts4' must be base64 of IPv4 addresses, 4 bytes each")
    assert await refused_with(rig, "ban", hosts4="") == ("bad_request", "ban: 'targets' must be a non-empty list")
    assert await refused_with(rig, "ban", hosts4=packed(["192.0.2.1"]), targets=[{"target": "192.0.2.2"}]) == (
        "bad_request", "ban: 'hosts4' takes the request's timeout, comment and jail: its 'targets' must be strings")
    assert rig.in_kernel("default_ip4") == set()


async def test_reply_full_is_the_default_and_anything_else_is_refused(rig: ApiRig) -> None:
    hosts = [v4(i) for i in range(BULK_THRESHOLD)]
    full = await rig.api("ban", {**stdin_request(hosts), "reply": "full"}, PEER)
    assert sorted(full["applied"]) == sorted(hosts)
    assert await rig.api("ban", stdin_request(hosts), PEER) == full  # a v1 client that never says `reply`
    assert await refused_with(rig, "ban", targets=hosts, reply="some") == (
        "bad_request", "ban: 'reply' must be one of full, counts")


# --- list, check ----------------------------------------------------------------------------------------


async def test_list_is_sorted_filtered_and_leaves_out_ended_bans(rig: ApiRig) -> None:
    await call(rig, "ban", targets=["203.0.113.9", "203.0.113.10"], timeout="10m")
    await call(rig, "ban", targets=["198.51.100.0/24"], set="web", timeout="permanent", comment="scan")
    bans = (await call(rig, "list"))["bans"]
    assert [(b["blocklist"], b["set"], b["target"]) for b in bans] == [
        ("default", "default_ip4", "203.0.113.10"), ("default", "default_ip4", "203.0.113.9"),
        ("web", "web_net4", "198.51.100.0/24")]
    assert bans[0]["expires_in"] == 600.0 and bans[2] == {
        "target": "198.51.100.0/24", "blocklist": "web", "set": "web_net4", "until": None, "expires_in": None,
        "origin": "cli", "reason": "scan", "jail": ""}
    assert [b["target"] for b in (await call(rig, "list", set="web"))["bans"]] == ["198.51.100.0/24"]
    rig.clock.advance(600)
    assert [b["target"] for b in (await call(rig, "list"))["bans"]] == ["198.51.100.0/24"]


async def test_check_names_every_covering_ban_and_the_allowlist_entry(rig: ApiRig) -> None:
    await call(rig, "ban", targets=["198.51.100.0/24"], timeout="10m")
    await call(rig, "ban", targets=["198.51.100.7"], set="web", timeout="1h")
    r = await call(rig, "check", target="198.51.100.7")
    assert r["target"] == "198.51.100.7" and r["allowlisted"] is None
    assert sorted((b["target"], b["set"], b["expires_in"]) for b in r["bans"]) == [
        ("198.51.100.0/24", "default_net4", 600.0), ("198.51.100.7", "web_ip4", 3600.0)]
    assert await call(rig, "check", target="10.20.30.40") == {
        "target": "10.20.30.40", "allowlisted": "10.0.0.0/8", "bans": []}
    rig.clock.advance(601)
    assert [b["set"] for b in (await call(rig, "check", target="198.51.100.7"))["bans"]] == ["web_ip4"]
    assert (await refused_with(rig, "check", target="nope"))[0] == "invalid_address"


# --- status ---------------------------------------------------------------------------------------------


async def test_status_reports_kernel_counts_next_to_the_tracked_ones(rig: ApiRig) -> None:
    await call(rig, "ban", targets=["203.0.113.7", "203.0.113.8", "2001:db8::1"])
    await call(rig, "ban", targets=["198.51.100.0/24"], set="web")
    del rig.fake.sets["default_ip4"][k("203.0.113.8")]  # lost behind our back: the kernel count says so
    rig.fake.outside_change(drop_set="web_ip6")
    rig.clock.advance(90.5)
    st = await call(rig, "status")
    sets = {s["name"]: s for s in st["sets"]}
    assert sets["default_ip4"] == {"name": "default_ip4", "blocklist": "default", "family": "ipv4",
                                   "kind": "hash", "elements": 1, "tracked": 2, "size": 262144}
    assert (sets["default_ip6"]["elements"], sets["default_ip6"]["tracked"]) == (1, 1)
    assert (sets["web_net4"]["kind"], sets["web_net4"]["elements"]) == ("interval", 1)
    assert sets["web_ip6"]["elements"] is None  # the set is missing in the kernel
    assert sets["small_ip4"]["size"] == 2
    assert sets["allow_net4"]["blocklist"] == "allow" and sets["allow_net4"]["elements"] == 0
    assert (st["version"], st["uptime"], st["table"]) == (__version__, 90.5, "inet nftblock")
    assert st["kernel"] == rig.fake.features.describe()
    assert st["feeds"] == FEEDS and st["jails"] == []


async def test_status_counts_batches_and_errors(rig: ApiRig) -> None:
    rig.fake.fail[("default_ip4", k("203.0.113.9"))] = E.ENOMEM
    await call(rig, "ban", targets=["203.0.113.1", "203.0.113.2", "203.0.113.3"], set="small")
    await call(rig, "ban", targets=["203.0.113.9", "10.1.1.1"])
    st = await call(rig, "status")
    b = st["batches"]
    assert (b["flushes"], b["ops"], b["pending"], b["failures"]) == (2, 4, 0, 2)
    assert (b["max_ops"], b["delay"]) == (10000, 0.002)
    assert st["errors"] == {"kernel": {str(E.ENFILE): 1, str(E.ENOMEM): 1}, "set_full": 1, "refused": 3,
                            "allowlisted": 1, "rebuilds": 0, "drift_repaired": 0, "adopted": 0,
                            "unbannable_removed": 0}


async def test_status_merges_the_daemons_extra_part() -> None:
    extra = {"jails": [{"name": "sshd", "bans": 1}], "store": None}
    async with api_rig(CONFIG, status_extra=lambda: extra) as rig:
        st = await call(rig, "status")
    assert st["jails"] == extra["jails"] and st["store"] is None and st["feeds"] == []


# --- feeds, reload, ping, unknown commands --------------------------------------------------------------


async def test_feeds_status_refresh_and_accept(rig: ApiRig) -> None:
    assert await call(rig, "feeds") == {"feeds": FEEDS}
    assert await call(rig, "feeds_refresh", name="spamhaus") == {"feed": FEEDS[0]}
    assert await call(rig, "feeds_accept", name="spamhaus") == {"feed": FEEDS[0]}
    assert rig.feeds is not None and rig.feeds.refreshed == [("spamhaus", False), ("spamhaus", True)]
    assert await refused_with(rig, "feeds_refresh", name="nope") == (
        "not_found", "no feed named 'nope' (feeds: spamhaus)")


async def test_feeds_without_feeds_configured() -> None:
    async with api_rig(CONFIG) as rig:
        assert await call(rig, "feeds") == {"feeds": []}
        assert await refused_with(rig, "feeds_refresh", name="x") == (
            "not_found", "no feed named 'x' (no feeds configured)")


async def test_reload_verdicts() -> None:
    verdicts = [(True, "reloaded: jail sshd changed"), (False, "config.yaml:3: unknown key 'foo'")]

    async def reload() -> tuple[bool, str]:
        return verdicts.pop(0)

    async with api_rig(CONFIG, reload=reload) as rig:
        assert await call(rig, "reload") == {"reloaded": True, "message": "reloaded: jail sshd changed"}
        assert await refused_with(rig, "reload") == ("refused", "config.yaml:3: unknown key 'foo'")
    async with api_rig(CONFIG) as rig:
        assert (await refused_with(rig, "reload"))[0] == "unavailable"


async def test_ping_and_malformed_requests(rig: ApiRig) -> None:
    assert await call(rig, "ping") == {"pong": True, "version": __version__}
    assert (await refused_with(rig, "frobnicate"))[0] == "bad_request"
    assert (await refused_with(rig, "ban", targets=[]))[0] == "bad_request"
    assert (await refused_with(rig, "ban", targets=["203.0.113.7"], timeout=0))[0] == "bad_request"
    assert rig.fake.transactions == []


# --- fleet hooks ----------------------------------------------------------------------------------------


async def test_fleet_hooks_see_what_was_applied_and_every_unban(rig: ApiRig) -> None:
    banned: list[tuple[str, float | None, str]] = []
    unbanned: list[tuple[str, str]] = []
    rig.api.set_fleet(lambda: {"fleet": "prod", "connected": True},
                      lambda bans, now: banned.extend((str(t), u, s) for t, u, s in bans),
                      lambda nets, src: unbanned.extend((str(n), src) for n in nets))
    assert (await call(rig, "fleet")) == {"fleet": {"fleet": "prod", "connected": True}}
    await call(rig, "ban", targets=["203.0.113.7", "10.1.1.1"], timeout="1m")  # 10.1.1.1 is allowlisted
    assert banned == [("203.0.113.7/32", NOW + 60, "cli")]
    banned.clear()
    await call(rig, "ban", targets=["203.0.113.7"], timeout="30s")  # unchanged: nothing new to share
    assert banned == []
    await call(rig, "ban", targets=[v4(i) for i in range(BULK_THRESHOLD)], origin="fail2ban")  # the bulk path
    assert len(banned) == BULK_THRESHOLD and {s for _t, _u, s in banned} == {"fail2ban"}
    await call(rig, "unban", targets=["203.0.113.7", "203.0.113.99"])  # not held here: fleet-wide all the same
    assert unbanned == [("203.0.113.7/32", "cli"), ("203.0.113.99/32", "cli")]
    unbanned.clear()
    await call(rig, "unban", targets=[v4(i) for i in range(BULK_THRESHOLD)])
    assert len(unbanned) == BULK_THRESHOLD


async def test_fleet_is_null_without_fleet_mode(rig: ApiRig) -> None:
    assert (await call(rig, "fleet")) == {"fleet": None}
