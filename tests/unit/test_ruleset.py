"""The planned kernel objects: the drop rules and their allowlist check, the chains that follow devices,
and the chain changes a setup makes. Pure: no kernel (tests/integration/test_kernel.py and test_ingress.py
check the same plans against the real one)."""

# The base chain's rules are RuleSpecs in these plans (a SkipSpec comes only with ingress devices): the
# union attributes below are safe.
# mypy: disable-error-code="union-attr, arg-type"

from __future__ import annotations

import pytest

from nftblockd.config import parse_config
from nftblockd.kernel import nfmsg as m
from nftblockd.kernel import ruleset as rs

EXAMPLE = "blocklists: {default: {}, feeds: {size: 1048576}}\nchain: {ingress: [eth1, wg0]}\n"


def plan(text: str = EXAMPLE) -> rs.Ruleset:
    return rs.plan_ruleset(parse_config(text))


def test_one_drop_rule_per_blocklist_set_with_the_allowlist_looked_up_after_a_match() -> None:
    p = plan()
    base = p.chains[0]
    assert (base.name, base.hook, base.priority, base.device) == ("prerouting", "prerouting", -300, None)
    assert [r.set_name for r in base.rules] == [s.name for s in p.sets if s.blocklist is not None]
    assert all(r.verdict == "drop" and r.counter for r in base.rules)
    assert {(r.version, r.unless) for r in base.rules} == {(4, "allow_net4"), (6, "allow_net6")}
    assert rs.render_rule(base.rules[0]) == ('ip saddr @default_ip4 ip saddr != @allow_net4 counter drop '
                                             'comment "nftblockd blocklist default"')
    assert rs.render_rule(base.rules[-1]) == ('ip6 saddr @feeds_net6 ip6 saddr != @allow_net6 counter drop '
                                              'comment "nftblockd blocklist feeds"')
    # no rule for the allowlist itself: an innocent packet never looks it up
    assert not any(r.set_name.startswith("allow") for c in p.chains for r in c.rules)


def test_the_allowlist_lookup_is_inverted_and_comes_after_the_ban_lookup() -> None:
    r = plan().chains[0].rules[0]
    exprs = m.attrs_dict(rs.rule_expressions(r, 3, 1))[m.NFTA_RULE_EXPRESSIONS]
    names, lookups = [], []
    for _k, e in m.iter_attrs(exprs):
        a = m.attrs_dict(e)
        name = m.read_strz(a[m.NFTA_EXPR_NAME])
        names.append(name)
        if name == "lookup":
            d = m.attrs_dict(a[m.NFTA_EXPR_DATA])
            lookups.append((m.read_strz(d[1]), m.read_be32(d[4]), m.read_be32(d[m.NFTA_LOOKUP_FLAGS])
                            if m.NFTA_LOOKUP_FLAGS in d else 0))
    assert names == ["meta", "cmp", "payload", "lookup", "payload", "lookup", "counter", "immediate"]
    assert lookups == [("default_ip4", 3, 0), ("allow_net4", 1, m.NFT_LOOKUP_F_INV)]


def test_ingress_chains_exist_only_for_devices_that_exist() -> None:
    p = plan()
    assert [c.name for c in p.chains] == ["prerouting", "ingress_eth1", "ingress_wg0"]
    assert all(c.hook == "ingress" and c.priority == rs.INGRESS_PRIORITY for c in p.chains[1:])
    assert [c.name for c in rs.chains_for(p, {"lo", "wg0"})] == ["prerouting", "ingress_wg0"]
    assert rs.chains_for(p, set()) == p.chains[:1]
    assert rs.chains_for(p, {"eth1", "wg0", "eth2"})[1:] == p.chains[1:]


def test_the_base_chain_skips_what_an_installed_ingress_chain_checked_and_only_that() -> None:
    p = plan()
    base = rs.chains_for(p, {"wg0", "eth1"})[0]
    assert base.rules[:2] == (rs.SkipSpec("eth1"), rs.SkipSpec("wg0")) and base.rules[2:] == p.chains[0].rules
    assert rs.chains_for(p, {"wg0"})[0].rules[:1] == (rs.SkipSpec("wg0"),)
    assert rs.render_rule(base.rules[0]) == 'iifname "eth1" return comment "nftblockd: checked at ingress"'
    exprs = m.attrs_dict(rs.skip_expressions(rs.SkipSpec("wg0")))[m.NFTA_RULE_EXPRESSIONS]
    parts = [m.attrs_dict(e) for _k, e in m.iter_attrs(exprs)]
    assert [m.read_strz(a[m.NFTA_EXPR_NAME]) for a in parts] == ["meta", "cmp", "immediate"]
    cmp = m.attrs_dict(parts[1][m.NFTA_EXPR_DATA])
    assert m.attrs_dict(cmp[3])[m.NFTA_DATA_VALUE] == b"wg0" + b"\0" * 13  # IFNAMSIZ, as nft compares it


