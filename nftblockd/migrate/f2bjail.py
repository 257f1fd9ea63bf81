"""fail2ban's jail configuration (merged `jail.conf`, `jail.d/`, `jail.local`) → a migration plan.

fail2ban's rules, as its JailReader applies them: a jail is a section of the merged files, its options fall
back to `[DEFAULT]`, `%(__name__)s` is the jail's name, `%(known/x)s` the value a later file replaced;
`filter = NAME[opts]` names `filter.d/NAME.conf`, `action` holds one `NAME[opts]` per line naming
`action.d/NAME.conf`. Times are fail2ban's (`10m`, `1h 30m`, `1w`, `3600`, `-1`).

Every option that changes what fail2ban does and that the plan cannot express becomes a `Dropped` with the
reason; nothing is left out without one.

This module must NOT read files, run commands or look at the clock: what it needs from the host (is a filter
there, what does its journalmatch say, is an action a firewall action, what unit does `sshd.service` name)
comes through the `Host` protocol (migrate/host.py reads the real one; the tests pass fakes).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from nftblockd.addr import AddressError, HostBitsError, format_target, parse_target
from nftblockd.detect.f2b import F2bConfig
from nftblockd.detect.filterload import parse_spec
from nftblockd.detect.matcher import FilterError
from nftblockd.durations import MAX_TIMEOUT, PERMANENT, BanLength

__all__ = ["ActionPlan", "Dropped", "Host", "JailPlan", "Migration", "f2b_seconds", "our_jail", "plan_migration",
           "secret_options", "split_spec"]

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,23}$")  # config.NAME_RE
_TRUE = ("true", "yes", "1", "on")
# fail2ban's bantime.increment formula without multipliers: bantime * 2**count * factor, for count >= 1
_F2B_GROWTH = 2.0
_F2B_MAX_SHIFT = 20  # fail2ban stops doubling after 20 earlier bans
# fail2ban's default bantime.formula (jail.conf's comment, and ObserverThread's when none is set): what
# nftblockd's escalation with factor 2 computes, so naming it in a config is no loss
_F2B_DEFAULT_FORMULA = "ban.Time*(1<<(ban.Countifban.Count<20else20))*banFactor"


class Host(Protocol):
    """What the plan needs to know about the machine's fail2ban files (migrate/host.py)."""

    def filter_file(self, name: str) -> str | None:
        """The path of filter.d/NAME.conf (or NAME.local when there is no .conf), None if neither exists."""

    def journalmatch(self, filter_path: str, options: Mapping[str, str]) -> str | None:
        """The filter's `journalmatch` with its options applied; raises FilterError if unreadable."""

    def action_file(self, name: str) -> str | None:
        """The path of action.d/NAME.conf (or .local), None if neither exists."""

    def ban_action(self, path: str, options: Mapping[str, str]) -> str | None:
        """Why the action is a firewall (ban) action, or None for a notification action."""

    def action_problems(self, path: str, options: Mapping[str, str]) -> list[str]:
        """Why nftblockd could not run this notification action ([] when it can)."""

    def action_events(self, path: str, options: Mapping[str, str]) -> tuple[str, ...]:
        """The events the action file has a script for, of ban and unban (fail2ban runs `actionunban` on every
        unban, so the imported action must too)."""

    def real_unit(self, unit: str) -> str:
        """The unit `unit` is an alias of (journald records the real name), or `unit` itself."""

    def log_access(self, path: str) -> str | None:
        """Why the packaged service could not read the log file (or glob) `path`, or None when it can or
        cannot be told yet (a file that does not exist)."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """Something of the fail2ban setup the generated config does not carry over, and why."""

    jail: str  # fail2ban's jail name, "DEFAULT" for a [DEFAULT] option, or "" for the setup as a whole
    what: str
    reason: str
    jails: tuple[str, ...] = ()  # the enabled jails it concerns, when more than `jail` says

    def __str__(self) -> str:
        where = f"[{self.jail}] " if self.jail else ""
        which = f" (jails {', '.join(self.jails)})" if self.jails else ""
        return f"{where}{self.what}: {self.reason}{which}"


@dataclass(frozen=True, slots=True)
class ActionPlan:
    name: str
    file: str
    options: tuple[tuple[str, str], ...]
    on: tuple[str, ...] = ("ban",)


@dataclass(frozen=True, slots=True)
class JailPlan:
    name: str  # nftblockd's (letters, digits, _)
    f2b_name: str
    filter: str = ""  # a filter spec: /etc/fail2ban/filter.d/sshd.conf[mode=normal]
    files: tuple[str, ...] = ()
    journal: tuple[tuple[str, tuple[str, ...]], ...] = ()  # field -> values (ORed); fields ANDed
    journal_path: str | None = None
    maxretry: int = 5
    findtime: float = 600.0
    bantime: BanLength = 600.0
    escalation: tuple[float, float] | None = None  # (factor, max seconds); None: off
    ignoreip: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()
    recidive: bool = False
    notes: tuple[str, ...] = ()  # what the reader should know about this jail (written as comments)


@dataclass(frozen=True, slots=True)
class Migration:
    source: str  # the fail2ban directory
    jails: tuple[JailPlan, ...]
    actions: tuple[ActionPlan, ...]
    allowlist: tuple[str, ...]
    allowlist_self: bool
    dropped: tuple[Dropped, ...]


# ------------------------------------------------------------------------------------------------------
# fail2ban's value syntaxes

_TIME_UNITS: tuple[tuple[str, float], ...] = (
    (r"y(?:ears?)?|yy?", 52 * 7 * 86400.0),
    (r"mo(?:nths?)?|mm?o", (365 * 3 + 366) * 86400.0 / 4 / 12),
    (r"w(?:eeks?)?|ww?", 7 * 86400.0),
    (r"d(?:ays?)?|dd?", 86400.0),
    (r"h(?:ours?)?|hh?", 3600.0),
    (r"m(?:in(?:utes?)?)?|mm?|mi", 60.0),
    (r"s(?:ec(?:onds?)?)?|ss?", 1.0),
)
_TIME_TOKEN = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*(" + "|".join(f"(?:{u})" for u, _ in _TIME_UNITS) + r")?(?![a-z])",
                         re.IGNORECASE)


def f2b_seconds(text: str) -> float:
    """fail2ban's time value (MyTime.str2seconds for the forms its docs show): `600`, `10m`, `1h 30m`, `1w`,
    `-1`. Raises ValueError."""
    s = text.strip()
    if not s:
        raise ValueError("empty time value")
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _TIME_TOKEN.match(s, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot read fail2ban time {text!r}")
        unit = (m.group(2) or "s").lower()
        size = next(v for u, v in _TIME_UNITS if re.fullmatch(u, unit))
        total += float(m.group(1)) * size
        pos = m.end()
        while pos < len(s) and s[pos] in " \t+":
            pos += 1
    return total


def split_spec(spec: str) -> tuple[str, dict[str, str]]:
    """fail2ban's extractOptions: `name[a=1, b="x, y"]` -> ("name", {"a": "1", "b": "x, y"}). ValueError
    (FilterError is one) when it cannot be read; the reading is the filter specs' (filterload.parse_spec)."""
    name, opts = parse_spec(spec)
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"cannot read {spec!r} as NAME[option=value, ...]")
    return name, opts


