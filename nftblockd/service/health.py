"""Whether the daemon is degraded: running and enforcing, but short of what its config asks. Pure.

Three reasons, each shown by `nftblock status` (its first line, exit code 3: docs/limits.md), by the status
result's `degraded` list and by the metric `nftblock_degraded{reason}`, which has every reason at 0 from the
start so an alert can match on it before anything went wrong:

- `source`: a log source that can never deliver (a journal jail on a machine without journald);
- `state`: bans are not saved (the state directory is read-only or the database unusable, so it runs in
  memory; or saving keeps failing): they are enforced now but lost at a restart;
- `batches`: the last kernel batch failed as a whole (not one refused element: the transaction).

A degraded daemon keeps running: it protects what it can, and says so. This module must NOT look at the
daemon's objects: the composition root hands it plain facts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

REASONS = ("source", "state", "batches")


@dataclass(frozen=True, slots=True)
class Degraded:
    reason: str  # one of REASONS
    message: str  # one sentence for an operator


def assess(dead_sources: Iterable[tuple[str, str]], *, state_in_memory: bool, state_error: str | None,
           batch_error: str | None) -> list[Degraded]:
    """The reasons the daemon is degraded, from plain facts: (jail, why) of each source that can never
    deliver, whether the store runs in memory, the error saving keeps failing with, the last batch's error."""
    out = [Degraded("source", f"jail {jail}: {why}") for jail, why in dead_sources]
    if state_in_memory:
        out.append(Degraded("state", "the state database runs in memory (the state directory cannot be "
                                     "written): bans are enforced but not kept across a restart"))
    elif state_error is not None:
        out.append(Degraded("state", f"saving to the state database fails: {state_error}"))
    if batch_error is not None:
        out.append(Degraded("batches", f"the last kernel batch failed: {batch_error}"))
    return out


def samples(found: Sequence[Degraded]) -> list[tuple[tuple[str], int]]:
    """`nftblock_degraded`'s samples: every reason, 1 where it applies."""
    now = {d.reason for d in found}
    return [((r,), 1 if r in now else 0) for r in REASONS]
