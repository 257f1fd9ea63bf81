"""Load and validate the YAML config into frozen dataclasses.

Every problem is collected and reported at once as `file:line: where: reason`, so an operator fixes a config
in one pass. This module never touches the kernel, the network or the filesystem beyond reading the file and
checking the permissions of the secret files it names (a fleet password file readable by others is refused
here, so both `--check-config` and the daemon refuse it); compiling filters happens in the daemon's build
step, which reports with the line numbers kept here.

This module loads the file and reads the core sections; the values live in config/model.py, the typed
getters in config/reader.py and the actions:/fleet: sections in config/sections.py. Importers keep using
`from nftblockd.config import X` for every name in __all__.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from nftblockd import boundedread
from nftblockd.config.model import (
    ACTION_EVENTS,
    ACTION_TYPES,
    HOOK_PRIORITIES,
    NAME_RE,
    TABLE_FAMILIES,
    ActionConfig,
    BatchConfig,
    BlocklistConfig,
    ChainConfig,
    Config,
    ConfigError,
    ControlConfig,
    Escalation,
    FeedConfig,
    FleetConfig,
    FleetTLS,
    JailConfig,
    Problem,
    SubnetEscalation,
    in_file_order,
    interface_name_problem,
)
from nftblockd.config.sections import ActionFleetSections
from nftblockd.config.yamlsrc import Path_, YamlError, load_yaml
from nftblockd.durations import (
    MAX_TIMEOUT,
    PERMANENT,
    PERMANENT_WORDS,
)


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
        text = boundedread.read_text(p, boundedread.CONFIG_MAX_BYTES)
    except OSError as exc:
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


class _Builder(ActionFleetSections):
    """Walks the document once, collecting problems instead of stopping at the first: the core sections
    here, actions: and fleet: in config/sections.py, the typed getters in config/reader.py."""

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
                "max_retry_after", "max_stale", "allow_empty", "actions",
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
                allow_empty=self.get(f, "allow_empty", path, bool, False),
                actions=self.names(f, "actions", path),
                line=self.doc.line(path),
            ))
        return tuple(out)


__all__ = [
    "ACTION_EVENTS", "ACTION_TYPES", "ActionConfig", "BatchConfig", "BlocklistConfig", "ChainConfig", "Config",
    "ConfigError", "ControlConfig", "Escalation",
    "FeedConfig", "FleetConfig", "FleetTLS", "JailConfig", "Problem", "SubnetEscalation", "examine_config",
    "examine_text",
    "in_file_order", "load_config", "parse_config",
]
