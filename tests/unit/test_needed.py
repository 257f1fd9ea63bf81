"""needed.py: what a host needs and never bans (issue #34 item 1): its names, and resolv.conf read as text."""

from __future__ import annotations

import ipaddress
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from nftblockd import needed
from nftblockd.config import Config, FeedConfig, FleetConfig


def test_names_are_the_fleet_server_its_sentinels_and_the_network_feeds() -> None:
    fleet = FleetConfig(name="prod", host_id="a", url="rediss://redis.example.net:6380/0")
    feeds = (FeedConfig("drop", "feeds", url="https://lists.example.org/drop.txt"),
             FeedConfig("local", "feeds", path="/var/lib/list.txt"))
    cfg = Config(file="t.yaml", fleet=fleet, feeds=feeds)
    assert needed.names(cfg) == [("the fleet server", "redis.example.net"),
                                 ("feed drop's server", "lists.example.org")]
    sentinels = replace(fleet, url=None, sentinel_hosts=(("10.0.0.1", 26379), ("s2.example", 26379)))
    assert [h for _w, h in needed.names(replace(cfg, fleet=sentinels, feeds=()))] == ["10.0.0.1", "s2.example"]
    assert needed.names(Config(file="t.yaml")) == []


def test_nameservers_of_a_resolv_conf() -> None:
    text = ("# generated\nnameserver 10.0.0.53\nsearch example.net\nnameserver fe80::1%eth0\n"
            "nameserver not-an-address\nnameserver\noptions ndots:2\n  nameserver 192.0.2.1 # comment\n")
    assert needed.nameservers(text) == [ipaddress.ip_address("10.0.0.53"), ipaddress.ip_address("fe80::1"),
                                        ipaddress.ip_address("192.0.2.1")]


@given(st.text())
def test_nameservers_never_raise_and_return_addresses(text: str) -> None:
    for a in needed.nameservers(text):
        assert isinstance(a, ipaddress.IPv4Address | ipaddress.IPv6Address)


def test_networks_are_single_addresses_with_mapped_ipv6_as_ipv4() -> None:
    got = needed.networks({"x": [ipaddress.ip_address("::ffff:10.0.0.5"), ipaddress.ip_address("2001:db8::1")],
                           "y": [ipaddress.ip_address("10.0.0.5")]})
    assert got == [ipaddress.ip_network("10.0.0.5/32"), ipaddress.ip_network("2001:db8::1/128")]
