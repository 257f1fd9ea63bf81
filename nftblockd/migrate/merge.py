"""A migration plan merged into an existing nftblockd config, text in, text out: what the file held stays.

`nftblock import-fail2ban-config -o FILE --force` into the config nftblockd already runs must not lose any
of it (a dropped `metrics:` block switched the Prometheus endpoint off without a word). The rules:

- Every top-level key the import does not write (table, chain, blocklists, control, state_dir, batch,
  reconcile, metrics, feeds, fleet, log_level, ...) is kept as its lines stand, comments included.
- `allowlist:` keeps its entries; fail2ban's common ignoreip entries it lacks are added after them.
  `allowlist_self:` keeps its value (a different ignoreself is said); without one, fail2ban's is added.
- `jails:` keeps every jail, with its lines; a fail2ban jail of the same name replaces it in place, and the
  replaced jail's lines stay as a comment above it (unless an earlier import wrote them: the first line of
  every imported jail says so, render.IMPORTED). The other imported jails follow the existing ones.
- `actions:` keeps every action; an imported action the file already holds (same type, file and options)
  is not written twice, and one whose name is taken by another action is renamed, with the jails that run it.
- The import's notes (source, what was not carried over) go at the top between two marker lines; a
  later import replaces them.

A block in flow style (`jails: {}`, `allowlist: [a, b]`) that the import adds to is written again in block
or flow style from its values (comments inside it are lost, and said). The result must load as YAML without
duplicate keys, or the merge is refused with the reason: the file is then left as it was.

Pure: this module must NOT read or write files; the caller hands it the text and writes the result.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from nftblockd.config.yamlsrc import Located, YamlError, load_yaml
from nftblockd.migrate.f2bjail import ActionPlan, Migration
from nftblockd.migrate.render import (
    ACTIONS_COMMENT,
    BEGIN,
    END,
    IMPORTED,
    comment_lines,
    flow_value,
    render_action,
    render_config,
    render_header,
    render_jail,
    yaml_scalar,
)

__all__ = ["BEGIN", "END", "MergeError", "Merged", "merge_config"]



class MergeError(ValueError):
    """The existing config cannot take the import; the message is `file:line: reason`."""


@dataclass(frozen=True, slots=True)
class Merged:
    text: str
    kept: tuple[str, ...]  # the existing file's top-level keys, kept
    notes: tuple[str, ...]  # what the merge changed in what the file held, one sentence each
    renamed: tuple[tuple[str, str], ...] = ()  # the plan's action name -> the name it has in the text


@dataclass(frozen=True, slots=True)
class _Block:
    key: str
    start: int  # 0-based index of the key's line
    end: int  # one past the block's last content line (comment lines at column 0 after it are not in it)
    flow: bool  # the value starts on the key's line (`jails: {}`, `allowlist: [a]`, `fleet: null`)


def merge_config(existing: str, file: str, m: Migration) -> Merged:
    """`m` merged into the config text `existing` (named `file` in errors). Raises MergeError."""
    lines = _strip_notes(existing.splitlines())
    if not any(ln.strip() and not ln.lstrip().startswith("#") for ln in lines):
        return Merged(render_config(m), (), ())  # nothing but comments: the import alone
    doc = _load("\n".join(lines) + "\n", file)
    if not isinstance(doc.value, dict):
        raise MergeError(f"{file}:1: not an nftblockd config (its top level is not a mapping): not merged")
    value: dict[str, Any] = doc.value
    if any(_indent(lines[doc.lines.get((k,), 1) - 1]) or lines[doc.lines.get((k,), 1) - 1].startswith("{")
           for k in value):
        # the top level itself in flow style ({table: ..., jails: ...}): its lines cannot be spliced
        redone = "\n".join(f"{yaml_scalar(str(k))}: {flow_value(v)}" for k, v in value.items()) + "\n"
        r = merge_config(redone, file, m)
        lost = ["the file's top level was written again from its values (in flow style, its comments could "
                "not be kept)"] if "#" in existing else []
        return Merged(r.text, r.kept, (*lost, *r.notes), r.renamed)
    blocks = _blocks(lines, doc)
    by_key = {b.key: b for b in blocks}
    notes: list[str] = []
    plan = m  # the header names every action's secrets, also those the file already held
    m, jails_text, renamed = _jails_and_actions(lines, doc, by_key, m, notes)
    edits: dict[str, list[str]] = {}  # key -> the lines that replace its block
    appended: list[str] = []

    _allowlist(lines, doc, by_key, m, file, notes, edits, appended)

    # jails and actions
    for key, part in jails_text.items():
        if key in by_key:
            edits[key] = part
        else:
            appended += ["", *part]

    merged = comment_lines(f"Merged into the config {file} held: all of it is kept "
                           f"({', '.join(b.key for b in blocks)}).")
    for n in notes:
        merged += comment_lines(n, first="#  - ", rest="#    ")
    out: list[str] = [BEGIN, *render_header(plan), "#", *merged, END]
    pos = 0
    for b in blocks:
        if b.key in edits:
            out += lines[pos:b.start]
            out += edits[b.key]
            pos = b.end
    out += lines[pos:]
    out += appended
    text = "\n".join(out) + "\n"
    try:
        problems: list[Any] = load_yaml(text, file).problems
    except YamlError as exc:
        problems = [exc.reason]
    if problems:  # an alias to an anchor in a replaced jail, say
        raise MergeError(f"{file}: the merged config would not load ({problems[0]}): not merged")
    kept = tuple(b.key for b in blocks)
    return Merged(text, kept, tuple(notes), tuple(renamed.items()))


def _allowlist(lines: Sequence[str], doc: Located, by_key: dict[str, _Block], m: Migration, file: str,
               notes: list[str], edits: dict[str, list[str]], appended: list[str]) -> None:
    value: dict[str, Any] = doc.value
    have = value.get("allowlist")
    new_allow = [a for a in m.allowlist if not _listed(a, have if isinstance(have, list) else [])]
    if "allowlist" in by_key and new_allow:
        b = by_key["allowlist"]
        if not b.flow and isinstance(have, list) and have:
            indent = _indent(lines[doc.lines[("allowlist", 0)] - 1])
            edits["allowlist"] = [*lines[b.start:b.end],
                                  f"{' ' * indent}# from fail2ban's ignoreip (every jail's)",
                                  *(f"{' ' * indent}- {yaml_scalar(a)}" for a in new_allow)]
        else:
            items = [*(have if isinstance(have, list) else []), *new_allow]
            edits["allowlist"] = [f"allowlist: {flow_value(items)}  # with fail2ban's ignoreip (every jail's)"]
            notes += _lost_comments(lines, b, "allowlist")
        notes.append(f"allowlist: added fail2ban's ignoreip {', '.join(new_allow)}")
    elif "allowlist" not in by_key and m.allowlist:
        appended += ["", "# fail2ban's ignoreip common to every jail: never banned, by anything", "allowlist:",
                     *(f"  - {yaml_scalar(a)}" for a in m.allowlist)]
    if "allowlist_self" in by_key:
        ours = value.get("allowlist_self")
        if isinstance(ours, bool) and ours != m.allowlist_self:
            notes.append(f"allowlist_self: kept {file}'s {str(ours).lower()} (fail2ban's ignoreself is "
                         f"{str(m.allowlist_self).lower()})")
    else:
        appended.append(f"allowlist_self: {'true' if m.allowlist_self else 'false'}  # fail2ban's ignoreself")



def _load(text: str, file: str) -> Located:
    try:
        doc = load_yaml(text, file)
    except YamlError as exc:
        raise MergeError(f"{exc.file}:{exc.line}: {exc.reason}: not merged") from None
    if doc.problems:
        p = doc.problems[0]
        raise MergeError(f"{p.file}:{p.line}: {p.reason}: not merged")
    return doc


def _strip_notes(lines: list[str]) -> list[str]:
    """The text without an earlier import's notes (BEGIN ... END)."""
    if BEGIN not in lines:
        return lines
    start = lines.index(BEGIN)
    end = lines.index(END, start) if END in lines[start:] else start
    return lines[:start] + lines[end + 1:]


