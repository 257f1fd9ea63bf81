from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.helpers.netns import NetNS


def _kernel_ok() -> str | None:
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) for network namespaces"
    if not shutil.which("nft") or not shutil.which("ip"):
        return "needs nft and ip (make deps)"
    return None


@pytest.fixture
def netns() -> Iterator[NetNS]:
    reason = _kernel_ok()
    if reason:
        pytest.skip(reason)
    ns = NetNS()
    try:
        yield ns
    finally:
        ns.delete()
