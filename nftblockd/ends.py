"""Ban ends as columns: seconds to whole milliseconds (the kernel's and the ban state's unit), and the packed
bytes a bulk row keeps them in (one little-endian float64 per address, +inf for a permanent ban).

Pure: no IO, no clock. One column at a time, by C-level passes (`map`, `array`): a fleet catch-up converts
100k ends at once, where a Python-level loop cost tens of ms. It must not know about sets, rows or the
kernel: the store, the ban state and the fleet sink call it with their columns.
"""

from __future__ import annotations

import array
import itertools
import math
import operator
import struct
import sys
from collections.abc import Iterable, Sequence
from typing import cast

__all__ = ["ends_ms", "float_ends", "last_end", "pack_ends", "secs_ms", "unpack_ends", "unpack_ends_ms"]

_INF_LE = struct.pack("<d", math.inf)  # a permanent ban's end in `pack_ends`


def secs_ms(untils: Iterable[float]) -> list[int]:
    """Ends in seconds (none permanent) as whole ms, truncated: `int(u * 1000)` each."""
    return list(map(int, map(operator.mul, untils, itertools.repeat(1000.0))))  # (the fastest spelling measured)


def ends_ms(untils: Sequence[float | None]) -> list[int | None]:
    """Ends in seconds as whole ms (truncated), None (permanent) kept."""
    if None in untils:
        return [None if u is None else int(u * 1000) for u in untils]
    return cast("list[int | None]", secs_ms(cast("Sequence[float]", untils)))


def pack_ends(untils: Sequence[float | None]) -> bytes:
    """Per-address ends of a bulk row: little-endian float64 each, +inf for a permanent ban."""
    arr = array.array("d", [math.inf if u is None else u for u in untils] if None in untils
                      else cast("Sequence[float]", untils))
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def float_ends(blob: bytes) -> array.array[float]:
    """`pack_ends`'s bytes as native floats, +inf kept."""
    arr = array.array("d")
    arr.frombytes(blob)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr


def unpack_ends(blob: bytes) -> list[float | None]:
    """Inverse of `pack_ends`."""
    ends: list[float | None] = float_ends(blob).tolist()  # type: ignore[assignment]
    if _INF_LE in blob:  # a C-level search (`math.inf in arr` makes a float per element); rarely a false hit
        ends = [None if u == math.inf else u for u in ends]
    return ends


def unpack_ends_ms(blob: bytes) -> list[int | None]:
    """`ends_ms(unpack_ends(blob))` without the list of floats between (a restart's million ends)."""
    arr = float_ends(blob)
    if _INF_LE in blob:
        return [None if u == math.inf else int(u * 1000) for u in arr]
    return cast("list[int | None]", secs_ms(arr))


def last_end(blob: bytes) -> float | None:
    """A bulk row's `until` (prune deletes it once that has passed): its latest end, None if one is permanent."""
    top = max(float_ends(blob))
    return None if top == math.inf else top
