"""nftblockd.config is the config's public face: load.py's names, imported only when first asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import nftblockd.config
import nftblockd.config.load

REPO = Path(__file__).resolve().parents[2]


def test_the_face_offers_what_the_loader_exports() -> None:
    assert nftblockd.config.__all__ == nftblockd.config.load.__all__
    for name in nftblockd.config.__all__:
        assert getattr(nftblockd.config, name) is getattr(nftblockd.config.load, name), name


def test_a_name_the_face_does_not_offer_is_an_attribute_error() -> None:
    name = "parse_section"
    with pytest.raises(AttributeError, match=name):
        getattr(nftblockd.config, name)


def test_the_values_and_the_yaml_reader_import_without_the_loader() -> None:
    # detect/filterload.py reads YAML filters with config/yamlsrc.py: `nftblock test-filter` must not pay
    # for the config loader it does not use
    code = ("import sys, nftblockd.config.yamlsrc, nftblockd.config.model; "
            "print(*sorted(m for m in sys.modules if m.startswith('nftblockd.config')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert r.stdout.split() == ["nftblockd.config", "nftblockd.config.model", "nftblockd.config.yamlsrc"]
