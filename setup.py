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


setup(
    ext_modules=[
        Extension(
            "nftblockd.detect._scan",
            sources=["nftblockd/detect/_scan.c"],
            libraries=["pcre2-8"],
            define_macros=[("Py_LIMITED_API", "0x030B0000")],
            py_limited_api=True,
            optional=True,
        ),
        # the sorted-key diff of a feed refresh (feeds/delta.py); optional too: without it, the Python walk
        Extension(
            "nftblockd.feeds._sorted",
            sources=["nftblockd/feeds/_sorted.c"],
            define_macros=[("Py_LIMITED_API", "0x030B0000")],
            py_limited_api=True,
            optional=True,
        ),
        # a catch-up read's plain bans decoded in one loop (fleet/rawread.py); optional: without it, the
        # column passes in Python (~10x the time)
        Extension(
            "nftblockd.fleet._plain",
            sources=["nftblockd/fleet/_plain.c"],
            define_macros=[("Py_LIMITED_API", "0x030B0000")],
            py_limited_api=True,
            optional=True,
        ),
        # a feed refresh's range elements encoded in one loop (kernel/nfmsg.py); optional: without it, a struct
        # pack per range in Python (~15x the time)
        Extension(
            "nftblockd.kernel._nlenc",
            sources=["nftblockd/kernel/_nlenc.c"],
            define_macros=[("Py_LIMITED_API", "0x030B0000")],
            py_limited_api=True,
            optional=True,
        ),
    ],
    cmdclass={"bdist_wheel": BdistWheel},
    options={"bdist_wheel": {"py_limited_api": LIMITED_API}},
)
