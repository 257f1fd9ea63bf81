"""The validated config's values: frozen dataclasses, the Problem type and the name rules they share.

This module only declares values; it must NOT read files, parse YAML or validate sections (config/reader.py,
config/sections.py and config/load.py do that), so every module that only needs the types imports it cheaply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nftblockd.addr import IPNet
from nftblockd.config.yamlsrc import Path_
from nftblockd.durations import (
    PERMANENT,
    BanLength,
)

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,23}$")
TABLE_FAMILIES = ("inet",)
HOOK_PRIORITIES = {"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0}


def interface_name_problem(name: object) -> str | None:
    """Why `name` cannot be a network device's name (the kernel's dev_valid_name), or None."""
    if not isinstance(name, str):
        return f"an interface name is a string, got {name!r}"
    if not 0 < len(name.encode()) < 16:
        return f"interface name {name!r} must be 1 to 15 bytes long"
    if name in (".", "..") or any(c in name for c in "/:") or any(c.isspace() for c in name):
        return f"{name!r} is not a valid interface name (no '/', ':', or whitespace; not . or ..)"
    return None


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding about the operator's config. `line` 0 means the file as a whole (it cannot be read).

    A warning (`warning=True`) does not make the config invalid: it names something that will not work yet,
    such as a log file that does not exist.
    """

    file: str
    line: int
    where: str
    reason: str
    warning: bool = False

    def __str__(self) -> str:
        where = f"{self.where}: " if self.where else ""
        level = "warning: " if self.warning else ""
        at = f"{self.file}:{self.line}" if self.line else self.file
        return f"{at}: {level}{where}{self.reason}"


def in_file_order(problems: list[Problem]) -> list[Problem]:
    """Problems sorted by line (stable: findings on one line keep the order they were found in)."""
    return sorted(problems, key=lambda p: p.line)


class ConfigError(Exception):
    """The operator's config is wrong; `problems` lists every finding, in file order."""

    def __init__(self, problems: list[Problem]) -> None:
        problems = in_file_order(problems)
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class SubnetEscalation:
    """`subnet_escalation:` of a blocklist: `threshold` bans inside one /`ipv4_prefix` (IPv4) or /`ipv6_prefix`
    (IPv6) within `window` ban that prefix for `bantime` (detect/subnet.py)."""

    ipv4_prefix: int = 24
    ipv6_prefix: int = 48
    threshold: int = 5
    window: float = 600.0
    bantime: float = 86400.0  # bounded on purpose: a prefix changes hands, so no permanent prefix bans
    max_prefixes: int = 100_000  # prefixes tracked at once (memory bound)


@dataclass(frozen=True, slots=True)
class BlocklistConfig:
    name: str
    timeout: BanLength = 3600.0  # default ban length for bans that do not say
    size: int = 262144  # per kernel set; the kernel answers ENFILE beyond it
    subnet: SubnetEscalation | None = None  # subnet escalation (None: off)
    # Where it was written: for messages only, never for equality (a reload compares meaning, and a comment
    # added above must not make the same blocklist look changed).
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class ChainConfig:
    hook: str = "prerouting"
    priority: int = -300
    ingress: tuple[str, ...] = ()  # interfaces that also get an ingress chain (drops before prerouting)


@dataclass(frozen=True, slots=True)
class ControlConfig:
    socket: str = "/run/nftblockd/control.sock"
    mode: int = 0o600
    group: str | None = None


@dataclass(frozen=True, slots=True)
class BatchConfig:
    max_ops: int = 10000
    delay: float = 0.002  # seconds after a batch's first op before it is flushed


@dataclass(frozen=True, slots=True)
class Escalation:
    """bantime x factor^(previous bans) up to `max` (recidive-style growth)."""

    factor: float = 2.0
    max: float = 7 * 86400.0
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class JailConfig:
    name: str
    filter: str
    files: tuple[str, ...] = ()
    journal_matches: tuple[tuple[str, str], ...] = ()
    journal_path: str | None = None  # a directory of journal files instead of the local journal
    maxretry: int = 5
    findtime: float = 600.0
    bantime: BanLength = 3600.0
    escalation: Escalation = Escalation()
    blocklist: str = "default"
    ignoreip: tuple[IPNet, ...] = ()
    ipv6_prefix: int = 64  # count and ban IPv6 offenders by /64: a single host holds a whole /64
    enabled: bool = True
    recidive: bool = False  # counts bans of other jails (`watch`, or all) instead of log lines
    watch: tuple[str, ...] = ()
    # fleet counting (fleet/counting.py): failures of all hosts add up; None: this jail counts alone
    fleet_maxretry: int | None = None
    fleet_findtime: float | None = None  # None: findtime
    actions: tuple[str, ...] = ()  # names in Config.actions, run on this jail's bans (and unbans)
    line: int = field(default=0, compare=False)  # for messages only, as BlocklistConfig.line
    filter_line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class FeedConfig:
    name: str
    blocklist: str
    url: str | None = None
    path: str | None = None
    format: str = "plain"  # plain | csv | json
    column: int | str = 0  # for csv (index or header name) and json (key of objects in a list)
    refresh: float = 3600.0
    jitter: float = 0.1
    timeout: float = 30.0
    max_size: int = 64 * 1024 * 1024
    ban_timeout: BanLength = PERMANENT  # PERMANENT: entries stay until the feed drops them
    max_shrink: float = 0.5
    min_prefix_v4: int = 8
    min_prefix_v6: int = 16
    allow_special: bool = False
    # An entry that leaves the list stays blocked until the next refresh confirms it gone (lists that flap).
    defer_removals: bool = False
    # A Retry-After the server sends (429, 503) is honoured up to this many seconds; None: up to `refresh`,
    # 0: ignored. A server cannot silence a feed for longer than that.
    max_retry_after: float | None = None
    # No successful fetch for this long: the feed's entries are withdrawn (a list that old blocks whoever has
    # the addresses now). None: the last good copy stays in force however old it is.
    max_stale: float | None = None
    # An answer with no entries (an empty body, only comments) is a fresh list only when the feed says it may
    # be empty: then it is applied at once. Otherwise it is never a successful refresh (held by the shrink
    # guard, or an error when nothing is in force), so max_stale keeps counting (docs/feeds.md).
    allow_empty: bool = False
    actions: tuple[str, ...] = ()  # names in Config.actions, run for entries the feed adds (and removes)
    line: int = field(default=0, compare=False)  # for messages only, as BlocklistConfig.line


