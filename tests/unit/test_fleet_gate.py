"""Trust gate: limits, never-ban space, allowlist and own addresses, clamping and the per-origin rate cap."""

from __future__ import annotations

import ipaddress
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.allowlist import build_allowlist
from nftblockd.fleet import gate as gate_mod
from nftblockd.fleet.codec import FleetEvent, Rejection
from nftblockd.fleet.gate import FLOOD_FACTOR, REPLAY_AGE, Accepted, Gate, TrustLimits

N = ipaddress.ip_network
A = ipaddress.ip_address
NOW = 1_700_000_000.0


def _gate(**kw: object) -> Gate:
    allow = build_allowlist([N("192.0.2.0/24")], [A("198.51.100.10"), A("2001:db8::10")])
    return Gate(TrustLimits(**kw), allow)  # type: ignore[arg-type]


def _ev(net: str, until: float = NOW + 3600, op: str = "ban", origin: str = "web-02") -> FleetEvent:
    return FleetEvent(op, N(net), until, origin, 1, "jail:sshd", 0)  # type: ignore[arg-type]


def _reason(r: Accepted | Rejection) -> str:
    return r.reason if isinstance(r, Rejection) else "ok"


@pytest.mark.parametrize(("net", "reason"), [
    ("203.0.113.7/32", "ok"),
    ("203.0.113.0/24", "ok"),
    ("203.0.0.0/16", "ok"),
    ("203.0.0.0/15", "too_wide"),
    ("0.0.0.0/0", "too_wide"),
    ("::/0", "too_wide"),
    ("2001:db8:1::/48", "ok"),
    ("2001:db8::/47", "too_wide"),
    ("192.0.2.55/32", "allowlisted"),
    ("198.51.100.10/32", "allowlisted"),  # the host's own address
    ("198.51.100.0/24", "allowlisted"),  # a range around it
    ("2001:db8::/64", "allowlisted"),
    ("127.0.0.1/32", "never_ban"),
    ("0.0.0.0/32", "never_ban"),
    ("255.255.255.255/32", "never_ban"),
    ("224.0.0.251/32", "never_ban"),
    ("240.1.0.0/16", "never_ban"),
    ("169.254.1.1/32", "never_ban"),
    ("::/128", "never_ban"),
    ("fe80::1/128", "never_ban"),
    ("ff02::1/128", "never_ban"),
    ("10.1.2.3/32", "ok"),  # private space is bannable: a fleet may need to stop an inside host
])
def test_targets(net: str, reason: str) -> None:
    assert _reason(_gate().check(_ev(net), NOW, NOW)) == reason


def test_never_ban_overlap_both_ways() -> None:
    g = _gate(min_prefix_v4=1)
    r = g.check_net(N("224.0.0.0/3"))  # the shared never-ban table (neverban.py), overlap counts
    assert r is not None and r.reason == "never_ban" and "224.0.0.0/4" in r.detail
    assert g.check_net(N("8.8.8.8/32")) is None


def test_clamping() -> None:
    g = _gate(max_ban=3600.0)
    r = g.check(_ev("203.0.113.7/32", NOW + 86400), NOW, NOW)
    assert isinstance(r, Accepted) and r.until == NOW + 3600 and r.clamped
    r = g.check(_ev("203.0.113.7/32", math.inf), NOW, NOW)
    assert isinstance(r, Accepted) and r.until == NOW + 3600 and r.clamped
    r = g.check(_ev("203.0.113.7/32", NOW + 0.2), NOW, NOW)
    assert isinstance(r, Accepted) and r.until == NOW + 1.0  # at least one second
    assert _reason(g.check(_ev("203.0.113.7/32", NOW - 1), NOW, NOW)) == "expired"
    r = _gate(allow_permanent=True).check(_ev("203.0.113.7/32", math.inf), NOW, NOW)
    assert isinstance(r, Accepted) and r.until == math.inf and not r.clamped


def test_unbans_skip_the_target_checks() -> None:
    r = _gate().check(_ev("127.0.0.1/32", 0.0, "unban"), NOW, NOW)
    assert isinstance(r, Accepted) and r.event.op == "unban"


