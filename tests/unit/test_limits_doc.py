"""docs/limits.md names each bound as `module.NAME` = value (or `module.Class(param)` = its default): each is
imported and compared here, so the page cannot drift from the code; and the bounds added for issue 33 must
be on it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "limits.md"
_NAMED = re.compile(r"`(nftblockd(?:\.\w+)+)(?:\((\w+)\))?` = (\d+(?:\.\d+)?)")


def _value(dotted: str, param: str | None) -> Any:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        rest = parts[cut:]
        break
    else:
        raise AssertionError(f"no module in {dotted}")
    for i, name in enumerate(rest):
        if i == len(rest) - 1 and dataclasses.is_dataclass(obj) and isinstance(obj, type):
            field = {f.name: f for f in dataclasses.fields(obj)}[name]
            return field.default
        obj = getattr(obj, name)
    if param is not None:
        return inspect.signature(obj).parameters[param].default
    return obj


def _named() -> list[tuple[str, str | None, str]]:
    return _NAMED.findall(DOC.read_text())


@pytest.mark.parametrize(("dotted", "param", "written"), _named())
def test_each_bound_on_the_page_is_the_codes_value(dotted: str, param: str, written: str) -> None:
    value = _value(dotted, param or None)
    assert float(value) == float(written), f"{dotted}{f'({param})' if param else ''} is {value}, not {written}"


def test_the_new_bounds_are_all_on_the_page() -> None:
    named = {d + (f"({p})" if p else "") for d, p, _v in _named()}
    for name in ("boundedread.CONFIG_MAX_BYTES", "boundedread.FILTER_MAX_BYTES", "boundedread.SECRET_MAX_BYTES",
                 "boundedread.LOG_SAMPLE_MAX_BYTES", "cli.targets.MAX_STDIN_LINE", "cli.targets.MAX_STDIN_TARGETS",
                 "config.yamlsrc.MAX_NUMBER_DIGITS", "config.reader.MAX_UNKNOWN_KEYS", "control.server.MAX_BUFFERED",
                 "control.protocol.MAX_TARGETS", "control.api.MAX_INVALID_TARGETS", "control.wire.DEFAULT_MAX_REQUEST",
                 "sources.linesplit.DEFAULT_MAX_LINE", "detect.jails.QUEUE_BATCHES", "config.yamlsrc.MAX_DEPTH"):
        assert f"nftblockd.{name}" in named, name
    assert len(named) >= 40


def test_the_cli_repeats_the_protocols_target_bound() -> None:
    from nftblockd.cli.targets import MAX_STDIN_TARGETS
    from nftblockd.control.protocol import MAX_TARGETS

    assert MAX_STDIN_TARGETS == MAX_TARGETS
