"""Where filters come from: a spec (`sshd[mode=aggressive]`, a YAML file, a fail2ban `.conf`) in, a compiled
Filter out. The built-in filters live in nftblockd/detect/filters/*.yaml; fail2ban's files are read by f2b.py.

Errors are FilterError with file:line and the reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import tzinfo
from pathlib import Path
from typing import Any

from nftblockd import boundedread
from nftblockd.detect.f2b import read_filter
from nftblockd.detect.matcher import Engine, Filter, FilterDef, FilterError, RegexSource, compile_filter
from nftblockd.detect.sysloghead import SYSLOG

__all__ = ["builtin_filters", "filter_from_yaml", "load_filter", "load_yaml_filter", "parse_spec"]

_SPEC_RE = re.compile(r"^(?P<name>[^\[\]]+?)\s*(?:\[(?P<opts>.*)\])?\s*$", re.DOTALL)
_BUILTIN_DIR = Path(__file__).with_name("filters")


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`sshd[mode=aggressive, publickey="any"]` -> ("sshd", {"mode": "aggressive", "publickey": "any"})."""
    m = _SPEC_RE.match(spec.strip())
    if m is None:
        raise FilterError("", f"cannot read filter spec {spec!r}")
    return m.group("name").strip(), _parse_options(m.group("opts") or "", spec)


def _parse_options(text: str, spec: str) -> dict[str, str]:
    opts: dict[str, str] = {}
    pos = 0
    item = re.compile(r"""\s*([\w\-.]+)\s*=\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^,]*?)\s*(?:,|$)""")
    while pos < len(text):
        if not text[pos:].strip():
            break
        m = item.match(text, pos)
        if m is None or m.end() == pos:
            raise FilterError("", f"cannot read the options in filter spec {spec!r} near {text[pos:]!r}")
        value = m.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        opts[m.group(1)] = value
        pos = m.end()
    return opts


def builtin_filters() -> list[str]:
    """Names of the filters shipped with nftblockd."""
    return sorted(p.stem for p in _BUILTIN_DIR.glob("*.yaml"))


def load_filter(spec: str, *, search_dirs: Sequence[Path] = (), tz: tzinfo | None = None,
                engine: Engine = "auto") -> Filter:
    """Load and compile a filter.

    `spec` is a built-in name (`sshd`), a YAML filter file, or a fail2ban filter (`.conf` path, or a name
    found in `search_dirs` such as /etc/fail2ban/filter.d), each optionally followed by options in
    fail2ban syntax: `sshd[mode=aggressive]`, `/etc/fail2ban/filter.d/sshd.conf[mode=aggressive]`.
    A bare name is looked up as NAME.yaml in `search_dirs`, then among the built-ins, then as a fail2ban
    NAME.conf in `search_dirs`. `tz` is the zone of timestamps without one (None: the host's).
    Raises FilterError.
    """
    name, opts = parse_spec(spec)
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        return compile_filter(load_yaml_filter(path, opts), tz=tz, engine=engine)
    if path.suffix in (".conf", ".local"):
        return _load_conf(path, opts, tz, engine)
    if "/" in name:
        if not path.is_file():
            raise FilterError("", f"filter {name!r}: no such file")
        try:
            head = boundedread.read_bytes(path, boundedread.FILTER_MAX_BYTES)[:65536].decode(errors="replace")
        except OSError as exc:
            raise FilterError("", f"filter {name!r}: {exc.strerror or exc}") from None
        if re.search(r"^\s*\[Definition\]", head, re.MULTILINE):
            return _load_conf(path, opts, tz, engine)
        return compile_filter(load_yaml_filter(path, opts), tz=tz, engine=engine)
    for d in (*search_dirs, _BUILTIN_DIR):
        cand = Path(d) / f"{name}.yaml"
        if cand.is_file():
            return compile_filter(load_yaml_filter(cand, opts), tz=tz, engine=engine)
    conf = _find_conf(name, search_dirs)
    if conf is not None:
        return _load_conf(conf, opts, tz, engine)
    known = ", ".join(builtin_filters())
    raise FilterError("", f"unknown filter {name!r} (built-in filters: {known}; or give a .yaml/.conf path)")


