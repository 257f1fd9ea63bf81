"""Pure subnet escalation: bans in, prefix-ban decisions out, one small state machine per (blocklist, prefix).

This module never does IO, never reads the clock (every call takes `now`, wall-clock epoch seconds) and never
bans anything itself: the daemon shows it the bans a blocklist received (its jails' and, in fleet mode, the
fleet's) and applies the `Escalate` decisions it returns through the ordinary ban path (the enforcer, which
writes the prefix to the blocklist's interval set, persists it and writes the audit line). It must not be
shown its own prefix bans (they are wider than the prefix and ignored anyway) nor feed entries.

Rules
=====

Prefix. A ban of target T in a blocklist with `subnet_escalation` counts for the /`ipv4_prefix` (IPv4) or
/`ipv6_prefix` (IPv6) network P around T. A target as wide as P or wider (a range ban, an earlier escalation)
counts for nothing. Distinct targets count, not bans: the same address banned again (a re-ban, a longer end
from recidive, a fleet ban of an address this host banned itself) is one.

States, per (blocklist, P):

    IDLE ──ban inside P──► COUNTING ──threshold-th distinct target within window──► decide
      ▲                       │                                                    │       │
      └── no ban inside P ────┘       ESCALATED ◄── Escalate (the prefix is OK) ───┘       │
          for window (or evicted)        │                                                 │
      ▲                                  └── its bantime passes ──► IDLE                   │
      └────────────────────────────────────────── Refused (the prefix is not) ─────────────┘

  IDLE       nothing is stored.
  COUNTING   target -> time of its latest ban, for the targets banned within the last `window` (fewer than
             `threshold` of them; older ones are dropped whenever P is looked at).
  decide     P is checked as a whole, like any ban: a prefix that touches never-ban space (neverban.py) is
             refused as `never_ban`; one that contains any allowlisted address (the global allowlist, this
             host's own addresses) is refused as `allowlisted`: a prefix holding an allowed neighbour is never
             banned, whatever its other addresses did. Otherwise `Escalate(P, until = now + bantime)` names
             the targets that made it. Either way the counts of P are cleared.
  ESCALATED  P is banned until `until`: bans inside it are ignored (the prefix ban covers them) until then.

Memory. At most `max_prefixes` (a per-blocklist setting) COUNTING prefixes per blocklist, each holding fewer
than `threshold` targets, plus at most as many ESCALATED prefixes (each one a prefix ban in the kernel). The
prefixes of a blocklist are kept in the order they were last touched; when the cap bites the least recently
touched one is dropped (`evicted` counts them): it is either stale (nothing banned inside it for a window) or
the coldest partial count. ESCALATED entries are dropped when their ban ends, and the oldest first when the
cap bites. A fleet of bans spread one per prefix over more than `max_prefixes` prefixes within a window can
thus push out a partial count; it cannot make a prefix ban happen.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from nftblockd.addr import IPNet, format_host, format_target
from nftblockd.allowlist import Allowlist
from nftblockd.config import SubnetEscalation
from nftblockd.neverban import never_ban_range

JAIL = "subnet-escalation"  # the `jail` of an escalation's Ban (no configured jail can be named so)


class Escalate(NamedTuple):
    """Ban `prefix` in `blocklist` until `until`: `targets` (text, in order of their latest ban) were banned
    inside it."""

    blocklist: str
    prefix: IPNet
    until: float
    targets: tuple[str, ...]

    def reason(self) -> str:
        shown = ", ".join(self.targets[:8]) + (", ..." if len(self.targets) > 8 else "")
        return f"subnet: {len(self.targets)} bans in {format_target(self.prefix)} ({shown})"


class Refused(NamedTuple):
    """The threshold was reached in `prefix`, but the prefix may not be banned (`reason`: never_ban or
    allowlisted; `detail` says which entry)."""

    blocklist: str
    prefix: IPNet
    reason: str
    detail: str
    targets: tuple[str, ...]


@dataclass(slots=True)
class SubnetStats:
    escalated: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # per reason
    evicted: int = 0  # partial counts dropped by the cap


class _List:
    """One blocklist's prefixes: (version, prefix start) -> {target key -> time}, least recently touched first;
    and the ESCALATED prefixes -> until."""

    __slots__ = ("counting", "escalated", "policy")

    def __init__(self, policy: SubnetEscalation) -> None:
        self.policy = policy
        self.counting: dict[tuple[int, int], dict[tuple[int, int], float]] = {}
        self.escalated: dict[tuple[int, int], float] = {}


class SubnetEscalator:
    """The rules above for the blocklists in `policies`; `allow` is replaced when the allowlist changes."""

    def __init__(self, policies: Mapping[str, SubnetEscalation], allow: Allowlist) -> None:
        self.allow = allow
        self.stats = SubnetStats()
        self._lists = {name: _List(p) for name, p in policies.items()}

    def watches(self, blocklist: str) -> bool:
        return blocklist in self._lists

    def tracked(self) -> int:
        """COUNTING prefixes, all blocklists (a gauge)."""
        return sum(len(x.counting) for x in self._lists.values())

    def observe(self, blocklist: str, target: IPNet, now: float) -> Escalate | Refused | None:
        """A ban of `target` was applied in `blocklist` at `now`."""
        return self.observe_key(blocklist, target.version, int(target.network_address), target.prefixlen, now)

    def observe_hosts(self, blocklist: str, version: int, keys: Iterable[int], now: float) -> list[Escalate | Refused]:
        """Bans of single addresses (host keys of IP `version`), all applied at `now`."""
        out: list[Escalate | Refused] = []
        if blocklist not in self._lists:
            return out
        bits = 32 if version == 4 else 128
        for k in keys:
            d = self.observe_key(blocklist, version, k, bits, now)
            if d is not None:
                out.append(d)
        return out

    def observe_key(self, blocklist: str, version: int, start: int, prefixlen: int,
                    now: float) -> Escalate | Refused | None:
        lst = self._lists.get(blocklist)
        if lst is None:
            return None
        pol = lst.policy
        bits = 32 if version == 4 else 128
        plen = pol.ipv4_prefix if version == 4 else pol.ipv6_prefix
        if prefixlen <= plen:
            return None  # as wide as the prefix or wider: an escalation itself, or a range ban
        pstart = start >> (bits - plen) << (bits - plen)
        pkey = (version, pstart)
        until = lst.escalated.get(pkey)
        if until is not None:
            if until > now:
                return None
            del lst.escalated[pkey]
        seen = lst.counting.pop(pkey, None)  # popped and put back: the dict's order is last touched
        if seen is None:
            seen = {}
            if len(lst.counting) >= pol.max_prefixes:
                del lst.counting[next(iter(lst.counting))]
                self.stats.evicted += 1
        else:
            horizon = now - pol.window
            if min(seen.values()) <= horizon:
                seen = {t: at for t, at in seen.items() if at > horizon}
        seen.pop((start, prefixlen), None)  # a re-ban moves to the end: `targets` stays oldest first
        seen[(start, prefixlen)] = now
        if len(seen) < pol.threshold:
            lst.counting[pkey] = seen
            return None
        return self._decide(blocklist, lst, version, pstart, plen, seen, now)

    def _decide(self, blocklist: str, lst: _List, version: int, pstart: int, plen: int,
                seen: dict[tuple[int, int], float], now: float) -> Escalate | Refused:
        bits = 32 if version == 4 else 128
        last = pstart | ((1 << (bits - plen)) - 1)
        prefix = _net(version, pstart, plen)
        targets = tuple(format_host(s, version) if p == bits else format_target(_net(version, s, p))
                        for s, p in seen)
        why = never_ban_range(version, pstart, last)
        if why is not None:
            return self._refuse(Refused(blocklist, prefix, "never_ban", why, targets))
        entry = self.allow.contains_range(version, pstart, last)
        if entry is not None:
            return self._refuse(Refused(blocklist, prefix, "allowlisted", f"contains allowlist entry {entry}",
                                        targets))
        if len(lst.escalated) >= lst.policy.max_prefixes:
            live = {p: u for p, u in lst.escalated.items() if u > now}
            while len(live) >= lst.policy.max_prefixes:
                del live[min(live, key=live.__getitem__)]
            lst.escalated = live
        until = now + lst.policy.bantime
        lst.escalated[(version, pstart)] = until
        self.stats.escalated += 1
        return Escalate(blocklist, prefix, until, targets)

    def _refuse(self, r: Refused) -> Refused:
        self.stats.refused[r.reason] = self.stats.refused.get(r.reason, 0) + 1
        return r

    def forget(self, blocklist: str, prefix: IPNet) -> None:
        """The prefix ban is gone before its end (an unban, the kernel refused it): count afresh."""
        lst = self._lists.get(blocklist)
        if lst is not None:
            lst.escalated.pop((prefix.version, int(prefix.network_address)), None)


def _net(version: int, start: int, prefixlen: int) -> IPNet:
    if version == 4:
        return ipaddress.IPv4Network((start, prefixlen))
    return ipaddress.IPv6Network((start, prefixlen))


__all__ = ["JAIL", "Escalate", "Refused", "SubnetEscalator", "SubnetStats"]
