#!/usr/bin/env bash
# Build dist/nftblockd_<version>_<arch>.deb from this checkout with dpkg-deb alone (no debhelper, no network
# beyond pip fetching the pinned bundled dependencies). Architecture-specific: it carries the matcher's native
# core, compiled here against the system's python3 (stable ABI: any CPython >= 3.11) and libpcre2-8.
#
# What goes where:
#   /usr/lib/nftblockd/                 the nftblockd package (with nftblockd/detect/_scan.abi3.so, the
#                                       matcher's native core), plus asyncinotify and prometheus-client
#                                       (pure Python, pinned to the versions installed in the build venv,
#                                       i.e. the ones the tests ran against)
#   /usr/bin/nftblockd, /usr/bin/nftblock
#                                       entry scripts generated from pyproject's [project.scripts] by
#                                       packaging/entry-script.sh; run by /usr/bin/python3 -I (nftblock:
#                                       -IS) with /usr/lib/nftblockd first on sys.path
#   /usr/lib/systemd/system/nftblockd.service, /usr/lib/sysusers.d/nftblockd.conf
#   /usr/share/python3/runtime.d/nftblockd.rtupdate
#                                       re-compiles the byte-code when the default python3 changes (an
#                                       upgrade from Debian 12 to 13); postinst compiles it on install
#   /etc/nftblockd/nftblockd.yaml       conffile (config/nftblockd.yaml)
#   /etc/fail2ban/action.d/nftblock.conf, nftblock.py
#                                       conffiles (fail2ban reads its actions from there)
#   /usr/share/doc/nftblockd/           README, copyright, changelog, docs/*.md (what the README and the
#                                       config's comments name), examples (unit drop-in for feeds, Grafana)
#   /usr/share/man/man8/nftblockd.8.gz, nftblock.8.gz, /usr/share/man/man5/nftblockd.yaml.5.gz
#                                       rendered now by packaging/manpages.py from the real parsers and
#                                       the example config, so they cannot drift from the programs
# From Debian: python3 (>= 3.11), python3-systemd (C extension), python3-yaml, python3-aiohttp, and what the
# native core links (libpcre2-8-0, libc6; found by dpkg-shlibdeps).
#
# One package for Debian 12 (bookworm, Python 3.11) and Debian 13 (trixie, Python 3.13): the core uses the
# stable ABI of 3.11, the Depends name no version only one release has, files are under /usr (trixie's
# lintian refuses /lib), and the versions dpkg-shlibdeps derives from the build host are met by both when
# that host is the older release, Debian 12 (build there). tests/systemd installs and runs it on both.
#
# Environment: OUT_DIR (default: dist), PYTHON (default: .venv/bin/python, else python3; must have the
# bundled dependencies installed), EXAMPLE_CONFIG (default: config/nftblockd.yaml), CC (default: gcc),
# SYSTEM_PYTHON (default: /usr/bin/python3: the interpreter the package runs on, whose headers the core is
# compiled with).
set -euo pipefail
umask 022

cd "$(dirname "$0")/.."
ROOT=$PWD
OUT_DIR=${OUT_DIR:-dist}
EXAMPLE_CONFIG=${EXAMPLE_CONFIG:-config/nftblockd.yaml}
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi

