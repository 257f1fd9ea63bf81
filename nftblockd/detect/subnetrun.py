"""Subnet escalation at work: shows applied bans to the pure `SubnetEscalator` and applies what it decides.

The daemon calls `jail_bans` (its ban sink committed jail bans) and `fleet_bans` (the fleet sink applied bans
received from other hosts) from inside those paths, so both only queue: a prefix ban is applied by `run()`,
a task of the daemon, through `apply` (the enforcer: never-ban and allowlist checked again for the whole
prefix, the blocklist's interval set, the state database, the audit line). A refused prefix gets one audit
line naming the addresses that reached the threshold and the entry that saved it.

This module decides nothing itself (subnet.py does) and never talks to the kernel directly; prefix bans are
never published to the fleet (each host escalates from the bans it holds, fleet bans included).
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (an IO edge: a task applies the prefix bans the escalator decides)
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol

from nftblockd.addr import IPNet, format_target
from nftblockd.events import Ban
from nftblockd.service.logsetup import quote

from .subnet import JAIL, Escalate, Refused, SubnetEscalator

log = logging.getLogger("nftblockd.subnet")
audit_log = logging.getLogger("nftblockd.audit")


class Result(Protocol):
    """What the enforcer says about one ban (kernel/enforcer.DecisionResult): `code` None when applied."""

    @property
    def code(self) -> str | None: ...


class SubnetRunner:
    def __init__(self, escalator: SubnetEscalator,
                 apply: Callable[[list[Ban]], Awaitable[Sequence[Result]]]) -> None:
        self.escalator = escalator
        self.apply = apply
        self.failed = 0  # prefix bans the enforcer refused (a full set, the allowlist changed meanwhile)
        self._queue: asyncio.Queue[Escalate] = asyncio.Queue()

    def jail_bans(self, bans: Iterable[Ban], now: float) -> None:
        e = self.escalator
        for b in bans:
            if b.jail != JAIL and e.watches(b.blocklist):
                self._take(e.observe(b.blocklist, b.target, now))

    def fleet_bans(self, blocklist: str, ranges: Sequence[IPNet], hosts: Sequence[tuple[int, Sequence[int]]],
                   now: float) -> None:
        e = self.escalator
        if not e.watches(blocklist):
            return
        for net in ranges:
            self._take(e.observe(blocklist, net, now))
        for version, keys in hosts:
            for d in e.observe_hosts(blocklist, version, keys, now):
                self._take(d)

    def _take(self, d: Escalate | Refused | None) -> None:
        if d is None:
            return
        if isinstance(d, Escalate):
            self._queue.put_nowait(d)  # bounded by the escalator: each needs `threshold` bans first
            return
        audit_log.info("refused subnet ban %s in %s: %s; banned inside it: %s", format_target(d.prefix),
                       d.blocklist, quote(d.detail), ", ".join(d.targets),
                       extra={"jail": JAIL, "address": format_target(d.prefix)})

    def pending(self) -> int:
        return self._queue.qsize()

    async def run(self) -> None:
        """Apply decided prefix bans, those queued meanwhile together; until cancelled."""
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self.apply_now(batch)

    async def apply_now(self, batch: list[Escalate]) -> None:
        bans = [Ban(d.prefix, d.blocklist, d.until, "jail", d.reason(), JAIL) for d in batch]
        try:
            results = await self.apply(bans)
        except Exception:
            log.exception("applying %d subnet bans failed; their prefixes count afresh", len(bans))
            results = []
        for i, d in enumerate(batch):
            if i >= len(results) or results[i].code is not None:
                self.failed += 1
                self.escalator.forget(d.blocklist, d.prefix)

    def status(self) -> dict[str, object]:
        st = self.escalator.stats
        return {"escalated": st.escalated, "refused": dict(st.refused), "failed": self.failed,
                "evicted": st.evicted, "tracked": self.escalator.tracked()}


__all__ = ["SubnetRunner"]
