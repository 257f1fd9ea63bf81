"""fail2ban's `maxlines` buffer: the last N lines of a stream (dates cut out) joined by newlines, searched by
regexes that span lines, and the lines a match used taken out of the buffer.

This follows fail2ban 1.0 (server/filter.py findFailure, server/failregex.py Regex.search): the buffer is
`"\\n".join(lines) + "\\n"`, searched with re.MULTILINE; a match takes out every line from the one it starts
in to the one it ends in, apart from the lines `<SKIPLINES>` stepped over, which stay for later matches.
`<SKIPLINES>` is `\\n(?P<skiplinesN>(?:(?:.*\\n)*?))`, as fail2ban writes it. The buffer lives in the caller's
MatchContext (the daemon keeps one per jail, as fail2ban keeps one per filter); a line without a date, or
with an empty one (`^WARNING:()**`), takes the date of the line before it, fail2ban's "last known date".
The cost: every line is searched in a window of up to N lines, on Python's `re`.

Pure: no IO, no clock; the regexes themselves are compiled and run by matcher.Filter.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["MAX_MAXLINES", "BufferedLine", "expand_skiplines", "joined", "split_match"]

# fail2ban's filters ask for up to 20; every line is searched in a window this many lines long, so it is bounded
MAX_MAXLINES = 50
_SKIP = "<SKIPLINES>"


class BufferedLine(NamedTuple):
    text: str  # the line without its date, as the regexes see it
    time: float | None  # its date, or the last one before it (fail2ban's "last known date")


def expand_skiplines(pattern: str) -> str:
    """Each `<SKIPLINES>` as fail2ban expands it: a line break, then any lines, shortest first (numbered)."""
    parts = pattern.split(_SKIP)
    out = [parts[0]]
    for n, rest in enumerate(parts[1:]):
        out.append(rf"\n(?P<skiplines{n}>(?:(?:.*\n)*?))")
        out.append(rest)
    return "".join(out)


def joined(buf: list[BufferedLine]) -> str:
    return "\n".join(b.text for b in buf) + "\n"


def split_match(m: re.Match[str], buf: list[BufferedLine]) -> tuple[list[BufferedLine], list[BufferedLine]]:
    """(the lines the match used, the lines that stay in the buffer) — fail2ban's Regex.search."""
    if len(buf) <= 1:
        return list(buf), []
    s = m.string
    start = s.rfind("\n", 0, m.start() + 1) + 1
    end_nl = s.find("\n", max(m.end() - 1, 0))
    end = len(s) if end_nl < 0 else end_nl + 1
    first, last = s.count("\n", 0, start), s.count("\n", 0, end)
    matched = buf[first:last]
    unmatched = buf[:first]
    skipped: list[str] = []
    for name, value in m.groupdict().items():
        if name.startswith("skiplines") and value:
            skipped += value.splitlines()
    n = 0
    for line in skipped:  # the skipped lines go back, in order
        for k, b in enumerate(matched[n:]):
            if b.text == line:
                unmatched.append(matched.pop(n + k))
                n += k
                break
    unmatched.extend(buf[last:])
    return matched, unmatched