die() { echo "build-deb: $*" >&2; exit 1; }
command -v dpkg-deb >/dev/null || die "dpkg-deb is needed (apt-get install dpkg)"
command -v dpkg-shlibdeps >/dev/null || die "dpkg-shlibdeps is needed (apt-get install dpkg-dev)"
CC=${CC:-gcc}
SYSTEM_PYTHON=${SYSTEM_PYTHON:-/usr/bin/python3}
command -v "$CC" >/dev/null || die "a C compiler is needed for the native core (apt-get install gcc)"
[[ -f /usr/include/pcre2.h ]] || die "libpcre2-dev is needed for the native core (apt-get install libpcre2-dev)"
PY_INCLUDE=$("$SYSTEM_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[[ -f $PY_INCLUDE/Python.h ]] || die "$SYSTEM_PYTHON's headers are needed (apt-get install python3-dev)"
ARCH=$(dpkg --print-architecture)
[[ -f $EXAMPLE_CONFIG ]] || die "$EXAMPLE_CONFIG is missing: it becomes /etc/nftblockd/nftblockd.yaml"

# Python dependency → how the package gets it. A new dependency in pyproject.toml fails the build until it is
# listed here: bundled (pure Python, pinned) or a Debian package.
# The `fleet` extra is optional at run time: its packages are Recommends/Suggests in debian/control (checked
# below), and nftblockd/fleet/client.py refuses a version that does not serve, naming what to install.
declare -A DEBIAN_PROVIDES=([systemd-python]=python3-systemd [pyyaml]=python3-yaml [aiohttp]=python3-aiohttp
                            [redis]=python3-redis [hiredis]=python3-hiredis)
DEBIAN_EXTRAS=(fleet)
BUNDLED=(asyncinotify prometheus-client)

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
# debian/<package> under a directory holding debian/control: the layout dpkg-shlibdeps expects
PKG=$STAGE/debian/nftblockd
LIB=$PKG/usr/lib/nftblockd
DOC=$PKG/usr/share/doc/nftblockd
MAN=$PKG/usr/share/man
mkdir -p "$PKG/DEBIAN" "$LIB" "$PKG/usr/bin" "$PKG/usr/lib/systemd/system" "$PKG/usr/lib/sysusers.d" \
    "$PKG/usr/share/python3/runtime.d" \
    "$PKG/etc/nftblockd" "$PKG/etc/fail2ban/action.d" "$DOC/examples" "$MAN/man5" "$MAN/man8"

# Reproducible timestamps (files, man page dates): the last commit's, when there is one.
if [[ -z ${SOURCE_DATE_EPOCH:-} ]] && SOURCE_DATE_EPOCH=$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null); then
    export SOURCE_DATE_EPOCH
fi

# Version, entry points and package data, from pyproject.toml; the checks keep this script honest.
PROVIDES_MAP=$(for k in "${!DEBIAN_PROVIDES[@]}"; do echo "$k=${DEBIAN_PROVIDES[$k]}"; done)
"$PYTHON" - "$STAGE/meta" "$PROVIDES_MAP" "${DEBIAN_EXTRAS[*]}" "${!DEBIAN_PROVIDES[@]}" -- "${BUNDLED[@]}" <<'PY'
import re, sys, tomllib
from importlib import metadata
out, provides, extras, rest = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
debian, bundled = rest[:rest.index("--")], rest[rest.index("--") + 1:]
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
init = open("nftblockd/__init__.py").read()
m = re.search(r'^__version__ = "([^"]+)"', init, re.M)
if not m or m.group(1) != project["version"]:
    sys.exit(f"build-deb: pyproject version {project['version']} != nftblockd.__version__ "
             f"{m.group(1) if m else '?'}")
def norm(name): return re.sub(r"[-_.]+", "-", name).lower()
deps = {norm(re.split(r"[ <>=!~;\[]", d, maxsplit=1)[0]) for d in project["dependencies"]}
unmapped = deps - {norm(d) for d in debian} - {norm(b) for b in bundled}
if unmapped:
    sys.exit(f"build-deb: decide how to ship {', '.join(sorted(unmapped))} (bundle it or map it to a "
             "Debian package in packaging/build-deb.sh)")
# Optional extras shipped as Debian packages: every requirement mapped, and the package named in control's
# Recommends or Suggests (an operator who turns the feature on finds it there)
pkg_of = {norm(k): v for k, v in (line.split("=", 1) for line in provides.splitlines())}
control = open("packaging/debian/control").read()
optional = " ".join(re.findall(r"^(?:Recommends|Suggests):(.*)$", control, re.M))
for extra in extras:
    for req in project["optional-dependencies"][extra]:
        name = norm(re.split(r"[ <>=!~;\[]", req, maxsplit=1)[0])
        if name not in pkg_of:
            sys.exit(f"build-deb: map {name} (the {extra} extra) to a Debian package in packaging/build-deb.sh")
        if not re.search(rf"(^|[ ,|]){re.escape(pkg_of[name])}([ ,(]|$)", optional):
            sys.exit(f"build-deb: {pkg_of[name]} (the {extra} extra's {name}) is in neither Recommends nor "
                     "Suggests of packaging/debian/control")
pins = []
for b in bundled:
    try:
        pins.append(f"{b}=={metadata.version(b)}")
    except metadata.PackageNotFoundError:
        sys.exit(f"build-deb: {b} is not installed for {sys.executable}; run `make venv` first")