@pytest.mark.parametrize(("existing", "wanted_devices", "deleted"), [
    ({}, {"eth1", "wg0"}, []),  # a fresh table
    ({"ingress_eth0": m.ChainHook(5, -500, "eth0")}, set(), ["ingress_eth0"]),  # no longer configured
    ({"ingress_wg0": m.ChainHook(5, -500, "wg0")}, {"eth1"}, ["ingress_wg0"]),  # configured, device gone
    ({"input": m.ChainHook(1, -300, None)}, set(), ["input"]),  # the hook was input before
    ({"prerouting": m.ChainHook(0, 0, None)}, set(), ["prerouting"]),  # another priority: made again
    ({"helper": None}, set(), ["helper"]),  # a regular chain we never plan
])
def test_chain_changes(existing: dict[str, m.ChainHook | None], wanted_devices: set[str],
                       deleted: list[str]) -> None:
    assert rs.chain_changes(rs.chains_for(plan(), wanted_devices), existing) == deleted


def test_kept_chains_attached_as_planned_are_left_alone() -> None:
    p = plan()
    existing = {c.name: c.hook_key for c in p.chains}
    assert rs.chain_changes(p.chains, existing) == []
    assert rs.chain_changes(rs.chains_for(p, {"wg0"}), existing) == ["ingress_eth1"]


def test_encode_ruleset_deletes_chains_before_making_them_and_stale_sets_last() -> None:
    p = plan()
    msgs = rs.encode_ruleset(p, 0, 100, ("old_ip4",), chains=rs.chains_for(p, {"wg0"}),
                             delete_chains=["ingress_eth0", "prerouting"])
    kinds = [int.from_bytes(x[4:6], "little") & 0xFF for x in msgs]
    assert kinds[0] == m.NFT_MSG_NEWTABLE
    first_chain = kinds.index(m.NFT_MSG_NEWCHAIN)
    assert kinds[first_chain - 2:first_chain] == [m.NFT_MSG_DELCHAIN, m.NFT_MSG_DELCHAIN]
    assert kinds.count(m.NFT_MSG_NEWCHAIN) == 2  # prerouting again, ingress_wg0; not ingress_eth1
    assert kinds[-1] == m.NFT_MSG_DELSET
    seqs = [int.from_bytes(x[8:12], "little") for x in msgs]
    assert seqs == list(range(100, 100 + len(msgs)))


def test_render_shows_ingress_chains_with_their_device() -> None:
    text = rs.render_nft(plan())
    assert '\tchain ingress_wg0 {\n\t\ttype filter hook ingress device "wg0" priority -500; policy accept;' in text
    assert "accept comment" not in text


# -- no rule for an empty set ----------------------------------------------------------------------------

def test_only_the_filled_sets_have_rules_and_the_skips_stay_first() -> None:
    p = plan()
    chains = rs.chains_for(p, {"wg0"}, {"feeds_net4", "default_ip6"})
    base, wg0 = chains
    assert base.rules == (rs.SkipSpec("wg0"), *(r for r in p.chains[0].rules
                                                 if r.set_name in {"feeds_net4", "default_ip6"}))
    assert [r.set_name for r in wg0.rules] == ["default_ip6", "feeds_net4"]  # the plan's order
    # nothing banned yet: no lookups at all, the skip rule alone
    assert [c.rules for c in rs.chains_for(p, {"wg0"}, set())] == [(rs.SkipSpec("wg0"),), ()]
    every = {s.name for s in p.sets}
    assert rs.chains_for(p, {"wg0"}, every) == rs.chains_for(p, {"wg0"})


def test_a_sets_first_element_brings_its_rule_to_every_chain_and_nothing_else() -> None:
    p = plan()
    chains = rs.chains_for(p, {"eth1"}, set())
    added = rs.rules_for_sets(p.chains, {"default_net4"})
    assert [(chain, r.set_name) for chain, r in added] == [
        ("prerouting", "default_net4"), ("ingress_eth1", "default_net4"), ("ingress_wg0", "default_net4")]
    assert rs.rules_for_sets(chains, {"default_net4"}) == []  # chains as installed: no rules in them yet
    msgs = rs.encode_added_rules(p, added[:2], 7)
    assert [int.from_bytes(x[4:6], "little") & 0xFF for x in msgs] == [m.NFT_MSG_NEWRULE] * 2
    assert [int.from_bytes(x[8:12], "little") for x in msgs] == [7, 8]
    # the same bytes as the rule in a full installation (appended: after the skip rules)
    set_ids = {s.name: i for i, s in enumerate(p.sets, start=1)}
    r = added[0][1]
    assert msgs[0] == rs.encode_rule(p.table, "prerouting", r, set_ids["default_net4"], 7, set_ids["allow_net4"])
