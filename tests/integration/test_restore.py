"""A restart from a state database of row-saved bans gives the kernel and the daemon exactly what was saved.

The database is written the way jail bans (one row each) and bulk bans (one bulk row) are saved, with ends of
every kind: each its own, ended, permanent, in never-ban space, IPv4 and IPv6 hosts, ranges, keys holding the
bytes 0x00 and 0xff, more labels than the store's one-scan-per-group limit, and addresses saved both in a bulk
row and as a row of another label (the save that ends last wins). After a reboot (table gone) the daemon must
put back every ban still in force with its own end, origin and jail, and drop the rest.
"""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path

from nftblockd.addr import format_target, target_text
from nftblockd.events import Ban
from nftblockd.state.store import Store
from tests.helpers.daemon import DaemonProc
from tests.helpers.netns import NetNS

CONFIG = """
blocklists: {default: {timeout: 1h}}
allowlist_self: false
jails: {}
"""
JAIL = ("jail", "5 failures in 10m", "sshd")
RECIDIVE = ("jail", "3 bans in 1d", "recidive")
CLI = ("cli", "manual", "")
BULK = ("cli", "bulk", "")


def saved_bans(now: float) -> tuple[list[Ban], list[Ban]]:
    """(rows saved one by one after the bulk row, what must be in force after the restart)."""
    def ban(target: str, until: float | None, label: tuple[str, str, str]) -> Ban:
        return Ban(ipaddress.ip_network(target), "default", until, label[0], label[1], label[2])  # type: ignore[arg-type]

    rows = [ban(f"203.0.113.{i}", now + 100 + i * 37.123, JAIL) for i in range(1, 41)]
    rows += [ban(f"203.0.113.{i}", now - 10, JAIL) for i in range(41, 46)]  # ended
    rows += [ban("203.0.113.46", None, JAIL), ban("198.51.0.255", now + 500.0004, JAIL),
             ban("198.51.255.0", now + 501.9996, JAIL)]
    rows += [ban(f"2001:db8::{i}", now + 200 + i, JAIL) for i in range(1, 6)]
    rows += [ban(f"203.0.113.{i}", now + 900, RECIDIVE) for i in range(100, 106)]
    rows += [ban(f"192.0.2.{i}", now + 5000, CLI) for i in range(1, 11)]
    rows += [ban("198.18.0.0/15", None, CLI), ban("2001:db8:bad::/48", now + 3000, CLI),
             ban("100.64.0.0/24", now - 1, CLI)]
    never = [ban("127.0.0.9", now + 100, JAIL), ban("224.0.0.7", now + 100, JAIL), ban("ff02::1", now + 100, JAIL)]
    # both in the bulk row (ends now + 7200) and as a jail row: the row ends later, then earlier
    overlap = [ban("10.20.0.1", now + 9000, JAIL), ban("10.20.0.2", now + 100, JAIL)]
    want = [b for b in rows if b.until is None or b.until > now] + [overlap[0]]
    want += [ban(f"10.20.{i // 256}.{i % 256}", now + 7200, BULK) for i in range(1200) if i != 1]
    return rows + never + overlap, want


def write_db(path: Path, now: float) -> list[Ban]:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows, want = saved_bans(now)
    with Store.open(path) as st:
        st.commit(save_packed=[("default", [ipaddress.IPv4Address(f"10.20.{i // 256}.{i % 256}").packed
                                             for i in range(1200)], now + 7200, *BULK)], created=now - 60)
        for b in rows:  # one decision at a time, as a jail saves them
            st.commit(save=[b], created=now)
    return want


def test_row_saved_bans_come_back_exactly(netns: NetNS, tmp_path: Path) -> None:
    now = time.time()
    d = DaemonProc(netns, tmp_path / "d", CONFIG)
    db = Path(d.state_dir) / "state.db"
    want = write_db(db, now)
    try:
        d.start()
        listed = {b["target"]: b for b in d.cli_json("list")["bans"]}
        assert set(listed) == {format_target(b.target) for b in want}
        for b in want:
            got = listed[format_target(b.target)]
            assert (got["origin"], got["reason"], got["jail"]) == (b.origin, b.reason, b.jail), b
            if b.until is None:
                assert got["until"] is None, b
            else:  # kept to the millisecond
                assert abs(got["until"] - b.until) < 0.0011, (b, got["until"])
        checked = time.time()
        kernel = {**netns.set_elements("nftblock", "default_ip4"), **netns.set_elements("nftblock", "default_ip6"),
                  **netns.set_elements("nftblock", "default_net4"), **netns.set_elements("nftblock", "default_net6")}
        assert set(kernel) == set(listed)
        for target, b in listed.items():
            if b["until"] is None:
                assert "expires" not in kernel[target], target
            else:  # the kernel counts down from its own clock, in whole seconds
                assert abs(kernel[target]["expires"] - (b["until"] - checked)) < 3, (target, kernel[target])
        assert d.cli_json("status")["errors"]["unbannable_removed"] == 3
        assert d.stop() == 0
        with Store.open(db) as st:  # what no ban may cover is deleted from the database too
            kept = {target_text(r[1]) for r in st.load_active_rows(time.time())}
        assert kept == set(listed)
    finally:
        d.close()
