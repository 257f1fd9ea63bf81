"""KernelWriter against the real kernel, inside a private network namespace."""

from __future__ import annotations

import errno
import ipaddress
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nftblockd.addr import net_key
from nftblockd.config import parse_config
from nftblockd.kernel import nfmsg as m
from nftblockd.kernel import ruleset as rs
from nftblockd.kernel.bans import OpSpec, SetOp
from nftblockd.kernel.batcher import Group
from nftblockd.kernel.netlink import NftSocket
from nftblockd.kernel.writer import KernelStateError, KernelWriter
from tests.helpers.netns import NetNS, inside

CONFIG = """
allowlist: [192.0.2.0/24, "2001:db8::/64"]
blocklists:
  default: {timeout: 1h, size: 64}
  feeds: {size: 100000}
"""


def make_writer(ns: NetNS, text: str = CONFIG) -> KernelWriter:
    plan = rs.plan_ruleset(parse_config(text))
    with inside(ns):
        sock = NftSocket()
    return KernelWriter(plan, sock)


@pytest.fixture
def writer(netns: NetNS) -> Iterator[KernelWriter]:
    w = make_writer(netns)
    w.setup([ipaddress.ip_network("192.0.2.0/24"), ipaddress.ip_network("2001:db8::/64")])
    yield w
    w.close()


def ip4(s: str) -> int:
    return int(ipaddress.IPv4Address(s))


def now_ms() -> int:
    return int(time.time() * 1000)


def drop_rules(ns: NetNS, chain: str = "prerouting") -> list[str]:
    """The sets our chain's drop rules look up, in the chain's order."""
    out = []
    for o in ns.nft_json("list", "chain", "inet", "nftblock", chain):
        rule = o.get("rule")
        if rule:
            out += [e["match"]["right"][1:] for e in rule["expr"] if "match" in e and e["match"]["op"] == "=="
                    and str(e["match"]["right"]).startswith("@")]
    return out


def test_setup_creates_the_planned_ruleset(netns: NetNS, writer: KernelWriter) -> None:
    # every set, and a rule for each once all hold something (nothing is banned yet: no rule at all)
    assert drop_rules(netns) == []
    t = now_ms()
    writer.write_ops([SetOp(s.name, 1 << 8 | (s.key_len * 8) if s.interval else 1, True, t + 60_000)
                      for s in writer.plan.sets if s.blocklist is not None])
    writer.setup([ipaddress.ip_network("192.0.2.0/24"), ipaddress.ip_network("2001:db8::/64")])
    listing = netns.nft("list", "table", "inet", "nftblock").stdout
    for line in rs.render_nft(writer.plan).splitlines():
        if "counter" in line:  # nft shows the counter values too
            line = line.replace(" counter", " counter packets 0 bytes 0")
        assert line.strip() in listing, line
    assert netns.set_elements("nftblock", "allow_net4") == {"192.0.2.0/24": {}}
    assert writer.features.owner and writer.features.persist
    assert writer.features.destroy and writer.features.timeout_update  # this kernel is 6.18
    assert writer.table_intact() == []


def test_setup_twice_keeps_one_copy_of_each_rule(netns: NetNS, writer: KernelWriter) -> None:
    writer.write_ops([SetOp("default_ip4", ip4("203.0.113.5"), True, now_ms() + 60_000)])
    writer.setup([ipaddress.ip_network("192.0.2.0/24")])
    writer.setup([ipaddress.ip_network("198.51.100.0/24")])
    assert drop_rules(netns) == ["default_ip4"]
    assert netns.set_elements("nftblock", "allow_net4") == {"198.51.100.0/24": {}}


def test_add_with_timeouts_and_delete(netns: NetNS, writer: KernelWriter) -> None:
    t = now_ms()
    ops = [SetOp("feeds_ip4", ip4(f"10.0.{i // 250}.{i % 250 + 1}"), True, t + 600_000) for i in range(5000)]
    res = writer.write_ops(ops)
    assert res.committed_ops == 5000 and not res.failed
    elems = netns.set_elements("nftblock", "feeds_ip4")
    assert len(elems) == 5000
    assert 590 <= elems["10.0.0.1"]["expires"] <= 600 and 599 <= elems["10.0.0.1"]["timeout"] <= 600
    res = writer.write_ops([SetOp("feeds_ip4", op.key, False) for op in ops[:1000]])
    assert not res.failed
    assert len(netns.set_elements("nftblock", "feeds_ip4")) == 4000


