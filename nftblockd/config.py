"""Load and validate the YAML config into frozen dataclasses.

Every problem is collected and reported at once as `file:line: where: reason`, so an operator fixes a config
in one pass. This module never touches the kernel, the network or the filesystem beyond reading the file and
checking the permissions of the secret files it names (a fleet password file readable by others is refused
here, so both `--check-config` and the daemon refuse it); compiling filters happens in the daemon's build
step, which reports with the line numbers kept here.
"""

from __future__ import annotations

import os
import re
import socket
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nftblockd.addr import AddressError, IPNet, parse_target
from nftblockd.argtemplate import TemplateError, parse_template
from nftblockd.durations import (
    MAX_TIMEOUT,
    PERMANENT,
    PERMANENT_WORDS,
    BanLength,
    format_duration,
    parse_duration,
    parse_timeout,
)
from nftblockd.yamlsrc import Located, Path_, YamlError, load_yaml

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


def load_config(path: str | Path) -> Config:
    """Read and validate `path`; raises ConfigError listing every problem."""
    cfg, problems = examine_config(path)
    if problems or cfg is None:
        raise ConfigError(problems)
    return cfg


def parse_config(text: str, file: str = "<config>") -> Config:
    cfg, problems = examine_text(text, file)
    if problems or cfg is None:
        raise ConfigError(problems)
    return cfg