def _is_content(line: str, deeper_than: int) -> bool:
    s = line.strip()
    if not s:
        return False
    return not s.startswith("#") or _indent(line) > deeper_than


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _blocks(lines: Sequence[str], doc: Located) -> list[_Block]:
    keys = sorted(((doc.lines.get((k,), 1) - 1, str(k)) for k in doc.value), key=lambda t: t[0])
    out = []
    for i, (start, key) in enumerate(keys):
        stop = keys[i + 1][0] if i + 1 < len(keys) else len(lines)
        end = start + 1
        for j in range(start + 1, stop):
            if _is_content(lines[j], 0):
                end = j + 1
        rest = lines[start].split(":", 1)[1] if ":" in lines[start] else ""
        flow = bool(rest.strip()) and not rest.strip().startswith("#")
        out.append(_Block(key, start, end, flow))
    return out


def _listed(entry: str, have: Sequence[object]) -> bool:
    def canon(x: object) -> str:
        try:
            return str(ipaddress.ip_network(str(x), strict=False))
        except ValueError:
            return str(x)

    return canon(entry) in {canon(h) for h in have}


def _lost_comments(lines: Sequence[str], b: _Block, key: str) -> list[str]:
    if any("#" in ln for ln in lines[b.start:b.end]):
        return [f"{key}: written again from its values (the comments inside it could not be kept)"]
    return []


