"""Parse and print durations ("90s", "10m", "1h30m", "2d", "500ms", plain seconds), and name ban lengths. Pure.

A ban's length has one encoding in the pure layer, `BanLength`: a positive number of seconds, or the
sentinel `PERMANENT` for a ban that never ends. `None` is never a length: "not said, use the configured
default" is the control protocol's `BLOCKLIST_DEFAULT` (control/protocol.py), decided before a length exists.
A length becomes an end (epoch seconds; `None` for an end that never comes, as in `events.Ban.until`) in one
place, `ban_end`.

No regular expressions: `nftblock ban --timeout 600s` runs once per ban from fail2ban's shell action, and
importing `re` is a tenth of that process's start-up (bench/bench_cli.py). The grammar is small enough to
scan by hand; tests/unit/test_durations.py checks the scanner against the regex it replaced.
"""

from __future__ import annotations

import math

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the CLI imports this module per ban)
if TYPE_CHECKING:
    from typing import Final, TypeAlias


class Permanent:
    """The length of a ban that never ends. There is one instance, `PERMANENT`; test with `isinstance` (mypy
    narrows `float | Permanent` with it) or `is`. A plain class, not an enum: `nftblock ban` imports this
    module and `enum` is not otherwise loaded there."""

    __slots__ = ()
    _the: Permanent | None = None

    def __new__(cls) -> Permanent:
        if cls._the is None:
            cls._the = super().__new__(cls)
        return cls._the

    def __repr__(self) -> str:
        return "PERMANENT"

    def __str__(self) -> str:
        return "permanent"

    def __reduce__(self) -> str:
        return "PERMANENT"  # copy and pickle give back the one instance


PERMANENT: Final = Permanent()
BanLength: TypeAlias = "float | Permanent"
"""Seconds (> 0), or PERMANENT."""

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
PERMANENT_WORDS = frozenset({"permanent", "never", "forever"})
# The longest finite ban: ten years. Longer is what "permanent" is for, and a timeout of 1e308 seconds
# overflowed the kernel's millisecond arithmetic (issue 13) instead of being refused as the client's mistake.
MAX_TIMEOUT = 3650 * 86400.0


def _number(text: str, pos: int) -> int:
    """End of `digits[.digits]` starting at `pos` (digits as the regex \\d: any Unicode decimal digit), or `pos`
    if there is none."""
    n = len(text)
    end = pos
    while end < n and text[end].isdecimal():
        end += 1
    if end == pos:
        return pos
    if end + 1 < n and text[end] == "." and text[end + 1].isdecimal():
        end += 2
        while end < n and text[end].isdecimal():
            end += 1
    return end


def parse_duration(value: object) -> float:
    """Seconds as a float; raises ValueError with a reason an operator understands."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 30s, 10m, 1h or 2d, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"a duration cannot be negative: {value!r}")
        return _finite(value, value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration such as 30s, 10m, 1h or 2d, got {value!r}")
    text = value.strip().lower().replace(" ", "")
    if text and _number(text, 0) == len(text):
        return _finite(float(text), value)
    pos = 0
    total = 0.0
    n = len(text)
    while pos < n:
        end = _number(text, pos)
        if end == pos:
            break
        unit = "ms" if text.startswith("ms", end) else text[end:end + 1]
        if unit not in _UNITS:
            break
        total += float(text[pos:end]) * _UNITS[unit]
        pos = end + len(unit)
    if pos != n or not text:
        raise ValueError(f"expected a duration such as 30s, 10m, 1h or 2d, got {value!r}")
    return _finite(total, value)


def _finite(seconds: float, value: object) -> float:
    try:
        out = float(seconds)
    except OverflowError:  # an int too large for a float
        out = math.inf
    if not math.isfinite(out):
        raise ValueError(f"the duration {_short(value)} is too large")
    return out


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_timeout(value: object) -> BanLength:
    """Like parse_duration, but "permanent"/"never"/"forever" give PERMANENT and zero is refused.

    A zero timeout would mean "never expires" to the kernel, so it must be asked for by name, never computed.
    """
    if isinstance(value, str) and value.strip().lower() in PERMANENT_WORDS:
        return PERMANENT
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("a ban timeout must be positive (write 'permanent' for a ban that never expires)")
    if seconds > MAX_TIMEOUT:
        raise ValueError(f"a ban timeout is at most {format_duration(MAX_TIMEOUT)} (got {_short(value)}); write "
                         "'permanent' for a ban that never expires")
    return seconds


def ban_end(length: BanLength, now: float) -> float | None:
    """When a ban of `length` that starts at `now` ends: epoch seconds, or None for PERMANENT (the encoding of
    `events.Ban.until`). The one place a length becomes an end."""
    return None if isinstance(length, Permanent) else now + float(length)


def longest(lengths: list[BanLength]) -> BanLength:
    """The longest of several lengths (PERMANENT outlasts any number); ValueError if there are none."""
    if any(isinstance(t, Permanent) for t in lengths):
        return PERMANENT
    return max(float(t) for t in lengths)  # type: ignore[arg-type]  # (no Permanent left: checked above)


def format_duration(seconds: BanLength) -> str:
    """Compact human form: 3725 → '1h2m5s'; PERMANENT → 'permanent'."""
    if isinstance(seconds, Permanent):
        return "permanent"
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    s = round(seconds)
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            out.append(f"{s // size}{unit}")
            s %= size
    return "".join(out) or "0s"