def _action_lines(value: str) -> list[str]:
    """fail2ban's `action` value: one action per line, a bracket may span lines."""
    out: list[str] = []
    cur = ""
    depth = 0
    for line in value.split("\n"):
        if not line.strip():
            continue
        cur = f"{cur} {line.strip()}" if cur else line.strip()
        depth += line.count("[") - line.count("]")
        if depth <= 0:
            out.append(cur)
            cur, depth = "", 0
    if cur:
        out.append(cur)
    return out


# ------------------------------------------------------------------------------------------------------
# the plan


class _Jail:
    """One fail2ban jail's options, interpolated in its section the way fail2ban's JailReader does."""

    def __init__(self, cfg: F2bConfig, name: str) -> None:
        self.cfg = cfg
        self.name = name
        self.vars = {"__name__": name}

    def get(self, opt: str) -> str | None:
        v = self.cfg.get(self.name, opt, self.vars)
        return None if v is None else v.strip()

    def own(self) -> list[str]:
        return self.cfg.own_options(self.name)


def plan_migration(cfg: F2bConfig, source: str, host: Host) -> Migration:
    """Turn the merged fail2ban jail configuration into a plan for an nftblockd config."""
    dropped: list[Dropped] = []
    jails: list[tuple[JailPlan, frozenset[str], bool]] = []
    actions: dict[tuple[str, tuple[tuple[str, str], ...]], ActionPlan] = {}
    used_names: set[str] = set()
    for section in cfg.sections:
        if section in ("INCLUDES", "Definition", "Init") or section.startswith("KNOWN/") or "?" in section:
            continue
        jail = _Jail(cfg, section)
        try:
            enabled = (jail.get("enabled") or "false").lower() in _TRUE
        except FilterError as exc:
            dropped.append(Dropped(section, "enabled", f"cannot read: {exc}"))
            continue
        if not enabled:
            continue
        try:
            plan, ignore, ignoreself = _plan_jail(jail, host, dropped, actions, used_names)
        except (FilterError, ValueError) as exc:
            dropped.append(Dropped(section, "the whole jail", str(exc)))
            continue
        if plan is not None:
            used_names.add(plan.name)
            jails.append((plan, ignore, ignoreself))
    # fail2ban's ignoreip is per jail; what every jail ignores becomes the global allowlist (which also
    # protects from feeds and manual bans), the rest stays with its jail
    common: frozenset[str] = frozenset.intersection(*(i for _, i, _ in jails)) if jails else frozenset()
    out = []
    for plan, ignore, _ in jails:
        extra = tuple(sorted(ignore - common, key=_addr_key))
        out.append(_replace(plan, ignoreip=extra))
    selfs = {s for _, _, s in jails}
    if len(selfs) > 1:
        dropped.append(Dropped("", "ignoreself", "some jails set ignoreself = false and others true; nftblockd's "
                               "allowlist_self is one setting for all: kept true (this host's addresses are "
                               "never banned)"))
    return Migration(
        source=source,
        jails=tuple(out),
        actions=tuple(actions.values()),
        allowlist=tuple(sorted(common, key=_addr_key)),
        allowlist_self=selfs != {False},
        dropped=_once(dropped, cfg),
    )


