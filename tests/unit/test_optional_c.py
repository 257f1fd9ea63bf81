"""optional_c.load: only "not built" falls back to the Python twin; a broken module is not hidden."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nftblockd import optional_c


def test_a_module_not_built_is_none_and_nftblock_native_0_turns_one_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert optional_c.load("nftblockd._no_such_c_module") is None
    assert optional_c.load("json") is not None
    monkeypatch.setenv("NFTBLOCK_NATIVE", "0")
    assert optional_c.load("json") is None


def test_a_module_that_fails_to_import_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_c_twin.py").write_text("import nftblockd._missing_symbol_stand_in\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ModuleNotFoundError, match="_missing_symbol_stand_in"):
            optional_c.load("broken_c_twin")
    finally:
        sys.modules.pop("broken_c_twin", None)