def _find_conf(name: str, search_dirs: Sequence[Path]) -> Path | None:
    for d in search_dirs:
        for cand in (Path(d) / f"{name}.conf", Path(d) / "filter.d" / f"{name}.conf"):
            if cand.is_file():
                return cand
    return None


def _load_conf(path: Path, opts: dict[str, str], tz: tzinfo | None, engine: Engine) -> Filter:

    return compile_filter(read_filter(path, opts), tz=tz, engine=engine)


# YAML filter schema (see nftblockd/filters/sshd.yaml for a full example):
#
#   name: sshd                       # defaults to the file name
#   description: text
#   options: {mode: normal}          # defaults; a spec such as `sshd[mode=aggressive]` overrides them
#   choices: {mode: [normal, ddos, extra, aggressive]}   # allowed values, checked when loading
#   vars: {suffix: '...'}            # named regex fragments, used as <suffix>; options are usable too,
#                                    # a spec may override a var (`apache-badbots[badbots="X|Y"]`), and
#                                    # <name-<mode>> picks a var by an option's value
#   prefilter: [sshd]                # optional: a line must contain one of these to be looked at
#   prefix: '<F-MLFID><syslog></F-MLFID>'  # optional: matched at the line start (after the timestamp is
#                                    # cut out), regexes see the rest; <syslog> is a built-in fragment
#                                    # (syslog, journal and RFC 5424 headers) naming the program <daemon>
#   datepattern: '{^LN-BEG}'         # optional: fail2ban datepattern; default: common forms anywhere
#   failregex:                       # tried in order, first match wins
#     - '^Invalid user <F-USER>.*</F-USER> from <HOST> port \d+$'
#     - regex: '^Did not receive identification string from <HOST>'
#       when: {mode: [ddos, aggressive]}  # only with these option values
#   ignoreregex: [...]               # same form; a failure that also matches one is reported ignored
#
# Regexes use fail2ban's tags: <HOST> (an address; a host name only to be counted as rejected), <ADDR>,
# <IP4>, <IP6>, <F-ID/>, <F-NAME>...</F-NAME> captures, and the multi-line tags <F-MLFID>, <F-NOFAIL>,
# <F-MLFFORGET>, <F-MLFGAINED> (see MatchContext).

_YAML_KEYS = {"name", "description", "options", "choices", "vars", "prefilter", "prefix", "datepattern",
              "failregex", "ignoreregex"}
_VAR_RE = re.compile(r"<([a-z_][\w\-]*)>")

# Fragments every YAML filter may use. <syslog> is a syslog / journal / RFC 5424 header up to the message,
# after the timestamp has been cut out; the program name comes from the filter's `daemon` var.
_BASE_VARS = {
    "syslog": SYSLOG,
    "daemon": r"\S+",
}


def load_yaml_filter(path: Path, opts: Mapping[str, str] | None = None) -> FilterDef:
    """Read one YAML filter into a FilterDef, applying `opts` (option overrides from the spec)."""
    from nftblockd.config.yamlsrc import YamlError, load_yaml

    try:
        text = boundedread.read_text(path, boundedread.FILTER_MAX_BYTES)
    except OSError as exc:
        reason = exc.strerror or exc
        raise FilterError(str(path), f"cannot read the filter: {reason}") from None
    try:
        doc = load_yaml(text, str(path))
        if doc.problems:
            raise doc.problems[0]
    except YamlError as exc:
        raise FilterError(f"{exc.file}:{exc.line}", exc.reason) from None
    return filter_from_yaml(doc.value, str(path), doc.line, opts or {})


