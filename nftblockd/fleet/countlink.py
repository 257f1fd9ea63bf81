"""The fleet counting's connection to the server: one script call per batch of failures (fleet/counting.py).

Its own connection, apart from the ban stream's two (fleet/link.py): a count must never queue behind a large
publish or a blocked `XREAD`, and a crossing's ban must not wait for anything but its own round trip. The
script is sent by SHA (`EVALSHA`) and loaded on `NOSCRIPT` (a restarted or failed-over server has no scripts).
This module decides nothing and reads no clock; errors surface as `link.LinkError`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rexc
from redis.asyncio import Redis

from nftblockd.config import FleetConfig
from nftblockd.fleet.counting import SCRIPT
from nftblockd.fleet.link import LinkError, RedisLink, _close_client, _error

SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()


class CountLink:
    def __init__(self, cfg: FleetConfig) -> None:
        self.cfg = cfg
        self.client: Redis | None = None

    async def connect(self) -> None:
        await self.close()
        cmd, reader = RedisLink(self.cfg)._clients()  # the same connection settings (URL or Sentinel, TLS, ACL)
        await _close_client(reader)  # never connected: only the command client is needed
        try:
            await cmd.ping()
        except (rexc.RedisError, OSError) as exc:
            await _close_client(cmd)
            raise _error(exc) from None
        self.client = cmd

    async def close(self) -> None:
        c, self.client = self.client, None
        if c is not None:
            await _close_client(c)

    async def count(self, keys: Sequence[str], argv: Sequence[str]) -> Any:
        """Run the counting script. Raises LinkError."""
        c = self.client
        if c is None:
            raise LinkError("not connected to the fleet server")
        try:
            try:
                return await c.execute_command("EVALSHA", SHA, len(keys), *keys, *argv)
            except rexc.NoScriptError:
                return await c.execute_command("EVAL", SCRIPT, len(keys), *keys, *argv)
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None

    async def seen(self, decision_key: str, count_key: str) -> tuple[Any, list[Any]]:
        """(the decision key's value or None, the count key's members), in one MULTI. Raises LinkError."""
        c = self.client
        if c is None:
            raise LinkError("not connected to the fleet server")
        try:
            pipe = c.pipeline(transaction=True)
            pipe.execute_command("GET", decision_key)
            pipe.execute_command("ZRANGE", count_key, 0, -1)
            decision, members = await pipe.execute()
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        return decision, list(members or [])


__all__ = ["SHA", "CountLink"]
