"""Issue 13 (hardening), end to end: the real daemon in a private namespace, real files, the kernel read back
with `nft -j`. Each test reproduces one finding of the issue and checks the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.daemon import REPO, DaemonProc
from tests.helpers.netns import NetNS, wait_for

NEVER = ["0.0.0.0", "::", "255.255.255.255", "224.0.0.1", "240.0.0.1", "fe80::1", "ff02::1"]
_pids = iter(range(1000, 10**6))


def failures(addr: str, n: int = 1) -> str:
    stamp = time.strftime("%b %e %H:%M:%S")
    return "".join(f"{stamp} host sshd[{next(_pids)}]: Failed password for invalid user admin from {addr} "
                   f"port {40000 + i} ssh2\n" for i in range(n))


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def elements(ns: NetNS, blocklist: str = "default") -> set[str]:
    return {e for kind in ("ip4", "ip6", "net4", "net6")
            for e in ns.set_elements("nftblock", f"{blocklist}_{kind}")}


def jail_config(log: Path, *, maxretry: int = 1, size: int | None = None) -> str:
    sized = f"\nblocklists:\n  default:\n    size: {size}\n" if size else ""
    return f"""
reconcile: {{interval: 1h}}{sized}
jails:
  sshd:
    files: ["{log}"]
    filter: sshd
    maxretry: {maxretry}
    findtime: 10m
    bantime: 1h
    ipv6_prefix: 64
"""


@pytest.fixture
def jail(netns: NetNS, tmp_path: Path) -> Iterator[tuple[DaemonProc, Path]]:
    log = tmp_path / "auth.log"
    log.write_text("")
    d = DaemonProc(netns, tmp_path / "d", jail_config(log)).start()
    yield d, log
    d.close()


# -- item 2: never-ban space -------------------------------------------------------------------------------


def test_log_lines_from_never_ban_space_ban_nothing(netns: NetNS, jail: tuple[DaemonProc, Path]) -> None:
    d, log = jail
    append(log, "".join(failures(a) for a in NEVER) + failures("198.51.100.5"))
    wait_for(lambda: "198.51.100.5" in elements(netns), what="the marker ban")
    assert elements(netns) == {"198.51.100.5"}
    st = next(j for j in d.cli_json("status")["jails"] if j["name"] == "sshd")
    assert st["never_ban"] == len(NEVER) and st["bans"] == 1


def test_cli_bans_of_never_ban_space_are_refused_with_the_reason(netns: NetNS,
                                                                 jail: tuple[DaemonProc, Path]) -> None:
    d, _log = jail
    r = d.cli("ban", *NEVER, "0.0.0.0/8", "192.0.0.0/2", "203.0.113.7")
    assert r.returncode == 1
    for t in [*NEVER, "0.0.0.0/8", "192.0.0.0/2"]:
        assert f"refused {t}: {t} is never banned: " in r.stderr, (t, r.stderr)
    assert "multicast 224.0.0.0/4" in r.stderr and "it overlaps" in r.stderr
    # the bulk path (64 targets and more go set-at-a-time)
    bulk = [f"198.51.100.{i}" for i in range(10, 80)] + ["224.0.0.2", "0.0.0.0", "ff02::2"]
    r = d.cli("ban", "-", input="\n".join(bulk) + "\n")
    assert r.returncode == 1
    for t in ("224.0.0.2", "0.0.0.0", "ff02::2"):
        assert f"{t} is never banned" in r.stderr
    assert elements(netns) == {"203.0.113.7", *bulk[:70]}


def test_a_huge_timeout_is_refused_as_a_bad_request(jail: tuple[DaemonProc, Path]) -> None:
    import json
    import socket

    d, _log = jail
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(d.socket)
        s.sendall(b'{"v":1,"id":7,"cmd":"ban","args":{"targets":["203.0.113.9"],"timeout":1e308}}\n')
        reply = json.loads(s.makefile("rb").readline())
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
    assert "at most 3650d" in reply["error"]["message"]


# -- item 7: a full set ------------------------------------------------------------------------------------


def test_a_full_set_is_not_counted_as_bans(netns: NetNS, tmp_path: Path) -> None:
    log = tmp_path / "auth.log"
    log.write_text("")
    d = DaemonProc(netns, tmp_path / "d", jail_config(log, size=1000)).start()
    try:
        append(log, "".join(failures(f"10.{i >> 8 & 255}.{i & 255}.1") for i in range(1500)))

        def settled() -> dict[str, int] | None:
            st = next(j for j in d.cli_json("status")["jails"] if j["name"] == "sshd")
            return st if st["bans"] + st["ban_refused"] == 1500 else None

        st = wait_for(settled, what="1500 ban decisions settled")
        in_kernel = len(netns.set_elements("nftblock", "default_ip4"))
        assert in_kernel == 1000
        assert st["bans"] == in_kernel and st["ban_refused"] == 500 and st["decided"] == 1500
        assert d.cli_json("status")["errors"]["set_full"] >= 500
    finally:
        d.close()


# -- item 7: without CAP_NET_ADMIN ---------------------------------------------------------------------------


def test_without_cap_net_admin_the_daemon_names_the_capability(netns: NetNS, tmp_path: Path) -> None:
    cfg = tmp_path / "nftblockd.yaml"
    cfg.write_text("reconcile: {interval: 1h}\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("NOTIFY_SOCKET", None)
    # root without CAP_NET_ADMIN: dropped from the bounding set, so the exec'd Python never has it
    r = subprocess.run(["ip", "netns", "exec", netns.name, "setpriv", "--bounding-set=-net_admin",
                        "--inh-caps=-net_admin", "--", sys.executable, "-m", "nftblockd.daemon.main", "--config",
                        str(cfg), "--socket", str(tmp_path / "c.sock"), "--state-dir", str(tmp_path / "state")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "CAP_NET_ADMIN" in r.stderr, r.stderr
    assert "get type 16" not in r.stderr


# -- item 5: SIGTERM and a hanging feed ---------------------------------------------------------------------

HANG = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
print("accepted", flush=True)
time.sleep(3600)
"""


