"""Catch-up after a (re)connect, and the snapshot reconcile. Pure: the caller brings what it read.

How a host knows where it stands
--------------------------------
The host stores its cursor as (server `run_id`, last stream id applied). `run_id` changes whenever the
server process restarts and differs between a primary and its replicas, so it tells whether the ids the
cursor refers to belong to the history the server now has. On every connect the host reads the server's
`run_id`, the stream's first entry id, its last generated id and, where the server has it (7.0+), how many
entries were ever removed from it (entries added minus length; trimming does not move "max-deleted-entry-id",
so that field cannot tell); then `decide`:

- no cursor                               -> snapshot ("no_cursor")
- another run_id, and the server holds the entry the cursor names (same id): a promoted replica, or a
  restart that kept its data (AOF)        -> replay from the cursor, with a re-assert of own bans (`Replay.
  reassert`). A snapshot costs ~40 us per active ban on every host (a failover with 15,000 active bans
  stalled sharing 5 s instead of 2.6 s, issue #23); what the new server lacks is what its owners re-assert
- another run_id otherwise                -> snapshot ("new_server": restart without data, data loss)
- cursor beyond the last generated id     -> snapshot ("cursor_ahead": a history we never saw)
- cursor == last generated id             -> replay (nothing to read, keep blocking from there)
- every entry after the cursor still held -> replay (cursor >= first entry, or nothing ever removed)
- otherwise                               -> snapshot ("trimmed": entries after the cursor were trimmed away)

Replay is at-least-once: re-applying is harmless (a ban keeps the later end; an unban deletes if present).

Snapshot reconcile
------------------
The snapshot is the `active` sorted set (member -> end) and the `unbanned` tombstones (member -> unban time),
read atomically with the stream's last id. `reconcile` turns it into one change for the kernel:
- every gated snapshot ban is added unless the kernel already holds the address (fleet- or local-origin)
  until at least as late;
- nothing is removed because the snapshot lacks it. A server that restarted empty, a replica promoted before
  it received the last writes, or a new server all hold *less* than the fleet decided: taking their absence
  as an unban removed every host's fleet bans from its kernel until their owners re-asserted them (~1 s), and
  those of a host that was down until it came back (issue #23). A ban ends by its kernel timeout or by an
  explicit unban, nothing else;
- an explicit unban is a tombstone, and a tombstone is its owner's (each host has its own set, schema 2): a
  host's tombstone lifts only a fleet element that host banned (`FleetUnban.owner`; the sink checks) and never
  a local-origin ban, so a snapshot never removes a ban this host made itself; an operator's tombstone lifts
  a fleet-origin element the snapshot does not hold active (a later ban would), and a local-origin ban only
  when the tombstone is *newer* than it: an unban before this host decided its own ban does not cancel it.

Re-assert
---------
After a snapshot, this host's own still-active recent bans whose `active` score is missing or lower are
published again (`reassert`): this repairs writes a primary acknowledged and lost in a failover. A ban the
snapshot shows tombstoned after we made it is not resurrected.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from nftblockd.addr import IPNet
from nftblockd.events import FleetBan, FleetChange, FleetHosts, FleetUnban, LocalBan  # values shared with kernel/

StreamId: TypeAlias = tuple[int, int]  # (milliseconds, sequence)


def parse_id(text: str | bytes) -> StreamId:
    """`"1700000000000-3"` -> (1700000000000, 3); raises ValueError for anything else."""
    if type(text) is bytes:  # what the server sends, once per entry read: no decode (~0.7x the time)
        ms_b, sep_b, seq_b = text.partition(b"-")
        if sep_b and ms_b.isdigit() and seq_b.isdigit():
            return int(ms_b), int(seq_b)
    if not isinstance(text, (str, bytes)):  # (a broken server's reply: an int, a list, None)
        raise ValueError(f"not a stream id: {text!r}")
    s = text.decode() if isinstance(text, bytes) else text  # (UnicodeDecodeError is a ValueError)
    ms, sep, seq = s.partition("-")
    if not ms.isdigit() or (sep and not seq.isdigit()):
        raise ValueError(f"not a stream id: {s!r}")
    return int(ms), int(seq or 0)


def format_id(sid: StreamId) -> str:
    return f"{sid[0]}-{sid[1]}"


def before(sid: StreamId) -> StreamId:
    """The greatest stream id below `sid` (a cursor that reads `sid` next); (0, 0) stays."""
    if sid[1] > 0:
        return sid[0], sid[1] - 1
    return (sid[0] - 1, 2**64 - 1) if sid[0] > 0 else (0, 0)


@dataclass(frozen=True, slots=True)
class Cursor:
    run_id: str
    last_id: StreamId


@dataclass(frozen=True, slots=True)
class ServerView:
    run_id: str
    first_id: StreamId | None  # None: the stream is empty or absent
    last_generated: StreamId  # (0, 0) when the stream never existed
    removed: int | None = None  # entries ever trimmed or deleted (Redis >= 7.0); None when unknown
    holds_cursor: bool = False  # the stream holds an entry with exactly the cursor's id


@dataclass(frozen=True, slots=True)
class Replay:
    after: StreamId
    reassert: bool = False  # another server (failover, restart): re-assert own bans it may have lost


SnapshotWhy: TypeAlias = Literal["no_cursor", "new_server", "cursor_ahead", "trimmed"]


@dataclass(frozen=True, slots=True)
class Snapshot:
    why: SnapshotWhy


def decide(saved: Cursor | None, server: ServerView) -> Replay | Snapshot:
    if saved is None:
        return Snapshot("no_cursor")
    if saved.run_id != server.run_id:
        if server.holds_cursor and saved.last_id != (0, 0):
            return Replay(saved.last_id, reassert=True)
        return Snapshot("new_server")
    cur = saved.last_id
    if cur > server.last_generated:
        return Snapshot("cursor_ahead")
    if cur == server.last_generated:
        return Replay(cur)
    if server.first_id is not None and cur >= server.first_id:
        return Replay(cur)
    if server.removed == 0:
        return Replay(cur)  # nothing was ever removed: the cursor merely sits before the first entry
    return Snapshot("trimmed")


# -- reconcile -------------------------------------------------------------------------------------------


def reconcile(active: Mapping[IPNet, float], tombstones: Mapping[IPNet, float],
              fleet_elements: Mapping[IPNet, float], local: Mapping[IPNet, LocalBan], *,
              owner: str | None = None, origin: str = "") -> FleetChange:
    """The change that makes the kernel agree with one owner's snapshot (`origin`: the host whose keys these
    are; `owner`: whose bans its tombstones lift, None for the operator's). `active` must already be gated and
    clamped."""
    bans = []
    for net, until in active.items():
        have = fleet_elements.get(net)
        lb = local.get(net)
        best = max(have if have is not None else -math.inf, lb.until if lb is not None else -math.inf)
        if best < until:
            bans.append(FleetBan(net, until, origin))
    unbans = []
    for net, at in tombstones.items():
        if net in active:
            continue  # banned again after the unban (a ban's publish removes the tombstone; a race otherwise)
        if net in fleet_elements:
            unbans.append(FleetUnban(net, None, owner))
            continue
        lb = local.get(net)
        if owner is None and lb is not None and at > lb.created:
            unbans.append(FleetUnban(net, at))
    return FleetChange(tuple(bans), tuple(unbans))


@dataclass(frozen=True, slots=True)
class OwnBan:
    """One of this host's published bans, from its outbox."""

    oseq: int
    net: IPNet
    until: float
    src: str
    created: float


def reassert(own: Iterable[OwnBan], active: Mapping[IPNet, float], tombstones: Mapping[IPNet, float],
             now: float) -> list[OwnBan]:
    """Own bans to publish again: still running, missing or shorter on the server, not tombstoned since."""
    out = []
    for b in own:
        if b.until <= now:
            continue
        if active.get(b.net, -math.inf) >= b.until:
            continue
        t = tombstones.get(b.net)
        if t is not None and t >= b.created:
            continue
        out.append(b)
    return out


__all__ = [
    "Cursor", "FleetBan", "FleetChange", "FleetHosts", "FleetUnban", "LocalBan", "OwnBan", "Replay", "ServerView",
    "Snapshot", "StreamId", "before", "decide", "format_id", "parse_id", "reassert", "reconcile",
]