def test_rate_cap_per_origin_on_server_time() -> None:
    g = _gate(rate=10.0, burst=5)
    results = [_reason(g.check(_ev("203.0.113.7/32"), NOW, NOW)) for _ in range(7)]
    assert results == ["ok"] * 5 + ["rate"] * 2
    # another origin has its own bucket
    assert _reason(g.check(_ev("203.0.113.7/32", origin="web-03"), NOW, NOW)) == "ok"
    # 0.35 s of server time refills 3 tokens at 10/s
    results = [_reason(g.check(_ev("203.0.113.7/32"), NOW, NOW + 0.35)) for _ in range(4)]
    assert results == ["ok"] * 3 + ["rate"]
    # a replay hours later goes at the pace the entries were written: their server time, not ours
    g2 = _gate(rate=10.0, burst=5)
    late = _ev("203.0.113.7/32", NOW + 9000)
    ok = sum(_reason(g2.check(late, NOW + 7200, NOW + i * 0.1)) == "ok" for i in range(100))
    assert ok == 100


def test_origin_memory_is_bounded() -> None:
    g = Gate(TrustLimits(), build_allowlist([]), max_origins=3)
    for i in range(10):
        g.check(_ev("203.0.113.7/32", origin=f"h{i}"), NOW, NOW)
    assert len(g._buckets) == 3


def _at(i: int, ts_ms: int, origin: str = "web-02") -> FleetEvent:
    return FleetEvent("ban", N(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}/32"), NOW + 3600, origin, i,
                      "jail:sshd", ts_ms)


def test_a_backlog_flushed_at_once_passes_at_the_pace_it_was_decided() -> None:
    """Issue #23: 30,000 bans decided over 20 minutes (25/s) and published in one second after an outage were
    22-25 % refused by the server-time bucket. Paced by their own times, all pass."""
    g = _gate(rate=2000.0, burst=20000)
    decided0 = NOW - 1300
    results = [_reason(g.check(_at(i, int((decided0 + i / 25) * 1000)), NOW, NOW + i / 30000))
               for i in range(30000)]
    assert results.count("ok") == 30000


def test_a_flood_decided_now_is_still_capped() -> None:
    g = _gate(rate=2000.0, burst=20000)
    results = [_reason(g.check(_at(i, int(NOW * 1000)), NOW, NOW + i / 30000)) for i in range(30000)]
    assert 20000 <= results.count("ok") <= 20000 + 2000 and results.count("rate") >= 8000


def test_forged_old_times_buy_at_most_the_flood_ceiling() -> None:
    """A peer claiming old decision times, spread at exactly `rate`, passes the replay bucket; the ceiling by
    server time (FLOOD_FACTOR x burst at once) still holds it."""
    g = _gate(rate=100.0, burst=100)
    n = 5000
    results = [_reason(g.check(_at(i, int((NOW - 3600 + i / 100) * 1000)), NOW, NOW)) for i in range(n)]
    assert results.count("ok") == 100 * FLOOD_FACTOR


def test_replays_and_live_events_have_separate_buckets() -> None:
    g = _gate(rate=10.0, burst=5)
    live = [_reason(g.check(_at(i, int(NOW * 1000)), NOW, NOW)) for i in range(6)]
    replay = [_reason(g.check(_at(100 + i, int((NOW - 600 + i) * 1000)), NOW, NOW)) for i in range(6)]
    assert live == ["ok"] * 5 + ["rate"]
    assert replay == ["ok"] * 6  # one a second of decision time: within the replay bucket's pace
    assert REPLAY_AGE > 0


@given(st.lists(st.floats(-10.0, 8 * 86400.0) | st.just(math.inf), min_size=1, max_size=30), st.booleans())
def test_check_hosts_clamps_every_end_as_clamp_does(offsets: list[float], permanent: bool) -> None:
    """Ends all within [now + 1 s, now + max_ban] are left as they are without a `clamp` each: the same answer."""
    gate = _gate(rate=1e9, burst=10**9, allow_permanent=permanent)
    untils = [NOW + o for o in offsets]
    _hosts_as_clamp(gate, untils, NOW)


def _hosts_as_clamp(gate: Gate, untils: list[float], now: float) -> None:
    """`check_hosts` of bans ending at `untils` answers for each what `clamp` does (the rate cap out of play)."""
    n = len(untils)
    got = gate.check_hosts(["h"] * n, [now] * n, [4] * n, [0x08080808 + i for i in range(n)], untils, now)
    for i, u in enumerate(untils):
        c = gate.clamp(u, now)
        if isinstance(c, Rejection):
            assert got.refused[i].reason == c.reason
        else:
            assert i not in got.refused and got.ends[i] == c[0]