def _once(dropped: Sequence[Dropped], cfg: F2bConfig) -> tuple[Dropped, ...]:
    """Each fact once: the same item with the same reason in several jails is one entry naming them, and
    one that comes from [DEFAULT] (no jail sets the option itself) is said of [DEFAULT]."""
    groups: dict[tuple[str, str], list[str]] = {}
    for d in dropped:
        if d.jail and not d.jails:
            groups.setdefault((d.what, d.reason), []).append(d.jail)
    out: list[Dropped] = []
    for d in dropped:
        if not d.jail or d.jails:
            out.append(d)
            continue
        names = groups.pop((d.what, d.reason), None)
        if names is None:
            continue  # said with the first jail it concerns
        names = list(dict.fromkeys(names))
        opt = _option_of(d.what)
        inherited = [n for n in names if opt in cfg.defaults and opt not in cfg.own_options(n)]
        own = [n for n in names if n not in inherited]
        if inherited:
            out.append(Dropped("DEFAULT", d.what, d.reason, tuple(inherited)))
        if own:
            out.append(Dropped(", ".join(own), d.what, d.reason))
    return tuple(out)


def _option_of(what: str) -> str:
    """The fail2ban option a Dropped's `what` is about: `usedns = yes` -> usedns, `ignoreip x` -> ignoreip."""
    word = what.split(maxsplit=1)[0] if what.strip() else ""
    return word.split("=", 1)[0]


