#!/usr/bin/env bash
# harness.sh: boot a Debian container (13 trixie or 12 bookworm) with a real systemd as PID 1
# (systemd-nspawn), for the tests in tests/systemd/. Works on a host whose own PID 1 is not systemd (a CI VM,
# a container runner).
#
# Environment: NFTBLOCKD_TEST_SUITE (bookworm | trixie; default bookworm) picks the release, for `rootfs`
# and `boot` alike; NFTBLOCKD_TEST_EXTRA (package names, space- or comma-separated) adds packages a test
# needs to the rootfs (e.g. redis-server). Suite and extra packages are part of the cache key: each
# combination is its own cached tree. `run` and `stop` need neither.
#
#   harness.sh rootfs              print the cached rootfs directory, building it first if needed (mmdebstrap)
#   harness.sh boot NAME [DIR]     boot a throw-away container NAME on the cached rootfs; DIR (host) is
#                                  bind-mounted read-only at /srv/test inside; returns once systemd reports
#                                  the boot finished (running or degraded)
#   harness.sh run NAME CMD...     run CMD as root inside NAME (all its namespaces, clean environment);
#                                  stdin, stdout, stderr and the exit status pass through
#   harness.sh stop NAME           power NAME off (SIGKILL after a bound) and remove what boot created
#
# What it relies on, and why:
# - The rootfs is built once per package list and cached under $NFTBLOCKD_TEST_CACHE (default
#   /var/cache/nftblockd-test): the key is a hash of the package list, which includes the Depends and
#   Recommends of packaging/debian/control, so a new dependency builds a new rootfs by itself. The container
#   has no network (--private-network: only `lo`), so everything the .deb needs from Debian must be in it.
# - Every boot is --volatile=overlay: the cached tree is the read-only lower layer, all writes (dpkg, the
#   journal, the daemon's state) go to a tmpfs that disappears at poweroff. Runs cannot spoil the cache and
#   several may boot side by side.
# - --private-network: the container's nftables and sockets live in their own network namespace; nothing
#   the tests do reaches the host's ruleset.
# - --system-call-filter=bpf: nspawn's seccomp filter refuses bpf() by default, and systemd inside then
#   silently (debug level) ignores IPAddressDeny=, which the tests check.
# - Without systemd on the host nobody makes a cgroup for the container: we create one per container in
#   each cgroup hierarchy nspawn uses and pass --keep-unit, so nspawn puts its payload below it, and `stop`
#   removes it. --register=no: there is no machined to register with.
# - `run` is nsenter into the container's PID 1 namespaces: like `docker exec`, the process joins the
#   namespaces but not a unit; use `systemd-run --wait --pipe` inside for real unit semantics.
set -euo pipefail

