"""Read fail2ban's own filter files (`filter.d/*.conf`) into nftblockd filters.

What a fail2ban filter file may use, and what this module implements of it:

- INI syntax as Python's configparser reads it for fail2ban: `[section]`, `key = value` or `key: value`,
  indented continuation lines (one regex per line), `#`/`;` comment lines, `;` inline comments, keys
  folded to lower case, a `[DEFAULT]` section visible from every section;
- `[INCLUDES]` with `before =` / `after =` files (relative to the including file), each followed by its
  `.local`, and for the filter itself `NAME.conf`, `NAME.d/*.conf`, `NAME.local`, `NAME.d/*.local`;
  a later file overrides a key and the value it replaced stays reachable as `%(known/key)s`;
- `%(name)s` interpolation, also `%(section/name)s`, `%(default/name)s`, `%(known/name)s`; `%%` is `%`;
- `[Init]` options and options given with the spec (`sshd.conf[mode=aggressive]`), which win over the
  file's own values, and fail2ban's `<tag>` substitution (`<mdre-<mode>>`, `<lt_<logtype>/__prefix_line>`)
  from those options and any `[Definition]` key;
- `prefregex` (with `<F-CONTENT>`), `failregex`, `ignoreregex`, `datepattern`; `<HOST>`, `<ADDR>`,
  `<F-...>` tags are the matcher's job (matcher.expand_tags).

`maxlines` > 1 is passed on (FilterDef.maxlines; the matcher searches a buffer of that many lines,
detect/multiline.py). Not implemented, and reported in `Filter.notes` rather than failing: `usedns`
(nftblockd never resolves names), `journalmatch` (exposed in the notes for the operator to copy into the
jail's `journal.matches`).

Pure apart from reading the filter files it is pointed at; nothing here touches the network or the clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nftblockd import boundedread
from nftblockd.boundedread import BoundedReadError
from nftblockd.detect.matcher import FilterDef, FilterError, RegexSource
from nftblockd.detect.multiline import MAX_MAXLINES

__all__ = ["F2bConfig", "read_config", "read_filter"]

_SECTION_RE = re.compile(r"^\[(?P<name>.+)\]\s*$")
_OPTION_RE = re.compile(r"^(?P<key>.*?)\s*(?P<sep>[=:])\s*(?P<value>.*)$")
_INTERP_RE = re.compile(r"%\(([^)]+)\)s")
_TAG_RE = re.compile(r"<([^ <>]+)>")
_SECOPT_RE = re.compile(r"^([\w\-]+)/([^\s>]+)$")
_MAX_DEPTH = 10  # configparser's interpolation depth
_MAX_TAG_REPLACE = 25
# Characters one value may expand to, by %(name)s interpolation (all levels counted) or by <tag> substitution.
# Ten levels of ten references are 10**9 characters: without a bound, a third-party filter made test-filter
# run past a minute at 280 MB (issue 13). The largest filter fail2ban ships expands to about 10 KB.
_MAX_EXPANSION = 1 << 20
_CONFIG_OPTS = ("usedns", "prefregex", "ignoreregex", "failregex", "maxlines", "datepattern", "journalmatch")


@dataclass(slots=True)
class _Value:
    text: str
    where: str  # file:line of the key


@dataclass(slots=True)
class F2bConfig:
    """Merged sections of a filter file and everything it includes (raw, uninterpolated values)."""

    defaults: dict[str, _Value] = field(default_factory=dict)
    sections: dict[str, dict[str, _Value]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    # -- reading -------------------------------------------------------------------------------------

    def merge(self, parsed: _Parsed) -> None:
        self.files.append(parsed.file)
        self.defaults.update(parsed.defaults)
        for name, opts in parsed.sections.items():
            if "?" in name:
                continue  # conditional sections (fail2ban's `[name?cond]`): unused by filters
            old = self.sections.get(name)
            if old is None:
                self.sections[name] = dict(opts)
                continue
            known = self.sections.setdefault("KNOWN/" + name, {})
            known.update({k: v for k, v in old.items() if k in opts})
            old.update(opts)

    # -- lookups ---------------------------------------------------------------------------------------

    def raw(self, section: str, option: str, vars: Mapping[str, str] | None = None) -> _Value | None:
        opt = option.lower()
        if vars and opt in vars:
            return _Value(vars[opt], "<option>")
        sec = self.sections.get(section)
        if sec is not None and opt in sec:
            return sec[opt]
        return self.defaults.get(opt)

    def get(self, section: str, option: str, vars: Mapping[str, str] | None = None) -> str | None:
        """An option's value with %(...)s interpolated in the context of `section`, or None if unset."""
        raw = self.raw(section, option, vars)
        if raw is None:
            return None
        return self._interpolate(raw.text, section, vars or {}, raw.where, 0, [_MAX_EXPANSION])

    def get_ex(self, section: str, option: str, vars: Mapping[str, str] | None = None) -> str | None:
        """Like get, but `sec/opt`, `default/opt` and `known/opt` name another section's option."""
        m = _SECOPT_RE.match(option)
        if m is not None:
            sec, opt = m.group(1), m.group(2)
            low = sec.lower()
            tries = ("KNOWN/" + section, section) if low == "known" else \
                ("DEFAULT",) if low == "default" else (sec,)
            for s in tries:
                if s == "DEFAULT":
                    v = self.defaults.get(opt.lower())
                    if v is not None:
                        return self._interpolate(v.text, section, {}, v.where, 0, [_MAX_EXPANSION])
                elif s in self.sections and opt.lower() in self.sections[s]:
                    return self.get(s, opt)
        return self.get(section, option, vars)

    def own_options(self, section: str) -> list[str]:
        return list(self.sections.get(section, {}))

    def _lookup(self, name: str, section: str, vars: Mapping[str, str]) -> _Value | None:
        key = name.lower()
        found = self.raw(section, key, vars)
        if found is not None:
            return found
        m = _SECOPT_RE.match(name)
        if m is None:
            return None
        sec, opt = m.group(1), m.group(2).lower()
        low = sec.lower()
        if low == "known":
            v = self.sections.get("KNOWN/" + section, {}).get(opt)
            return v if v is not None else self.defaults.get(opt)
        if low == "default":
            return self.defaults.get(opt)
        return self.sections.get(sec, {}).get(opt)

    def _interpolate(self, text: str, section: str, vars: Mapping[str, str], where: str, depth: int,
                     budget: list[int]) -> str:
        """`budget[0]`: characters the whole expansion may still produce (shared by every level)."""
        budget[0] -= len(text)
        if budget[0] < 0:
            raise FilterError(where, f"interpolation expands to more than {_MAX_EXPANSION} characters "
                                     "(%(name)s references multiplying at each level?)")
        if "%" not in text:
            return text
        if depth > _MAX_DEPTH:
            raise FilterError(where, f"interpolation nests deeper than {_MAX_DEPTH} levels (a loop?)")
        out: list[str] = []
        pos = 0
        while True:
            i = text.find("%", pos)
            if i < 0:
                out.append(text[pos:])
                break
            out.append(text[pos:i])
            if text.startswith("%%", i):
                out.append("%")
                pos = i + 2
                continue
            m = _INTERP_RE.match(text, i)
            if m is None:
                raise FilterError(where, f"'%' must be written '%%' or start %(name)s, "
                                         f"near {text[i:i + 20]!r}")
            ref = self._lookup(m.group(1), section, vars)
            if ref is None:
                raise FilterError(where, f"%({m.group(1)})s is not defined")
            out.append(self._interpolate(ref.text, section, vars, where, depth + 1, budget))
            pos = m.end()
        return "".join(out)