def test_adds_with_an_end_each_in_one_group(netns: NetNS, writer: KernelWriter,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet catch-up's group: every element its own end (`_mixed_hash_adds`, timed_hash_messages), IPv4 and
    IPv6, into the kernel in one write with the timeout each asked for."""
    encoded: list[int] = []
    timed = m.timed_hash_messages

    def spy(*a: Any) -> list[bytes]:
        encoded.append(len(a[4]))
        return timed(*a)

    monkeypatch.setattr(m, "timed_hash_messages", spy)
    t = now_ms()
    keys4 = [ip4(f"10.1.{i // 250}.{i % 250 + 1}") for i in range(3000)]
    keys6 = [int(ipaddress.IPv6Address(f"2001:db8:1::{i + 1:x}")) for i in range(50)]  # (the set holds 64)
    specs4 = [OpSpec(True, t + 120_000 + i * 1000) for i in range(3000)]
    specs6 = [OpSpec(True, t + 60_000 + i * 1000, "", True) for i in range(50)]
    res = writer.write([Group("feeds_ip4", keys4, specs4), Group("default_ip6", keys6, specs6)], t)
    assert res.committed_ops == 3050 and not res.failed and sorted(encoded) == [50, 3000]
    elems = netns.set_elements("nftblock", "feeds_ip4")
    assert len(elems) == 3000
    assert 118 <= elems["10.1.0.1"]["expires"] <= 120 and elems["10.1.0.1"]["timeout"] == 120
    assert 3117 <= elems["10.1.11.250"]["expires"] <= 3119
    six = netns.set_elements("nftblock", "default_ip6")
    assert len(six) == 50 and 107 <= six["2001:db8:1::32"]["expires"] <= 109


def test_delete_of_absent_element_is_not_an_error(writer: KernelWriter) -> None:
    res = writer.write_ops([SetOp("default_ip4", ip4("203.0.113.9"), False),
                        SetOp("default_net4", net_key(ipaddress.ip_network("198.18.0.0/15")), False)])
    assert not res.failed


def test_reban_extends_the_timeout(netns: NetNS, writer: KernelWriter) -> None:
    k = ip4("203.0.113.7")
    writer.write_ops([SetOp("default_ip4", k, True, now_ms() + 60_000)])
    assert netns.set_elements("nftblock", "default_ip4")["203.0.113.7"]["timeout"] == 60
    writer.write_ops([SetOp("default_ip4", k, True, now_ms() + 3_600_000, existed=True)])
    e = netns.set_elements("nftblock", "default_ip4")["203.0.113.7"]
    assert e["expires"] > 3500


def test_refresh_by_replace_on_kernels_without_timeout_update(netns: NetNS, writer: KernelWriter) -> None:
    from dataclasses import replace
    writer.features = replace(writer.features, timeout_update=False)
    k = ip4("203.0.113.8")
    writer.write_ops([SetOp("default_ip4", k, True, now_ms() + 60_000)])
    res = writer.write_ops([SetOp("default_ip4", k, True, now_ms() + 7_200_000, existed=True)])
    assert not res.failed
    assert netns.set_elements("nftblock", "default_ip4")["203.0.113.8"]["expires"] > 7000
    # the old element expired meanwhile (here: was removed): the delete half finds nothing, the add still lands
    writer.write_ops([SetOp("default_ip4", k, False)])
    res = writer.write_ops([SetOp("default_ip4", k, True, now_ms() + 60_000, existed=True)])
    assert not res.failed and "203.0.113.8" in netns.set_elements("nftblock", "default_ip4")


def test_a_computed_zero_timeout_is_never_sent(netns: NetNS, writer: KernelWriter) -> None:
    t = now_ms()
    res = writer.write_ops([SetOp("default_ip4", ip4("203.0.113.1"), True, t - 1),
                        SetOp("default_ip4", ip4("203.0.113.2"), True, t + 60_000)], now_ms=t)
    assert res.expired == [("default_ip4", ip4("203.0.113.1"))]
    assert set(netns.set_elements("nftblock", "default_ip4")) == {"203.0.113.2"}


def test_cidr_is_enforced_as_the_whole_range(netns: NetNS, writer: KernelWriter) -> None:
    nets = ["10.0.0.0/8", "11.0.0.0/16", "11.1.0.0/16", "255.255.255.0/24"]
    res = writer.write_ops([SetOp("default_net4", net_key(ipaddress.ip_network(n)), True, now_ms() + 60_000)
                        for n in nets])
    assert not res.failed
    assert set(netns.set_elements("nftblock", "default_net4")) == set(nets)
    # unbanning one of two adjacent ranges leaves the other
    writer.write_ops([SetOp("default_net4", net_key(ipaddress.ip_network("11.0.0.0/16")), False)])
    assert set(netns.set_elements("nftblock", "default_net4")) == {"10.0.0.0/8", "11.1.0.0/16", "255.255.255.0/24"}
    assert {k: v for k, v in writer.dump_keys("default_net4").items()}.keys() == {
        net_key(ipaddress.ip_network(n)) for n in ("10.0.0.0/8", "11.1.0.0/16", "255.255.255.0/24")}


def test_ipv6_hash_and_interval(netns: NetNS, writer: KernelWriter) -> None:
    a = int(ipaddress.IPv6Address("2001:db8:1::1"))
    n = net_key(ipaddress.ip_network("2001:db8:2::/48"))
    res = writer.write_ops([SetOp("default_ip6", a, True, now_ms() + 60_000),
                        SetOp("default_net6", n, True, None)])
    assert not res.failed
    assert "2001:db8:1::1" in netns.set_elements("nftblock", "default_ip6")
    assert netns.set_elements("nftblock", "default_net6") == {"2001:db8:2::/48": {}}


def test_one_bad_element_does_not_lose_the_batch(netns: NetNS, writer: KernelWriter) -> None:
    writer.write_ops([SetOp("default_net4", net_key(ipaddress.ip_network("10.0.0.0/8")), True, now_ms() + 60_000)])
    ops = [SetOp("default_net4", net_key(ipaddress.ip_network("12.0.0.0/8")), True, now_ms() + 60_000),
           SetOp("default_net4", net_key(ipaddress.ip_network("10.1.0.0/16")), True, now_ms() + 60_000),
           SetOp("default_net4", net_key(ipaddress.ip_network("13.0.0.0/8")), True, now_ms() + 60_000),
           SetOp("default_ip4", ip4("203.0.113.5"), True, now_ms() + 60_000)]
    res = writer.write_ops(ops)
    bad = ("default_net4", net_key(ipaddress.ip_network("10.1.0.0/16")))
    assert set(res.failed) == {bad} and res.failed[bad][0] == errno.EEXIST
    assert set(netns.set_elements("nftblock", "default_net4")) == {"10.0.0.0/8", "12.0.0.0/8", "13.0.0.0/8"}
    assert "203.0.113.5" in netns.set_elements("nftblock", "default_ip4")


def test_full_set_reports_enfile(netns: NetNS, writer: KernelWriter) -> None:
    ops = [SetOp("default_ip4", ip4(f"10.9.0.{i}"), True, now_ms() + 60_000) for i in range(1, 80)]
    res = writer.write_ops(ops)
    assert len(res.failed) == 79 - 64
    assert all(e == errno.ENFILE for e, _ in res.failed.values())
    assert len(netns.set_elements("nftblock", "default_ip4")) == 64
    # found in one refused transaction, not one per refused element (the kernel reports one error per
    # message: a `ban -` of 300k into a 262,144-element set took minutes of transactions)
    assert res.transactions == 2


def test_a_full_set_still_refreshes_its_elements_and_takes_what_a_delete_frees(netns: NetNS,
                                                                               writer: KernelWriter) -> None:
    writer.write_ops([SetOp("default_ip4", ip4(f"10.9.0.{i}"), True, now_ms() + 60_000) for i in range(1, 65)])
    later = now_ms() + 3_600_000
    ops = [SetOp("default_ip4", ip4("10.9.1.1"), True, later),  # new: takes the slot the delete frees
           SetOp("default_ip4", ip4("10.9.0.1"), True, later, existed=True),  # a refresh: done
           SetOp("default_ip4", ip4("10.9.1.2"), True, later),  # new: refused, and so is the next
           SetOp("default_ip4", ip4("10.9.1.3"), True, later),
           SetOp("default_ip4", ip4("10.9.0.2"), True, later, existed=True),  # a refresh after them: done
           SetOp("default_ip4", ip4("10.9.0.3"), False, None)]  # a delete (sent before the set's adds)
    res = writer.write_ops(ops)
    assert set(res.failed) == {("default_ip4", ip4("10.9.1.2")), ("default_ip4", ip4("10.9.1.3"))}
    assert all(e == errno.ENFILE for e, _ in res.failed.values())
    elements = netns.set_elements("nftblock", "default_ip4")
    assert len(elements) == 64 and "10.9.0.3" not in elements and "10.9.1.1" in elements
    assert all(elements[a]["expires"] > 3000 for a in ("10.9.0.1", "10.9.0.2"))


def test_foreign_table_left_untouched(netns: NetNS) -> None:
    netns.run("nft", "-f", "-", input="table inet mine {\n set s { type ipv4_addr; elements = { 1.2.3.4 }; }\n"
              " chain c { type filter hook input priority 0; ip saddr @s drop; }\n}\n")
    before = netns.nft("list", "table", "inet", "mine").stdout
    w = make_writer(netns)
    w.setup([])
    w.write_ops([SetOp("default_ip4", ip4("203.0.113.5"), True, now_ms() + 60_000)])
    assert netns.nft("list", "table", "inet", "mine").stdout == before
    w.close()


def test_owned_table_survives_flush_and_delete_by_others(netns: NetNS, writer: KernelWriter) -> None:
    writer.write_ops([SetOp("default_ip4", ip4("203.0.113.5"), True, now_ms() + 60_000)])
    r = netns.nft("delete", "table", "inet", "nftblock", check=False)
    assert r.returncode != 0 and "Operation not permitted" in r.stderr
    netns.nft("flush", "ruleset")
    assert writer.table_intact() == []
    assert "203.0.113.5" in netns.set_elements("nftblock", "default_ip4")


def test_table_persists_after_the_socket_closes_and_is_adopted(netns: NetNS) -> None:
    w = make_writer(netns)
    w.setup([])
    w.write_ops([SetOp("default_ip4", ip4("203.0.113.5"), True, now_ms() + 60_000)])
    w.close()
    assert "203.0.113.5" in netns.set_elements("nftblock", "default_ip4")
    w2 = make_writer(netns)
    w2.setup([])  # adopts the persisted table
    assert w2.features.owner
    assert "203.0.113.5" in netns.set_elements("nftblock", "default_ip4")
    r = netns.nft("delete", "table", "inet", "nftblock", check=False)
    assert r.returncode != 0
    w2.close()


def test_unowned_table_is_rebuilt_after_delete(netns: NetNS) -> None:
    w = make_writer(netns)
    w.protect = False
    try:
        w.setup([])
        netns.nft("delete", "table", "inet", "nftblock")
        assert w.table_intact() == ["table inet nftblock"]
        w.setup([])
        assert w.table_intact() == []
    finally:
        w.close()


def test_wrong_set_type_is_a_clear_error(netns: NetNS) -> None:
    netns.run("nft", "-f", "-", input="table inet nftblock {\n set default_ip4 { type ipv6_addr; }\n}\n")
    w = make_writer(netns)
    try:
        with pytest.raises(KernelStateError, match=r"default_ip4.*Delete the table"):
            w.setup([])
    finally:
        w.close()


def test_set_counts_and_point_lookup(writer: KernelWriter) -> None:
    writer.write_ops([SetOp("default_ip4", ip4("203.0.113.5"), True, now_ms() + 60_000)])
    assert writer.set_counts()["default_ip4"] == 1
    e = writer.sock.get_element("nftblock", "default_ip4", bytes([203, 0, 113, 5]))
    assert e is not None and e.timeout_ms == 60_000
    assert writer.sock.get_element("nftblock", "default_ip4", bytes([203, 0, 113, 6])) is None


# -- no rule for an empty set ------------------------------------------------------------------------------

def test_a_set_gets_its_rule_with_its_first_element_and_loses_it_once_empty(netns: NetNS,
                                                                             writer: KernelWriter) -> None:
    batches: list[list[int]] = []
    transact = writer.sock.transact

    def spy(msgs: list[bytes], **kw: object) -> object:
        batches.append([int.from_bytes(x[4:6], "little") & 0xFF for x in msgs])
        return transact(msgs, **kw)  # type: ignore[arg-type]

    writer.sock.transact = spy  # type: ignore[assignment,method-assign]
    assert drop_rules(netns) == [] and writer.table_intact() == []
    k = ip4("203.0.113.9")
    assert not writer.write_ops([SetOp("default_ip4", k, True, now_ms() + 60_000)]).failed
    # one transaction: the element and its rule (nothing ever sits in a set without its rule)
    assert batches[-1] == [m.NFT_MSG_NEWSETELEM, m.NFT_MSG_NEWRULE]
    assert drop_rules(netns) == ["default_ip4"] and writer.table_intact() == []
    rng = net_key(ipaddress.ip_network("198.18.0.0/15"))
    writer.write_ops([SetOp("default_net4", rng, True, now_ms() + 60_000),
                      SetOp("default_ip4", ip4("203.0.113.10"), True, now_ms() + 60_000)])
    assert drop_rules(netns) == ["default_ip4", "default_net4"]  # a rule once, not per add
    n = len(batches)
    writer.write_ops([SetOp("default_ip4", ip4("203.0.113.11"), True, now_ms() + 60_000)])
    assert m.NFT_MSG_NEWRULE not in batches[n]
    # an empty set keeps its rule until the next check (it only costs the lookup), which drops it in one
    # transaction that re-adds the others
    writer.write_ops([SetOp("default_ip4", key, False) for key in (k, k + 1, k + 2)])
    assert drop_rules(netns) == ["default_ip4", "default_net4"]
    assert writer.drop_idle_rules() == ["default_ip4"]
    assert drop_rules(netns) == ["default_net4"] and writer.table_intact() == []
    assert writer.drop_idle_rules() == []
    # at the next setup (start, reload), the kernel's counts say which sets hold something
    writer.filled = None
    writer.setup([])
    assert writer.filled == {"default_net4"} and drop_rules(netns) == ["default_net4"]
    writer.write_ops([SetOp("feeds_ip6", 1, True)])
    assert drop_rules(netns) == ["default_net4", "feeds_ip6"]


def test_a_write_that_adds_nothing_brings_no_rule(netns: NetNS, writer: KernelWriter) -> None:
    t = now_ms()
    res = writer.write_ops([SetOp("default_ip4", ip4("203.0.113.1"), False),
                            SetOp("default_ip6", 1, True, t - 1)], now_ms=t)
    assert not res.failed and res.expired == [("default_ip6", 1)]
    assert drop_rules(netns) == [] and writer.filled == set()


def test_a_chain_gone_between_look_and_commit_is_looked_up_again(netns: NetNS) -> None:
    """On kernels before 6.16 an ingress chain goes with its device, maybe between the writer's look at the
    chains and the commit of a first element with its rules: the kernel refuses the rule (ENOENT), the writer
    looks again and commits without it; an error that stays fails the ops instead of hiding them."""
    w = make_writer(netns, CONFIG + "chain: {ingress: [ghost0]}\n")
    try:
        w.setup([])
        real = w.sock.list_chains
        lies = [1]

        def stale(table: str) -> dict[str, object]:
            chains: dict[str, object] = dict(real(table))
            if lies:
                lies.pop()
                chains["ingress_ghost0"] = None  # "still there"
            return chains

        w.sock.list_chains = stale  # type: ignore[assignment,method-assign]
        res = w.write_ops([SetOp("default_ip4", ip4("203.0.113.4"), True, now_ms() + 60_000)])
        assert not res.failed and not lies and drop_rules(netns) == ["default_ip4"]
        lies[:] = [1] * 6  # never true: the ops fail, with the kernel's errno
        res = w.write_ops([SetOp("default_net4", net_key(ipaddress.ip_network("198.18.0.0/15")), True)])
        assert set(res.failed) == {("default_net4", net_key(ipaddress.ip_network("198.18.0.0/15")))}
        assert next(iter(res.failed.values()))[0] == errno.ENOENT
        assert drop_rules(netns) == ["default_ip4"] and "198.18.0.0/15" not in netns.set_elements(
            "nftblock", "default_net4")
    finally:
        w.close()
