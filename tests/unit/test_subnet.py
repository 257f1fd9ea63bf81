"""Subnet escalation (detect/subnet.py): the rules of its module docstring, one by one, and a model check."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.allowlist import Allowlist
from nftblockd.config import ConfigError, SubnetEscalation, parse_config
from nftblockd.detect.subnet import Escalate, Refused, SubnetEscalator

POL = SubnetEscalation(threshold=3, window=600.0, bantime=3600.0)
NONE = Allowlist.from_networks([])


def esc(policy: SubnetEscalation = POL, allow: Allowlist = NONE) -> SubnetEscalator:
    return SubnetEscalator({"default": policy}, allow)


def net(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text)


def test_threshold_distinct_addresses_in_one_prefix_escalates() -> None:
    e = esc()
    assert e.observe("default", net("203.0.113.1/32"), 100.0) is None
    assert e.observe("default", net("203.0.113.1/32"), 101.0) is None  # the same address again: still one
    assert e.observe("default", net("203.0.113.9/32"), 102.0) is None
    d = e.observe("default", net("203.0.113.200/32"), 103.0)
    assert isinstance(d, Escalate)
    assert d.prefix == net("203.0.113.0/24") and d.until == 103.0 + 3600.0
    assert d.targets == ("203.0.113.1", "203.0.113.9", "203.0.113.200")
    assert "203.0.113.0/24" in d.reason() and "203.0.113.9" in d.reason()
    assert e.stats.escalated == 1 and e.tracked() == 0


def test_other_prefixes_and_blocklists_do_not_add_up() -> None:
    e = SubnetEscalator({"default": POL}, NONE)
    for i, a in enumerate(("203.0.113.1", "203.0.114.1", "198.51.100.1", "203.0.112.1")):
        assert e.observe("default", net(a + "/32"), 100.0 + i) is None
    assert e.observe("other", net("203.0.113.2/32"), 105.0) is None  # not watched
    assert e.observe_hosts("other", 4, [1, 2, 3], 105.0) == []
    assert e.tracked() == 4


def test_window_drops_old_bans() -> None:
    e = esc()
    e.observe("default", net("203.0.113.1/32"), 0.0)
    e.observe("default", net("203.0.113.2/32"), 100.0)
    assert e.observe("default", net("203.0.113.3/32"), 600.0) is None  # the first is a window old
    assert isinstance(e.observe("default", net("203.0.113.4/32"), 601.0), Escalate)


def test_escalated_prefix_ignores_bans_inside_until_its_end() -> None:
    e = esc()
    for i in range(3):
        e.observe("default", net(f"203.0.113.{i + 1}/32"), 10.0)
    for i in range(5):
        assert e.observe("default", net(f"203.0.113.{i + 50}/32"), 20.0) is None
    assert e.tracked() == 0
    for i in range(2):
        assert e.observe("default", net(f"203.0.113.{i + 50}/32"), 10.0 + 3600.0 + i) is None
    assert isinstance(e.observe("default", net("203.0.113.99/32"), 3612.0), Escalate)


def test_prefix_bans_and_wider_ranges_do_not_count() -> None:
    e = esc()
    for _ in range(5):
        assert e.observe("default", net("203.0.113.0/24"), 1.0) is None
        assert e.observe("default", net("203.0.0.0/16"), 1.0) is None
    assert e.tracked() == 0


def test_ipv6_counts_64s_in_a_48() -> None:
    e = esc()
    assert e.observe("default", net("2001:db8:1:1::/64"), 1.0) is None
    assert e.observe("default", net("2001:db8:1:2::/64"), 1.0) is None
    d = e.observe("default", net("2001:db8:1:3::5/128"), 1.0)
    assert isinstance(d, Escalate) and d.prefix == net("2001:db8:1::/48")
    assert d.targets == ("2001:db8:1:1::/64", "2001:db8:1:2::/64", "2001:db8:1:3::5")


def test_a_prefix_holding_an_allowlisted_address_is_refused() -> None:
    e = esc(allow=Allowlist.from_networks([net("203.0.113.77/32")]))
    for i in range(2):
        e.observe("default", net(f"203.0.113.{i + 1}/32"), 1.0)
    d = e.observe("default", net("203.0.113.3/32"), 1.0)
    assert isinstance(d, Refused) and d.reason == "allowlisted" and "203.0.113.77" in d.detail
    assert e.stats.refused == {"allowlisted": 1} and e.stats.escalated == 0
    # the allowlist changes: the next crossing escalates
    e.allow = NONE
    for i in range(3):
        d2 = e.observe("default", net(f"203.0.113.{i + 10}/32"), 2.0)
    assert isinstance(d2, Escalate)


def test_never_ban_space_is_refused() -> None:
    e = esc(SubnetEscalation(ipv4_prefix=8, threshold=2))
    e.observe("default", net("127.0.0.5/32"), 1.0)  # (the enforcer refuses these; the rule stands alone here)
    d = e.observe("default", net("127.0.0.6/32"), 1.0)
    assert isinstance(d, Refused) and d.reason == "never_ban"


def test_cap_evicts_least_recently_touched_prefix() -> None:
    e = esc(SubnetEscalation(threshold=2, max_prefixes=3))
    e.observe("default", net("10.0.1.1/32"), 1.0)
    e.observe("default", net("10.0.2.1/32"), 2.0)
    e.observe("default", net("10.0.3.1/32"), 3.0)
    e.observe("default", net("10.0.1.1/32"), 4.0)  # touched again: 10.0.2.0/24 is now the coldest
    e.observe("default", net("10.0.4.1/32"), 5.0)
    assert e.tracked() == 3 and e.stats.evicted == 1
    assert isinstance(e.observe("default", net("10.0.1.9/32"), 6.0), Escalate)
    assert e.observe("default", net("10.0.2.9/32"), 6.0) is None  # its count was dropped


def test_forget_allows_a_new_escalation() -> None:
    e = esc(SubnetEscalation(threshold=2))
    e.observe("default", net("10.0.1.1/32"), 1.0)
    assert isinstance(e.observe("default", net("10.0.1.2/32"), 1.0), Escalate)
    e.forget("default", net("10.0.1.0/24"))
    e.observe("default", net("10.0.1.3/32"), 2.0)
    assert isinstance(e.observe("default", net("10.0.1.4/32"), 2.0), Escalate)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 15), st.integers(0, 30)), max_size=80),
       st.integers(2, 4), st.integers(1, 4))
def test_model(events: list[tuple[int, int, int]], threshold: int, cap: int) -> None:
    """Against a plain model: per prefix, the distinct addresses banned within the window since the last
    decision; a decision exactly when the threshold is reached; never more than `cap` prefixes tracked; a
    prefix escalated at most once per bantime."""
    pol = SubnetEscalation(threshold=threshold, window=10.0, bantime=25.0, max_prefixes=cap)
    e = esc(pol)
    t = 0.0
    escalated_at: dict[int, float] = {}
    for prefix, host, dt in events:
        t += dt
        d = e.observe("default", net(f"10.0.{prefix}.{host}/32"), t)
        assert e.tracked() <= cap
        if isinstance(d, Escalate):
            assert d.prefix == net(f"10.0.{prefix}.0/24")
            assert len(d.targets) == threshold and len(set(d.targets)) == threshold
            assert f"10.0.{prefix}.{host}" in d.targets
            assert prefix not in escalated_at or t >= escalated_at[prefix] + 25.0
            escalated_at[prefix] = t
        else:
            assert d is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 255), min_size=1, max_size=40))
def test_model_no_eviction_exact(hosts: list[int]) -> None:
    """With no cap and no window: the escalation comes exactly at the 4th distinct host, naming the four."""
    e = esc(SubnetEscalation(threshold=4, window=1e9, bantime=1e9))
    seen: list[int] = []
    done = False
    for h in hosts:
        d = e.observe("default", net(f"192.0.2.{h}/32"), 1.0)
        if not done:  # a re-ban moves the address to the end: `targets` is in order of latest ban
            if h in seen:
                seen.remove(h)
            seen.append(h)
        if not done and len(seen) == 4:
            assert isinstance(d, Escalate) and d.targets == tuple(f"192.0.2.{x}" for x in seen)
            done = True
        else:
            assert d is None


def test_config_parses_and_refuses_with_lines() -> None:
    cfg = parse_config("blocklists:\n  default:\n    subnet_escalation: {threshold: 4, window: 5m, bantime: 2h}\n")
    s = cfg.blocklist("default").subnet
    assert s == SubnetEscalation(threshold=4, window=300.0, bantime=7200.0)
    assert parse_config("blocklists:\n  default: {}\n").blocklist("default").subnet is None
    off = parse_config("blocklists:\n  default:\n    subnet_escalation: {enabled: false}\n")
    assert off.blocklist("default").subnet is None
    with pytest.raises(ConfigError) as ei:
        parse_config("blocklists:\n  default:\n    subnet_escalation:\n      ipv4_prefix: 4\n"
                     "      bantime: permanent\n      colour: red\n", "x.yaml")
    text = "\n".join(str(p) for p in ei.value.problems)
    assert "x.yaml:4" in text and "ipv4_prefix" in text
    assert "x.yaml:5" in text and "bantime" in text
    assert "x.yaml:6" in text and "colour" in text


class _Res:
    def __init__(self, code: str | None) -> None:
        self.code = code


async def test_runner_applies_fleet_and_jail_bans_and_forgets_refused() -> None:
    from nftblockd.detect.subnetrun import SubnetRunner
    from nftblockd.events import Ban

    applied: list[Ban] = []
    answer: list[str | None] = [None]

    async def apply(bans: list[Ban]) -> list[_Res]:
        applied.extend(bans)
        return [_Res(answer[0]) for _ in bans]

    r = SubnetRunner(esc(SubnetEscalation(threshold=3)), apply)
    r.jail_bans([Ban(net("10.1.2.3/32"), "default", 50.0, "jail", "", "sshd")], 1.0)
    r.fleet_bans("default", [], [(4, [int(ipaddress.IPv4Address("10.1.2.4")),
                                     int(ipaddress.IPv4Address("10.1.2.5"))])], 1.0)
    r.fleet_bans("other", [net("10.9.0.0/30")], [], 1.0)  # not watched
    assert r.pending() == 1
    await r.apply_now([r._queue.get_nowait()])
    assert [(b.target, b.jail, b.origin, b.until) for b in applied] == [
        (net("10.1.2.0/24"), "subnet-escalation", "jail", 1.0 + 86400.0)]
    assert "10.1.2.3" in applied[0].reason and r.status()["escalated"] == 1
    # its own prefix ban shown back (the sink's on_applied) counts for nothing
    r.jail_bans(applied, 2.0)
    assert r.pending() == 0
    # the enforcer refuses the next one: the prefix counts afresh
    answer[0] = "full"
    r.fleet_bans("default", [net("2001:db8:7:1::/64"), net("2001:db8:7:2::/64"), net("2001:db8:7:3::/64")], [], 3.0)
    await r.apply_now([r._queue.get_nowait()])
    assert r.failed == 1
    r.fleet_bans("default", [net("2001:db8:7:4::/64"), net("2001:db8:7:5::/64"), net("2001:db8:7:6::/64")], [], 4.0)
    assert r.pending() == 1
