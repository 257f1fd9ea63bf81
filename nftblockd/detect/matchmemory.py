"""The recent log lines of each offender of one jail, for the actions its bans run (`{matches}`, `<matches>`).

Only jails with actions keep one: the tracker itself keeps times, never text. Bounded: at most `max_hosts`
offenders (the one first seen longest ago is forgotten first), the last `max_lines` lines each, and at most
`max_hosts` decided bans waiting for their actions (JailRunner moves an offender's lines there when the
tracker bans it; the action side takes them once the kernel holds the ban). Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from nftblockd.addr import IPAddr, IPNet


class Recent(NamedTuple):
    failures: int
    lines: tuple[str, ...]
    fields: tuple[tuple[str, str], ...]  # the last match's <F-...> captures


class MatchMemory:
    __slots__ = ("_decided", "_lines", "_shift", "max_hosts", "max_lines")

    def __init__(self, ipv6_prefix: int = 64, *, max_hosts: int = 10_000, max_lines: int = 20) -> None:
        self._shift = 128 - ipv6_prefix
        self.max_hosts = max_hosts
        self.max_lines = max_lines
        # key -> [failures, lines, fields]: a mutable entry, so a failure costs an append, not a new tuple
        # (the memory cost 50 % of a jail's matching with a tuple per failure; see the commit that made it)
        self._lines: dict[int, list[Any]] = {}
        self._decided: dict[IPNet, Recent] = {}

    def _key(self, host: IPAddr) -> int:
        # IPv4 keys are the address, IPv6 keys the prefix as a negative number: the two never meet
        return int(host) if host.version == 4 else -1 - (int(host) >> self._shift)

    def add(self, host: IPAddr, line: str, fields: Mapping[str, str]) -> None:
        key = self._key(host)
        d = self._lines
        entry = d.get(key)
        if entry is None:
            if len(d) >= self.max_hosts:  # the offender first seen longest ago is forgotten
                del d[next(iter(d))]
            d[key] = [1, [line], fields]
            return
        entry[0] += 1
        lines = entry[1]
        lines.append(line)
        if len(lines) > self.max_lines:
            del lines[0]
        entry[2] = fields

    def decided(self, host: IPAddr, target: IPNet) -> None:
        """The tracker banned `host` as `target`: its lines wait for the ban's actions."""
        got = self._lines.pop(self._key(host), None)
        if got is None:
            return
        if len(self._decided) >= self.max_hosts:
            del self._decided[next(iter(self._decided))]
        count, lines, fields = got
        self._decided[target] = Recent(count, tuple(lines), tuple(fields.items()))

    def take(self, target: IPNet) -> Recent | None:
        return self._decided.pop(target, None)

    def __len__(self) -> int:
        return len(self._lines) + len(self._decided)


__all__ = ["MatchMemory", "Recent"]
