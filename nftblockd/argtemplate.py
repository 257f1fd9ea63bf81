"""`{placeholder}` templates of command actions (argv elements, environment values).

A template is parsed once, when the config is read: literal text and `{name}` fields, `{{` and `}}` for
braces. Only the names in PLACEHOLDERS exist; there is no format spec, conversion, attribute or index access
(Python's str.format would let `{address.__class__}` reach into objects). Rendering puts each value in
whole into the one argv element it stands in: no shell ever reads the result, so nothing a log line holds can
become a second argument or a command.

Pure: no IO, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

# What a ban or unban event offers a template (actions/render.py fills them; docs/actions.md lists them).
PLACEHOLDERS = frozenset({
    "event", "address", "family", "jail", "blocklist", "origin", "reason", "duration", "until", "time",
    "failures", "matches", "skipped", "host",
})

_FIELD_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


class TemplateError(ValueError):
    """A template that cannot be used; the message says why."""


class Template(NamedTuple):
    """Parsed template: literal pieces and field names, alternating (`parts[0]` literal, then name, ...)."""

    source: str
    parts: tuple[str, ...]

    @property
    def fields(self) -> tuple[str, ...]:
        return self.parts[1::2]

    def render(self, values: Mapping[str, str]) -> str:
        out = list(self.parts)
        for i in range(1, len(out), 2):
            out[i] = values.get(out[i], "")
        return "".join(out)


def parse_template(text: str) -> Template:
    """Parse `text`; raises TemplateError naming the first problem."""
    parts: list[str] = []
    lit: list[str] = []
    pos = 0
    for m in _FIELD_RE.finditer(text):
        lit.append(text[pos:m.start()])
        pos = m.end()
        tok = m.group(0)
        if tok == "{{":
            lit.append("{")
        elif tok == "}}":
            lit.append("}")
        elif m.group(1) is None:
            raise TemplateError(f"unmatched {tok!r} at offset {m.start()} (write {tok * 2} for a literal brace)")
        else:
            name = m.group(1)
            if name not in PLACEHOLDERS:
                raise TemplateError(f"unknown placeholder {{{name}}} (known: "
                                    f"{', '.join('{' + p + '}' for p in sorted(PLACEHOLDERS))})")
            parts.append("".join(lit))
            parts.append(name)
            lit = []
    lit.append(text[pos:])
    parts.append("".join(lit))
    return Template(text, tuple(parts))


__all__ = ["PLACEHOLDERS", "Template", "TemplateError", "parse_template"]
