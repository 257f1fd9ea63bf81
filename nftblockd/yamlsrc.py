"""Load YAML into plain Python values while remembering the line of every mapping key and list item.

Config errors must name file and line; PyYAML's composed nodes carry marks, so we walk the node tree
ourselves instead of using `safe_load`. Pure apart from reading the text it is given.
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


def load_yaml(text: str, file: str) -> Located:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise YamlError(file, line, f"invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise YamlError(file, 1, f"invalid YAML: {exc}") from None
    out = Located(value=None, file=file)
    if node is None:
        out.value = {}
        return out
    out.value = _convert(node, (), out.lines, file, out.problems)
    return out


def _convert(node: yaml.Node, path: Path_, lines: dict[Path_, int], file: str, problems: list[YamlError]) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for knode, vnode in node.value:
            if not isinstance(knode, yaml.ScalarNode):
                raise YamlError(file, knode.start_mark.line + 1, "mapping keys must be plain text")
            key = _scalar(knode)
            if not isinstance(key, str | int):
                raise YamlError(file, knode.start_mark.line + 1, f"mapping keys must be text, got {key!r}")
            skey = str(key)
            if skey in result:
                first = lines[(*path, skey)]
                problems.append(YamlError(file, knode.start_mark.line + 1,
                                          f"duplicate key {skey!r} (first on line {first}); this one is ignored"))
                continue
            lines[(*path, skey)] = knode.start_mark.line + 1
            result[skey] = _convert(vnode, (*path, skey), lines, file, problems)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            items.append(_convert(item, (*path, i), lines, file, problems))
        return items
    assert isinstance(node, yaml.ScalarNode)
    return _scalar(node)


def _scalar(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()
