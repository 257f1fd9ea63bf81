"""wire.py's JSON (the json package's C encoder and scanner, without the package) equals the json package's."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.control.wire import dumps, loads

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def outcome(fn: Any, *args: Any, **kw: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args, **kw)
    except TypeError:
        return "TypeError", None
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return "ValueError", None


@given(JSON)
def test_dumps_is_json_dumps(value: Any) -> None:
    ours = outcome(dumps, value)
    ref = outcome(json.dumps, value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    assert ours == ref


@given(JSON, st.sampled_from(["", " ", "\t\n", "\r\n "]))
def test_loads_is_json_loads_on_documents(value: Any, ws: str) -> None:
    text = ws + json.dumps(value, ensure_ascii=False) + ws
    assert same(loads(text.encode("utf-8", "surrogatepass")), json.loads(text.encode("utf-8", "surrogatepass")))


@given(st.binary(max_size=30) | st.text(alphabet='{}[]",:0123456789.eE+-truefalsn \\u\t', max_size=30).map(str.encode))
def test_loads_is_json_loads_on_anything(data: bytes) -> None:
    ours, ref = outcome(loads, data), outcome(json.loads, data)
    if data[:1] in (b"\x00",) or (len(data) >= 2 and data[1:2] == b"\x00"):
        return  # json.loads would read these as UTF-16/32; the protocol is UTF-8
    assert (ours[0] == "ok") == (ref[0] == "ok"), (data, ours, ref)
    assert same(ours[1], ref[1])


def test_not_serializable_and_nan_are_refused() -> None:
    with pytest.raises(TypeError):
        dumps({"x": object()})
    with pytest.raises(ValueError):
        dumps({"x": float("nan")})
    with pytest.raises(ValueError):
        loads(b'{"a": 1} x')
    with pytest.raises(ValueError):
        loads(b"")
    assert loads(b'\xef\xbb\xbf{"a": NaN}')["a"] != 0


def test_wire_imports_no_json_package() -> None:
    root = str(Path(__file__).resolve().parents[2])
    code = (f"import sys\nsys.path.insert(0, {root!r})\nimport nftblockd.control.client\n"
            "sys.exit(bool({'json', 're', 'typing', 'dataclasses', 'enum'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-I", "-S", "-c", code], check=False).returncode == 0
