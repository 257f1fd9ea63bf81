"""The seam between the enforcer and the kernel: what the enforcer needs from a set writer, and the values
that cross it. The real implementation is writer.KernelWriter (netlink); tests use an in-memory fake
(tests/helpers/fakekernel.py) that records transactions and fails chosen elements with chosen errnos.

Pure declarations: no IO here. Every method is blocking; the enforcer calls them from its one kernel thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from nftblockd.addr import IPNet
from nftblockd.kernel.batcher import Group
from nftblockd.kernel.ruleset import Ruleset

__all__ = ["Features", "IngressChange", "SetWriter", "WriteResult"]


@dataclass(frozen=True, slots=True)
class Features:
    """What the kernel we run on can do (probed once at setup)."""

    release: tuple[int, int]
    owner: bool  # the table is ours alone (NFT_TABLE_F_OWNER): others cannot flush or delete it
    persist: bool  # ... and it outlives our socket (NFT_TABLE_F_PERSIST)
    destroy: bool  # DESTROYSETELEM: deleting an absent element is not an error
    timeout_update: bool  # re-adding an element updates its timeout in place (>= 6.12)

    def describe(self) -> dict[str, object]:
        return {"release": f"{self.release[0]}.{self.release[1]}", "table_owner": self.owner,
                "table_persist": self.persist, "destroy_setelem": self.destroy,
                "timeout_update": self.timeout_update}

    def sentence(self) -> str:
        """The same for an operator's log line: what the kernel does, and what it lacks."""
        have = {"table owned by nftblockd": self.owner, "kept across restarts": self.persist,
                "idempotent element deletes": self.destroy, "timeouts refreshed in place": self.timeout_update}
        text = f"kernel {self.release[0]}.{self.release[1]}: " + ", ".join(k for k, v in have.items() if v)
        missing = [k for k, v in have.items() if not v]
        return text + (f"; without: {', '.join(missing)}" if missing else "")


@dataclass(slots=True)
class WriteResult:
    """What became of a list of groups: everything not in `failed` or `expired` is in the kernel."""

    failed: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)  # (set, key) -> (errno, text)
    expired: list[tuple[str, int]] = field(default_factory=list)  # adds whose end had passed: not sent
    committed_ops: int = 0
    transactions: int = 0
    elements_sent: int = 0
    seconds: float = 0.0
    missing_sets: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class IngressChange:
    """Devices whose ingress chain `sync_ingress` attached (the device appeared) or detached (it went)."""

    attached: tuple[str, ...]
    detached: tuple[str, ...]


class SetWriter(Protocol):
    """The table, its sets and their elements, as the enforcer sees them."""

    plan: Ruleset  # replaced by a reload when only the chains changed (the sets never change while running)

    @property
    def features(self) -> Features: ...

    @property
    def last_generation(self) -> int:
        """The ruleset generation after our own last commit (or read): a different `generation()` later
        means someone else changed the ruleset."""
        ...

    def setup(self, allowlist: Sequence[IPNet]) -> None:
        """Create or adopt the table and (re)install chains, rules and the allowlist in one transaction."""

    def sync_ingress(self) -> IngressChange:
        """Attach ingress chains whose device appeared, detach those whose device went (one transaction)."""
        ...

    def write(self, groups: Sequence[Group], now_ms: int | None = None) -> WriteResult:
        """Apply element ops; one bad element never loses the rest (see writer.py for the guarantees)."""
        ...

    def drop_idle_rules(self) -> list[str]:
        """Remove the drop rules of sets the kernel counts empty (one transaction); returns those sets.
        A set's next first element brings its rule back in the transaction that adds it."""
        ...

    def encode_timed_hosts(self, set_name: str, keys: Sequence[int], until_ms: Sequence[int | None],
                           now_ms: int) -> list[bytes] | None:
        """The element messages `write_timed_hosts` would send for these, made on the caller's thread (it
        touches nothing the kernel thread changes), or None when they need `write`'s general path."""
        ...

    def write_timed_hosts(self, set_name: str, keys: Sequence[int], until_ms: Sequence[int | None],
                          now_ms: int, encoded: list[bytes] | None = None) -> WriteResult:
        """Add single addresses to a hash set, each with its own end (None: permanent): saved bans going back
        after a restart. Same guarantees as `write`; ends already past are reported in `expired`. `encoded`:
        what `encode_timed_hosts` made of the same arguments (None: encode here)."""
        ...

    def generation(self) -> int:
        """Read the ruleset generation now."""
        ...

    def table_intact(self) -> list[str]:
        """What is missing from our table; an empty list when it is intact."""
        ...

    def set_counts(self) -> dict[str, int | None]:
        """Element count per planned set as the kernel reports it (None: the set is missing)."""
        ...

    def dump_keys(self, set_name: str) -> dict[int, int | None]:
        """key -> remaining ms (None = permanent) of every element the kernel holds in `set_name`."""
        ...

    def close(self) -> None: ...