def filter_from_yaml(value: Any, file: str, line_of: Callable[[tuple[str | int, ...]], int],
                     opts: Mapping[str, str]) -> FilterDef:
    def where(*path: str | int) -> str:
        return f"{file}:{line_of(tuple(path))}"

    if not isinstance(value, dict):
        raise FilterError(where(), "a filter file is a mapping (name, failregex, ...)")
    for key in value:
        if key not in _YAML_KEYS:
            raise FilterError(where(key), f"unknown key {key!r} (known: {', '.join(sorted(_YAML_KEYS))})")
    name = str(value.get("name") or Path(file).stem)
    options = _chosen_options(value, opts, name, where)
    variables = {**_BASE_VARS, **{str(k): str(v) for k, v in (value.get("vars") or {}).items()}, **options}
    fail = _regexes(value, "failregex", options, variables, where)
    if not fail:
        raise FilterError(where("failregex"), f"filter {name!r} has no failregex for these options")
    prefilter = value.get("prefilter")
    if prefilter is not None and (not isinstance(prefilter, list) or not all(isinstance(s, str) and s
                                                                              for s in prefilter)):
        raise FilterError(where("prefilter"), "prefilter is a list of non-empty substrings")
    ignore = _regexes(value, "ignoreregex", options, variables, where)
    prefix = value.get("prefix")
    at = where("prefix")
    return FilterDef(
        name=name,
        source=file,
        failregex=fail,
        ignoreregex=ignore,
        prefix=RegexSource(_substitute(str(prefix), variables, at), at) if prefix else None,
        datepattern=str(value["datepattern"]) if value.get("datepattern") else None,
        prefilter=tuple(prefilter) if prefilter else None,
        options=options,
    )


def _chosen_options(value: dict[str, Any], opts: Mapping[str, str], name: str, where: Callable[..., str]
                    ) -> dict[str, str]:
    """The filter's options with the caller's choices applied; an unknown option or value is refused."""
    options = {str(k): str(v) for k, v in (value.get("options") or {}).items()}
    choices = value.get("choices") or {}
    for k, v in opts.items():
        if k not in options and k not in (value.get("vars") or {}):
            raise FilterError(where("options"), f"filter {name!r} has no option {k!r}")
        allowed = choices.get(k)
        if allowed is not None and v not in [str(a) for a in allowed]:
            raise FilterError(where("choices", k), f"option {k}={v!r} must be one of {allowed}")
        options[k] = v
    return options


def _substitute(text: str, variables: Mapping[str, str], at: str) -> str:
    """Expand %(name)s references until none is left (16 rounds at most: more is a loop)."""
    for _ in range(16):
        new = _VAR_RE.sub(lambda m: variables.get(m.group(1), m.group(0)), text)
        if new == text:
            return new
        text = new
    raise FilterError(at, "variables refer to each other in a loop")


def _regexes(value: dict[str, Any], key: str, options: Mapping[str, str], variables: Mapping[str, str],
             where: Callable[..., str]) -> tuple[RegexSource, ...]:
    """The regexes under `key` that apply with these options, variables expanded, each with where it is."""
    raw = value.get(key) or []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise FilterError(where(key), f"{key} must be a list of regexes")
    out = []
    for i, item in enumerate(raw):
        at = where(key, i)
        if isinstance(item, dict):
            unknown = set(item) - {"regex", "when"}
            if unknown or "regex" not in item:
                raise FilterError(at, "a rule is a regex or {regex: ..., when: {option: [values]}}")
            if not _applies(item.get("when") or {}, options, at):
                continue
            item = item["regex"]
        if not isinstance(item, str) or not item:
            raise FilterError(at, "a regex must be non-empty text")
        out.append(RegexSource(_substitute(item, variables, at), at))
    return tuple(out)


def _applies(when: Any, options: Mapping[str, str], at: str) -> bool:
    if not isinstance(when, dict):
        raise FilterError(at, "when: is a mapping of option to the values it applies to")
    for k, allowed in when.items():
        values = [str(a) for a in (allowed if isinstance(allowed, list) else [allowed])]
        if options.get(str(k)) not in values:
            return False
    return True
