"""The daemon's build steps that need no running daemon: overrides, filter and action compiling, the checks of
interfaces, log files and own addresses that `--check-config` shares with a start.

Functions of the Config (and of the host's addresses and devices) only; it must NOT hold daemon state, start
tasks or touch nftables: daemon/root.py composes what these build.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nftblockd.actions.f2baction import F2bAction, check_action, load_action
from nftblockd.addr import IPAddr
from nftblockd.config import Config, ConfigError, Problem
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.matcher import Filter, FilterError, UnsupportedRegex, expand_tags
from nftblockd.detect.rxlint import exponential_risk
from nftblockd.events import Origin
from nftblockd.kernel import links, ownaddr

log = logging.getLogger("nftblockd")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What became of a reload: `message` is one sentence (or a config error list) for the operator."""

    ok: bool
    message: str


@dataclass(frozen=True, slots=True)
class Overrides:
    socket: str | None = None
    state_dir: str | None = None
    metrics: str | None = None


def apply_overrides(cfg: Config, o: Overrides) -> Config:
    if o.socket:
        cfg = replace(cfg, control=replace(cfg.control, socket=o.socket))
    if o.state_dir:
        cfg = replace(cfg, state_dir=o.state_dir)
    if o.metrics:
        cfg = replace(cfg, metrics_listen=o.metrics)
    return cfg


def own_addresses() -> list[IPAddr]:
    """The machine's own addresses (never banned when allowlist_self is on), read over rtnetlink."""
    try:
        return ownaddr.own_addresses()
    except (OSError, ownaddr.DumpError) as exc:
        log.warning("could not read the machine's own addresses: %s", exc)
        return []


def device_names() -> set[str] | None:
    """The network devices of this namespace (None when they cannot be read: then nothing is warned)."""
    try:
        lk = links.Links()
    except OSError as exc:
        log.warning("could not list network devices: %s", exc)
        return None
    try:
        return lk.names()
    except (OSError, links.DumpError) as exc:
        log.warning("could not list network devices: %s", exc)
        return None
    finally:
        lk.close()


def ingress_warnings(cfg: Config, present: set[str] | None) -> list[Problem]:
    """A warning for each `chain.ingress` device that does not exist now: its chain is attached when it
    appears (a misspelt name never appears, which is why it is said at --check-config and at start)."""
    if present is None:
        return []
    return [Problem(cfg.file, cfg.lines.get(("chain", "ingress", i), 0), "chain.ingress",
                    f"device {dev!r} does not exist now (its ingress chain is attached when it appears)",
                    warning=True)
            for i, dev in enumerate(cfg.chain.ingress) if dev not in present]


def _origin(text: str) -> Origin:
    return text if text in ("cli", "jail", "feed", "fail2ban", "store", "remote") else "store"  # type: ignore


def guarded(fn: Callable[..., None], *args: Any) -> None:
    """Offer events to the actions from the ban path: a bug there is logged, never raised into the path that
    enforces (the ban is in the kernel already)."""
    try:
        fn(*args)
    except Exception:
        log.exception("offering events to the actions failed; the bans stand")


def compile_filters(cfg: Config) -> tuple[dict[str, Filter], list[Problem]]:
    """Compile every enabled jail's filter; a bad one is a problem with the jail's file and line."""
    out: dict[str, Filter] = {}
    problems = []
    for j in cfg.jails:
        if not j.enabled or j.recidive or not j.filter:
            continue
        try:
            out[j.name] = load_filter(j.filter, search_dirs=(Path(cfg.file).parent / "filter.d",
                                                             Path("/etc/nftblockd/filter.d")))
        except FilterError as exc:
            problems.append(Problem(cfg.file, j.filter_line or j.line, f"jails.{j.name}.filter", str(exc)))
    return out, problems


def compile_actions(cfg: Config) -> tuple[dict[str, F2bAction], list[Problem]]:
    """Read every fail2ban action file; a file that cannot serve is a problem at the action's `file:` line."""
    out: dict[str, F2bAction] = {}
    problems = []
    for a in cfg.actions:
        if a.type != "fail2ban" or not a.file.startswith("/"):  # a relative file: refused by the config
            continue
        why = check_action(a.file, dict(a.options), a.on)
        if why:
            problems += [Problem(cfg.file, a.file_line or a.line, f"actions.{a.name}.file", w) for w in why]
        else:
            out[a.name] = load_action(a.file, dict(a.options))
    return out, problems


def build_filters(cfg: Config) -> dict[str, Filter]:
    """compile_filters, raising ConfigError for any problem."""
    out, problems = compile_filters(cfg)
    if problems:
        raise ConfigError(problems)
    return out


def build_actions(cfg: Config) -> dict[str, F2bAction]:
    """compile_actions, raising ConfigError for any problem."""
    out, problems = compile_actions(cfg)
    if problems:
        raise ConfigError(problems)
    return out


def regex_warnings(cfg: Config, filters: dict[str, Filter]) -> list[Problem]:
    """A warning for each regex of a jail's filter that backtracks exponentially (`^(a+)+$`,
    rxlint.exponential_risk): the matcher runs it on RE2, or on `re` over a capped line, but the operator
    should rewrite it. The shipped filters and fail2ban's stock ones have none."""
    out = []
    for j in cfg.jails:
        flt = filters.get(j.name)
        if flt is None:
            continue
        d = flt.definition
        for src in (*d.failregex, *d.ignoreregex, *(x for x in (d.prefregex, d.prefix) if x is not None)):
            try:
                risk = exponential_risk(expand_tags(src.text))
            except UnsupportedRegex:
                continue
            if risk is not None:
                out.append(Problem(cfg.file, j.filter_line or j.line, f"jails.{j.name}.filter",
                                   f"{src.where}: {risk}: rewrite it so each character can be matched one way "
                                   "(a possessive or atomic repeat, or one repeat instead of two nested)",
                                   warning=True))
    return out


def log_file_warnings(cfg: Config) -> list[Problem]:
    """A warning for each log file (or glob) of an enabled jail that names nothing now: the daemon follows it
    once it appears, but until then the jail reads nothing from it."""
    from nftblockd.sources.tail import missing_files

    out = []
    for j in cfg.jails:
        if not j.enabled:
            continue
        for i, pattern in enumerate(j.files):
            for why in missing_files([pattern]):
                out.append(Problem(cfg.file, cfg.lines.get(("jails", j.name, "files", i), j.line),
                                   f"jails.{j.name}.files", why + " (followed once it appears)", warning=True))
    return out