@dataclass(slots=True)
class _Parsed:
    file: str
    defaults: dict[str, _Value] = field(default_factory=dict)
    sections: dict[str, dict[str, _Value]] = field(default_factory=dict)


def _parse_ini(text: str, file: str) -> _Parsed:
    """configparser's reading rules, as fail2ban configures it, keeping the line of every key."""
    out = _Parsed(file)
    current: dict[str, _Value] | None = None
    key: str | None = None
    key_indent = 0
    lines: list[str] = []

    def flush() -> None:
        nonlocal key
        if current is not None and key is not None:
            while lines and not lines[-1]:
                lines.pop()
            current[key].text = "\n".join(lines)
        key = None

    for lineno, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        indent = len(raw) - len(raw.lstrip())
        if stripped.startswith(("#", ";")):
            continue  # comment lines vanish, even inside a multi-line value
        value = _strip_inline_comment(raw)
        if key is not None and indent > key_indent and value.strip():
            lines.append(value.strip())
            continue
        if not value.strip():
            if key is not None:
                lines.append("")
            continue
        flush()
        m = _SECTION_RE.match(stripped)
        if m is not None:
            name = m.group("name")
            current = out.defaults if name == "DEFAULT" else out.sections.setdefault(name, {})
            continue
        if current is None:
            raise FilterError(f"{file}:{lineno}", "a key before the first [section]")
        om = _OPTION_RE.match(value.strip())
        if om is None or not om.group("key"):
            raise FilterError(f"{file}:{lineno}", f"expected 'key = value', got {stripped!r}")
        key = om.group("key").strip().lower()
        key_indent = indent
        current[key] = _Value("", f"{file}:{lineno}")
        lines = [om.group("value").strip()]
    flush()
    return out


