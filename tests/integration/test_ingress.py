"""Ingress chains that follow the config and the devices, against the real kernel: a veth pair into the
test's namespace brings a device (and traffic from banned sources through it), deleting the pair takes it
away. The writer alone first, then the daemon: warnings at start, a device appearing and going, a restart
and a reload that change the configured devices."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nftblockd.addr import net_key
from nftblockd.config import parse_config
from nftblockd.kernel import nfmsg as m
from nftblockd.kernel import ruleset as rs
from nftblockd.kernel.bans import SetOp
from nftblockd.kernel.links import Links
from nftblockd.kernel.netlink import NftSocket
from nftblockd.kernel.writer import KernelWriter
from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, Peer, inside, wait_for

BANNED = [f"198.18.{i}.{i + 1}" for i in range(20)]  # all inside 198.18.0.0/15
COMMENT = "nftblockd blocklist default"


@pytest.fixture
def peer(netns: NetNS) -> Iterator[Peer]:
    p = Peer(netns, "vethR")
    try:
        yield p
    finally:
        p.close()


def writer_for(ns: NetNS, ingress: list[str]) -> KernelWriter:
    plan = rs.plan_ruleset(parse_config(f"chain: {{ingress: {ingress}}}\nallowlist: [192.0.2.0/24]\n"))
    with inside(ns):
        return KernelWriter(plan, NftSocket(), links=Links())


def chains(ns: NetNS) -> dict[str, dict[str, object]]:
    return {o["chain"]["name"]: o["chain"] for o in ns.nft_json("list", "table", "inet", "nftblock") if "chain" in o}


def first_rule(ns: NetNS) -> str:
    lines = ns.nft("list", "chain", "inet", "nftblock", "prerouting").stdout.splitlines()
    return lines[3].strip()


def dropped(ns: NetNS, chain: str) -> int:
    """Packets counted by the drop rules of one of our chains."""
    n = 0
    for o in ns.nft_json("list", "chain", "inet", "nftblock", chain):
        rule = o.get("rule")
        if rule and rule.get("comment") == COMMENT:
            n += sum(e["counter"]["packets"] for e in rule["expr"] if isinstance(e, dict) and "counter" in e)
    return n


def ban_range(w: KernelWriter) -> None:
    res = w.write_ops([SetOp("default_net4", net_key(ipaddress.ip_network("198.18.0.0/15")), True,
                             int(time.time() * 1000) + 600_000)])
    assert not res.failed


def test_a_chain_for_a_missing_device_is_attached_when_it_appears_and_detached_when_it_goes(
        netns: NetNS, peer: Peer) -> None:
    w = writer_for(netns, ["vethR"])
    try:
        w.setup([])
        assert set(chains(netns)) == {"prerouting"}  # nothing attached to a device that does not exist
        assert w.table_intact() == []
        ban_range(w)
        peer.attach()
        change = w.sync_ingress()
        assert (change.attached, change.detached) == (("vethR",), ())
        listing = netns.nft("list", "chain", "inet", "nftblock", "ingress_vethR").stdout
        assert 'type filter hook ingress device "vethR" priority -500; policy accept;' in listing
        # what came in on vethR was looked up there: prerouting lets it go on, in the same transaction
        assert first_rule(netns) == 'iifname "vethR" return comment "nftblockd: checked at ingress"'
        assert w.table_intact() == [] and w.sync_ingress() == type(change)((), ())
        peer.send_udp(BANNED)
        wait_for(lambda: dropped(netns, "ingress_vethR") == len(BANNED), what="drops on the ingress chain")
        assert dropped(netns, "prerouting") == 0  # every packet dropped before it got there
        peer.detach()
        change = w.sync_ingress()
        assert (change.attached, change.detached) == ((), ("vethR",))
        assert set(chains(netns)) == {"prerouting"} and w.table_intact() == []
        assert first_rule(netns).startswith("ip saddr @default_net4")  # the one set holding something
    finally:
        w.close()


def test_setup_removes_chains_no_longer_configured_in_the_transaction_that_installs_the_rules(
        netns: NetNS, peer: Peer) -> None:
    peer.attach()
    w = writer_for(netns, ["vethR"])
    w.setup([])
    assert set(chains(netns)) == {"prerouting", "ingress_vethR"}
    ban_range(w)
    w.close()
    w = writer_for(netns, [])
    batches: list[list[int]] = []
    transact = w.sock.transact

    def spy(msgs: list[bytes], **kw: object) -> object:
        batches.append([int.from_bytes(x[4:6], "little") & 0xFF for x in msgs])
        return transact(msgs, **kw)  # type: ignore[arg-type]

    w.sock.transact = spy  # type: ignore[assignment,method-assign]
    try:
        w.setup([])
        assert set(chains(netns)) == {"prerouting"}
        first = batches[0]
        assert m.NFT_MSG_DELCHAIN in first and m.NFT_MSG_NEWRULE in first  # one transaction: no moment between
        peer.send_udp(BANNED)
        wait_for(lambda: dropped(netns, "prerouting") == len(BANNED), what="drops at prerouting")
    finally:
        w.close()


def test_a_chain_attached_at_another_priority_is_made_again(netns: NetNS) -> None:
    """Our own table, left by a run configured with another priority."""
    netns.run("nft", "-f", "-", input="table inet nftblock {\n chain prerouting {\n  type filter hook prerouting "
              "priority 0; policy accept;\n  counter comment \"nftblockd blocklist default\"\n }\n}\n")
    w = writer_for(netns, [])
    try:
        w.setup([])  # before: EOPNOTSUPP, the kernel cannot change a chain's priority
        c = chains(netns)["prerouting"]
        assert c["prio"] == -300
        ban_range(w)
        rules = [o["rule"] for o in netns.nft_json("list", "chain", "inet", "nftblock", "prerouting") if "rule" in o]
        assert len(rules) == 1 and all(r.get("comment") == COMMENT for r in rules)  # the filled set's only
    finally:
        w.close()


def test_a_first_ban_drops_from_its_first_packet_at_both_hooks_and_so_does_one_after_an_idle_drop(
        netns: NetNS, peer: Peer) -> None:
    """No rule for an empty set: the rule comes in the transaction of the set's first element, on every
    installed chain, so the first packet after a ban is dropped; and again after the rule was dropped idle."""
    peer.attach()
    w = writer_for(netns, ["vethR"])
    try:
        w.setup([])
        assert first_rule(netns) == 'iifname "vethR" return comment "nftblockd: checked at ingress"'
        assert len(netns.nft("list", "chain", "inet", "nftblock", "prerouting").stdout.splitlines()) == 6
        ban_range(w)
        peer.send_udp(BANNED)
        wait_for(lambda: dropped(netns, "ingress_vethR") == len(BANNED), what="drops at ingress")
        key = net_key(ipaddress.ip_network("198.18.0.0/15"))
        assert not w.write_ops([SetOp("default_net4", key, False)]).failed
        assert w.drop_idle_rules() == ["default_net4"]
        assert [c.rules for c in w.chains()] == [(rs.SkipSpec("vethR"),), ()] and w.table_intact() == []
        ban_range(w)
        peer.send_udp(BANNED)
        wait_for(lambda: dropped(netns, "ingress_vethR") == len(BANNED), what="drops at ingress again")
        peer.detach()  # the kernel keeps the chain (6.16+) or deletes it: either way prerouting takes over
        w.sync_ingress()
        assert dropped(netns, "prerouting") == 0 and first_rule(netns).startswith("ip saddr @default_net4")
    finally:
        w.close()


# -- the daemon ---------------------------------------------------------------------------------------------

def config(ingress: list[str]) -> str:
    return f"blocklists: {{default: {{timeout: 1h}}}}\nchain: {{ingress: {ingress}}}\nallowlist: [192.0.2.0/24]\n"


def test_the_daemon_warns_then_follows_the_device_and_the_config(netns: NetNS, peer: Peer, tmp_path: Path) -> None:
    peer.dev = "nosuch0"
    d = DaemonProc(netns, tmp_path / "d", config(["nosuch0"])).start()
    try:
        assert ("WARNING" in d.log() and "chain.ingress: device 'nosuch0' does not exist now (its ingress chain "
                "is attached when it appears)" in d.log()), d.log()
        assert set(chains(netns)) == {"prerouting"}
        assert d.cli("ban", "198.18.0.0/15").returncode == 0
        peer.attach()
        wait_for(lambda: "ingress_nosuch0" in chains(netns), what="the chain attached when the device appeared")
        peer.send_udp(BANNED)
        wait_for(lambda: dropped(netns, "ingress_nosuch0") == len(BANNED), what="drops at ingress")
        assert dropped(netns, "prerouting") == 0
        assert "device nosuch0 appeared: its ingress chain is attached" in d.log()
        peer.detach()
        wait_for(lambda: "ingress_nosuch0" not in chains(netns), what="the chain detached when the device went")

        # a reload changes the devices: the chain follows without a restart
        peer.dev = "vethR"
        peer.attach()
        d.config_path.write_text(config(["vethR"]))
        r = d.cli("reload")
        assert r.returncode == 0, r.stderr
        d.wait_notify("READY=1")  # the reload's own READY=1: the restart below must wait for its own
        assert set(chains(netns)) == {"prerouting", "ingress_vethR"}

        # a restart with no ingress device: the kept table loses the chain in the setup transaction, and
        # every packet of a banned source is dropped at prerouting instead
        assert d.stop() == 0
        assert set(chains(netns)) == {"prerouting", "ingress_vethR"}  # the table (and its chains) outlive us
        d.config_path.write_text(config([]))
        d.start()
        assert set(chains(netns)) == {"prerouting"}
        assert "chain ingress_vethR removed from table inet nftblock (no longer configured)" in d.log()
        before = dropped(netns, "prerouting")
        peer.send_udp(BANNED)
        wait_for(lambda: dropped(netns, "prerouting") - before == len(BANNED), what="drops at prerouting")
    finally:
        d.close()