def test_sigterm_does_not_wait_for_a_hanging_feed(netns: NetNS, tmp_path: Path) -> None:
    server = netns.popen(sys.executable, "-c", HANG, stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        cfg = f"""
reconcile: {{interval: 1h}}
blocklists: {{default: {{}}, fb: {{}}}}
feeds:
  slow: {{url: "http://127.0.0.1:{port}/list.txt", blocklist: fb, timeout: 1h}}
"""
        d = DaemonProc(netns, tmp_path / "d", cfg).start()
        try:
            assert server.stdout.readline().strip() == b"accepted"  # the fetch is in flight, and hangs
            t0 = time.monotonic()
            rc = d.stop(timeout=20)  # SIGTERM; killed (and rc < 0) if it waits for the fetch
            took = time.monotonic() - t0
            assert rc == 0, d.log()
            print(f"SIGTERM with a hanging feed fetch: exited in {took:.2f} s")
        finally:
            d.close()
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


# -- item 7: feed removals deferred by one refresh ------------------------------------------------------------


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_feed_removals_are_deferred_by_one_refresh(netns: NetNS, tmp_path: Path) -> None:
    feed = tmp_path / "list.txt"
    feed.write_text("45.10.0.1\n45.10.0.5\n45.10.0.9\n")
    cfg = f"""
reconcile: {{interval: 1h}}
blocklists: {{default: {{}}, fb: {{}}}}
feeds:
  flappy: {{path: "{feed}", blocklist: fb, defer_removals: true}}
"""
    d = DaemonProc(netns, tmp_path / "d", cfg).start()
    try:
        def fb() -> set[str]:
            return set(netns.set_elements("nftblock", "fb_net4"))  # a feed's hosts are in its interval set

        def fetched() -> int:
            return int(next(f for f in d.cli_json("feeds")["feeds"] if f["name"] == "flappy")["counters"]["fetch_ok"])

        wait_for(lambda: fb() == {"45.10.0.1", "45.10.0.5", "45.10.0.9"}, what="the first copy")
        n = fetched()
        _write_atomically(feed, "45.10.0.1\n45.10.0.5\n")  # 45.10.0.9 leaves the list
        wait_for(lambda: fetched() > n, what="the second copy")
        assert fb() == {"45.10.0.1", "45.10.0.5", "45.10.0.9"}  # still blocked for one refresh
        _write_atomically(feed, "45.10.0.1\n45.10.0.5\n")  # the next copy confirms it gone
        wait_for(lambda: fb() == {"45.10.0.1", "45.10.0.5"}, what="the removal, one refresh later")
    finally:
        d.close()
