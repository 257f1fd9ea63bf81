"""An in-memory SetWriter (nftblockd.kernel.setwriter): the enforcer, the control API, the ban sink and the
metrics run against it without root (`running_enforcer` starts a real Enforcer on one). It records every
transaction, fails chosen elements with chosen errnos, fills sets to their configured size (ENFILE, as the
kernel does) and can play the part of someone else changing the ruleset (a new generation, a set gone).

What it does not model: interval overlap rules (EEXIST) unless told to fail an element, and element
expiry (elements stay until deleted; their expiry is recorded and `dump_keys` reports the remaining time).
"""

from __future__ import annotations

import asyncio
import errno as E
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from nftblockd.addr import IPNet
from nftblockd.allowlist import Allowlist, build_allowlist
from nftblockd.config import Config
from nftblockd.kernel.bans import OpSpec, TimedSpecs
from nftblockd.kernel.batcher import Group
from nftblockd.kernel.enforcer import Enforcer, Persist
from nftblockd.kernel.ruleset import Ruleset, chains_for
from nftblockd.kernel.setwriter import Features, IngressChange, WriteResult
from nftblockd.service.metrics import Metrics


class Element(NamedTuple):
    until_ms: int | None  # absolute; None: permanent
    comment: str


@dataclass(slots=True)
class FakeSetWriter:
    plan: Ruleset
    clock: Callable[[], float] = time.time
    features: Features = field(default_factory=lambda: Features((6, 18), True, True, True, True))
    sets: dict[str, dict[int, Element]] = field(default_factory=dict)
    allowlist: list[IPNet] = field(default_factory=list)
    transactions: list[list[Group]] = field(default_factory=list)
    fail: dict[tuple[str, int], int] = field(default_factory=dict)  # (set, key) -> errno, every time
    setups: int = 0
    timed_writes: int = 0  # write_timed_hosts calls (restores)
    timed_encodes: int = 0  # encode_timed_hosts calls (restores, before their writes)
    devices: set[str] = field(default_factory=set)  # the network devices that exist (for ingress chains)
    chains: set[str] = field(default_factory=set)  # the chains installed
    closed: bool = False
    idle_checks: int = 0
    _generation: int = 1
    _seen: int = 0

    def setup(self, allowlist: Sequence[IPNet]) -> None:
        self.setups += 1
        self.allowlist = list(allowlist)
        for s in self.plan.sets:
            self.sets.setdefault(s.name, {})
        self.chains = {c.name for c in chains_for(self.plan, self.devices)}
        self._commit()

    def sync_ingress(self) -> IngressChange:
        wanted = {c.name: c.device for c in chains_for(self.plan, self.devices) if c.device}
        devices = {c.name: c.device for c in self.plan.chains if c.device}
        attached = tuple(d for n, d in wanted.items() if n not in self.chains)
        detached = tuple(devices.get(n, n) or n for n in sorted(self.chains) if n in devices and n not in wanted)
        if attached or detached:
            self.chains = (self.chains - {n for n in devices if n not in wanted}) | set(wanted)
            self._commit()
        return IngressChange(attached, detached)

    @property
    def last_generation(self) -> int:
        return self._seen

    def generation(self) -> int:
        self._seen = self._generation
        return self._generation

    def _commit(self) -> None:
        self._generation += 1
        self._seen = self._generation

    def write(self, groups: Sequence[Group], now_ms: int | None = None) -> WriteResult:
        now_ms = int(self.clock() * 1000) if now_ms is None else now_ms
        res = WriteResult(transactions=1)
        self.transactions.append([Group(g.set_name, list(g.keys), TimedSpecs(list(g.specs.ends_ms), g.specs.new)
                                        if isinstance(g.specs, TimedSpecs) else list(g.specs)) for g in groups])
        sizes = {s.name: s.size for s in self.plan.sets}
        for g in groups:
            elems = self.sets.get(g.set_name)
            if self._timed_adds(g, elems, sizes.get(g.set_name), now_ms):
                res.elements_sent += len(g.keys)
                res.committed_ops += len(g.keys)
                continue
            for key, spec in zip(g.keys, g.specs, strict=True):
                res.elements_sent += 1
                if elems is None:
                    res.failed[(g.set_name, key)] = (E.ENOENT, f"no set {g.set_name}")
                    res.missing_sets.add(g.set_name)
                    continue
                errno = self.fail.get((g.set_name, key))
                if errno is not None:
                    res.failed[(g.set_name, key)] = (errno, "injected")
                    continue
                if not spec.add:
                    elems.pop(key, None)
                    res.committed_ops += 1
                    continue
                if spec.until_ms is not None and spec.until_ms <= now_ms:
                    res.expired.append((g.set_name, key))
                    continue
                size = sizes.get(g.set_name)
                if key not in elems and size is not None and len(elems) >= size:
                    res.failed[(g.set_name, key)] = (E.ENFILE, "")
                    continue
                elems[key] = Element(spec.until_ms, spec.comment)
                res.committed_ops += 1
        self._commit()
        return res

    def _timed_adds(self, g: Group, elems: dict[int, Element] | None, size: int | None, now_ms: int) -> bool:
        """A `TimedSpecs` group (adds each with its own end: a fleet catch-up) applied at once, when nothing
        about it needs the per-element model (no injected failure, room in the set, every end ahead): one
        element per key. (A benchmark that must pay what the real writer's encoding costs adds it itself:
        bench/bench_fleetpub.py's `EncodingSetWriter`.)"""
        specs = g.specs
        if not isinstance(specs, TimedSpecs) or elems is None or self.fail:
            return False
        if size is not None and len(elems) + len(g.keys) > size:
            return False
        spec = next((s for s in self.plan.sets if s.name == g.set_name), None)
        if spec is None or spec.interval or min(specs.ends_ms, default=now_ms + 1) <= now_ms:
            return False
        # `tuple.__new__(Element, (end, ""))` is `Element(end, "")` without NamedTuple's Python-level __new__: the
        # model's own bookkeeping was ~26 ms per 100k on a benchmark's kernel thread, under the GIL the receive
        # loop needs (a real kernel does this work outside the interpreter)
        elems.update(zip(g.keys, map(tuple.__new__, itertools.repeat(Element),
                                     zip(specs.ends_ms, itertools.repeat(""))), strict=False))
        return True

    def encode_timed_hosts(self, set_name: str, keys: Sequence[int], until_ms: Sequence[int | None],
                           now_ms: int) -> list[bytes] | None:
        self.timed_encodes += 1
        return None  # nothing to encode for a model: write_timed_hosts applies the ops

    def write_timed_hosts(self, set_name: str, keys: Sequence[int], until_ms: Sequence[int | None],
                          now_ms: int, encoded: list[bytes] | None = None) -> WriteResult:
        self.timed_writes += 1
        return self.write([Group(set_name, list(keys), [OpSpec(True, u) for u in until_ms])], now_ms)

    def table_intact(self) -> list[str]:
        return [f"set {s.name}" for s in self.plan.sets if s.name not in self.sets]

    def drop_idle_rules(self) -> list[str]:
        """Rules are not modelled here (tests/integration/test_kernel.py checks them): only the calls."""
        self.idle_checks += 1
        return []

    def set_counts(self) -> dict[str, int | None]:
        return {s.name: (len(self.sets[s.name]) if s.name in self.sets else None) for s in self.plan.sets}

    def dump_keys(self, set_name: str) -> dict[int, int | None]:
        now_ms = int(self.clock() * 1000)
        return {k: (None if e.until_ms is None else max(0, e.until_ms - now_ms))
                for k, e in self.sets.get(set_name, {}).items()}

    def close(self) -> None:
        self.closed = True

    # -- someone else at work ---------------------------------------------------------------------------

    def outside_change(self, drop_set: str | None = None) -> None:
        """Another process changed the ruleset (and, with `drop_set`, deleted one of our sets)."""
        if drop_set is not None:
            self.sets.pop(drop_set, None)
        self._generation += 1

    def elements(self, set_name: str) -> set[int]:
        return set(self.sets.get(set_name, {}))


@asynccontextmanager
async def running_enforcer(cfg: Config, fake: FakeSetWriter, *, allow: Allowlist | None = None,
                           metrics: Metrics | None = None, persist: Persist | None = None
                           ) -> AsyncIterator[Enforcer]:
    """A real Enforcer on `fake` (and its plan), started, its batcher running; closed on exit. The allowlist
    is the config's without the host's own addresses (no netlink read) unless `allow` is given."""
    allow = build_allowlist(cfg.allowlist, include_self=False) if allow is None else allow
    enforcer = Enforcer(cfg, fake.plan, allow, lambda: fake, metrics=metrics, persist=persist)
    await enforcer.start()
    stop = asyncio.Event()
    batcher = asyncio.create_task(enforcer.batcher.run(stop))
    try:
        yield enforcer
    finally:
        stop.set()
        await batcher
        await enforcer.close()
