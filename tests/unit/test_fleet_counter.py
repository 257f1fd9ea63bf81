"""fleet/counter.py with a fake server: batching, decisions handed over, losses counted, reconnects."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence
from typing import Any

from nftblockd.fleet.counter import FleetCounter
from nftblockd.fleet.counting import CountPolicy, Decided
from nftblockd.fleet.link import LinkError
from tests.helpers.fleet import fleet_config, until

A = ipaddress.ip_address


class FakeServer:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.up = True
        self.gate = asyncio.Event()
        self.gate.set()
        self.connects = 0

    async def connect(self) -> None:
        if not self.up:
            raise LinkError("refused")
        self.connects += 1

    async def close(self) -> None:
        pass

    async def count(self, keys: Sequence[str], argv: Sequence[str]) -> Any:
        await self.gate.wait()
        if not self.up:
            raise LinkError("gone")
        self.calls.append(list(argv))
        items = [argv[i:i + 6] for i in range(4, len(argv), 6)]
        decided = [[t.encode(), b"2000000000.000", b"a,b,c", 3, src.encode()] for t, k, *_r, src in items
                   if int(k) >= 3]
        return [decided, sum(int(k) for _t, k, *_r in items), 0, 0, 0]

    async def seen(self, decision_key: str, count_key: str) -> tuple[Any, list[Any]]:
        return None, [b"a|1", b"b|2"]


async def test_batches_fold_repeats_and_decisions_reach_the_daemon() -> None:
    srv = FakeServer()
    got: list[Decided] = []
    c = FleetCounter(fleet_config("prod", "a", "redis://x"), srv,
                     {"sshd": CountPolicy(3, 600.0, 3600.0, ipv6_prefix=64)}, got.extend)
    task = asyncio.ensure_future(c.run())
    try:
        await until(lambda: c.stats.connected, what="connected")
        srv.gate.clear()  # the server is slow: failures gather meanwhile
        c.failure("sshd", A("198.51.100.1"))
        await asyncio.sleep(0)
        for _ in range(3):
            c.failure("sshd", A("198.51.100.2"))
        c.failure("sshd", A("2001:db8::1"))
        c.failure("sshd", A("2001:db8::2"))  # the same /64
        c.failure("other", A("198.51.100.3"))  # a jail without fleet counting: ignored
        srv.gate.set()
        await until(lambda: c.stats.accepted == 6, what="all counted")
        assert len(srv.calls) == 2  # the first alone, then everything that gathered in one call
        assert srv.calls[1][4:] == ["198.51.100.2", "3", "3", "600000", "3600000", "count:sshd",
                                    "2001:db8::/64", "2", "3", "600000", "3600000", "count:sshd"]
        assert [str(d.net) for d in got] == ["198.51.100.2/32"] and c.stats.decided == 1
        assert (await c.seen(ipaddress.ip_network("198.51.100.9/32")))["sshd"]["seen_by"] == ["a", "b"]
        # the server goes away: what was gathered is lost and counted; counting resumes when it is back
        srv.up = False
        c.failure("sshd", A("198.51.100.4"))
        await until(lambda: not c.stats.connected, what="noticed")
        c.failure("sshd", A("198.51.100.5"))
        assert (await c.seen(ipaddress.ip_network("198.51.100.9/32"))) == {"error": "not connected to the fleet "
                                                                          "server"}
        srv.up = True
        await until(lambda: c.stats.connected, 5, what="back")
        assert c.stats.lost == 2
        c.failure("sshd", A("198.51.100.6"))
        await until(lambda: c.stats.accepted == 7, what="counting again")
        assert c.status()["pending"] == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
