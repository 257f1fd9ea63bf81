"""Issue 33's properties for every parser of outside input that takes an address: feed lines (each format),
CLI targets, control requests and their targets, fleet events through the codec and the gate.

Each parser either returns a value inside its documented bounds or refuses with a reason, never raises
anything else, and never widens an address range: every network it returns lies inside what was written
(compared as ints, by tests/helpers/spans.py, which reads the text without nftblockd.addr).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import math
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from nftblockd.addr import AddressError, IPNet, parse_target
from nftblockd.allowlist import build_allowlist
from nftblockd.cli.targets import canonical_target
from nftblockd.control.protocol import COMMANDS, ControlError, parse_args
from nftblockd.control.server import Peer
from nftblockd.feeds.parse import FeedFormatError, parse_feed
from nftblockd.fleet.codec import REASONS, SCHEMA, Rejection, decode
from nftblockd.fleet.gate import Accepted, Gate, TrustLimits
from tests.helpers.apirig import api_rig
from tests.helpers.spans import inside, written_span
from tests.unit.test_addr import target_text_like


@st.composite
def typo(draw: st.DrawFn) -> str:
    """An address with a prefix length, host bits set more often than not: `45.67.89.10/9`."""
    if draw(st.booleans()):
        return f"{ipaddress.IPv4Address(draw(st.integers(0, 2**32 - 1)))}/{draw(st.integers(0, 32))}"
    return f"{ipaddress.IPv6Address(draw(st.integers(0, 2**128 - 1)))}/{draw(st.integers(0, 128))}"


targets = st.one_of(typo(), target_text_like())


def within(net: IPNet, text: str) -> bool:
    return inside(net.version, int(net.network_address), int(net.broadcast_address), text)


def accepted(texts: list[str]) -> list[IPNet]:
    """What the one rule (addr.parse_target) accepts of `texts`, in order."""
    out = []
    for t in texts:
        with contextlib.suppress(AddressError):
            out.append(parse_target(t))
    return out


# -- feeds: each format ------------------------------------------------------------------------------------

_SAFE = str.maketrans("", "", "#;,\"\n\r\t\x0b\x0c\x1c\x1d\x1e\x1f\x85\u2028\u2029")


@settings(deadline=None)
@given(st.lists(targets.map(lambda t: t.translate(_SAFE)), min_size=1, max_size=25),
       st.sampled_from(["plain", "csv", "json", "json_objects"]))
@example(["45.67.89.10/9", "2001:db8:f3::1/17", "1.2.3.0/24", "8.8.8.8"], "plain")
def test_a_feed_returns_exactly_the_entries_written_or_refuses_the_body(texts: list[str], fmt: str) -> None:
    args: tuple[str, int | str]
    if fmt == "plain":
        body, args = "\n".join(texts), ("plain", 0)
    elif fmt == "csv":
        body, args = "ip\n" + "\n".join(texts), ("csv", "ip")
    elif fmt == "json":
        body, args = json.dumps(texts), ("json", 0)
    else:
        body, args = json.dumps([{"ip": t} for t in texts]), ("json", "ip")
    try:
        r = parse_feed(body, *args)
    except FeedFormatError as exc:
        assert str(exc)  # a reason the operator sees
        return
    want = accepted([t for t in texts if t.strip()])
    assert r.networks() == [n for n in want if n.version == 4] + [n for n in want if n.version == 6]
    host_bits = sum(1 for t in texts if (s := written_span(t)) is not None and s.host_bits and "%" not in t)
    assert r.stats.host_bits <= host_bits  # refused, never widened (and counted as such)
    for net in r.networks():
        assert any(within(net, t) for t in texts)


# -- CLI targets -------------------------------------------------------------------------------------------


@given(targets)
@example("45.67.89.10/9")
@example("2001:db8:f3::1/17")
def test_a_cli_target_is_what_was_written_or_refused(text: str) -> None:
    try:
        canonical = canonical_target(text)
    except ValueError as exc:  # addr.AddressError
        assert str(exc)
        return
    net = parse_target(canonical)
    assert within(net, text), (text, canonical)


# -- control requests --------------------------------------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
                     | targets, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                         st.sampled_from(["targets", "target", "set", "timeout", "reason", "jail", "origin",
                                          "reply", "name", "x"]), inner, max_size=4), max_leaves=12)


@given(st.sampled_from(sorted(COMMANDS)), st.dictionaries(
    st.sampled_from(["targets", "target", "set", "timeout", "reason", "jail", "origin", "reply", "name",
                     "hosts4", "hosts6", "blocklist", "x"]), _json, max_size=5))
def test_control_arguments_parse_or_are_refused_as_bad_requests(cmd: str, args: dict[str, Any]) -> None:
    try:
        parse_args(cmd, args)
    except ControlError as exc:
        assert exc.code == "bad_request" and exc.message


PEER = Peer(pid=1, uid=0, gid=0)


@settings(max_examples=40, deadline=None)
@given(st.lists(targets, min_size=1, max_size=8))
@example(["198.51.100.77/24", "2001:db8:f3::1/17", "203.0.113.9"])
def test_a_control_ban_applies_only_what_was_written(texts: list[str]) -> None:
    async def run() -> tuple[dict[str, Any], list[str]]:
        async with api_rig("blocklists:\n  default: {timeout: 1h}\n") as rig:
            r = await rig.api("ban", {"targets": texts}, PEER)
            return r, [t for t, _ in rig.bans()]

    r, banned = asyncio.run(run())
    for t in [*r["applied"], *banned]:  # what the answer says and what the state (the kernel's twin) holds
        net = parse_target(t)
        assert any(within(net, w) for w in texts), (t, texts)
    assert len(r["applied"]) + len(r["refused"]) <= len(texts)
    for x in r["refused"]:
        assert x["code"] and x["message"]


# -- fleet events: codec and gate ----------------------------------------------------------------------------

_GATE_NOW = 1_700_000_000.0


@given(targets, st.sampled_from([b"ban", b"unban"]),
       st.one_of(st.floats(0, 5e9).map(lambda f: repr(f).encode()), st.just(b"inf")))
@example("45.67.89.10/9", b"ban", b"1800000000.0")
def test_a_fleet_event_carries_the_net_written_or_a_reason(text: str, op: bytes, until: bytes) -> None:
    fields = {b"v": SCHEMA.encode(), b"op": op, b"net": text.encode(errors="surrogatepass"), b"until": until,
              b"origin": b"web-02", b"oseq": b"7", b"src": b"jail:sshd", b"ts": b"0"}
    ev = decode(fields)
    if isinstance(ev, Rejection):
        assert ev.reason in REASONS
        span = written_span(text)
        if span is not None and span.host_bits and text == text.strip() and "%" not in text \
                and text.count("/") == 1:
            assert ev.reason in ("host_bits", "bad_net")
        return
    assert within(ev.net, text)
    allow = build_allowlist([ipaddress.ip_network("192.0.2.0/24")], [])
    got = Gate(TrustLimits(), allow).check(ev, _GATE_NOW, _GATE_NOW)
    assert isinstance(got, Accepted | Rejection)
    if isinstance(got, Rejection):
        assert got.reason in REASONS
    else:
        assert got.event.net == ev.net and (got.until <= ev.until or math.isnan(ev.until))