def _strip_inline_comment(line: str) -> str:
    # configparser with inline_comment_prefixes=";": a ';' after whitespace starts a comment
    for i, c in enumerate(line):
        if c == ";" and i > 0 and line[i - 1].isspace():
            return line[:i]
    return line


def _read_one(path: Path) -> _Parsed | None:
    try:
        text = boundedread.read_text(path, boundedread.FILTER_MAX_BYTES)
    except FileNotFoundError:
        return None
    except BoundedReadError as exc:
        raise FilterError(str(path), exc.reason) from None
    except OSError as exc:
        raise FilterError(str(path), f"cannot read: {exc.strerror or exc}") from None
    return _parse_ini(text, str(path))


def _with_local(paths: Sequence[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        out.append(p)
        local = p.with_suffix(".local")
        if local not in paths and local.is_file():
            out.append(local)
    return out


def _expand_includes(path: Path, seen: tuple[Path, ...]) -> list[tuple[Path, _Parsed]]:
    parsed = _read_one(path)
    if parsed is None:
        return []
    before: list[tuple[Path, _Parsed]] = []
    after: list[tuple[Path, _Parsed]] = []
    inc = parsed.sections.get("INCLUDES", {})
    for opt, bucket in (("before", before), ("after", after)):
        if opt not in inc:
            continue
        for name in inc[opt].text.split("\n"):
            name = name.strip()
            if not name:
                continue
            target = Path(name) if Path(name).is_absolute() else path.parent / name
            if target in seen or target == path:
                continue
            for p in _with_local([target]):
                bucket.extend(_expand_includes(p, (*seen, path)))
    return [*before, (path, parsed), *after]


def read_config(path: str | Path) -> F2bConfig:
    """Read a filter file with its .d/ and .local companions and everything they include."""
    p = Path(path)
    base = p.with_suffix("") if p.suffix in (".conf", ".local") else p
    candidates = [base.with_suffix(".conf")] if p.suffix != ".local" else [p]
    confd = Path(str(base) + ".d")
    if confd.is_dir():
        candidates += sorted(confd.glob("*.conf"))
    if p.suffix != ".local":
        candidates.append(base.with_suffix(".local"))
    if confd.is_dir():
        candidates += sorted(confd.glob("*.local"))
    existing = [c for c in candidates if c.is_file()]
    if not existing:
        raise FilterError(str(p), "no such fail2ban filter file")
    cfg = F2bConfig()
    done: set[Path] = set()
    for c in existing:
        for f, parsed in _expand_includes(c, ()):
            if f in done:
                continue
            done.add(f)
            cfg.merge(parsed)
    return cfg


# --------------------------------------------------------------------------------------------------------
# [Definition] + [Init] + spec options -> FilterDef


def _substitute_tags(value: str, combined: Mapping[str, str], cfg: F2bConfig, vars: Mapping[str, str],
                     where: str, stack: tuple[str, ...] = ()) -> str:
    """fail2ban's `<tag>` substitution: innermost tags first, repeated until nothing known is left."""
    counts: dict[str, int] = {}
    changed = True
    while changed:  # a replacement can complete an outer tag (`<lt_<logtype>/x>`): repeat until stable
        changed = False
        m = _TAG_RE.search(value)
        while m is not None:
            tag = m.group(1)
            repl = _tag_value(tag, combined, cfg, vars, where, stack)
            if repl is None:
                m = _TAG_RE.search(value, m.end())
                continue
            counts[tag] = counts.get(tag, 0) + 1
            if counts[tag] > _MAX_TAG_REPLACE:
                raise FilterError(where, f"<{tag}> keeps expanding into itself")
            value = value.replace(f"<{tag}>", repl)
            if len(value) > _MAX_EXPANSION:
                raise FilterError(where, f"<tag> substitution expands to more than {_MAX_EXPANSION} characters "
                                         f"(<{tag}> and the tags it holds multiplying?)")
            changed = True
            m = _TAG_RE.search(value, m.start())
    return value


def _tag_value(tag: str, combined: Mapping[str, str], cfg: F2bConfig, vars: Mapping[str, str], where: str,
               stack: tuple[str, ...]) -> str | None:
    if tag in stack:
        raise FilterError(where, f"<{tag}> refers to itself")
    raw = combined.get(tag)
    if raw is None:
        try:
            raw = cfg.get_ex("Definition", tag, vars)
        except FilterError:
            raw = None
    if raw is None:
        return None
    return _substitute_tags(raw, combined, cfg, vars, where, (*stack, tag))


def read_filter(path: str | Path, options: Mapping[str, str] | None = None) -> FilterDef:
    """A fail2ban filter file as a FilterDef; `options` are the spec's (`[mode=aggressive]`)."""
    cfg = read_config(path)
    if "Definition" not in cfg.sections:
        raise FilterError(str(path), "not a fail2ban filter: no [Definition] section")
    init_opts: dict[str, str] = {k.lower(): v for k, v in (options or {}).items()}
    p_opts = dict(init_opts)  # what interpolation in [Definition] sees: the spec's options win
    combined: dict[str, str] = {}
    where: dict[str, str] = {}
    for opt in _CONFIG_OPTS:
        if opt in p_opts:
            continue
        raw = cfg.raw("Definition", opt, p_opts)
        if raw is None:
            continue
        combined[opt] = cfg.get("Definition", opt, p_opts) or ""
        where[opt] = raw.where
    for opt in cfg.own_options("Init"):
        v = cfg.get("Init", opt) or ""
        init_opts.setdefault("known/" + opt, v)
        init_opts.setdefault(opt, v)
    combined.update(init_opts)

    def final(opt: str) -> str | None:
        v = combined.get(opt)
        if v is None:
            return None
        return _substitute_tags(v, combined, cfg, p_opts, where.get(opt, str(path)))

    def regexes(opt: str) -> tuple[RegexSource, ...]:
        v = final(opt)
        at = where.get(opt, str(path))
        return tuple(RegexSource(r, at) for r in (v or "").split("\n") if r.strip())

    notes: list[str] = []
    maxlines = 1
    raw_max = (final("maxlines") or "").strip()
    if raw_max:
        try:
            maxlines = int(raw_max)
        except ValueError:
            raise FilterError(where.get("maxlines", str(path)), f"maxlines must be a number, got {raw_max!r}") from None
        if maxlines > MAX_MAXLINES:
            notes.append(f"{where.get('maxlines', path)}: maxlines = {maxlines}: nftblockd buffers at most "
                         f"{MAX_MAXLINES} lines")
        elif maxlines > 1:
            notes.append(f"{where.get('maxlines', path)}: maxlines = {maxlines}: the regexes search the last "
                         f"{maxlines} lines of each source (on Python's re)")
    journal = final("journalmatch")
    if journal and journal.strip():
        notes.append(f"journalmatch: {' '.join(journal.split())}")
    pref = final("prefregex")
    datepattern = final("datepattern")
    return FilterDef(
        name=Path(path).stem,
        source=str(path),
        failregex=regexes("failregex"),
        ignoreregex=regexes("ignoreregex"),
        prefregex=RegexSource(pref, where.get("prefregex", str(path))) if pref and pref.strip() else None,
        datepattern=datepattern if datepattern and datepattern.strip() else None,
        ignore_whole_line=True,
        notes=tuple(notes),
        options=dict(options or {}),
        maxlines=max(1, maxlines),
    )
