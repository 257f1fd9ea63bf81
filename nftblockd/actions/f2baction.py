"""fail2ban `action.d` files as nftblockd actions: read, with their tags filled the way fail2ban fills them,
and compiled into shell templates in which nothing from a log line is ever shell text.

Reading reuses detect/f2b.py (INI, `[INCLUDES]`, `.local` files, `%(name)s` and `%(known/name)s`
interpolation, `[Init]`, `<tag>` substitution): the options the config gives (`options:`, fail2ban's
`action = X[tag=value]`) win over `[Init]`, as in fail2ban. What is left afterwards are the *event tags*, filled
per ban: `<ip>`, `<name>`, `<failures>`, `<matches>`, `<F-USER>`, ...

The safety rule (fail2ban's CVE-2021-32749 was code execution through an action's tags). The action's
command is a shell script, written by whoever wrote the action file; the event tags are not. An event tag is
replaced in the script by
- its value itself only when the tag is one whose value nftblockd made (the address in its canonical form,
  the jail's name, numbers, this host's name) and the value holds nothing but `[A-Za-z0-9_.:/+@=,-]`;
- otherwise (`<matches>`, `<ipmatches>`, `<ipjailmatches>`, `<F-*>`: text from a log line) by a reference
  to an environment variable, `${NFTBLOCK_MATCHES}`, that the runner sets to the value. The shell expands a
  parameter once and never parses its value again, so no quote, `$(...)`, backtick, `;` or newline in it can
  become a command; the reference is wrapped for where it stands (`"${V}"` outside quotes, `${V}` inside
  double quotes, `'"${V}"'` inside single quotes) so that the value also stays one word, as written.
Tag substitution is one pass over the finished script: a value is never searched for tags or `%(...)s`.
The remaining risk is a script that itself runs text as code (`eval <matches>`): no action fail2ban ships
does; docs/actions.md says so.

This module reads the action files it is given and nothing else; no clock, no network.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from nftblockd.detect.f2b import F2bConfig, _substitute_tags, read_config
from nftblockd.detect.matcher import FilterError

__all__ = ["COMMANDS", "F2bAction", "ShellTemplate", "TagRef", "check_action", "env_name", "load_action",
           "render_shell"]

COMMANDS = ("actionstart", "actionstop", "actioncheck", "actionban", "actionunban")
# Tags fail2ban fills per ban. Values of the TRUSTED ones are made by nftblockd (literal in the script when
# they are plain); the rest carry log text (always an environment variable).
TRUSTED_TAGS = frozenset({"ip", "fid", "ip-rev", "family", "name", "failures", "ipfailures", "ipjailfailures",
                          "time", "bantime", "bancount", "restored", "fq-hostname", "sh-hostname", "actname",
                          "agent"})
UNTRUSTED_TAGS = frozenset({"matches", "ipmatches", "ipjailmatches"})
_TRUE = ("1", "on", "true", "yes")  # fail2ban's reading of a "bool" option (helpers._as_bool): all else is false
_PLAIN_RE = re.compile(r"[A-Za-z0-9_.:/+@=,-]*")
_TAG_RE = re.compile(r"<([^ <>]+)>")
# Commands that make a fail2ban action a ban action: nftblockd enforces the ban itself (in its own sets)
_FIREWALL_RE = re.compile(r"(?<![\w-])(iptables|ip6tables|nft|ipset|firewall-cmd|ufw|pfctl|ipfw|shorewall|"
                          r"npf|npfctl|ipf|apf|afctl|route|ip\s+route|xt_recent|hosts\.deny)(?![\w-])")


def is_event_tag(tag: str) -> bool:
    return tag in TRUSTED_TAGS or tag in UNTRUSTED_TAGS or tag.startswith("F-")


def env_name(tag: str) -> str:
    """The environment variable an event tag's value travels in: `F-USER` -> `NFTBLOCK_F_USER`."""
    return "NFTBLOCK_" + re.sub(r"\W", "_", tag).upper()


class TagRef(NamedTuple):
    """An event tag in a script, and the shell quoting context it stands in: `n` unquoted (also inside
    `$(...)` or backticks), `d` inside double quotes, `s` inside single quotes."""

    tag: str
    context: str


@dataclass(frozen=True, slots=True)
class ShellTemplate:
    where: str  # file:line of the option, for messages
    parts: tuple[str | TagRef, ...]

    @property
    def empty(self) -> bool:
        return not "".join(p for p in self.parts if isinstance(p, str)).strip() and not any(
            isinstance(p, TagRef) for p in self.parts)


@dataclass(frozen=True, slots=True)
class F2bAction:
    file: str
    commands: tuple[tuple[str, ShellTemplate], ...]  # COMMANDS that are set and not empty
    fixed: tuple[tuple[str, str], ...]  # event tags the options fix (`name=SSH`): they win over the event
    # fail2ban's `actionstart_on_demand`: actionstart before the jail's first ban instead of at its start (fail2ban
    # turns it on by itself only for `?family=` conditional options, which nftblockd does not read)
    start_on_demand: bool = False

    def command(self, which: str) -> ShellTemplate | None:
        for k, t in self.commands:
            if k == which:
                return t
        return None


