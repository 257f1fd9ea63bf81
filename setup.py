"""Build of the optional native scanning core (nftblockd/detect/_scan.c, against libpcre2-8) and of the feed
refresh's sorted-key diff (nftblockd/feeds/_sorted.c, Python's C API alone).

Everything else about the package is in pyproject.toml. The extension is optional: without a C compiler or
libpcre2-dev the build prints a warning and the matcher runs on its pure-Python path (`nftblockd --version`
and `nftblock test-filter` say which engine runs, and why not the native one). It uses the stable ABI, so
one build serves every CPython >= 3.11: the wheel is tagged cp311-abi3-<platform>. A wheel built without a
compiler holds no compiled code and is tagged py3-none-any instead, so it never poses as carrying it. The
diff is optional the same way: without it feeds/delta.py walks the lists in Python (~2x the time), and so is
the fleet catch-up's decoder (nftblockd/fleet/_plain.c): without it fleet/rawread.py's column passes, and
the range encoder (nftblockd/kernel/_nlenc.c): without it a struct pack per range in kernel/nfmsg.py.
"""

from __future__ import annotations

import os

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel

LIMITED_API = "cp311"  # Py_LIMITED_API 0x030B0000 below: the oldest CPython the binary serves


class BdistWheel(bdist_wheel):
    """abi3 when compiled code was built; a pure wheel when every optional build failed."""

    def get_tag(self) -> tuple[str, str, str]:
        build_ext = self.get_finalized_command("build_ext")
        built = any(os.path.exists(build_ext.get_ext_fullpath(e.name)) for e in build_ext.extensions)
        return super().get_tag() if built else ("py3", "none", "any")


def optional_extension(module: str, libraries: list[str] | None = None) -> Extension:
    """One optional C module for the stable ABI, its source next to where it is imported from."""
    return Extension(module, sources=[module.replace(".", "/") + ".c"], libraries=libraries or [],
                     define_macros=[("Py_LIMITED_API", "0x030B0000")], py_limited_api=True, optional=True)


setup(
    ext_modules=[
        optional_extension("nftblockd.detect._scan", libraries=["pcre2-8"]),
        # the sorted-key diff of a feed refresh (feeds/delta.py); optional too: without it, the Python walk
        optional_extension("nftblockd.feeds._sorted"),
        # a catch-up read's plain bans decoded in one loop (fleet/rawread.py); optional: without it, the
        # column passes in Python (~10x the time)
        optional_extension("nftblockd.fleet._plain"),
        # set elements that cannot share one template (kernel/nfmsg.py: interval ranges, hash elements each
        # with its own timeout); optional: without it, a struct pack per element in Python (3-15x the time)
        optional_extension("nftblockd.kernel._nlenc"),
    ],
    cmdclass={"bdist_wheel": BdistWheel},
    options={"bdist_wheel": {"py_limited_api": LIMITED_API}},
)