with open(out, "w") as f:
    f.write(f"VERSION={project['version']}\n")
    f.write("PINS=" + " ".join(pins) + "\n")
    for name, target in project["scripts"].items():
        f.write(f"SCRIPT={name}={target}\n")
PY
VERSION=$(sed -n 's/^VERSION=//p' "$STAGE/meta")
read -r -a PINS <<<"$(sed -n 's/^PINS=//p' "$STAGE/meta")"

# The changelog's newest entry is this version, signed by the control file's maintainer.
CHANGELOG_HEAD=$(head -n1 packaging/debian/changelog)
[[ $CHANGELOG_HEAD == "nftblockd ($VERSION) "* ]] \
    || die "packaging/debian/changelog starts with '$CHANGELOG_HEAD'; add an entry for $VERSION"
MAINTAINER=$(sed -n 's/^Maintainer: //p' packaging/debian/control)
SIGNER=$(sed -n '0,/^ -- /s/^ -- \(.*>\)  .*/\1/p' packaging/debian/changelog)
[[ $SIGNER == "$MAINTAINER" ]] || die "changelog signed by '$SIGNER', control names '$MAINTAINER'"

# Our package: the .py files and the package data pyproject declares (detect/filters/*.yaml, py.typed).
"$PYTHON" - "$LIB" <<'PY'
import pathlib, shutil, sys, tomllib
dest = pathlib.Path(sys.argv[1])
data = tomllib.load(open("pyproject.toml", "rb")).get("tool", {}).get("setuptools", {}) \
    .get("package-data", {}).get("nftblockd", [])
src = pathlib.Path("nftblockd")
files = {p for p in src.rglob("*.py") if "__pycache__" not in p.parts}
for pattern in data:
    files |= {p for p in src.glob(pattern) if p.is_file()}
for p in sorted(files):
    target = dest / p
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(p, target)
PY
# The native core: the same C source setup.py builds, for the system's python3. A package is not built
# without it (an operator who installs one expects the engine the benchmarks measured).
"$CC" -O2 -g0 -s -shared -fPIC -Wall -DPy_LIMITED_API=0x030B0000 -I"$PY_INCLUDE" \
    nftblockd/detect/_scan.c -lpcre2-8 -o "$LIB/nftblockd/detect/_scan.abi3.so"
chmod 0644 "$LIB/nftblockd/detect/_scan.abi3.so"
# The feed refresh's sorted-key diff (setup.py's second extension; Python's C API alone). Linked to libc
# although it calls nothing there: a shared library without it is lintian's shared-library-lacks-prerequisites.
"$CC" -O2 -g0 -s -shared -fPIC -Wall -DPy_LIMITED_API=0x030B0000 -I"$PY_INCLUDE" \
    nftblockd/feeds/_sorted.c -Wl,--no-as-needed -lc -o "$LIB/nftblockd/feeds/_sorted.abi3.so"
chmod 0644 "$LIB/nftblockd/feeds/_sorted.abi3.so"
# The fleet catch-up's decoder (setup.py's third extension; Python's C API alone, linked to libc as above).
"$CC" -O2 -g0 -s -shared -fPIC -Wall -DPy_LIMITED_API=0x030B0000 -I"$PY_INCLUDE" \
    nftblockd/fleet/_plain.c -Wl,--no-as-needed -lc -o "$LIB/nftblockd/fleet/_plain.abi3.so"
chmod 0644 "$LIB/nftblockd/fleet/_plain.abi3.so"
# The range encoder of interval-set writes (setup.py's fourth extension; Python's C API alone, libc as above).
"$CC" -O2 -g0 -s -shared -fPIC -Wall -DPy_LIMITED_API=0x030B0000 -I"$PY_INCLUDE" \
    nftblockd/kernel/_nlenc.c -Wl,--no-as-needed -lc -o "$LIB/nftblockd/kernel/_nlenc.abi3.so"
chmod 0644 "$LIB/nftblockd/kernel/_nlenc.abi3.so"
"$SYSTEM_PYTHON" -I -B -c 'import sys; sys.path.insert(0, sys.argv[1]); from nftblockd.detect import native
assert native.available(), native.describe()
from nftblockd.feeds import delta
assert delta.NATIVE, "nftblockd.feeds._sorted"
from nftblockd.fleet import rawread
assert rawread.NATIVE, "nftblockd.fleet._plain"
from nftblockd.kernel import nfmsg
assert nfmsg.NATIVE, "nftblockd.kernel._nlenc"' "$LIB" || die "the native core does not load in $SYSTEM_PYTHON"
printf 'Source: nftblockd\n\nPackage: nftblockd\nArchitecture: any\n' >"$STAGE/debian/control"
SHLIBS=$(cd "$STAGE" && dpkg-shlibdeps -O "debian/nftblockd/usr/lib/nftblockd/nftblockd/detect/_scan.abi3.so" \
    | sed -n 's/^shlibs:Depends=//p')