@dataclass(frozen=True, slots=True)
class FleetTLS:
    ca: str | None = None
    cert: str | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """`fleet:`: share bans with other hosts through a Redis/Valkey server (docs/fleet.md)."""

    name: str
    host_id: str
    url: str | None = None  # redis:// or rediss://; exactly one of url and sentinel_hosts
    sentinel_hosts: tuple[tuple[str, int], ...] = ()
    sentinel_service: str = ""
    username: str | None = None  # the host's ACL user (None: the `default` user)
    password_file: str | None = None
    tls: FleetTLS | None = None  # also implied by a rediss:// url
    share_jails: tuple[str, ...] | None = None  # None: every jail; () none
    share_cli: bool = True
    blocklist: str = "default"  # the local blocklist received bans go to
    min_prefix_v4: int = 16
    min_prefix_v6: int = 48
    max_ban: float = 7 * 86400.0
    allow_permanent: bool = False
    rate: float = 2000.0  # events per second one origin may push (sustained)
    burst: int = 20000  # ... and at once
    history: float = 7 * 86400.0  # how long the stream and the tombstones keep an event
    count_rate: float = 100.0  # failures per second one host may add to the fleet's counts (fleet counting)
    count_burst: int = 1000  # ... and at once
    actions: tuple[str, ...] = ()  # names in Config.actions, run on bans received from other hosts
    line: int = 0


ACTION_TYPES = ("command", "webhook", "fail2ban")
ACTION_EVENTS = ("ban", "unban")


@dataclass(frozen=True, slots=True)
class ActionConfig:
    """`actions.NAME`: something run after a ban (or unban) is in the kernel (docs/actions.md).

    `argv`/`env` (command) are templates checked by argtemplate.py; `file`/`options` (fail2ban) name an
    action.d file and its `[Init]` overrides. The bounds apply to every type: at most `queue` events wait,
    `concurrency` run at once, `rate` runs per second are started (bursts of `burst`), what is over a bound is
    skipped and counted; a failed run is retried `retries` times, `retry_delay` seconds doubling.
    """

    name: str
    type: str
    on: tuple[str, ...] = ("ban",)
    argv: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    batch: int = 1  # webhook: up to this many events in one request
    file: str = ""
    options: tuple[tuple[str, str], ...] = ()
    lifecycle: bool = True  # fail2ban: run actionstart/actionstop (false: only actionban/actionunban)
    timeout: float = 30.0
    retries: int = 2
    retry_delay: float = 1.0
    queue: int = 1000
    concurrency: int = 1
    rate: float = 1.0
    burst: int = 20
    line: int = field(default=0, compare=False)
    file_line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Config:
    file: str
    table: str = "nftblock"
    family: str = "inet"
    protect_table: bool = True  # NFT_TABLE_F_OWNER|PERSIST where the kernel has them
    chain: ChainConfig = ChainConfig()
    control: ControlConfig = ControlConfig()
    state_dir: str = "/var/lib/nftblockd"
    batch: BatchConfig = BatchConfig()
    reconcile_interval: float = 30.0
    allowlist: tuple[IPNet, ...] = ()
    allowlist_self: bool = True
    blocklists: tuple[BlocklistConfig, ...] = (BlocklistConfig("default"),)
    metrics_listen: str | None = None
    jails: tuple[JailConfig, ...] = ()
    feeds: tuple[FeedConfig, ...] = ()
    leave_bans_on_stop: bool = True
    log_level: str = "info"
    fleet: FleetConfig | None = None
    actions: tuple[ActionConfig, ...] = ()
    lines: dict[Path_, int] = field(default_factory=dict, compare=False, repr=False)

    def blocklist(self, name: str) -> BlocklistConfig:
        for b in self.blocklists:
            if b.name == name:
                return b
        raise KeyError(name)