def examine_config(path: str | Path) -> tuple[Config | None, list[Problem]]:
    """Every problem of the config at `path`, plus the config as far as it could be built (None when the
    file cannot be read or is not YAML). `--check-config` takes the partial config on to find the problems
    that need more than the file (filters that do not compile), so that one run reports them all."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return None, [Problem(str(p), 0, "", f"cannot read the config: {reason}")]
    return examine_text(text, str(p))


def examine_text(text: str, file: str = "<config>") -> tuple[Config | None, list[Problem]]:
    try:
        doc = load_yaml(text, file)
    except YamlError as exc:
        return None, [Problem(exc.file, exc.line, "", exc.reason)]
    b = _Builder(doc)
    b.problems += [Problem(e.file, e.line, "", e.reason) for e in doc.problems]
    cfg = b.build()
    return cfg, in_file_order(b.problems)


class _Builder:
    """Walks the document once, collecting problems instead of stopping at the first."""

    def __init__(self, doc: Located) -> None:
        self.doc = doc
        self.problems: list[Problem] = []

    def fail(self, path: Path_, reason: str) -> None:
        where = ".".join(str(p) for p in path)
        self.problems.append(Problem(self.doc.file, self.doc.line(path), where, reason))

    # -- typed getters: on error they record a problem and return the default ------------------------

    def mapping(self, value: Any, path: Path_, known: set[str]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {type(value).__name__}")
            return {}
        for key in value:
            if key not in known:
                hint = f" (known: {', '.join(sorted(known))})" if known else ""
                self.fail((*path, key), f"unknown key {key!r}{hint}")
        return value

    def get(self, m: dict[str, Any], key: str, path: Path_, kind: type | tuple[type, ...], default: Any) -> Any:
        if key not in m or m[key] is None:
            return default
        v = m[key]
        if isinstance(v, bool) and kind in (int, float, (int, float)):
            self.fail((*path, key), f"expected a number, got {v!r}")
            return default
        if not isinstance(v, kind):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.fail((*path, key), f"expected {names}, got {v!r}")
            return default
        return v

    def duration(self, m: dict[str, Any], key: str, path: Path_, default: float, *, positive: bool = False,
                 most: float | None = None) -> float:
        """A duration; `positive` refuses 0 (a findtime or an interval of 0 has no meaning and made the
        daemon fail at start with a traceback instead of here with file:line), `most` caps it."""
        if key not in m:
            return default
        try:
            value = parse_duration(m[key])
        except ValueError as exc:
            self.fail((*path, key), str(exc))
            return default
        if positive and value <= 0:
            self.fail((*path, key), f"must be longer than 0, got {m[key]!r}")
            return default
        if most is not None and value > most:
            self.fail((*path, key), f"must be at most {format_duration(most)}, got {m[key]!r}")
            return default
        return value

    def timeout(self, m: dict[str, Any], key: str, path: Path_, default: BanLength) -> BanLength:
        if key not in m:
            return default
        try:
            return parse_timeout(m[key])
        except ValueError as exc:
            self.fail((*path, key), str(exc))
            return default

    def positive_int(self, m: dict[str, Any], key: str, path: Path_, default: int, lo: int = 1,
                     hi: int = 2**31) -> int:
        v = self.get(m, key, path, int, default)
        if not lo <= v <= hi:
            self.fail((*path, key), f"must be between {lo} and {hi}, got {v}")
            return default
        return int(v)

    def addresses(self, value: Any, path: Path_) -> tuple[IPNet, ...]:
        """A list of addresses or CIDRs. A CIDR with host bits set (`10.0.0.1/8`) is refused, as the CLI
        refuses it: the operator meant either the address or the network, and guessing could allow a whole
        /8 where one host was meant."""
        if value is None:
            return ()
        if not isinstance(value, list):
            self.fail(path, "expected a list of addresses or CIDRs")
            return ()
        out = []
        for i, item in enumerate(value):
            try:
                out.append(parse_target(str(item), strict=True))
            except AddressError as exc:
                self.fail((*path, i), str(exc))
        return tuple(out)

    # -- sections ------------------------------------------------------------------------------------

    def build(self) -> Config:
        top = self.mapping(self.doc.value, (), {
            "table", "chain", "control", "state_dir", "batch", "reconcile", "allowlist", "allowlist_self",
            "blocklists", "metrics", "jails", "feeds", "leave_bans_on_stop", "log_level", "fleet", "actions",
        })
        family, table, protect = self.table(top.get("table"))
        blocklists = self.blocklists(top.get("blocklists"))
        names = {b.name for b in blocklists}
        cfg = Config(
            file=self.doc.file,
            table=table,
            family=family,
            protect_table=protect,
            chain=self.chain(top.get("chain")),
            control=self.control(top.get("control")),
            state_dir=self.get(top, "state_dir", (), str, "/var/lib/nftblockd"),
            batch=self.batch(top.get("batch")),
            reconcile_interval=self.reconcile(top.get("reconcile")),
            allowlist=self.addresses(top.get("allowlist"), ("allowlist",)),
            allowlist_self=self.get(top, "allowlist_self", (), bool, True),
            blocklists=blocklists,
            metrics_listen=self.metrics(top.get("metrics")),
            jails=self.jails(top.get("jails"), names),
            feeds=self.feeds(top.get("feeds"), names),
            leave_bans_on_stop=self.get(top, "leave_bans_on_stop", (), bool, True),
            log_level=self.log_level(top),
            actions=self.actions(top.get("actions")),
            lines=self.doc.lines,
        )
        if top.get("fleet") is not None:  # `fleet: null` (the example config's form) is no fleet
            cfg = replace(cfg, fleet=self.fleet(top["fleet"], cfg))
        names = {j.name for j in cfg.jails}
        for j in cfg.jails:
            if j.fleet_maxretry is not None and cfg.fleet is None:
                self.fail(("jails", j.name, "fleet_maxretry"), "fleet counting needs a fleet: block")
            if j.fleet_maxretry is not None and j.recidive:
                self.fail(("jails", j.name, "fleet_maxretry"), "a recidive jail counts bans, not failures: no "
                          "fleet counting")
            if j.fleet_findtime is not None and j.fleet_maxretry is None:
                self.fail(("jails", j.name, "fleet_findtime"), "fleet_findtime needs fleet_maxretry")
            for w in j.watch:
                if w not in names or w == j.name:
                    self.fail(("jails", j.name, "watch"), f"{w!r} is not another jail of this config")
        self.action_refs(cfg)
        owned = {f.blocklist for f in cfg.feeds}
        for j in cfg.jails:
            if j.blocklist in owned:
                self.fail(("jails", j.name, "blocklist"), f"blocklist {j.blocklist!r} is filled by feeds (its sets "
                          "hold exactly the feeds' entries); give the jail another blocklist")
        return cfg

    def log_level(self, top: dict[str, Any]) -> str:
        level = self.get(top, "log_level", (), str, "info").lower()
        if level not in ("debug", "info", "warning", "error"):
            self.fail(("log_level",), "must be one of debug, info, warning, error")
            return "info"
        return str(level)

    def table(self, value: Any) -> tuple[str, str, bool]:
        protect = True
        if value is None:
            return "inet", "nftblock", protect
        if isinstance(value, str):
            family, _, name = value.rpartition(" ")
            family = family or "inet"
        elif isinstance(value, dict):
            m = self.mapping(value, ("table",), {"family", "name", "protect"})
            family = self.get(m, "family", ("table",), str, "inet")
            name = self.get(m, "name", ("table",), str, "nftblock")
            protect = self.get(m, "protect", ("table",), bool, True)
        else:
            self.fail(("table",), "expected a table name such as 'inet nftblock'")
            return "inet", "nftblock", protect
        if family not in TABLE_FAMILIES:
            self.fail(("table",), f"table family must be inet (covers IPv4 and IPv6), got {family!r}")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,31}", name):
            self.fail(("table",), f"invalid table name {name!r}")
        return "inet", name, protect

    def chain(self, value: Any) -> ChainConfig:
        path: Path_ = ("chain",)
        m = self.mapping(value, path, {"hook", "priority", "ingress"})
        hook = self.get(m, "hook", path, str, "prerouting")
        if hook not in ("prerouting", "input", "forward"):
            self.fail((*path, "hook"), f"hook must be prerouting, input or forward, got {hook!r}")
        prio_raw = m.get("priority", "raw")
        if isinstance(prio_raw, str) and prio_raw in HOOK_PRIORITIES:
            prio = HOOK_PRIORITIES[prio_raw]
        elif isinstance(prio_raw, int) and not isinstance(prio_raw, bool):
            prio = prio_raw
        else:
            self.fail((*path, "priority"), f"priority must be a number or one of {', '.join(HOOK_PRIORITIES)}")
            prio = -300
        raw = m.get("ingress") or []
        ingress: list[str] = []
        if not isinstance(raw, list):
            self.fail((*path, "ingress"), "ingress must be a list of interface names")
            raw = []
        for i, dev in enumerate(raw):
            why = interface_name_problem(dev)
            if why is None and dev in ingress:
                why = f"{dev!r} is listed twice"
            if why is not None:
                self.fail((*path, "ingress", i), why)
            else:
                ingress.append(dev)
        return ChainConfig(hook=hook, priority=prio, ingress=tuple(ingress))

    def control(self, value: Any) -> ControlConfig:
        path: Path_ = ("control",)
        m = self.mapping(value, path, {"socket", "mode", "group"})
        mode = m.get("mode", 0o600)
        if isinstance(mode, str):
            try:
                mode = int(mode, 8)
            except ValueError:
                self.fail((*path, "mode"), f"mode must be octal such as '0600', got {mode!r}")
                mode = 0o600
        if not isinstance(mode, int) or mode & ~0o660:
            self.fail((*path, "mode"), "mode may only grant read/write to owner and group (e.g. 0600, 0660)")
            mode = 0o600
        return ControlConfig(
            socket=self.get(m, "socket", path, str, "/run/nftblockd/control.sock"),
            mode=mode,
            group=self.get(m, "group", path, str, None),
        )

    def batch(self, value: Any) -> BatchConfig:
        path: Path_ = ("batch",)
        m = self.mapping(value, path, {"max_ops", "delay"})
        return BatchConfig(
            max_ops=self.positive_int(m, "max_ops", path, 10000, 1, 1_000_000),
            delay=self.duration(m, "delay", path, 0.002),
        )

    def reconcile(self, value: Any) -> float:
        m = self.mapping(value, ("reconcile",), {"interval"})
        return self.duration(m, "interval", ("reconcile",), 30.0, positive=True)

    def metrics(self, value: Any) -> str | None:
        m = self.mapping(value, ("metrics",), {"listen"})
        listen = self.get(m, "listen", ("metrics",), str, None)
        if listen is not None and not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[0-9.]+|localhost):\d{1,5}", listen):
            self.fail(("metrics", "listen"), f"expected ADDRESS:PORT such as 127.0.0.1:9789, got {listen!r}")
            return None
        return str(listen) if listen is not None else None

    def blocklists(self, value: Any) -> tuple[BlocklistConfig, ...]:
        if value is None:
            return (BlocklistConfig("default"),)
        m = self.mapping(value, ("blocklists",), set(value) if isinstance(value, dict) else set())
        out = []
        for name, body in m.items():
            path: Path_ = ("blocklists", name)
            if not NAME_RE.fullmatch(name) or name == "allow":
                self.fail(path, "a blocklist name is a letter then up to 23 letters, digits or _ "
                                "('allow' is reserved for the allowlist)")
                continue
            b = self.mapping(body, path, {"timeout", "size", "subnet_escalation"})
            out.append(BlocklistConfig(
                name=name,
                timeout=self.timeout(b, "timeout", path, 3600.0),
                size=self.positive_int(b, "size", path, 262144, 1, 2**28),
                subnet=self.subnet_escalation(b.get("subnet_escalation"), (*path, "subnet_escalation")),
                line=self.doc.line(path),
            ))
        if not out:
            self.fail(("blocklists",), "at least one blocklist is needed")
        return tuple(out)

    def subnet_escalation(self, value: Any, path: Path_) -> SubnetEscalation | None:
        """A blocklist's `subnet_escalation:` (absent or `enabled: false`: None)."""
        if value is None:
            return None
        m = self.mapping(value, path, {"ipv4_prefix", "ipv6_prefix", "threshold", "window", "bantime",
                                       "max_prefixes", "enabled"})
        if not self.get(m, "enabled", path, bool, True):
            return None
        return SubnetEscalation(
            # no wider than /8 and /32: an escalation is for a provider's customer block, not a whole provider
            ipv4_prefix=self.positive_int(m, "ipv4_prefix", path, 24, 8, 31),
            ipv6_prefix=self.positive_int(m, "ipv6_prefix", path, 48, 32, 127),
            threshold=self.positive_int(m, "threshold", path, 5, 2, 65536),
            window=self.duration(m, "window", path, 600.0, positive=True, most=MAX_TIMEOUT),
            bantime=self.duration(m, "bantime", path, 86400.0, positive=True, most=MAX_TIMEOUT),
            max_prefixes=self.positive_int(m, "max_prefixes", path, 100_000, 1, 10_000_000),
        )

    def jails(self, value: Any, blocklists: set[str]) -> tuple[JailConfig, ...]:
        m = self.mapping(value, ("jails",), set(value) if isinstance(value, dict) else set())
        out = []
        for name, body in m.items():
            path: Path_ = ("jails", name)
            if not NAME_RE.fullmatch(name):
                self.fail(path, "a jail name is a letter then up to 23 letters, digits or _")
                continue
            j = self.mapping(body, path, {
                "files", "journal", "filter", "maxretry", "findtime", "bantime", "escalation", "blocklist",
                "ignoreip", "ipv6_prefix", "enabled", "recidive", "watch", "actions", "fleet_maxretry",
                "fleet_findtime",
            })
            recidive = self.get(j, "recidive", path, bool, False)
            watch = j.get("watch") or []
            if not isinstance(watch, list) or not all(isinstance(w, str) for w in watch):
                self.fail((*path, "watch"), "watch must be a list of jail names")
                watch = []
            if watch and not recidive:
                self.fail((*path, "watch"), "watch is only for recidive jails (recidive: true)")
            files = j.get("files") or []
            if isinstance(files, str):
                files = [files]
            if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
                self.fail((*path, "files"), "files must be a list of paths or globs")
                files = []
            matches: tuple[tuple[str, str], ...] = ()
            journal_path: str | None = None
            if "journal" in j:
                jm = self.mapping(j["journal"], (*path, "journal"), {"matches", "path"})
                raw = jm.get("matches") or {}
                journal_path = self.get(jm, "path", (*path, "journal"), str, None)
                if not isinstance(raw, dict) or not raw:
                    self.fail((*path, "journal", "matches"), "journal needs matches such as "
                              "{_SYSTEMD_UNIT: ssh.service} (a list of values ORs them)")
                else:
                    pairs = []
                    for k, v in raw.items():
                        values = v if isinstance(v, list) else [v]
                        if not re.fullmatch(r"[A-Z0-9_]+", str(k)) or not values or any(
                                isinstance(x, dict | list) for x in values):
                            self.fail((*path, "journal", "matches", k), "a journal field name (capitals, "
                                      "digits, _) with a value or a list of values")
                            continue
                        pairs += [(str(k), str(x)) for x in values]
                    matches = tuple(pairs)
            if not files and not matches and j.get("enabled", True) and not recidive:
                self.fail(path, "a jail needs files: or journal: to read from (or recidive: true)")
            flt = self.get(j, "filter", path, str, "")
            if not flt and not recidive:
                self.fail(path, "a jail needs a filter (a built-in name, a YAML file or a fail2ban .conf)")
            blocklist = self.get(j, "blocklist", path, str, "default")
            if blocklist not in blocklists:
                self.fail((*path, "blocklist"), f"unknown blocklist {blocklist!r}")
            esc = self.mapping(j.get("escalation"), (*path, "escalation"), {"factor", "max", "enabled"})
            factor = self.get(esc, "factor", (*path, "escalation"), (int, float), 2.0)
            if factor < 1:
                self.fail((*path, "escalation", "factor"), "factor must be at least 1")
            v6 = self.positive_int(j, "ipv6_prefix", path, 64, 16, 128)
            out.append(JailConfig(
                name=name,
                filter=flt,
                files=tuple(files),
                journal_matches=matches,
                journal_path=journal_path,
                maxretry=self.positive_int(j, "maxretry", path, 5, 1, 1_000_000),
                findtime=self.duration(j, "findtime", path, 600.0, positive=True),
                bantime=self.timeout(j, "bantime", path, 3600.0),
                escalation=Escalation(
                    factor=float(factor),
                    max=self.duration(esc, "max", (*path, "escalation"), 7 * 86400.0, most=MAX_TIMEOUT),
                    enabled=self.get(esc, "enabled", (*path, "escalation"), bool, True),
                ),
                blocklist=blocklist,
                ignoreip=self.addresses(j.get("ignoreip"), (*path, "ignoreip")),
                ipv6_prefix=v6,
                enabled=self.get(j, "enabled", path, bool, True),
                recidive=recidive,
                watch=tuple(watch),
                fleet_maxretry=(self.positive_int(j, "fleet_maxretry", path, 2, 2, 1_000_000)
                                if j.get("fleet_maxretry") is not None else None),
                fleet_findtime=(self.duration(j, "fleet_findtime", path, 600.0, positive=True)
                                if j.get("fleet_findtime") is not None else None),
                actions=self.names(j, "actions", path),
                line=self.doc.line(path),
                filter_line=self.doc.line((*path, "filter")),
            ))
        return tuple(out)

    def feeds(self, value: Any, blocklists: set[str]) -> tuple[FeedConfig, ...]:
        m = self.mapping(value, ("feeds",), set(value) if isinstance(value, dict) else set())
        out = []
        for name, body in m.items():
            path: Path_ = ("feeds", name)
            if not NAME_RE.fullmatch(name):
                self.fail(path, "a feed name is a letter then up to 23 letters, digits or _")
                continue
            f = self.mapping(body, path, {
                "url", "path", "format", "column", "refresh", "jitter", "timeout", "max_size", "blocklist",
                "ban_timeout", "max_shrink", "min_prefix_v4", "min_prefix_v6", "allow_special", "defer_removals",
                "max_retry_after", "max_stale", "actions",
            })
            url = self.get(f, "url", path, str, None)
            fpath = self.get(f, "path", path, str, None)
            if (url is None) == (fpath is None):
                self.fail(path, "a feed needs exactly one of url: or path:")
            if url is not None and not re.match(r"^https?://", url):
                self.fail((*path, "url"), "url must start with http:// or https://")
            fmt = self.get(f, "format", path, str, "plain")
            if fmt not in ("plain", "csv", "json"):
                self.fail((*path, "format"), "format must be plain, csv or json")
            blocklist = self.get(f, "blocklist", path, str, "")
            if blocklist not in blocklists:
                self.fail((*path, "blocklist"), f"unknown blocklist {blocklist!r}")
            shrink = self.get(f, "max_shrink", path, (int, float), 0.5)
            if not 0 < shrink <= 1:
                self.fail((*path, "max_shrink"), "max_shrink is a share between 0 and 1")
            jitter = self.get(f, "jitter", path, (int, float), 0.1)
            if not 0 <= jitter < 1:
                self.fail((*path, "jitter"), "jitter is a share between 0 and 1")
            out.append(FeedConfig(
                name=name,
                blocklist=blocklist,
                url=url,
                path=fpath,
                format=fmt,
                column=self.get(f, "column", path, (int, str), 0),
                refresh=self.duration(f, "refresh", path, 3600.0, positive=True),
                jitter=float(jitter),
                timeout=self.duration(f, "timeout", path, 30.0, positive=True),
                max_size=self.positive_int(f, "max_size", path, 64 * 1024 * 1024, 1, 2**34),
                ban_timeout=self.timeout(f, "ban_timeout", path, PERMANENT),
                max_shrink=float(shrink),
                min_prefix_v4=self.positive_int(f, "min_prefix_v4", path, 8, 1, 32),
                min_prefix_v6=self.positive_int(f, "min_prefix_v6", path, 16, 1, 128),
                allow_special=self.get(f, "allow_special", path, bool, False),
                defer_removals=self.get(f, "defer_removals", path, bool, False),
                max_retry_after=(None if f.get("max_retry_after") is None
                                 else self.duration(f, "max_retry_after", path, 0.0)),
                max_stale=(None if f.get("max_stale") is None or str(f["max_stale"]).lower() in PERMANENT_WORDS
                           else self.duration(f, "max_stale", path, 0.0, positive=True)),
                actions=self.names(f, "actions", path),
                line=self.doc.line(path),
            ))
        return tuple(out)

    # -- actions (docs/actions.md) --------------------------------------------------------------------

    def names(self, m: dict[str, Any], key: str, path: Path_) -> tuple[str, ...]:
        """A list of action names (checked against `actions:` in action_refs, once every section is read)."""
        raw = m.get(key)
        if raw is None:
            return ()
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            self.fail((*path, key), "actions is a list of action names (defined under the top-level actions:)")
            return ()
        return tuple(raw)

    def action_refs(self, cfg: Config) -> None:
        known = {a.name for a in cfg.actions}
        users: list[tuple[Path_, tuple[str, ...]]] = [(("jails", j.name), j.actions) for j in cfg.jails]
        users += [(("feeds", f.name), f.actions) for f in cfg.feeds]
        if cfg.fleet is not None:
            users.append((("fleet",), cfg.fleet.actions))
        for path, names in users:
            for i, n in enumerate(names):
                if n not in known:
                    hint = f" (defined: {', '.join(sorted(known))})" if known else " (no actions: are defined)"
                    self.fail((*path, "actions", i), f"unknown action {n!r}{hint}")
                elif n in names[:i]:
                    self.fail((*path, "actions", i), f"action {n!r} is listed twice")

    def str_pairs(self, value: Any, path: Path_, key_re: re.Pattern[str], what: str,
                  banned: str = "\r\n\0") -> list[tuple[str, str]]:
        """A mapping of names to scalar values (numbers become text), each name matching `key_re`, no value
        holding a character of `banned`."""
        if value is None:
            return []
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping of {what}")
            return []
        out = []
        for k, v in value.items():
            if not isinstance(k, str) or not key_re.fullmatch(k):
                self.fail((*path, k), f"{k!r} is not a valid {what} name")
            elif isinstance(v, dict | list) or v is None:
                self.fail((*path, k), f"the value of {k!r} must be a string or a number")
            elif any(c in str(v) for c in banned):
                self.fail((*path, k), f"the value of {k!r} must be one line (no CR, LF or NUL)" if "\n" in banned
                          else f"the value of {k!r} cannot hold a NUL")
            else:
                out.append((k, str(v).lower() if isinstance(v, bool) else str(v)))
        return out

    def actions(self, value: Any) -> tuple[ActionConfig, ...]:
        m = self.mapping(value, ("actions",), set(value) if isinstance(value, dict) else set())
        out = []
        for name, body in m.items():
            a = self.action(str(name), body)
            if a is not None:
                out.append(a)
        return tuple(out)

    # complexity exempt (C901): one flat walk over an action's keys, each checked where it is read
    def action(self, name: str, body: Any) -> ActionConfig | None:  # noqa: C901
        path: Path_ = ("actions", name)
        if not NAME_RE.fullmatch(name):
            self.fail(path, "an action name is a letter then up to 23 letters, digits or _")
            return None
        common = {"type", "on", "timeout", "retries", "retry_delay", "queue", "concurrency", "rate", "burst"}
        kind = body.get("type") if isinstance(body, dict) else None
        specific = {"command": {"argv", "env"}, "webhook": {"url", "headers", "batch"},
                    "fail2ban": {"file", "options", "lifecycle"}}
        if kind not in ACTION_TYPES:
            self.fail(path if kind is None else (*path, "type"),
                      f"an action needs type: {', '.join(ACTION_TYPES)}" + ("" if kind is None else f"; got {kind!r}"))
            return None
        a = self.mapping(body, path, common | specific[str(kind)])
        on_raw = a.get("on", ["ban"])
        if isinstance(on_raw, str):
            on_raw = [on_raw]
        on: list[str] = []
        if not isinstance(on_raw, list) or not on_raw:
            self.fail((*path, "on"), "on is a list of events: ban, unban")
        else:
            for i, ev in enumerate(on_raw):
                if ev not in ACTION_EVENTS:
                    self.fail((*path, "on", i), f"unknown event {ev!r} (events: {', '.join(ACTION_EVENTS)})")
                elif ev not in on:
                    on.append(str(ev))
        rate = self.get(a, "rate", path, (int, float), 1.0)
        if not 0 < rate <= 10_000:
            self.fail((*path, "rate"), "rate is runs per second, more than 0 and at most 10000")
            rate = 1.0
        cfg = ActionConfig(
            name=name, type=str(kind), on=tuple(on) or ("ban",),
            timeout=self.duration(a, "timeout", path, 30.0, positive=True, most=3600.0),
            retries=self.positive_int(a, "retries", path, 2, 0, 100),
            retry_delay=self.duration(a, "retry_delay", path, 1.0, most=3600.0),
            queue=self.positive_int(a, "queue", path, 1000, 1, 1_000_000),
            concurrency=self.positive_int(a, "concurrency", path, 1, 1, 64),
            rate=float(rate),
            burst=self.positive_int(a, "burst", path, 20, 1, 1_000_000),
            line=self.doc.line(path),
        )
        if kind == "command":
            argv = a.get("argv")
            if not isinstance(argv, list) or not argv or not all(isinstance(x, str | int | float) for x in argv):
                self.fail((*path, "argv"), "argv is a non-empty list of strings: the program, then its arguments "
                          "(no shell; {address}-style placeholders are filled in each one)")
                argv = []
            args = [str(x) for x in argv]
            for i, t in enumerate(args):
                try:
                    parse_template(t)
                except TemplateError as exc:
                    self.fail((*path, "argv", i), str(exc))
            if args and not os.path.isabs(args[0]):
                self.fail((*path, "argv", 0), f"the program must be an absolute path, got {args[0]!r} "
                          "(no PATH lookup: the daemon's PATH is not the operator's)")
            elif args and "{" in args[0]:
                self.fail((*path, "argv", 0), "the program cannot hold a placeholder")
            env = self.str_pairs(a.get("env"), (*path, "env"), _ENV_NAME_RE, "environment variable")
            for k, v in env:
                try:
                    parse_template(v)
                except TemplateError as exc:
                    self.fail((*path, "env", k), str(exc))
            return replace(cfg, argv=tuple(args), env=tuple(env))
        if kind == "webhook":
            url = self.get(a, "url", path, str, "")
            if not re.fullmatch(r"https?://[^\s]+", url):
                self.fail((*path, "url"), "a webhook needs url: http://... or https://...")
            headers = self.str_pairs(a.get("headers"), (*path, "headers"), _HEADER_RE, "header")
            return replace(cfg, url=url, headers=tuple(headers),
                           batch=self.positive_int(a, "batch", path, 1, 1, 10_000))
        # the file itself is read in the daemon's build step (daemon.compile_actions), as filters are
        file = self.get(a, "file", path, str, "")
        # fail2ban options may span lines (`logpath` of the *-lines actions), as in a jail.local
        options = self.str_pairs(a.get("options"), (*path, "options"), _F2B_TAG_RE, "fail2ban option", "\0")
        if not file:
            self.fail(path, "a fail2ban action needs file: (an action.d .conf file)")
        elif not os.path.isabs(file):
            self.fail((*path, "file"), f"file must be an absolute path, got {file!r}")
        life = a.get("lifecycle", True)
        if not isinstance(life, bool):
            self.fail((*path, "lifecycle"), f"lifecycle is true or false (whether the file's actionstart and "
                      f"actionstop run), got {life!r}")
            life = True
        return replace(cfg, file=file, options=tuple(options), file_line=self.doc.line((*path, "file")),
                       lifecycle=life)

    def secret_file(self, m: dict[str, Any], key: str, path: Path_) -> str | None:
        """A path to a file only root (its owner) may read: a secret readable by others is refused."""
        value = self.get(m, key, path, str, None)
        if value is None:
            return None
        try:
            st = os.stat(value)
        except OSError as exc:
            self.fail((*path, key), f"cannot use {value}: {exc.strerror}")
            return str(value)
        if not stat.S_ISREG(st.st_mode):
            self.fail((*path, key), f"{value} is not a regular file")
        elif st.st_mode & 0o077:
            self.fail((*path, key), f"{value} is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o});"
                      f" chmod 0600 it")
        return str(value)

    def plain_file(self, m: dict[str, Any], key: str, path: Path_) -> str | None:
        value = self.get(m, key, path, str, None)
        if value is not None and not os.path.isfile(value):
            self.fail((*path, key), f"{value} is not a readable file")
        return value if value is None else str(value)

    # complexity exempt (C901): one flat walk over the fleet block's keys, each checked where it is read
    def fleet(self, value: Any, cfg: Config) -> FleetConfig | None:  # noqa: C901
        path: Path_ = ("fleet",)
        m = self.mapping(value, path, {
            "name", "host_id", "url", "sentinel", "username", "password_file", "tls", "share", "blocklist",
            "trust", "history", "actions", "count",
        })
        if not m:
            self.fail(path, "fleet needs at least a name and a server (url: or sentinel:)")
            return None
        name = self.get(m, "name", path, str, "")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", name):
            self.fail((*path, "name"), "a fleet name is 1 to 32 letters, digits, '.', '_' or '-'")
        host_id = self.get(m, "host_id", path, str, None)
        if host_id is None:
            host_id = socket.gethostname().split(".")[0]
            if not FLEET_HOST_RE.fullmatch(host_id):
                self.fail((*path, "host_id"), f"the hostname {host_id!r} is not usable as a host id; set host_id")
        elif not FLEET_HOST_RE.fullmatch(host_id):
            self.fail((*path, "host_id"), "a host id is a letter or digit then up to 63 letters, digits, "
                      "'.', '_', ':' or '-'")
        url = self.get(m, "url", path, str, None)
        hosts: list[tuple[str, int]] = []
        service = ""
        if url is not None and not re.fullmatch(r"rediss?://[^\s]+", url):
            self.fail((*path, "url"), "url must start with redis:// or rediss://")
        if url is not None and re.match(r"rediss?://[^/@]*:[^/@]*@", url):
            self.fail((*path, "url"), "no password in the url: the config is world-readable; use password_file")
        if "sentinel" in m:
            sp: Path_ = (*path, "sentinel")
            s = self.mapping(m["sentinel"], sp, {"hosts", "service"})
            service = self.get(s, "service", sp, str, "")
            if not service:
                self.fail(sp, "sentinel needs service: (the name the Sentinels monitor)")
            raw = s.get("hosts")
            if not isinstance(raw, list) or not raw:
                self.fail((*sp, "hosts"), "sentinel needs hosts: a list of HOST:PORT")
                raw = []
            for i, h in enumerate(raw):
                hm = re.fullmatch(r"\[?([A-Za-z0-9.:-]+?)\]?:(\d{1,5})", str(h))
                if hm is None or not 0 < int(hm.group(2)) < 65536:
                    self.fail((*sp, "hosts", i), f"expected HOST:PORT, got {h!r}")
                else:
                    hosts.append((hm.group(1), int(hm.group(2))))
        if (url is None) == ("sentinel" not in m):
            self.fail(path, "fleet needs exactly one of url: or sentinel:")
        tls: FleetTLS | None = None
        if "tls" in m:
            tp: Path_ = (*path, "tls")
            t = self.mapping(m["tls"], tp, {"ca", "cert", "key"})
            tls = FleetTLS(ca=self.plain_file(t, "ca", tp), cert=self.plain_file(t, "cert", tp),
                           key=self.secret_file(t, "key", tp))
            if (tls.cert is None) != (tls.key is None):
                self.fail(tp, "a client certificate needs both cert: and key:")
        share_path: Path_ = (*path, "share")
        share = self.mapping(m.get("share"), share_path, {"jails", "cli"})
        jails_raw = share.get("jails", "all")
        share_jails: tuple[str, ...] | None = None
        jail_names = {j.name for j in cfg.jails}
        if jails_raw == "all":
            share_jails = None
        elif jails_raw in ("none", False):
            share_jails = ()
        elif isinstance(jails_raw, list) and all(isinstance(j, str) for j in jails_raw):
            for j in jails_raw:
                if j not in jail_names:
                    self.fail((*share_path, "jails"), f"{j!r} is not a jail of this config")
            share_jails = tuple(jails_raw)
        else:
            self.fail((*share_path, "jails"), "jails is all, none or a list of jail names")
        blocklist = self.get(m, "blocklist", path, str, "default")
        owned = {f.blocklist for f in cfg.feeds}
        if blocklist not in {b.name for b in cfg.blocklists}:
            self.fail((*path, "blocklist"), f"unknown blocklist {blocklist!r}")
        elif blocklist in owned:
            self.fail((*path, "blocklist"), f"blocklist {blocklist!r} is filled by feeds; fleet bans need another")
        tp2: Path_ = (*path, "trust")
        trust = self.mapping(m.get("trust"), tp2, {"min_prefix_v4", "min_prefix_v6", "max_ban",
                                                   "allow_permanent", "rate", "burst"})
        max_ban = self.duration(trust, "max_ban", tp2, 7 * 86400.0)
        if max_ban < 1:
            self.fail((*tp2, "max_ban"), "max_ban must be at least 1s")
            max_ban = 7 * 86400.0
        history = self.duration(m, "history", path, 7 * 86400.0)
        if history < 60:
            self.fail((*path, "history"), "history must be at least 1m (how long a host may be away and replay)")
            history = 7 * 86400.0
        rate = self.get(trust, "rate", tp2, (int, float), 2000.0)
        if rate <= 0:
            self.fail((*tp2, "rate"), "rate must be positive (events per second per origin)")
            rate = 2000.0
        cp: Path_ = (*path, "count")
        count = self.mapping(m.get("count"), cp, {"rate", "burst"})
        count_rate = self.get(count, "rate", cp, (int, float), 100.0)
        if count_rate <= 0:
            self.fail((*cp, "rate"), "rate must be positive (failures per second one host may count)")
            count_rate = 100.0
        return FleetConfig(
            count_rate=float(count_rate),
            count_burst=self.positive_int(count, "burst", cp, 1000, 1, 10_000_000),
            name=name,
            host_id=host_id,
            url=url,
            sentinel_hosts=tuple(hosts),
            sentinel_service=service,
            username=self.get(m, "username", path, str, None),
            password_file=self.secret_file(m, "password_file", path),
            tls=tls,
            share_jails=share_jails,
            share_cli=self.get(share, "cli", share_path, bool, True),
            blocklist=blocklist,
            min_prefix_v4=self.positive_int(trust, "min_prefix_v4", tp2, 16, 1, 32),
            min_prefix_v6=self.positive_int(trust, "min_prefix_v6", tp2, 48, 1, 128),
            max_ban=max_ban,
            allow_permanent=self.get(trust, "allow_permanent", tp2, bool, False),
            rate=float(rate),
            burst=self.positive_int(trust, "burst", tp2, 20000, 1, 10_000_000),
            history=history,
            actions=self.names(m, "actions", path),
            line=self.doc.line(path),
        )


FLEET_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_HEADER_RE = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}")  # an HTTP token (RFC 9110)
_F2B_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")

__all__ = [
    "ACTION_EVENTS", "ACTION_TYPES", "ActionConfig", "BatchConfig", "BlocklistConfig", "ChainConfig", "Config",
    "ConfigError", "ControlConfig", "Escalation",
    "FeedConfig", "FleetConfig", "FleetTLS", "JailConfig", "Problem", "SubnetEscalation", "examine_config",
    "examine_text",
    "in_file_order", "load_config", "parse_config",
]

