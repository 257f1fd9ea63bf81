"""Catch-up decision (replay or snapshot), snapshot reconcile and re-assert of own bans."""

from __future__ import annotations

import ipaddress
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.addr import IPNet
from nftblockd.fleet.catchup import (
    Cursor,
    FleetBan,
    FleetUnban,
    LocalBan,
    OwnBan,
    Replay,
    ServerView,
    Snapshot,
    decide,
    format_id,
    parse_id,
    reassert,
    reconcile,
)

N = ipaddress.ip_network
NOW = 1_700_000_000.0


def test_ids() -> None:
    assert parse_id(b"1700000000000-3") == (1700000000000, 3)
    assert parse_id("5") == (5, 0)
    assert format_id((5, 2)) == "5-2"
    for bad in ("", "a-1", "1-", "-1", "1-2-3"):
        with pytest.raises(ValueError):
            parse_id(bad)


@given(st.text(alphabet="0123456789-a ", max_size=30))
def test_an_id_in_bytes_reads_as_in_text(text: str) -> None:
    # the bytes path (no decode) against the text path it shortcuts
    try:
        want: tuple[int, int] | None = parse_id(text)
    except ValueError:
        want = None
    try:
        got: tuple[int, int] | None = parse_id(text.encode())
    except ValueError:
        got = None
    assert got == want


V = ServerView("R1", first_id=(100, 0), last_generated=(200, 5))


@pytest.mark.parametrize(("saved", "server", "want"), [
    (None, V, Snapshot("no_cursor")),
    (Cursor("R0", (150, 0)), V, Snapshot("new_server")),
    (Cursor("R1", (300, 0)), V, Snapshot("cursor_ahead")),
    (Cursor("R1", (200, 5)), V, Replay((200, 5))),
    (Cursor("R1", (150, 0)), V, Replay((150, 0))),
    (Cursor("R1", (100, 0)), V, Replay((100, 0))),
    (Cursor("R1", (99, 9)), V, Snapshot("trimmed")),
    (Cursor("R1", (99, 9)), ServerView("R1", (100, 0), (200, 5), removed=0), Replay((99, 9))),
    (Cursor("R1", (99, 9)), ServerView("R1", (100, 0), (200, 5), removed=1), Snapshot("trimmed")),
    (Cursor("R1", (0, 0)), ServerView("R1", (100, 0), (200, 5), removed=0), Replay((0, 0))),
    (Cursor("R1", (150, 0)), ServerView("R1", None, (200, 5)), Snapshot("trimmed")),  # all trimmed by age
    (Cursor("R1", (200, 5)), ServerView("R1", None, (200, 5)), Replay((200, 5))),
    (Cursor("R1", (0, 0)), ServerView("R1", None, (0, 0)), Replay((0, 0))),  # empty fleet, first start
    # another server that holds the cursor's entry (a promoted replica, a restart with AOF): replay, re-assert
    (Cursor("R0", (150, 0)), ServerView("R1", (100, 0), (200, 5), holds_cursor=True), Replay((150, 0), True)),
    (Cursor("R0", (150, 0)), ServerView("R1", (100, 0), (200, 5)), Snapshot("new_server")),
    (Cursor("R0", (0, 0)), ServerView("R1", None, (0, 0), holds_cursor=True), Snapshot("new_server")),
])
def test_decide(saved: Cursor | None, server: ServerView, want: Replay | Snapshot) -> None:
    assert decide(saved, server) == want


@given(st.tuples(st.integers(0, 50), st.integers(0, 3)), st.tuples(st.integers(0, 50), st.integers(0, 3)),
       st.tuples(st.integers(0, 50), st.integers(0, 3)))
def test_replay_only_when_nothing_after_the_cursor_was_lost(cur: tuple[int, int], first: tuple[int, int],
                                                            last: tuple[int, int]) -> None:
    if first > last:
        first, last = last, first
    d = decide(Cursor("R", cur), ServerView("R", first, last))
    # replay is safe exactly when the cursor is inside [first, last] (or at last)
    assert isinstance(d, Replay) == (first <= cur <= last or cur == last)


