"""What one acknowledged request changes in the durable state: the typed record the enforcer hands to the
persister (instead of five parallel lists). Pure value; no IO."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nftblockd.addr import IPNet
from nftblockd.events import Ban

__all__ = ["HistoryRow", "PackedBans", "StateChange"]

# (jail, target text, started, until): one ban in a jail's history (tracker.BanRecord.as_row)
HistoryRow = tuple[str, str, float, float | None]
# (blocklist, packed single addresses, until, origin, reason, jail): many like bans in one row. Building a
# million ipaddress objects only to store them would cost seconds.
PackedBans = tuple[str, list[bytes], float | None, str, str, str]


@dataclass(frozen=True, slots=True)
class StateChange:
    saves: Sequence[Ban] = ()
    deletes: Sequence[tuple[str, IPNet]] = ()  # (blocklist, target)
    history: Sequence[HistoryRow] = ()
    packed_saves: Sequence[PackedBans] = ()
    packed_deletes: Sequence[tuple[str, list[bytes]]] = ()  # (blocklist, packed single addresses)

    def __bool__(self) -> bool:
        return bool(self.saves or self.deletes or self.history or self.packed_saves or self.packed_deletes)

    @property
    def deletes_anything(self) -> bool:
        return bool(self.deletes or self.packed_deletes)

    @staticmethod
    def merge(changes: Sequence[StateChange]) -> StateChange:
        """One transaction's worth. The store runs a call's deletions before its saves, so a change that
        deletes must not be merged after saves of the same key: callers start a new merge at such a change."""
        return StateChange([x for c in changes for x in c.saves], [x for c in changes for x in c.deletes],
                           [x for c in changes for x in c.history], [x for c in changes for x in c.packed_saves],
                           [x for c in changes for x in c.packed_deletes])
