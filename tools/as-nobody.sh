#!/usr/bin/env bash
# Usage: tools/as-nobody.sh PYTHON ARGS...  Runs PYTHON ARGS as an unprivileged user when called as root, as
# the caller otherwise. `make coverage` runs the unit tier through it: the unit tier must pass as any user, and
# CI runs as root, so it proves it there (root-only unit tests, marked `root`, run as root afterwards).
#
# The user is nobody (uid/gid 65534): no supplementary groups, no capabilities, no new privileges, and a HOME
# of its own (a temp dir, removed afterwards) where the caches that default to the current directory go
# (coverage data, hypothesis' example database).
#
# A checkout or an interpreter under /root (mode 0700: a fresh clone there, a pyenv Python) is out of nobody's
# reach. Then the command runs in a private mount namespace where /root is an empty 0755 tmpfs with only the
# checkout and the interpreter's installation mounted back at their own paths: same paths, nothing else of
# /root visible, nothing changed outside the namespace. Should nobody still not reach them, the tests run as
# root, and it says so.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then exec "$@"; fi

user=(setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all)
# nobody reaches the interpreter and the checkout when, as nobody, the interpreter finds the installation root
# finds (one that cannot read its own prefix starts anyway, on another installation's standard library) and
# lists the current directory by its path
reachable() {
    local base
    base=$("$1" -c 'import sys; print(sys.base_prefix)')
    "${user[@]}" "$1" -c 'import os, sys; os.listdir(os.getcwd()); assert sys.base_prefix == sys.argv[1]' \
        "$base" 2>/dev/null
}

if ! reachable "$1" && [ -z "${AS_NOBODY_NS:-}" ]; then
    prefix=$(dirname "$(dirname "$(readlink -f "$(command -v "$1")")")")
    exec unshare --mount --propagation private -- env AS_NOBODY_NS=1 bash -c '
        set -euo pipefail
        stash=$(mktemp -d)
        keep=()
        for p in "$PWD" "$1"; do
            case $p in /root/*) keep+=("$p") ;; esac
        done
        for i in "${!keep[@]}"; do mkdir "$stash/$i" && mount --bind "${keep[$i]}" "$stash/$i"; done
        mount -t tmpfs -o mode=0755,size=1m nftblockd-as-nobody /root
        for i in "${!keep[@]}"; do mkdir -p "${keep[$i]}" && mount --move "$stash/$i" "${keep[$i]}"; done
        rmdir "$stash"/* "$stash" 2>/dev/null || true
        cd "$PWD"
        shift
        exec "$@"' as-nobody "$prefix" "$0" "$@"
fi

home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
chown 65534:65534 "$home"
env=(env -u AS_NOBODY_NS HOME="$home" COVERAGE_FILE="$home/.coverage"
     HYPOTHESIS_STORAGE_DIRECTORY="$home/.hypothesis" PYTHONDONTWRITEBYTECODE=1)
if ! reachable "$1"; then
    echo "as-nobody: $1 or $PWD is out of nobody's reach: running as root, NOT proving the tests pass as any user" >&2
    "${env[@]}" "$@"
    exit
fi
echo "as-nobody: running as uid 65534 (nobody)${AS_NOBODY_NS:+, /root showing only the checkout and the interpreter}" >&2
"${env[@]}" "${user[@]}" "$@"