[[ $SHLIBS == *libpcre2-8-0* ]] || die "dpkg-shlibdeps did not name libpcre2-8-0: $SHLIBS"

DIST_INFO=$LIB/nftblockd-$VERSION.dist-info
mkdir -p "$DIST_INFO"
printf 'Metadata-Version: 2.1\nName: nftblockd\nVersion: %s\n' "$VERSION" >"$DIST_INFO/METADATA"
echo dpkg >"$DIST_INFO/INSTALLER"

# Bundled dependencies: wheels only (pure Python), no byte-code (postinst compiles for the target python).
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile --only-binary=:all: \
    --target "$LIB" "${PINS[@]}"
rm -rf "$LIB/bin"  # console scripts of the bundled packages; nftblockd does not use them
# Modules of the bundled packages that carry a `#!/usr/bin/env python` line are libraries here (not
# executable): drop the line, keeping line numbers in tracebacks.
find "$LIB" -name '*.py' ! -perm /111 -exec sed -i '1s/^#!.*$/#/' {} +

# Entry scripts.
while IFS='=' read -r name target; do
    bash packaging/entry-script.sh "$name" "$target" /usr/lib/nftblockd "$VERSION" >"$PKG/usr/bin/$name"
    chmod 0755 "$PKG/usr/bin/$name"
done < <(sed -n 's/^SCRIPT=//p' "$STAGE/meta")

install -m 0644 systemd/nftblockd.service "$PKG/usr/lib/systemd/system/nftblockd.service"
install -m 0644 packaging/debian/sysusers.conf "$PKG/usr/lib/sysusers.d/nftblockd.conf"
install -m 0755 packaging/debian/rtupdate "$PKG/usr/share/python3/runtime.d/nftblockd.rtupdate"
install -m 0644 "$EXAMPLE_CONFIG" "$PKG/etc/nftblockd/nftblockd.yaml"
install -m 0644 packaging/fail2ban/action.d/nftblock.conf packaging/fail2ban/action.d/nftblock.py \
    "$PKG/etc/fail2ban/action.d/"
install -m 0644 README.md packaging/debian/copyright "$DOC/"
# The docs the README, the config's comments and the unit name (docs/actions.md, docs/fleet.md, ...), at the
# same relative paths as in the repository: /usr/share/doc/nftblockd/docs/.
install -d "$DOC/docs"
install -m 0644 docs/*.md "$DOC/docs/"
gzip -9n <packaging/debian/changelog >"$DOC/changelog.gz"
"$PYTHON" packaging/manpages.py "$STAGE/man" --example "$EXAMPLE_CONFIG" --version "$VERSION"
gzip -9n <"$STAGE/man/nftblockd.yaml.5" >"$MAN/man5/nftblockd.yaml.5.gz"
for page in nftblockd.8 nftblock.8; do gzip -9n <"$STAGE/man/$page" >"$MAN/man8/$page.gz"; done
install -m 0644 packaging/debian/examples/feeds.conf packaging/grafana-dashboard.json "$DOC/examples/"

install -m 0644 packaging/debian/conffiles "$PKG/DEBIAN/conffiles"
install -m 0755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$PKG/DEBIAN/"
SIZE=$(du -sk --apparent-size --exclude=DEBIAN "$PKG" | cut -f1)
sed -e "s/@VERSION@/$VERSION/" -e "s/@INSTALLED_SIZE@/$SIZE/" -e "s/@ARCH@/$ARCH/" -e "s/@SHLIBS@/$SHLIBS/" \
    packaging/debian/control >"$PKG/DEBIAN/control"
(cd "$PKG" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
    >"$PKG/DEBIAN/md5sums"

if [[ -n ${SOURCE_DATE_EPOCH:-} ]]; then
    find "$PKG" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +
fi

mkdir -p "$OUT_DIR"
DEB=$OUT_DIR/nftblockd_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz --build "$PKG" "$DEB" >/dev/null
echo "built $DEB"