# complexity exempt (C901): one character loop of a small shell reader; split, it would be harder to check
def split_script(text: str, where: str = "") -> ShellTemplate:  # noqa: C901
    """Find the event tags of a finished script and the quoting context of each (a small reading of POSIX
    sh: backslash, single and double quotes, backticks, `$(`...`)`, comments)."""
    parts: list[str | TagRef] = []
    lit: list[str] = []
    stack = ["n"]  # n: unquoted, d: "...", s: '...', b: `...`, p: $(...), (: a parenthesis inside one
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        top = stack[-1]
        if c == "<":
            m = _TAG_RE.match(text, i)
            if m is not None and is_event_tag(m.group(1)):
                parts.append("".join(lit))
                lit = []
                parts.append(TagRef(m.group(1), "s" if top == "s" else "d" if top == "d" else "n"))
                i = m.end()
                continue
        lit.append(c)
        i += 1
        if top == "s":
            if c == "'":
                stack.pop()
            continue
        if c == "\\" and i < n:
            lit.append(text[i])
            i += 1
            continue
        if c == "`":
            if top == "b":
                stack.pop()
            else:
                stack.append("b")
        elif c == "$" and i < n and text[i] == "(":
            lit.append("(")
            i += 1
            stack.append("p")
        elif top == "d":
            if c == '"':
                stack.pop()
        elif c == "'":
            stack.append("s")
        elif c == '"':
            stack.append("d")
        elif c == "(":
            stack.append("(")
        elif c == ")" and top in ("p", "("):
            stack.pop()
        elif c == "#" and (not lit[:-1] or lit[-2].isspace() or lit[-2] in ";&|("):
            j = text.find("\n", i)  # a comment to the end of the line: no tags are filled there
            j = n if j < 0 else j
            lit.append(text[i:j])
            i = j
    parts.append("".join(lit))
    return ShellTemplate(where, tuple(parts))


def render_shell(t: ShellTemplate, values: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The script for one event and the environment variables it refers to. `values`: event tag -> value
    (a tag without a value becomes empty, as fail2ban leaves an unknown `<F-...>` empty)."""
    out: list[str] = []
    env: dict[str, str] = {}
    for p in t.parts:
        if isinstance(p, str):
            out.append(p)
            continue
        value = values.get(p.tag, "")
        if p.tag in TRUSTED_TAGS and _PLAIN_RE.fullmatch(value):
            out.append(value)
            continue
        var = env_name(p.tag)
        env[var] = value
        ref = "${" + var + "}"
        out.append(f'"{ref}"' if p.context == "n" else ref if p.context == "d" else f"'\"{ref}\"'")
    return "".join(out), env


def load_action(path: str | Path, options: Mapping[str, str] | None = None) -> F2bAction:
    """Read an action file (with its includes and .local files); raises FilterError with file:line."""
    cfg = read_config(path)
    if "Definition" not in cfg.sections:
        raise FilterError(str(path), "not a fail2ban action: no [Definition] section")
    given = {k.lower(): v for k, v in (options or {}).items()}
    combined: dict[str, str] = {}
    for opt in cfg.own_options("Init"):
        # `<known/opt>` is the file's own value, read without the jail's option of that name: a jail's
        # `chain="<known/chain>"` (what jail.conf's action_ passes) means "the action's default", not itself.
        v = cfg.get("Init", opt, {k: x for k, x in given.items() if k != opt}) or ""
        combined.setdefault("known/" + opt, v)
        if not is_event_tag(opt):  # `[Init] name = default`: the event's jail wins, as in fail2ban
            combined[opt] = v
    combined.update(given)
    commands: list[tuple[str, ShellTemplate]] = []
    for opt in COMMANDS:
        raw = cfg.raw("Definition", opt, given)
        if raw is None:
            continue
        text = cfg.get("Definition", opt, given) or ""
        text = _fill_static(text, combined, cfg, given, raw.where)
        t = split_script(text, raw.where)
        if not t.empty:
            commands.append((opt, t))
    fixed = tuple((k, v) for k, v in given.items() if is_event_tag(k))
    on_demand = (cfg.get("Definition", "actionstart_on_demand", given) or "").strip().lower()
    return F2bAction(str(path), tuple(commands), fixed, on_demand in _TRUE)


def _fill_static(text: str, combined: Mapping[str, str], cfg: F2bConfig, given: Mapping[str, str],
                 where: str) -> str:
    """fail2ban's tag substitution of everything but the event tags (which stay `<tag>` for split_script)."""
    # The event tags are hidden from the substitution: an `[Init]` or `[Definition]` key of the same name
    # (`name = default`) must not fill them, and nothing substituted here may be searched for them again.
    hidden = _TAG_RE.sub(lambda m: f"\0{m.group(1)}\0" if is_event_tag(m.group(1)) and m.group(1) not in given
                         else m.group(0), text)
    filled = _substitute_tags(hidden, combined, cfg, given, where)
    filled = _TAG_RE.sub(lambda m: f"\0{m.group(1)}\0" if is_event_tag(m.group(1)) and m.group(1) not in given
                         else m.group(0), filled)
    filled = _substitute_tags(filled, {k: v for k, v in given.items()}, cfg, given, where)
    return re.sub(r"\0([^\0]*)\0", r"<\1>", filled)


def check_action(path: str, options: Mapping[str, str], on: Sequence[str]) -> list[str]:
    """Why the action file at `path` cannot serve an action run on `on` events ([] when it can)."""
    if not Path(path).is_file():
        return [f"{path} is not a readable file"]
    try:
        action = load_action(path, options)
    except FilterError as exc:
        return [str(exc).replace("fail2ban filter file", "fail2ban action file")]
    out = []
    for ev in on:
        if action.command("action" + ev) is None:
            out.append(f"{path} has no action{ev} (nothing to run on {ev}); leave {ev} out of on:")
    ban = action.command("actionban")
    if ban is not None:
        script = "".join(p for p in ban.parts if isinstance(p, str))
        m = _FIREWALL_RE.search(script)
        if m is not None:
            out.append(f"{path} is a ban action (its actionban runs {m.group(1)}): nftblockd enforces bans in "
                       "its own nftables sets; use only notification actions (mail, abuseipdb, ...)")
    return out
