"""The fleet counting's connection to the server: this host's appends to its own failure stream, and the reads of
every member's (fleet/counting.py has the keys and the rules).

Two connections of its own, apart from the ban stream's (fleet/link.py): an append must never queue behind a
large publish, and the blocking `XREAD` of all members' streams must not hold up an append. The commands are
the ACL's minimum (docs/fleet.md): `XADD` (its trims included) on the host's own key (the ACL refuses any
other), `XREAD`, `SCAN ... TYPE stream` to find the members' streams, `TIME` for the window's start. No script,
no shared key.
This module decides nothing and reads no clock; errors surface as `link.LinkError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from redis import exceptions as rexc
from redis.asyncio import Redis

from nftblockd.config import FleetConfig
from nftblockd.fleet.counting import FAIL_MAXLEN
from nftblockd.fleet.link import (
    BLOCK_MS,
    LinkError,
    RedisLink,
    _close_client,
    _connect_error,
    _error,
    honour_cancel,
)

SCAN_COUNT = 1000  # keys per SCAN step
Read = list[tuple[str, list[tuple[str, Any]]]]  # [(stream key, [(entry id, fields), ...]), ...]


class CountEngine(Protocol):
    """What the fleet counter needs of the server (CountLink; a fake in the unit tests)."""

    async def connect(self) -> int: ...
    async def close(self) -> None: ...
    async def append(self, key: str, entries: Sequence[Sequence[str]], trim_minid: str | None) -> str: ...
    async def members(self, pattern: str, limit: int, valid: Callable[[str], bool]) -> list[str]: ...
    async def read(self, cursors: Mapping[str, str], count: int, block_ms: int) -> Read: ...


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class CountLink:
    def __init__(self, cfg: FleetConfig, *, block_ms: int = BLOCK_MS) -> None:
        self.cfg = cfg
        self.block_ms = block_ms
        self.cmd: Redis | None = None
        self.reader: Redis | None = None

    async def connect(self) -> int:
        """Open both connections; returns the server's time in ms. Raises LinkError."""
        await self.close()
        try:
            # the ban link's connection settings (URL or Sentinel, TLS, ACL user) and timeouts
            self.cmd, self.reader = RedisLink(self.cfg, block_ms=self.block_ms)._clients()
            await self.reader.ping()
            sec, usec = await self.cmd.execute_command("TIME")
            server_ms = int(sec) * 1000 + int(usec) // 1000
        except (rexc.RedisError, OSError, ValueError) as exc:
            await self.close()
            raise _connect_error(exc, self.cfg) from None
        honour_cancel()  # the counter connects again after an error: a lost stop would loop for ever
        return server_ms

    async def close(self) -> None:
        clients = [c for c in (self.cmd, self.reader) if c is not None]
        self.cmd = self.reader = None
        for c in clients:
            await _close_client(c)

    async def append(self, key: str, entries: Sequence[Sequence[str]], trim_minid: str | None) -> str:
        """Append `entries` (field lists) to `key` with server IDs, in one round trip, then trim the stream by
        age if `trim_minid`; returns the last entry's ID. Raises LinkError."""
        c = self.cmd
        if c is None:
            raise LinkError("not connected to the fleet server")
        try:
            pipe = c.pipeline(transaction=False)
            # The age trim rides on the last XADD (one strategy per XADD: the others keep the length bound), so a
            # host needs no XTRIM in its ACL; with nothing to append the trim waits for the next append.
            last = len(entries) - 1
            for i, fields in enumerate(entries):
                trim = ("MINID", "~", trim_minid) if i == last and trim_minid is not None else ("MAXLEN", "~",
                                                                                               FAIL_MAXLEN)
                pipe.execute_command("XADD", key, *trim, "*", *fields)
            replies = await pipe.execute(raise_on_error=False)
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        honour_cancel()
        for r in replies:
            if isinstance(r, Exception):
                raise _error(r)
        return _s(replies[len(entries) - 1]) if entries else ""

    async def members(self, pattern: str, limit: int, valid: Callable[[str], bool]) -> list[str]:
        """Stream keys matching `pattern` that `valid` takes (at most `limit`: keys it refuses do not count, so a
        member's junk keys under its own prefix cannot crowd out the others'). Raises LinkError."""
        c = self.cmd
        if c is None:
            raise LinkError("not connected to the fleet server")
        out: list[str] = []
        cursor: Any = 0
        try:
            while True:
                cursor, keys = await c.execute_command("SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_COUNT,
                                                       "TYPE", "stream")
                honour_cancel()
                out += [s for s in map(_s, keys) if valid(s)]
                if int(cursor) == 0 or len(out) >= limit:
                    return sorted(set(out))[:limit]
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None

    async def read(self, cursors: Mapping[str, str], count: int, block_ms: int) -> Read:
        """Entries after each stream's cursor, waiting up to `block_ms` for the first. Raises LinkError."""
        r = self.reader
        if r is None:
            raise LinkError("not connected to the fleet server")
        if not cursors:
            return []
        try:
            reply = await r.execute_command("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", *cursors,
                                            *cursors.values())
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        honour_cancel()
        if not reply:
            return []
        pairs = reply.items() if isinstance(reply, dict) else reply  # RESP3 / RESP2
        out: Read = []
        for key, entries in pairs:
            got: list[tuple[str, Any]] = []
            for e in entries or ():
                sid, fields = e[0], e[1]
                if isinstance(fields, list | tuple):
                    fields = dict(zip(fields[::2], fields[1::2], strict=False))
                got.append((_s(sid), fields))
            out.append((_s(key), got))
        return out


__all__ = ["CountEngine", "CountLink", "Read"]