A, B, C, D, E = (N(x) for x in ("203.0.113.1/32", "203.0.113.2/32", "203.0.113.3/32", "198.51.100.0/24",
                               "203.0.113.5/32"))


def test_reconcile_adds_missing_and_longer_and_removes_only_tombstoned_fleet_elements() -> None:
    change = reconcile(
        active={A: NOW + 100, B: NOW + 500, D: math.inf},
        tombstones={E: NOW - 10},
        fleet_elements={A: NOW + 100, B: NOW + 50, C: NOW + 900, E: NOW + 900},
        local={},
    )
    assert set(change.bans) == {FleetBan(B, NOW + 500, ""), FleetBan(D, math.inf, "")}
    assert change.unbans == (FleetUnban(E, None),)  # C, merely absent, stays: only an explicit unban removes


def test_an_empty_or_younger_server_never_removes_a_kernel_ban() -> None:
    """Issue #23: a server restarted without persistence (or a promoted replica that missed the last writes)
    holds less than the fleet decided; its snapshot must not unban anything here."""
    fleet = {A: NOW + 100, B: NOW + 500, D: math.inf}
    local = {C: LocalBan(NOW - 5, NOW + 1000)}
    assert not reconcile({}, {}, fleet, local)
    younger = reconcile({A: NOW + 100}, {}, fleet, local)
    assert not younger.unbans and not younger.bans


@given(st.dictionaries(st.sampled_from([A, B, C, D]), st.floats(NOW - 100, NOW + 1000)),
       st.dictionaries(st.sampled_from([A, B, C, D]), st.floats(NOW - 100, NOW + 1000)))
def test_reconcile_removes_nothing_without_a_tombstone(active: dict[IPNet, float],
                                                        fleet: dict[IPNet, float]) -> None:
    assert reconcile(active, {}, fleet, {}).unbans == ()


def test_local_bans_survive_unless_a_newer_tombstone_exists() -> None:
    change = reconcile(
        active={A: NOW + 100},
        tombstones={B: NOW - 10, C: NOW - 10},
        fleet_elements={},
        local={A: LocalBan(NOW - 5, NOW + 1000),  # already longer locally: nothing to add
               B: LocalBan(NOW - 20, NOW + 1000),  # unbanned fleet-wide after we banned it: goes
               C: LocalBan(NOW - 5, NOW + 1000)},  # we banned it after that unban: stays
    )
    assert change.bans == ()
    assert change.unbans == (FleetUnban(B, NOW - 10),)
    assert not reconcile({}, {}, {}, {})


def test_reassert_own_bans_the_server_lacks() -> None:
    own = [OwnBan(1, A, NOW + 100, "jail:sshd", NOW - 50),  # server lost it: re-assert
           OwnBan(2, B, NOW + 100, "cli", NOW - 50),  # server has it longer: fine
           OwnBan(3, C, NOW - 1, "cli", NOW - 50),  # over: nothing to say
           OwnBan(4, D, NOW + 100, "cli", NOW - 50)]  # tombstoned after we made it: do not resurrect
    out = reassert(own, active={B: NOW + 200}, tombstones={D: NOW - 20}, now=NOW)
    assert [b.oseq for b in out] == [1]
    # a tombstone older than our ban does not stop it
    assert reassert([OwnBan(5, D, NOW + 100, "cli", NOW - 5)], {}, {D: NOW - 20}, NOW)[0].oseq == 5


def test_a_hosts_tombstones_lift_only_its_own_fleet_bans_never_a_local_one() -> None:
    """Schema 2: one owner's snapshot; its bans carry its name, its tombstones name it (the sink lifts only a
    fleet element that owner banned) and never touch a local ban, however new."""
    change = reconcile(active={A: NOW + 100}, tombstones={B: NOW - 10, C: NOW - 10}, fleet_elements={B: NOW + 50},
                       local={C: LocalBan(NOW - 20, NOW + 1000)}, owner="c", origin="c")
    assert change.bans == (FleetBan(A, NOW + 100, "c"),)
    assert change.unbans == (FleetUnban(B, None, "c"),)
