"""Load YAML into plain Python values while remembering the line of every mapping key and list item.

Config errors must name file and line; PyYAML's composed nodes carry marks, so we walk the node tree
ourselves instead of using `safe_load`. Pure apart from reading the text it is given. Walking it ourselves
means bounding it ourselves: aliases may not expand the document beyond EXPANSION times what it writes, nor
refer to themselves, and nesting is limited (each refused with file:line, never a traceback).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

Path_ = tuple[str | int, ...]


@dataclass
class Located:
    """A loaded document plus the 1-based line of each path (`("jails", "sshd", "maxretry") -> 12`)."""

    value: Any
    file: str
    lines: dict[Path_, int] = field(default_factory=dict)
    # Duplicate keys, every one of them (the first value is kept): a caller that reports all problems at
    # once adds these to its own; one that stops at the first raises `problems[0]`.
    problems: list[YamlError] = field(default_factory=list)

    def line(self, path: Path_) -> int:
        """The line of `path`, or of its nearest ancestor that has one."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), 1)


class YamlError(ValueError):
    def __init__(self, file: str, line: int, reason: str) -> None:
        super().__init__(f"{file}:{line}: {reason}")
        self.file, self.line, self.reason = file, line, reason


# YAML aliases share one node, so a small file can stand for a huge tree ("billion laughs": 9 levels of 9 aliases
# are 387 million values; issue 13 measured over a minute and 778 MB before this bound). A document may expand
# to EXPANSION times the values it writes, plus EXPANSION_FLOOR: far more than reusing an allowlist in every
# jail needs, and refused within milliseconds for a bomb.
EXPANSION = 10
EXPANSION_FLOOR = 10_000
MAX_DEPTH = 200  # nesting; a config is a few levels deep, and deeper inputs would exhaust Python's stack


