"""lintian on the package `make deb` builds: no errors and no warnings (informational tags are allowed).

lintian is Debian's own package checker (apt: lintian); it takes about ten seconds. The tags this file guards
against were all real once: no changelog, a maintainer address at localhost, no manual pages, a copyright
file without a notice, `#!/usr/bin/env python` in bundled library modules, systemctl in maintainer scripts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def lintian_tags(deb: Path) -> list[str]:
    lintian = shutil.which("lintian")
    if lintian is None:
        pytest.skip("lintian is not installed (make deps installs it)")
    proc = subprocess.run([lintian, "--tag-display-limit", "0", "--no-cfg", str(deb)], capture_output=True,
                          text=True, check=False)
    # Exit status 1 means "tags at the fail-on level were emitted"; anything higher is lintian failing.
    assert proc.returncode in (0, 1), proc.stderr
    return [line for line in proc.stdout.splitlines() if re.match(r"^[EWIPXON]: ", line)]


def test_no_errors_or_warnings(built_deb: Path) -> None:
    tags = lintian_tags(built_deb)
    bad = [t for t in tags if t.startswith(("E: ", "W: "))]
    assert bad == [], "\n".join(bad)


def test_the_package_ships_its_changelog_and_manual_pages(built_deb: Path) -> None:
    listing = subprocess.run(["dpkg-deb", "-c", str(built_deb)], capture_output=True, text=True,
                             check=True).stdout
    for path in ("usr/share/doc/nftblockd/changelog.gz", "usr/share/man/man8/nftblockd.8.gz",
                 "usr/share/man/man8/nftblock.8.gz", "usr/share/man/man5/nftblockd.yaml.5.gz"):
        assert f"./{path}\n" in listing, path