# -- jails and actions -----------------------------------------------------------------------------------


def _entries(lines: Sequence[str], doc: Located, key: str, block: _Block) -> list[tuple[str, int, int]]:
    """(name, start, end) of each entry of a block-style mapping, 0-based, end exclusive."""
    value = doc.value.get(key)
    if not isinstance(value, dict):
        return []
    starts = sorted((doc.lines[(key, n)] - 1, str(n)) for n in value)
    out = []
    for i, (start, name) in enumerate(starts):
        stop = starts[i + 1][0] if i + 1 < len(starts) else block.end
        ind = _indent(lines[start])
        end = start + 1
        for j in range(start + 1, stop):
            if _is_content(lines[j], ind):
                end = j + 1
        out.append((name, start, end))
    return out


def _shift(text: list[str], indent: int) -> list[str]:
    pad = " " * max(indent - 2, 0)
    return [pad + ln if ln else ln for ln in text]


def _same_action(old: object, a: ActionPlan) -> bool:
    if not isinstance(old, dict):
        return False
    opts = old.get("options") or {}
    return (old.get("type") == "fail2ban" and old.get("file") == a.file and isinstance(opts, dict)
            and {str(k): str(v) for k, v in opts.items()} == dict(a.options)
            and set(old) <= {"type", "file", "options"})


def _jails_and_actions(lines: Sequence[str], doc: Located, by_key: dict[str, _Block], m: Migration,
                       notes: list[str]) -> tuple[Migration, dict[str, list[str]], dict[str, str]]:
    value: dict[str, Any] = doc.value
    old_actions = value.get("actions") if isinstance(value.get("actions"), dict) else {}
    assert isinstance(old_actions, dict)
    # actions: reuse one the file holds, rename one whose name another holds
    rename: dict[str, str] = {}
    new_actions: list[ActionPlan] = []
    taken = {str(k) for k in old_actions}
    for a in m.actions:
        same = next((str(k) for k, v in old_actions.items() if _same_action(v, a)), None)
        if same is not None:
            rename[a.name] = same
            continue
        name, n = a.name, 2
        while name in taken:
            name = f"{a.name[:20]}_{n}"
            n += 1
        if name != a.name:
            notes.append(f"actions: fail2ban's {a.name} is named {name} ({a.name} is another action in the file)")
        taken.add(name)
        rename[a.name] = name
        new_actions.append(replace(a, name=name))
    jails = tuple(replace(j, actions=tuple(rename.get(x, x) for x in j.actions)) for j in m.jails)
    m = replace(m, jails=jails, actions=tuple(new_actions))
    texts = {**_jails_text(lines, doc, by_key, m, notes), **_actions_text(lines, doc, by_key, m, notes)}
    return m, texts, rename


