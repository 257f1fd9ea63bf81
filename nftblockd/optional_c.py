"""Load one of the package's optional C modules (the feed diff, the fleet's plain-ban columns and token loop).

Each has a Python twin that stays the reference, so a copy installed without a C compiler still works. Only
"not built" falls back: not `except ImportError`, which would also hide a module that is built but broken (an
undefined symbol is an ImportError) behind the slow path. NFTBLOCK_NATIVE=0 in the environment turns every
one off, as it does the matcher's core (nftblockd/detect/native.py): the operator's way out.

Must not: import anything but the module asked for.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def load(name: str) -> ModuleType | None:
    """The module `name`, or None when it was not built or NFTBLOCK_NATIVE=0."""
    if os.environ.get("NFTBLOCK_NATIVE", "1") == "0":
        return None
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return None
