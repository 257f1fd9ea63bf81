"""The kernel is a witness: a lost or damaged state database, or a wall-clock jump, never unbans anyone.

Each test bans through the CLI, damages what the daemon remembers, restarts it, and checks the kernel set
still holds every ban (and that the daemon knows them again, with their kernel timeouts, and says so).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS, wait_for

CONFIG = """
blocklists:
  default: {timeout: 1h}
reconcile: {interval: 1s}
allowlist_self: false
jails: {}
"""
ADDRESSES = [f"203.0.113.{i}" for i in range(1, 41)] + ["198.18.0.0/15", "2001:db8:bad::/48"]


def damage(db: Path, how: str) -> None:
    size = db.stat().st_size
    if how == "zero-length":
        db.write_bytes(b"")
    elif how == "half":
        with db.open("r+b") as f:
            f.truncate(size // 2)
    else:  # random bytes over the whole file
        db.write_bytes(os.urandom(size))
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)


@pytest.mark.parametrize("how", ["zero-length", "half", "random"])
def test_a_damaged_state_database_does_not_unban_what_the_kernel_holds(netns: NetNS, tmp_path: Path,
                                                                        how: str) -> None:
    d = DaemonProc(netns, tmp_path / "d", CONFIG).start()
    try:
        r = d.cli("ban", "--timeout", "30m", *ADDRESSES)
        assert r.returncode == 0, r.stderr
        assert d.stop() == 0
        damage(Path(d.state_dir) / "state.db", how)
        d.start()
        host4 = netns.set_elements("nftblock", "default_ip4")
        assert len(host4) == 40
        assert "198.18.0.0/15" in netns.set_elements("nftblock", "default_net4")
        assert "2001:db8:bad::/48" in netns.set_elements("nftblock", "default_net6")
        listed = {b["target"]: b for b in d.cli_json("list")["bans"]}
        assert set(listed) >= {"203.0.113.1", "198.18.0.0/15", "2001:db8:bad::/48"}
        # A ban the salvage read back keeps its saved origin; every other one is adopted from the kernel. A
        # file cut in half can keep some rows (the salvage reads a zero-filled copy); the others keep none.
        origins = [b["origin"] for b in listed.values()]
        adopted = d.cli_json("status")["errors"]["adopted"]
        assert set(origins) <= {"kernel", "cli"} and origins.count("kernel") == adopted
        if how != "half":
            assert adopted == 42 and listed["203.0.113.1"]["origin"] == "kernel"
        if adopted:
            assert "adopted them with their remaining kernel timeouts" in d.log()
        assert all(1500 < b["expires_in"] <= 1800 for b in listed.values())  # the kernel's or the saved time
        # the next reconcile rounds leave them alone, and a second restart finds them saved again
        assert d.stop() == 0
        d.start()
        assert len(netns.set_elements("nftblock", "default_ip4")) == 40
        assert d.cli_json("status")["errors"]["adopted"] == 0
    finally:
        d.close()


def test_disk_full_is_a_visible_degraded_state_that_catches_up(netns: NetNS, tmp_path: Path) -> None:
    d = DaemonProc(netns, tmp_path / "d", CONFIG)
    state = Path(d.state_dir)
    state.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(state)], check=True)
    try:
        d.start()
        filler = state / "filler"
        with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):  # to the last block
            while True:
                f.write(b"\0" * 4096)
        bans = [f"198.51.100.{i}" for i in range(1, 21)]
        for b in bans:
            r = d.cli("ban", "--timeout", "1h", b)
            assert r.returncode == 0, r.stderr  # enforced and acknowledged: the kernel has it
        assert len(netns.set_elements("nftblock", "default_ip4")) == 20
        r = d.cli("--json", "status")
        assert r.returncode == 3, r.stderr  # degraded: status says so in its exit code (docs/limits.md)
        status = json.loads(r.stdout)
        store = status["store"]
        assert store["degraded"] and store["unsaved_changes"] >= 1 and "full" in store["last_error"]
        assert [x["reason"] for x in status["degraded"]] == ["state"]
        assert "could not save state changes" in d.log()
        filler.unlink()
        wait_for(lambda: not d.cli_json("status", ok=(0, 3))["store"]["degraded"], timeout=15,
                 what="the retry to save")
        assert d.cli("status").returncode == 0
        assert d.cli_json("status")["store"]["unsaved_changes"] == 0
        assert d.stop() == 0
        d.start()
        listed = {b["target"]: b for b in d.cli_json("list")["bans"]}
        assert set(listed) == set(bans)
        assert {b["origin"] for b in listed.values()} == {"cli"}  # saved, not merely adopted from the kernel
    finally:
        d.close()
        subprocess.run(["umount", "-l", str(state)], check=False)


def test_saved_and_kernel_bans_the_allowlist_now_covers_are_removed_not_restored(netns: NetNS,
                                                                                tmp_path: Path) -> None:
    # Bans made before an address was allowlisted: at the next start the state database would restore them
    # and the reconcile adopt what the kernel still holds. Both now refuse them, delete them, and say so.
    d = DaemonProc(netns, tmp_path / "d", CONFIG).start()
    try:
        assert d.cli("ban", "203.0.113.5", "203.0.113.6", "198.51.100.0/24").returncode == 0
        assert d.stop() == 0
        d.config_path.write_text(CONFIG.replace("allowlist_self: false",
                                                "allowlist_self: false\nallowlist: [203.0.113.5, 198.51.100.0/23]"))
        d.start()
        assert set(netns.set_elements("nftblock", "default_ip4")) == {"203.0.113.6"}
        assert netns.set_elements("nftblock", "default_net4") == {}
        assert [b["target"] for b in d.cli_json("list")["bans"]] == ["203.0.113.6"]
        assert d.cli_json("status")["errors"]["unbannable_removed"] >= 2
        assert "that no ban may cover, instead of enforcing them" in d.log()
        assert d.stop() == 0
        d.start()  # deleted from the database too: nothing left to refuse
        assert d.cli_json("status")["errors"]["unbannable_removed"] == 0
        assert [b["target"] for b in d.cli_json("list")["bans"]] == ["203.0.113.6"]
    finally:
        d.close()