CACHE=${NFTBLOCKD_TEST_CACHE:-/var/cache/nftblockd-test}
SUITE=${NFTBLOCKD_TEST_SUITE:-bookworm}
EXTRA=${NFTBLOCKD_TEST_EXTRA:-}
MIRROR=${NFTBLOCKD_TEST_MIRROR:-http://deb.debian.org/debian}
SECURITY=${NFTBLOCKD_TEST_SECURITY:-http://deb.debian.org/debian-security}
BOOT_TIMEOUT=${NFTBLOCKD_TEST_BOOT_TIMEOUT:-120}
STATE_ROOT=/run/nftblockd-test
HERE=$(cd "$(dirname "$0")" && pwd)
CONTROL=$HERE/../../packaging/debian/control
# systemd as init with what a stock Debian server has around it (openssh-server: the shipped config's sshd
# jail reads its journal lines), plus what the tests use inside (iproute2 for a dummy interface and a
# network namespace, python3's http.server for a feed, the ssh client for failed logins). redis-server is
# what the fleet test (NFTBLOCKD_TEST_EXTRA=redis-server) adds: named here too, its tree and this one are the
# same (one key: the list is sorted and made unique), so a fresh machine builds two trees, not four.
# fail2ban: the journey test (test_journey.py) migrates a running fail2ban as the README says; its unit is
# disabled in the tree (below), so the other tests boot without it.
BASE_PKGS=(systemd systemd-sysv dbus libnss-systemd nftables iproute2 procps python3 openssh-server
           openssh-client redis-server fail2ban)
# Debian 13's lintian checks the .deb inside (its checks differ from 12's). Not in Debian 12's tree: 12's
# lintian is the build host's (make deps; tests/unit/test_lintian.py), and lintian brings about 160
# packages, half of a tree's build time.
[[ $SUITE = trixie ]] && BASE_PKGS+=(lintian)
INSIDE_ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
            SYSTEMD_PAGER=cat SYSTEMD_COLORS=0 TERM=dumb)

die() { echo "harness: $*" >&2; exit 1; }
say() { echo "harness: $*" >&2; }

# Debian packages the .deb depends on or recommends (names only: the rootfs has one version of each).
package_deps() {
    [[ -f $CONTROL ]] || die "$CONTROL is missing"
    sed -n -E 's/^(Pre-Depends|Depends|Recommends):[[:space:]]*//p' "$CONTROL" | tr ',' '\n' \
        | sed -E 's/\|.*//; s/\(.*\)//; s/:any//; s/[[:space:]]//g' | grep -v '^$' | grep -v '^@' || true
    # @SHLIBS@ is filled at build time by dpkg-shlibdeps from what the native core links: name it here
    echo libpcre2-8-0
}

rootfs_packages() { printf '%s\n' "${BASE_PKGS[@]}" $(package_deps) ${EXTRA//,/ } | sort -u; }

rootfs_dir() {
    local key
    key=$({ echo "$SUITE $MIRROR $SECURITY"; rootfs_packages; } | sha256sum | cut -c1-12)
    echo "$CACHE/$SUITE-$key"
}

need_tools() {
    local t
    for t in mmdebstrap systemd-nspawn nsenter flock; do
        command -v $t >/dev/null || die "$t is missing (make deps installs mmdebstrap and systemd-container)"
    done
}

check_suite() {
    case $SUITE in bookworm | trixie) ;; *) die "NFTBLOCKD_TEST_SUITE='$SUITE': bookworm or trixie" ;; esac
}

cmd_rootfs() {
    check_suite
    need_tools
    local dir tmp t0=$SECONDS pkgs
    dir=$(rootfs_dir)
    mkdir -p "$CACHE"
    exec 8>"$dir.lock"
    flock 8       # one builder per tree; the others wait and then find it built
    if [[ -f $dir/.complete ]]; then echo "$dir"; return 0; fi
    pkgs=$(rootfs_packages | paste -sd,)
    say "building the $SUITE rootfs $dir ($pkgs); once per package list, about a minute or two"
    tmp=$dir.tmp
    rm -rf "$tmp"
    mmdebstrap --quiet --variant=minbase --include="$pkgs" \
        --aptopt='Acquire::Retries "3"' \
        "$SUITE" "$tmp" "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
        "deb $SECURITY $SUITE-security main" >&2
    echo nftblockd-test >"$tmp/etc/hostname"
    systemd-machine-id-setup --root="$tmp" >/dev/null 2>&1 || systemd-id128 new >"$tmp/etc/machine-id"
    mkdir -p "$tmp/var/log/journal"
    # Units that would only wait for a network the container does not have, or do work a test does not want.
    for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
             systemd-networkd-wait-online.service fstrim.timer; do
        ln -sf /dev/null "$tmp/etc/systemd/system/$u"
    done
    # fail2ban is there to be migrated by the journey test, which starts it; not at every boot.
    rm -f "$tmp/etc/systemd/system/multi-user.target.wants/fail2ban.service"
    rm -f "$tmp/var/cache/apt/archives/"*.deb
    rootfs_packages >"$tmp/.packages"
    echo "$((SECONDS - t0))" >"$tmp/.build-seconds"
    touch "$tmp/.complete"
    mv "$tmp" "$dir"
    # Trees of other package lists (another branch, an older control file) unused for a week: boot touches
    # the tree it uses, so one that a running container may still use is never removed.
    find "$CACHE" -mindepth 1 -maxdepth 1 -type d -name "$SUITE-*" ! -path "$dir" -mtime +7 -exec rm -rf {} +
    say "rootfs built in $((SECONDS - t0)) s"
    echo "$dir"
}

# --- running containers ---------------------------------------------------------------------------------

check_name() { [[ ${1:-} =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]] || die "bad container name '${1:-}'"; }
host_has_systemd() { [[ -d /run/systemd/system ]] && [[ $(ps -p 1 -o comm=) = systemd ]]; }

# cgroup hierarchies nspawn uses: the unified one and, on a hybrid (v1) host, name=systemd.
cgroup_dirs() {
    if [[ $(stat -fc %T /sys/fs/cgroup) = cgroup2fs ]]; then echo /sys/fs/cgroup; return; fi
    [[ $(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null) = cgroup2fs ]] && echo /sys/fs/cgroup/unified
    [[ -d /sys/fs/cgroup/systemd ]] && echo /sys/fs/cgroup/systemd
    return 0
}

nspawn_pid() {  # $1 = state dir; the nspawn PID if it still runs
    local pid
    pid=$(cat "$1/nspawn.pid" 2>/dev/null) || return 1
    [[ -n $pid ]] && [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q systemd-nspawn \
        && echo "$pid"
}

# The container's PID 1, as a host PID: the child of nspawn that is PID 1 in its own PID namespace.
leader_pid() {  # $1 = state dir
    local np c
    np=$(nspawn_pid "$1") || return 1
    for c in $(cat /proc/"$np"/task/*/children 2>/dev/null); do
        [[ $(awk '/^NSpid:/ {print $NF}' "/proc/$c/status" 2>/dev/null) = 1 ]] && { echo "$c"; return 0; }
    done
    return 1
}

cmd_boot() {
    local name=${1:-} bind=${2:-}
    check_name "$name"
    need_tools
    local state=$STATE_ROOT/$name root cg=nftblockd-test-$name
    [[ -e $state/nspawn.pid ]] && nspawn_pid "$state" >/dev/null && die "$name is already running"
    root=$(cmd_rootfs)
    touch "$root"
    mkdir -p "$state"
    local args=(-q -b -D "$root" -M "$name" --volatile=overlay --private-network --register=no
                --console=read-only --kill-signal=SIGRTMIN+4 --system-call-filter=bpf)
    [[ -n $bind ]] && args+=(--bind-ro="$(realpath "$bind")":/srv/test)
    local t0=$SECONDS
    (
        # Our own cgroup (see the header), then exec: nspawn is this very process, in that cgroup.
        if ! host_has_systemd; then
            for h in $(cgroup_dirs); do mkdir -p "$h/$cg"; echo "$BASHPID" >"$h/$cg/cgroup.procs"; done
            args+=(--keep-unit)
        fi
        exec setsid systemd-nspawn "${args[@]}" </dev/null >"$state/console.log" 2>&1 8>&-
    ) &
    local np=$! l=
    echo "$np" >"$state/nspawn.pid"
    echo "$cg" >"$state/cgroup"
    while ((SECONDS - t0 < BOOT_TIMEOUT)); do
        # (Not nspawn_pid: until the subshell has exec'd, its command line is still bash's.)
        kill -0 "$np" 2>/dev/null || { tail -n 30 "$state/console.log" >&2 || true; die "systemd-nspawn exited"; }
        l=$(leader_pid "$state") && [[ -S /proc/$l/root/run/systemd/private ]] && break
        l=
        sleep 0.1
    done
    [[ -n $l ]] || die "no container PID 1 after ${BOOT_TIMEOUT}s (console: $state/console.log)"
    local st
    st=$(timeout $((BOOT_TIMEOUT - (SECONDS - t0) + 1)) \
        nsenter -t "$l" -m -u -i -n -p -C -r -w env -i "${INSIDE_ENV[@]}" systemctl is-system-running --wait) || true
    say "$name booted in $((SECONDS - t0)) s: $st"
    case $st in
        running) ;;
        degraded) cmd_run "$name" systemctl --failed --no-legend >&2 || true ;;
        *) die "$name: system state '$st' (console: $state/console.log)" ;;
    esac
}

cmd_run() {
    local name=${1:-}; shift || true
    check_name "$name"
    local l
    l=$(leader_pid "$STATE_ROOT/$name") || die "$name is not running"
    exec nsenter -t "$l" -m -u -i -n -p -C -r -w env -i "${INSIDE_ENV[@]}" "$@"
}

cmd_stop() {
    local name=${1:-}
    check_name "$name"
    local state=$STATE_ROOT/$name np l i cg h
    if np=$(nspawn_pid "$state"); then
        l=$(leader_pid "$state") || true
        [[ -n $l ]] && kill -s RTMIN+4 "$l" 2>/dev/null || true  # systemd: orderly poweroff
        for ((i = 0; i < 300; i++)); do kill -0 "$np" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$np" 2>/dev/null; then
            say "$name: no poweroff within 30 s, killing it"
            [[ -n $l ]] && kill -KILL "$l" 2>/dev/null || true  # takes the whole PID namespace down
            for ((i = 0; i < 50; i++)); do kill -0 "$np" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$np" 2>/dev/null || true
        fi
    fi
    cg=$(cat "$state/cgroup" 2>/dev/null) || cg=
    if [[ -n $cg ]] && ! host_has_systemd; then
        for h in $(cgroup_dirs); do
            [[ -d $h/$cg ]] && find "$h/$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        done
    fi
    rm -rf "$state"
}

cmd=${1:-}; shift || true
[[ $(id -u) = 0 ]] || die "must run as root"
case $cmd in
    rootfs) cmd_rootfs ;;
    boot) cmd_boot "$@" ;;
    run) cmd_run "$@" ;;
    stop) cmd_stop "$@" ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; [[ -z $cmd || $cmd = help ]] ;;
esac
