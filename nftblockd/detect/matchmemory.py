"""The recent log lines of each offender of one jail, for the actions its bans run (`{matches}`, `<matches>`).

Only jails with actions keep one: the tracker itself keeps times, never text. Bounded: at most `max_hosts`
offenders (the one seen longest ago is forgotten first), the last `max_lines` lines each, and at most
`max_hosts` decided bans waiting for their actions (JailRunner moves an offender's lines there when the
tracker bans it; the action side takes them once the kernel holds the ban). Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from nftblockd.addr import IPAddr, IPNet


class Recent(NamedTuple):
    failures: int
    lines: tuple[str, ...]
    fields: tuple[tuple[str, str], ...]  # the last match's <F-...> captures


class MatchMemory:
    __slots__ = ("_decided", "_lines", "ipv6_prefix", "max_hosts", "max_lines")

    def __init__(self, ipv6_prefix: int = 64, *, max_hosts: int = 10_000, max_lines: int = 20) -> None:
        self.ipv6_prefix = ipv6_prefix
        self.max_hosts = max_hosts
        self.max_lines = max_lines
        self._lines: dict[tuple[int, int], tuple[int, list[str], Mapping[str, str]]] = {}
        self._decided: dict[IPNet, Recent] = {}

    def _key(self, host: IPAddr) -> tuple[int, int]:
        n = int(host)
        return (6, n >> (128 - self.ipv6_prefix)) if host.version == 6 else (4, n)

    def add(self, host: IPAddr, line: str, fields: Mapping[str, str]) -> None:
        key = self._key(host)
        d = self._lines
        old = d.pop(key, None)  # popped and put back: the dict's order is the order offenders were last seen
        if old is None:
            if len(d) >= self.max_hosts:
                del d[next(iter(d))]
            old = (0, [], fields)
        count, lines, _f = old
        lines.append(line)
        if len(lines) > self.max_lines:
            del lines[0]
        d[key] = (count + 1, lines, fields)

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