# libyaml's parser when PyYAML has it (Debian's python3-yaml does): 200k keys compose in 1.9 s instead of 10.7 s,
# with the same nodes and marks.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str, file: str) -> Located:
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        problem = exc.problem or str(exc)
        if "nesting depth" in problem:  # libyaml's own bound on nesting
            problem = "nested too deeply"
        raise YamlError(file, line, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise YamlError(file, 1, f"invalid YAML: {exc}") from None
    except RecursionError:
        raise YamlError(file, 1, "invalid YAML: nested too deeply") from None
    out = Located(value=None, file=file)
    if node is None:
        out.value = {}
        return out
    budget = _Budget(EXPANSION * _distinct_nodes(node) + EXPANSION_FLOOR, file, out.problems)
    out.value = _convert(node, (), out.lines, budget, set())
    return out


class _Budget:
    """Values `_convert` may still produce, where to report running out, and the problems it collects."""

    __slots__ = ("file", "left", "limit", "problems")

    def __init__(self, limit: int, file: str, problems: list[YamlError]) -> None:
        self.limit = self.left = limit
        self.file = file
        self.problems = problems


def _distinct_nodes(root: yaml.Node) -> int:
    """Nodes written in the document (an alias counts once, however often it is used)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack += (k, v)
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value
    return len(seen)


def _convert(node: yaml.Node, path: Path_, lines: dict[Path_, int], budget: _Budget, active: set[int]) -> Any:
    file = budget.file
    lines.setdefault(path, node.start_mark.line + 1)
    budget.left -= 1
    if budget.left < 0:
        raise YamlError(file, _line(lines, path), f"the document expands to more than {budget.limit} values "
                        "through YAML aliases (an alias bomb?)")
    refused = _refused_tag(node)
    if refused is not None:
        budget.problems.append(YamlError(file, node.start_mark.line + 1, refused))
        return None
    if isinstance(node, yaml.ScalarNode):
        return _scalar(node, budget)
    if id(node) in active:
        raise YamlError(file, _line(lines, path), f"a YAML alias refers to itself (the value that starts at line "
                        f"{node.start_mark.line + 1} contains itself)")
    if len(active) >= MAX_DEPTH:
        raise YamlError(file, _line(lines, path), f"values nested more than {MAX_DEPTH} deep")
    active.add(id(node))
    try:
        if isinstance(node, yaml.MappingNode):
            result: dict[Any, Any] = {}
            for knode, vnode in node.value:
                if not isinstance(knode, yaml.ScalarNode):
                    raise YamlError(file, knode.start_mark.line + 1, "mapping keys must be plain text")
                if knode.tag == _MERGE:
                    budget.problems.append(YamlError(file, knode.start_mark.line + 1, "YAML merge keys (<<) are "
                                                     "not supported: write the keys out"))
                    continue
                refused = _refused_tag(knode)
                if refused is not None:
                    budget.problems.append(YamlError(file, knode.start_mark.line + 1, refused))
                    continue
                key = _scalar(knode, budget)
                if isinstance(key, bool):  # YAML 1.1 reads a plain `on:`/`yes:` key as a boolean: keep the text
                    key = knode.value
                if not isinstance(key, str | int):
                    raise YamlError(file, knode.start_mark.line + 1, f"mapping keys must be text, got {key!r}")
                skey = str(key)
                if skey in result:
                    first = lines[(*path, skey)]
                    budget.problems.append(YamlError(file, knode.start_mark.line + 1, f"duplicate key {skey!r} "
                                                     f"(first on line {first}); this one is ignored"))
                    continue
                lines[(*path, skey)] = knode.start_mark.line + 1
                result[skey] = _convert(vnode, (*path, skey), lines, budget, active)
            return result
        assert isinstance(node, yaml.SequenceNode)
        items = []
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            items.append(_convert(item, (*path, i), lines, budget, active))
        return items
    finally:
        active.discard(id(node))


def _line(lines: dict[Path_, int], path: Path_) -> int:
    """The line of the nearest mapping key on `path`: where an alias is used (a node's own mark is where its
    anchor was written)."""
    p = path
    while p and not isinstance(p[-1], str):
        p = p[:-1]
    return lines.get(p, lines.get((), 1))


# The tags a config can hold: what plain YAML resolves to without a tag (and `!!str` and friends written out).
# Anything else (`!!python/name:...`, `!custom`, `!!binary`, `!!set`) is refused with its line: SafeLoader has
# no constructor for most of them (a traceback before), and a `!custom` mapping was taken silently.
_Y = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_Y + t for t in ("str", "int", "float", "bool", "null", "timestamp"))
_MERGE = _Y + "merge"
MAX_NUMBER_DIGITS = 100  # an integer or float written longer is refused: no config value needs more


def _refused_tag(node: yaml.Node) -> str | None:
    """Why `node`'s tag cannot be in a config, or None."""
    if isinstance(node, yaml.ScalarNode):
        ok = node.tag in _SCALAR_TAGS
    elif isinstance(node, yaml.MappingNode):
        ok = node.tag == _Y + "map"
    else:
        ok = node.tag == _Y + "seq"
    if ok:
        return None
    if node.tag == _MERGE:
        return "<< is a YAML merge key (not supported); quote it to mean the text"
    shown = "!!" + node.tag[len(_Y):] if node.tag.startswith(_Y) else node.tag
    return f"the YAML tag {shown} is not supported (a config holds plain values only)"


def _scalar(node: yaml.ScalarNode, budget: _Budget) -> Any:
    if node.tag in (_Y + "int", _Y + "float") and len(node.value) > MAX_NUMBER_DIGITS:
        budget.problems.append(YamlError(budget.file, node.start_mark.line + 1, f"a number written with "
                                         f"{len(node.value)} characters; at most {MAX_NUMBER_DIGITS} are allowed"))
        return None
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError) as exc:  # a bad timestamp or an int the constructor refuses
        budget.problems.append(YamlError(budget.file, node.start_mark.line + 1, f"invalid value {node.value!r}: "
                                         f"{getattr(exc, 'problem', None) or exc}"))
        return None
    finally:
        loader.dispose()
