#!/usr/bin/env bash
# Usage: tools/as-nobody.sh PYTHON ARGS...  Runs PYTHON ARGS as an unprivileged user when called as root, as
# the caller otherwise. `make coverage` runs the unit tier through it: the unit tier must pass as any user, and
# CI runs as root, so it proves it there (root-only unit tests, marked `root`, run as root afterwards).
#
# The user is nobody (uid/gid 65534): no supplementary groups, no capabilities, no new privileges, and a HOME
# of its own (a temp dir, removed afterwards) where the caches that default to the current directory go
# (coverage data, hypothesis' example database). A checkout or an interpreter under a root-only path (a clone
# in /root, a pyenv Python) is out of nobody's reach: only then does it keep one capability,
# CAP_DAC_READ_SEARCH (read and traverse anything, write nothing), and it says so.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then exec "$@"; fi

home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
chown 65534:65534 "$home"
user=(setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs)
env=(env HOME="$home" COVERAGE_FILE="$home/.coverage" HYPOTHESIS_STORAGE_DIRECTORY="$home/.hypothesis"
     PYTHONDONTWRITEBYTECODE=1)
caps=(--inh-caps=-all --bounding-set=-all)
if ! "${user[@]}" "${caps[@]}" "${env[@]}" "$1" -c 'import os; os.listdir(os.getcwd())' 2>/dev/null; then
    caps=(--inh-caps=-all,+dac_read_search --ambient-caps=+dac_read_search --bounding-set=-all,+dac_read_search)
    echo "as-nobody: $1 or $PWD is out of nobody's reach (a root-only path): keeping CAP_DAC_READ_SEARCH" >&2
fi
echo "as-nobody: running as uid 65534 (nobody)" >&2
"${user[@]}" "${caps[@]}" "${env[@]}" "$@"
