"""What one acknowledged request changes in the durable state: the typed record the enforcer hands to the
persister (instead of five parallel lists). Pure value; no IO."""

from __future__ import annotations

import array
import itertools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from nftblockd.addr import IPNet
from nftblockd.ends import pack_ends
from nftblockd.events import Ban

__all__ = ["HistoryRow", "PackedBans", "StateChange", "TimedBans", "timed_bans"]

# (jail, target text, started, until): one ban in a jail's history (tracker.BanRecord.as_row)
HistoryRow = tuple[str, str, float, float | None]
# (blocklist, packed single addresses, until, origin, reason, jail): many like bans in one row. Building a
# million ipaddress objects only to store them would cost seconds.
PackedBans = tuple[str, list[bytes], float | None, str, str, str]


class TimedBans(NamedTuple):
    """Many single addresses of one label, each with its own end (a fleet catch-up of jail bans: every ban ends
    bantime after its own detection), packed as a bulk row holds them (`Store.commit(save_timed=...)`): one
    row for the lot, where `PackedBans`, one end each, made a row and three objects per ban."""

    blocklist: str
    keylen: int  # 4 (IPv4) or 16 (IPv6)
    keys: bytes  # the addresses end to end, big-endian
    ends: bytes  # one little-endian float64 per address (`ends.pack_ends`), +inf = permanent
    origin: str
    reason: str
    jail: str


def timed_bans(blocklist: str, version: int, keys: Sequence[int], untils: Sequence[float | None], origin: str,
               reason: str, jail: str) -> TimedBans:
    """`TimedBans` of host keys and their ends (None = permanent), packed by C-level passes (no bytes per key
    for IPv4)."""
    if version == 4:
        arr = array.array("I", keys)
        if sys.byteorder == "little":
            arr.byteswap()
        packed = arr.tobytes()
    else:
        rep = itertools.repeat
        packed = b"".join(map(int.to_bytes, keys, rep(16), rep("big")))  # type: ignore[arg-type]  # typeshed
    return TimedBans(blocklist, 4 if version == 4 else 16, packed, pack_ends(untils), origin, reason, jail)


@dataclass(frozen=True, slots=True)
class StateChange:
    saves: Sequence[Ban] = ()
    deletes: Sequence[tuple[str, IPNet]] = ()  # (blocklist, target)
    history: Sequence[HistoryRow] = ()
    packed_saves: Sequence[PackedBans] = ()
    packed_deletes: Sequence[tuple[str, list[bytes]]] = ()  # (blocklist, packed single addresses)
    timed_saves: Sequence[TimedBans] = ()

    def __bool__(self) -> bool:
        return bool(self.saves or self.deletes or self.history or self.packed_saves or self.packed_deletes
                    or self.timed_saves)

    @property
    def deletes_anything(self) -> bool:
        return bool(self.deletes or self.packed_deletes)

    @staticmethod
    def merge(changes: Sequence[StateChange]) -> StateChange:
        """One transaction's worth. The store runs a call's deletions before its saves, so a change that
        deletes must not be merged after saves of the same key: callers start a new merge at such a change."""
        return StateChange([x for c in changes for x in c.saves], [x for c in changes for x in c.deletes],
                           [x for c in changes for x in c.history], [x for c in changes for x in c.packed_saves],
                           [x for c in changes for x in c.packed_deletes], [x for c in changes for x in c.timed_saves])
