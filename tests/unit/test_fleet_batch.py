"""The receive loop's batch path for plain single-address bans, held to the entry-by-entry path it replaces.

`FleetService(batch=False)` applies every read entry by entry (decode, Gate.check, the last event per address
wins): the reference. The batch path (codec.plain_bans, Gate.check_hosts, FleetChange.hosts) must leave the
same counters, the same sink state (which addresses are banned, until when, from which origin), the same
token buckets, lag and cursor, read after read, on any mix of entries.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.addr import parse_target
from nftblockd.allowlist import build_allowlist
from nftblockd.fleet.codec import FleetEvent, decode, plain_bans
from nftblockd.fleet.gate import Gate, TrustLimits
from nftblockd.fleet.service import FleetService
from tests.helpers.fleet import FakeSink, fleet_config
from tests.helpers.store import memory_store

NOW = 1_700_000_000.0
ME = b"me"

Entry = tuple[tuple[int, int], dict[bytes, Any]]

ADDRESSES = (
    b"198.51.100.7", b"198.51.100.8", b"10.1.2.3", b"10.1.2.4", b"8.8.8.8",  # plain
    b"127.0.0.1", b"169.254.1.1", b"169.1.1.1", b"224.0.0.1", b"0.0.0.0", b"255.255.255.255",  # never-ban (or near)
    b"192.0.2.5", b"192.0.2.200",  # the first is allowlisted (192.0.2.0/28)
    b"2001:db8::1", b"2001:db8:1::1", b"fe80::1", b"::1", b"::", b"ff02::1", b"::ffff:10.1.2.3",  # IPv6, mapped
    b"2001:db8::1%eth0", b"10.1.2", b" 10.1.2.3", b"\xff\xfe",  # not addresses
)
RANGES = (b"10.1.0.0/16", b"10.1.2.0/24", b"10.1.2.3/24", b"0.0.0.0/0", b"2001:db8::/48", b"10.1.2.3/32")
UNTILS = (b"inf", repr(NOW + 100).encode(), repr(NOW + 10**7).encode(), repr(NOW - 5).encode(),
          repr(NOW + 0.2).encode(), b"1e400", b"-1", b"abc", b"0")
ORIGINS = (b"h1", b"h2", b"h3", ME, b"bad origin", b"")


def limits() -> dict[str, Any]:
    return {"rate": 2.0, "burst": 6, "max_ban": 3600.0, "min_prefix_v4": 16, "min_prefix_v6": 48}


def service(*, batch: bool, allow_permanent: bool) -> FleetService:
    cfg = fleet_config("prod", ME.decode(), "redis://127.0.0.1:1", allow_permanent=allow_permanent, **limits())
    allow = build_allowlist([parse_target("192.0.2.0/28"), parse_target("2001:db8:1::/48")], include_self=False)
    return FleetService(cfg, None, memory_store(), FakeSink(), allow, clock=lambda: NOW,  # type: ignore[arg-type]
                        batch=batch)


# a jail's bans: every ban its own end (ms apart; some already over, some beyond max_ban)
distinct_ends = st.integers(-2_000, 4_000_000).map(lambda ms: repr(NOW + ms / 1000).encode())


@st.composite
def plain_fields(draw: st.DrawFn) -> dict[bytes, Any]:
    f: dict[bytes, Any] = {b"v": b"2", b"op": b"ban", b"net": draw(st.sampled_from(ADDRESSES[:20])),
                           b"until": draw(st.sampled_from(UNTILS[:5]) | distinct_ends),
                           b"origin": draw(st.sampled_from((b"h1", b"h1", b"h2", b"h3", ME))),
                           b"oseq": str(draw(st.integers(0, 10**6))).encode()}
    if draw(st.booleans()):
        f[b"src"] = draw(st.sampled_from((b"jail:sshd", b"cli")))
    if draw(st.booleans()):
        f[b"ts"] = str(draw(st.integers(0, int(NOW * 1000)))).encode()
    return f


@st.composite
def any_fields(draw: st.DrawFn) -> dict[bytes, Any]:
    f = draw(plain_fields())
    kind = draw(st.sampled_from(("plain", "unban", "range", "odd_net", "odd_until", "odd_field", "own")))
    if kind == "unban":
        f[b"op"], f[b"until"] = b"unban", b"0"
    elif kind == "range":
        f[b"net"] = draw(st.sampled_from(RANGES))
    elif kind == "odd_net":
        f[b"net"] = draw(st.sampled_from(ADDRESSES[20:]))
    elif kind == "odd_until":
        f[b"until"] = draw(st.sampled_from(UNTILS[5:]))
    elif kind == "odd_field":
        key = draw(st.sampled_from((b"v", b"op", b"origin", b"oseq", b"src", b"ts", b"net", b"until")))
        f[key] = draw(st.sampled_from((b"2", b"x", b"-1", b"", "text", bytearray(b"1"), None, b"a" * 200,
                                       b"12345678901234567890")))
        if f[key] is None:
            del f[key]
    elif kind == "own":
        f[b"origin"] = ME
        f[b"op"] = draw(st.sampled_from((b"ban", b"unban", b"x")))
    return f


@st.composite
def reads(draw: st.DrawFn) -> list[list[Entry]]:
    """A few reads of consecutive stream entries; about half are all plain bans (the batch path's reads)."""
    ms = int(NOW * 1000) - 60_000
    out: list[list[Entry]] = []
    for _ in range(draw(st.integers(1, 4))):
        plain = draw(st.booleans())
        fields = draw(st.lists(plain_fields() if plain else any_fields(), min_size=1, max_size=40))
        read: list[Entry] = []
        for f in fields:
            ms += draw(st.sampled_from((0, 0, 1, 300, 2000)))
            read.append(((ms, len(read)), f))
        out.append(read)
    return out


def observed(svc: FleetService) -> dict[str, Any]:
    sink = svc.sink
    assert isinstance(sink, FakeSink)
    return {
        "received": dict(svc.stats.received),
        "fleet": sink.fleet, "origin": sink.origin, "local": sink.local,
        "calls": len(sink.calls),
        "buckets": {o: [(x.tokens, x.at) if x is not None else None for x in (b.live, b.replay, b.ceiling)]
                    for o, b in svc.gate._buckets.items()},
        # (the batch path keeps no entry id, oseq or src: what a retry needs is the same)
        "deferred": {net: (ev.op, ev.until, ev.origin, ev.ts) for net, (_o, _sid, ev) in svc._deferred.items()},
        "cursor": svc._cursors, "lag": svc.stats.lag_last,
    }


@settings(max_examples=300, deadline=None)
@given(reads(), st.booleans())
def test_the_batch_path_does_what_the_entry_by_entry_path_does(batches: list[list[Entry]], permanent: bool) -> None:
    async def run() -> None:
        ref = service(batch=False, allow_permanent=permanent)
        fast = service(batch=True, allow_permanent=permanent)
        for read in batches:
            await ref._apply(read, "h1")
            await fast._apply(read, "h1")
            assert observed(fast) == observed(ref)
        assert isinstance(fast.sink, FakeSink)
        for call in fast.sink.calls:  # the decoder's ends in ms travel only where they are the ends', in ms
            for h in call.hosts:
                assert h.ends_ms is None or h.ends_ms == tuple(int(e * 1000) for e in h.ends)

    asyncio.run(run())


@settings(max_examples=300, deadline=None)
@given(st.lists(any_fields(), min_size=1, max_size=20))
def test_plain_bans_agrees_with_decode(fields: list[dict[bytes, Any]]) -> None:
    entries = [((1_700_000_000_000 + i, 0), f) for i, f in enumerate(fields)]
    plain = plain_bans(entries, ME)
    others = [f for f in fields if f.get(b"origin") != ME]
    events = [decode(f) for f in others]
    if plain is None:  # something in the read is not a plain ban, or not well formed
        assert not all(isinstance(e, FleetEvent) and e.op == "ban" and b"/" not in f[b"net"]
                       and all(type(v) is bytes for v in f.values()) for e, f in zip(events, others, strict=True))
        return
    assert sum(plain.own.values()) == len(fields) - len(others)
    assert len(plain.keys) == len(others)
    for i, ev in enumerate(events):
        assert isinstance(ev, FleetEvent) and ev.op == "ban"
        assert ev.net.prefixlen == ev.net.max_prefixlen
        assert (plain.versions[i], plain.keys[i]) == (ev.net.version, int(ev.net.network_address))
        assert (plain.untils[i], plain.origins[i], plain.ts[i]) == (ev.until, ev.origin, ev.ts)


def test_a_read_of_plain_bans_reaches_the_sink_as_host_keys_and_a_mixed_read_entry_by_entry() -> None:
    def ban(net: bytes, until: float = NOW + 60) -> dict[bytes, Any]:
        return {b"v": b"2", b"op": b"ban", b"net": net, b"until": repr(until).encode(), b"origin": b"h1",
                b"oseq": b"1"}

    async def run() -> FakeSink:
        svc = service(batch=True, allow_permanent=False)
        await svc._apply([((1, 0), ban(b"10.0.0.1")), ((1, 1), ban(b"10.0.0.2")), ((1, 2), ban(b"10.0.0.1", NOW + 90))],
                         "h1")
        await svc._apply([((2, 0), ban(b"10.0.0.3")), ((2, 1), ban(b"10.0.1.0/24"))], "h1")
        assert isinstance(svc.sink, FakeSink)
        return svc.sink

    sink = asyncio.run(run())
    first, second = sink.calls
    assert not first.bans and [(h.version, h.origin, h.keys, h.ends, h.ends_ms) for h in first.hosts] == [
        (4, "h1", (0x0A000001, 0x0A000002), (NOW + 90, NOW + 60), (int((NOW + 90) * 1000), int((NOW + 60) * 1000)))]
    assert not second.hosts and len(second.bans) == 2


def test_check_hosts_takes_tokens_in_order_as_check_does() -> None:
    """Two origins interleaved, a burst of 3, 1 token/s: the same refusals as `check` one by one."""
    lim = TrustLimits(rate=1.0, burst=3)
    allow = build_allowlist([], include_self=False)
    origins = ["a", "b", "a", "a", "a", "b", "a", "a"]
    ats = [0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 1.0, 3.0]
    keys = [0x0A000001 + i for i in range(len(origins))]
    batch = Gate(lim, allow).check_hosts(origins, ats, [4] * len(keys), keys, [math.inf] * len(keys), 0.0)
    one = Gate(lim, allow)
    expected = {i for i, (o, at) in enumerate(zip(origins, ats, strict=True)) if not one._rate_ok(o, at)}
    assert set(batch.refused) == expected == {4}