def _jails_text(lines: Sequence[str], doc: Located, by_key: dict[str, _Block], m: Migration,
                notes: list[str]) -> dict[str, list[str]]:
    if not m.jails:
        return {}
    imported = {j.name: j for j in m.jails}
    b = by_key.get("jails")
    if b is None:
        return {"jails": ["jails:", *(ln for j in m.jails for ln in render_jail(j))]}
    old = doc.value.get("jails")
    entries = _entries(lines, doc, "jails", b) if not b.flow else []
    if b.flow or (old is not None and not isinstance(old, dict)) or (isinstance(old, dict) and old and not entries):
        if isinstance(old, dict) and old:
            notes += _lost_comments(lines, b, "jails")
        kept = {k: v for k, v in (old or {}).items() if str(k) not in imported} if isinstance(old, dict) else {}
        for k in (old or {}) if isinstance(old, dict) else ():
            if str(k) in imported:
                notes.append(f"jails: {k} replaced by fail2ban's [{imported[str(k)].f2b_name}]")
        text = ["jails:", *(f"  {yaml_scalar(str(k))}: {flow_value(v)}" for k, v in kept.items())]
        return {"jails": [*text, *(ln for j in m.jails for ln in render_jail(j))]}
    indent = _indent(lines[entries[0][1]]) if entries else 2
    out = [] if entries else list(lines[b.start:b.end])
    done: set[str] = set()
    pos = b.start
    for name, start, end in entries:
        out += lines[pos:start]  # the key's line, and what stands between entries
        pos = end
        j = imported.get(name)
        if j is None:
            out += lines[start:end]
            continue
        done.add(name)
        before = lines[start:end]
        if not (len(before) > 1 and before[1].strip().startswith(IMPORTED)):
            out += [f"{' ' * indent}# the jail {name} this file had before the import, replaced by fail2ban's "
                    f"[{j.f2b_name}]:", *(f"{' ' * indent}# {ln[min(indent, _indent(ln)):]}" if ln.strip() else "#"
                      for ln in before)]
            notes.append(f"jails: {name} replaced by fail2ban's [{j.f2b_name}] (the old one kept as a comment)")
        out += _shift(render_jail(j), indent)
    if entries:
        out += lines[entries[-1][2]:b.end]
    for j in m.jails:
        if j.name not in done:
            out += _shift(render_jail(j), indent)
    return {"jails": out}


def _actions_text(lines: Sequence[str], doc: Located, by_key: dict[str, _Block], m: Migration,
                  notes: list[str]) -> dict[str, list[str]]:
    if not m.actions:
        return {}
    b = by_key.get("actions")
    if b is None:
        return {"actions": [*ACTIONS_COMMENT, "actions:", *(ln for a in m.actions for ln in render_action(a))]}
    old = doc.value.get("actions")
    entries = _entries(lines, doc, "actions", b) if not b.flow else []
    if b.flow or not entries:
        if isinstance(old, dict) and old:
            notes += _lost_comments(lines, b, "actions")
        kept = old if isinstance(old, dict) else {}
        text = ["actions:", *(f"  {yaml_scalar(str(k))}: {flow_value(v)}" for k, v in kept.items())]
        return {"actions": [*text, *(ln for a in m.actions for ln in render_action(a))]}
    indent = _indent(lines[entries[0][1]])
    return {"actions": [*lines[b.start:b.end], *(ln for a in m.actions for ln in _shift(render_action(a), indent))]}