def _replace(p: JailPlan, **kw: object) -> JailPlan:
    from dataclasses import replace

    return replace(p, **kw)  # type: ignore[arg-type]


def _addr_key(a: str) -> tuple[int, str]:
    return (6 if ":" in a else 4, a)


def our_jail(f2b_name: str, jails: Collection[str]) -> str | None:
    """The jail among `jails` (the running daemon's) that fail2ban's jail `f2b_name` became when its config was
    imported: the same name, or the name the import gives it (`nginx-http-auth` -> `nginx_http_auth`); None
    when neither runs. (Two fail2ban jails that differ only in such characters, `a-b` and `a_b`, became
    `a_b` and `a_b_2`: the bans of both are taken to be `a_b`'s.)"""
    if f2b_name in jails:
        return f2b_name
    name = _our_name(f2b_name, set())
    return name if name in jails else None


def _our_name(f2b_name: str, used: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", f2b_name)
    if not base or not base[0].isalpha():
        base = "j_" + base
    base = base[:24]
    name, n = base, 2
    while name in used:
        suffix = f"_{n}"
        name = base[: 24 - len(suffix)] + suffix
        n += 1
    return name


# complexity exempt (C901): one pass over a jail's options in the order fail2ban reads them, each where
# it is translated, so that what is dropped and why sits next to what is kept
def _plan_jail(jail: _Jail, host: Host, dropped: list[Dropped],  # noqa: C901
               actions: dict[tuple[str, tuple[tuple[str, str], ...]], ActionPlan],
               used: set[str]) -> tuple[JailPlan | None, frozenset[str], bool]:
    j = jail.name
    notes: list[str] = []
    name = _our_name(j, used)
    if name != j:
        notes.append(f"fail2ban jail [{j}] (nftblockd names are letters, digits and _)")

    def drop(what: str, reason: str) -> None:
        dropped.append(Dropped(j, what, reason))

    # -- limits
    maxretry = int(float(jail.get("maxretry") or "5"))
    findtime = f2b_seconds(jail.get("findtime") or "600")
    bt = f2b_seconds(jail.get("bantime") or "600")
    bantime: BanLength = PERMANENT if bt < 0 else bt
    if maxretry < 1:
        drop("maxretry", f"maxretry = {maxretry} bans on nothing in fail2ban; nftblockd needs at least 1: using 1")
        maxretry = 1
    escalation = _escalation(jail, bantime, drop)

    # -- filter and source
    flt_spec = jail.get("filter") or ""
    fname, fopts = split_spec(flt_spec) if flt_spec else ("", {})
    recidive = fname == "recidive"
    filter_spec = ""
    files: tuple[str, ...] = ()
    journal: tuple[tuple[str, tuple[str, ...]], ...] = ()
    journal_path: str | None = None
    if recidive:
        notes.append("fail2ban's recidive reads fail2ban.log; nftblockd's recidive jail counts the bans of the "
                     "other jails directly")
    elif not fname:
        raise ValueError("no filter (filter = is empty)")
    else:
        path = host.filter_file(fname)
        if path is None:
            raise ValueError(f"filter {fname!r}: no filter.d/{fname}.conf or .local")
        filter_spec = _spec(path, fopts)
        backend_spec = jail.get("backend") or "auto"
        bname, bopts = split_spec(backend_spec)
        if bname == "systemd":
            jm = jail.get("journalmatch") or host.journalmatch(path, fopts)
            if not jm:
                raise ValueError(f"backend = systemd, but neither the jail nor filter {fname} has a journalmatch "
                                 "(nftblockd never reads the whole journal)")
            journal = _journal(jm, host, drop)
            for k, v in bopts.items():
                if k in ("journalpath", "journalfiles") and v.strip():
                    journal_path = v.split()[0]
                    if k == "journalfiles" or len(v.split()) > 1:
                        drop(f"backend option {k}", "nftblockd reads one journal directory (journal.path); "
                             f"used {journal_path!r}")
                else:
                    drop(f"backend option {k}={v}", "no equivalent in nftblockd's journal source")
            if jail.get("logpath"):
                notes.append("backend = systemd: fail2ban ignores logpath, and so does this jail")
        else:
            if bname not in ("auto", "pyinotify", "polling", "gamin"):
                drop(f"backend = {backend_spec}", "unknown backend; the jail tails its logpath")
            given = jail.get("logpath") or ""
            files = _logpaths(given, drop, host)
            if not files:
                raise ValueError("no logpath the service may read" if given.strip() else "no logpath")

    # -- what fail2ban would also have applied
    for opt in ("failregex", "ignoreregex", "prefregex", "maxlines", "datepattern"):
        if opt in jail.own() and jail.get(opt):
            drop(opt, f"a jail's own {opt} is not carried over: put it in a filter.d/{fname or 'NAME'}.local "
                      "(nftblockd reads those)")
    cmd = jail.get("ignorecommand")
    if cmd:
        drop("ignorecommand", "nftblockd never runs a command to decide a ban: add the addresses to the allowlist")
    usedns = (jail.get("usedns") or "warn").lower()
    if usedns in _TRUE:
        drop("usedns = yes", "nftblockd never resolves host names in log lines (a name in a log is only counted "
                             "as rejected)")
    tz = jail.get("logtimezone")
    if tz:
        drop("logtimezone", "nftblockd reads a timestamp without a zone in the host's zone")
    enc = (jail.get("logencoding") or "auto").lower()
    if enc not in ("auto", "utf-8", "utf8", "ascii"):
        drop(f"logencoding = {enc}", "nftblockd reads logs as UTF-8 (undecodable bytes replaced)")

    ignore, ignoreself = _ignoreip(jail, drop)
    acts = _actions(jail, host, drop, actions, notes)
    plan = JailPlan(
        name=name, f2b_name=j, filter=filter_spec, files=files, journal=journal, journal_path=journal_path,
        maxretry=maxretry, findtime=findtime, bantime=bantime, escalation=escalation, actions=acts,
        recidive=recidive, notes=tuple(notes),
    )
    return plan, ignore, ignoreself


def _spec(path: str, opts: Mapping[str, str]) -> str:
    if not opts:
        return path
    parts = []
    for k, v in opts.items():
        if re.fullmatch(r"[\w.:/+@-]*", v):
            parts.append(f"{k}={v}")
        else:
            parts.append(f'{k}="' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return f"{path}[{', '.join(parts)}]"


def _escalation(jail: _Jail, bantime: BanLength, drop: _Drop) -> tuple[float, float] | None:
    """fail2ban's bantime.increment as nftblockd's escalation (bantime * factor**n up to max)."""
    if (jail.get("bantime.increment") or "false").lower() not in _TRUE:
        return None
    if bantime is PERMANENT:
        return None
    assert isinstance(bantime, float)
    factor = float(jail.get("bantime.factor") or "1")
    mult = (jail.get("bantime.multipliers") or "").split()
    formula = jail.get("bantime.formula")
    maxtime_s = jail.get("bantime.maxtime")
    cap: float | None = f2b_seconds(maxtime_s) if maxtime_s else None
    if jail.get("bantime.rndtime"):
        drop("bantime.rndtime", "nftblockd adds no random time to a ban")
    if (jail.get("bantime.overalljails") or "false").lower() in _TRUE:
        drop("bantime.overalljails", "nftblockd's escalation counts the offender's earlier bans in the same jail "
                                     "only; a recidive jail is the way to count across jails")
    if mult:
        result_factor, last = _multipliers(mult, drop)
        cap = bantime * last if cap is None else min(cap, bantime * last)
        if factor != 1:
            drop("bantime.factor", f"x {factor:g} on top of bantime.multipliers: nftblockd's escalation is "
                                   "bantime x factor^n, from the multipliers alone")
    else:
        if formula and "".join(formula.split()) != _F2B_DEFAULT_FORMULA:
            drop("bantime.formula", "nftblockd's escalation is bantime x factor^n up to a max; fail2ban's "
                                    "default formula was assumed (factor 2)")
        if factor != 1:
            drop("bantime.factor", f"fail2ban multiplies every repeat ban by {factor:g} on top of doubling; "
                                   "nftblockd doubles only (factor 2)")
        result_factor = _F2B_GROWTH
        if cap is None:
            cap = bantime * float(1 << _F2B_MAX_SHIFT)
    if cap > MAX_TIMEOUT:
        cap = MAX_TIMEOUT
    return (result_factor, max(cap, bantime))


def _multipliers(mult: list[str], drop: _Drop) -> tuple[float, float]:
    """bantime.multipliers (ban n lasts bantime x m[n]) as (factor per earlier ban, the last multiplier)."""
    try:
        m = [float(x) for x in mult]
    except ValueError:
        drop("bantime.multipliers", f"not numbers: {' '.join(mult)}; using factor 2")
        return _F2B_GROWTH, float(1 << _F2B_MAX_SHIFT)
    growth = m[1] if len(m) == 2 else _F2B_GROWTH
    if len(m) >= 3 and m[1] > 0:
        ratios = {round(m[i + 1] / m[i], 6) for i in range(1, len(m) - 1) if m[i] > 0}
        growth = m[2] / m[1]
        if len(ratios) != 1:
            drop("bantime.multipliers", f"{' '.join(mult)} is not a geometric series; nftblockd multiplies "
                 f"by one factor per earlier ban: using {growth:g}")
        if abs(m[1] - growth) > 1e-9:
            drop("bantime.multipliers", f"the first repeat ban is bantime x {m[1]:g} in fail2ban, x {growth:g} "
                 "in nftblockd")
    return max(growth, 1.0), max(m[-1], 1.0) if m else 1.0


class _Drop(Protocol):
    def __call__(self, what: str, reason: str) -> None: ...


def _logpaths(value: str, drop: _Drop, host: Host) -> tuple[str, ...]:
    out = []
    for line in value.split("\n"):
        words = line.split()
        if not words:
            continue
        path = words[0]
        if not path.startswith("/"):
            drop(f"logpath {path}", "not an absolute path")
            continue
        why = host.log_access(path)
        if why is not None:  # a jail that would never read a line, or a file that is not a log (/etc/shadow)
            drop(f"logpath {path}", why)
            continue
        if words[1:] == ["head"]:
            drop(f"logpath {path} head", "nftblockd reads a new file from its end, as fail2ban's `tail`")
        elif words[1:] not in ([], ["tail"]):
            drop(f"logpath {line.strip()}", "unknown words after the path")
        out.append(path)
    return tuple(out)


def _journal(jm: str, host: Host, drop: _Drop) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """fail2ban's journalmatch (`A=x B=y + C=z`: terms ANDed, `+` ORs groups) as nftblockd's matches
    (a field's values ORed, fields ANDed)."""
    groups: list[list[tuple[str, str]]] = [[]]
    for word in jm.split():
        if word == "+":
            groups.append([])
            continue
        k, sep, v = word.partition("=")
        if not sep or not re.fullmatch(r"[A-Z0-9_]+", k):
            raise ValueError(f"cannot read journalmatch term {word!r}")
        if k == "_SYSTEMD_UNIT":
            v = host.real_unit(v)
        groups[-1].append((k, v))
    groups = [g for g in groups if g]
    if not groups:
        raise ValueError("empty journalmatch")
    fields = {k for g in groups for k, _ in g}
    if all(len(g) == 1 for g in groups) and len(fields) == 1:
        f = next(iter(fields))
        return ((f, tuple(dict.fromkeys(v for g in groups for _, v in g))),)
    # Alternatives over different fields have no form in nftblockd's matches: keep one group, preferring one
    # with _SYSTEMD_UNIT (journald sets it; no local user can forge it, unlike _COMM)
    chosen = next((g for g in groups if any(k == "_SYSTEMD_UNIT" for k, _ in g)), groups[0])
    for g in groups:
        if g is not chosen:
            drop(f"journalmatch alternative {' '.join(f'{k}={v}' for k, v in g)}",
                 "nftblockd's journal matches cannot OR different fields; the jail reads "
                 f"{' '.join(f'{k}={v}' for k, v in chosen)} only")
    merged: dict[str, list[str]] = {}
    for k, v in chosen:
        merged.setdefault(k, []).append(v)
    return tuple((k, tuple(v)) for k, v in merged.items())


def _ignoreip(jail: _Jail, drop: _Drop) -> tuple[frozenset[str], bool]:
    out: set[str] = set()
    for word in re.split(r"[\s,]+", jail.get("ignoreip") or ""):
        if not word:
            continue
        try:
            net = parse_target(word)
        except HostBitsError as exc:
            # fail2ban masks 127.0.0.1/8 to 127.0.0.0/8; nftblockd widens no range on any path, an allowed one
            # included (docs/addresses.md). The stock `127.0.0.1/8` loses nothing: loopback is never banned.
            if exc.network.is_loopback:
                continue  # fail2ban's own default `127.0.0.1/8`: nothing is lost (loopback is never banned)
            drop(f"ignoreip {word}", f"host bits set: not a network, and nftblockd never widens one to {exc.network}; "
                 f"write {exc.network} to allow the range, or the address alone")
            continue
        except AddressError:
            drop(f"ignoreip {word}", "not an address or CIDR (host names and file: lists are not read; "
                                     "nftblockd never resolves names)")
            continue
        out.add(format_target(net))
    ignoreself = (jail.get("ignoreself") or "true").lower() in _TRUE
    return frozenset(out), ignoreself


def _actions(jail: _Jail, host: Host, drop: _Drop,
             actions: dict[tuple[str, tuple[tuple[str, str], ...]], ActionPlan], notes: list[str]) -> tuple[str, ...]:
    names: list[str] = []
    for line in _action_lines(jail.get("action") or ""):
        try:
            aname, opts = split_spec(line)
        except ValueError as exc:
            drop(f"action {line}", str(exc))
            continue
        path = host.action_file(aname)
        if path is None:
            drop(f"action {aname}", f"no action.d/{aname}.conf or .local")
            continue
        why = host.ban_action(path, opts)
        if why is not None:
            notes.append(f"action {aname}: replaced by nftblockd's own ban ({why})")
            continue
        clean: dict[str, str] = {}
        for k, v in opts.items():
            if v.strip() == f"<known/{k}>":
                continue  # "the action's own value" (`chain="<known/chain>"`): the same as not giving it
            if "\n" in v:
                v = " ".join(v.split())  # a multi-line logpath: the action's shell reads it as words
            clean[k.lower()] = v
        problems = host.action_problems(path, clean)
        if problems:
            drop(f"action {aname}", "; ".join(problems))
            continue
        key = (path, tuple(sorted(clean.items())))
        plan = actions.get(key)
        if plan is None:
            taken = {a.name for a in actions.values()}
            plan = ActionPlan(_our_name(aname, taken), path, tuple(clean.items()), host.action_events(path, clean))
            actions[key] = plan
        if plan.name not in names:
            names.append(plan.name)
    return tuple(names)


def secret_options(actions: Sequence[ActionPlan]) -> list[str]:
    """Option names that look like credentials (the output file must then be readable by root only)."""
    return [f"{a.name}.{k}" for a in actions for k, v in a.options
            if v and re.search(r"key|token|pass|secret", k, re.IGNORECASE)]
