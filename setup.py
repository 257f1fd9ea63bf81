"""Build of the optional native scanning core (nftblockd/detect/_scan.c, against libpcre2-8).

Everything else about the package is in pyproject.toml. The extension is optional: without a C compiler or
libpcre2-dev the build prints a warning and the matcher runs on its pure-Python path (`nftblock
test-filter` says which engine ran). It uses the stable ABI, so one build serves every CPython >= 3.11.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "nftblockd.detect._scan",
            sources=["nftblockd/detect/_scan.c"],
            libraries=["pcre2-8"],
            define_macros=[("Py_LIMITED_API", "0x030B0000")],
            py_limited_api=True,
            optional=True,
        )
    ],
)
