"""The recent log lines of each offender of one jail, for the actions its bans run (`{matches}`, `<matches>`).

Only jails with an action that shows them keep lines (`keep`; ActionHub decides, see actions/hub.py): the
tracker itself keeps times, never text. Bounded: at most `max_hosts`
offenders (those first seen longest ago are forgotten first, a sixteenth of them at once), the last
`max_lines` lines each, and at most
`max_hosts` decided bans waiting for their actions (JailRunner moves an offender's lines there when the
tracker bans it; the action side takes them once the kernel holds the ban). Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice
from typing import Any, NamedTuple

from nftblockd.addr import IPAddr, IPNet


def _forget_oldest(d: dict[Any, Any], max_hosts: int) -> None:
    """Drop the oldest sixteenth of `d` (at least one entry). One at a time, `del d[next(iter(d))]` cost a
    scan over every entry deleted before it (a dict only compacts when it grows): with more offenders than
    `max_hosts` that scan was 20 % of a jail's matching (bench_jailmem, 50k offenders)."""
    for k in list(islice(d, max(1, max_hosts // 16))):
        del d[k]


class Recent(NamedTuple):
    failures: int
    lines: tuple[str, ...]
    fields: tuple[tuple[str, str], ...]  # the last match's <F-...> captures


class MatchMemory:
    __slots__ = ("_decided", "_keep", "_lines", "_shift", "max_hosts", "max_lines")

    def __init__(self, ipv6_prefix: int = 64, *, max_hosts: int = 10_000, max_lines: int = 20) -> None:
        self._keep = True
        self._shift = 128 - ipv6_prefix
        self.max_hosts = max_hosts
        self.max_lines = max_lines
        # key -> [failures, lines, fields]: a mutable entry, so a failure costs an append, not a new tuple
        # (the memory cost 50 % of a jail's matching with a tuple per failure; see the commit that made it)
        self._lines: dict[int, list[Any]] = {}
        self._decided: dict[IPNet, Recent] = {}

    @property
    def keep(self) -> bool:
        """Whether the jail's failures are to be added: False when none of its actions shows an offender's
        lines, captures or failure count (JailRunner then skips `add` altogether)."""
        return self._keep

    @keep.setter
    def keep(self, on: bool) -> None:
        if not on:  # nothing will take what is kept: let it go
            self._lines.clear()
            self._decided.clear()
        self._keep = on

    def _key(self, host: IPAddr) -> int:
        # IPv4 keys are the address, IPv6 keys the prefix as a negative number: the two never meet
        return int(host) if host.version == 4 else -1 - (int(host) >> self._shift)

    def add(self, host: IPAddr, line: str, fields: Mapping[str, str]) -> None:
        key = self._key(host)
        d = self._lines
        entry = d.get(key)
        if entry is None:
            if len(d) >= self.max_hosts:
                _forget_oldest(d, self.max_hosts)
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
            _forget_oldest(self._decided, self.max_hosts)
        count, lines, fields = got
        self._decided[target] = Recent(count, tuple(lines), tuple(fields.items()))

    def take(self, target: IPNet) -> Recent | None:
        return self._decided.pop(target, None)

    def __len__(self) -> int:
        return len(self._lines) + len(self._decided)


__all__ = ["MatchMemory", "Recent"]