_finite = st.floats(allow_nan=False, allow_infinity=False)


@given(_finite, st.floats(0.0, 1e12, exclude_min=True), st.booleans(),
       st.lists(_finite | st.just(math.inf) | st.floats(-2.0, 2.0), min_size=1, max_size=12),
       st.sampled_from([0.0, 1.0, 0.5]))
def test_check_hosts_shortcut_equals_clamp_for_any_now_and_limit(now: float, max_ban: float, permanent: bool,
                                                                 values: list[float], near: float) -> None:
    """`check_hosts`' shortcut (no `clamp` when the earliest and latest ends need none) against `clamp` itself,
    for any time and limit: ends near `now` (`near`: offsets from it), far from it, at 2**53 s and beyond
    (where `now + 1.0` is `now`), permanent."""
    gate = Gate(TrustLimits(max_ban=max_ban, allow_permanent=permanent, rate=1e9, burst=10**9),
                build_allowlist([]))
    _hosts_as_clamp(gate, [now + v * max_ban + near if abs(v) <= 2.0 else v for v in values], now)


@pytest.mark.parametrize("now", [2.0**53, 2.0**60])
def test_check_hosts_refuses_an_end_at_now_when_now_plus_a_second_rounds_to_now(now: float) -> None:
    gate = Gate(TrustLimits(rate=1e9, burst=10**9), build_allowlist([]))
    assert now + 1.0 == now and isinstance(gate.clamp(now, now), Rejection)
    got = gate.check_hosts(["h"], [now], [4], [0x08080808], [now], now)
    assert got.refused[0].reason == "expired"


def _buckets(g: Gate) -> dict[str, tuple[float, float, tuple[float, float] | None, float, float]]:
    return {o: (b.live.tokens, b.live.at, None if b.replay is None else (b.replay.tokens, b.replay.at),
                b.ceiling.tokens, b.ceiling.at) for o, b in g._buckets.items()}


_event = st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(0.0, 5.0), st.sampled_from([0.0, 1.0, 20.0, 600.0]))


@pytest.mark.skipif(gate_mod._take_live is None, reason="the optional C module was not built")
@given(st.lists(_event, max_size=60), st.floats(0.5, 50.0), st.integers(1, 8), st.booleans(), st.booleans())
def test_take_tokens_in_c_leaves_what_the_python_loop_leaves(events: list[tuple[str, float, float]], rate: float,
                                                            burst: int, with_decided: bool, float_ats: bool) -> None:
    """`_take_tokens` with its live runs in C (`_plain.take_live`) against the Python loop alone: the same
    refusals, in the same order, and every bucket the same to the bit, over runs of origins, replays among
    live events (decided long before), unknown decision times (0), times going back, and `at`s that are ints
    (which C leaves to Python)."""
    origins = [o for o, _t, _age in events]
    clock = NOW
    ats: list[float] = []
    decided: list[float] = []
    for _o, step, age in events:
        clock += step - 1.0  # now and then back in time
        ats.append(clock if float_ats else int(clock))
        decided.append(0.0 if age == 1.0 else clock - age)
    limits = TrustLimits(rate=rate, burst=burst)
    py, c = Gate(limits, build_allowlist([])), Gate(limits, build_allowlist([]))
    for _ in range(2):  # twice: the second pass starts from the buckets the first left
        dec = decided if with_decided else None
        take = gate_mod._take_live
        try:
            gate_mod._take_live = None
            want = py._take_tokens(list(origins), list(ats), None if dec is None else list(dec))
        finally:
            gate_mod._take_live = take
        got = c._take_tokens(list(origins), list(ats), None if dec is None else list(dec))
        assert list(got.items()) == list(want.items())
        assert _buckets(c) == _buckets(py)


def test_take_tokens_in_c_refuses_beyond_the_burst() -> None:
    """A run of one origin past its burst: the refusals the C loop makes are counted as Python's (a rate refusal
    each, in order)."""
    g = Gate(TrustLimits(rate=1.0, burst=3), build_allowlist([]))
    got = g._take_tokens(["h"] * 6, [NOW] * 6, [NOW] * 6)
    assert list(got) == [3, 4, 5] and {r.reason for r in got.values()} == {"rate"}
