"""Watch a kernel set from inside a namespace; print the CLOCK_MONOTONIC time at which it first holds `n`
elements (or "timeout"), then exit.

The end-to-end benchmarks time "last log line written → every ban in the kernel". Asking the daemon
(`nftblock status`) every few milliseconds would make the observer compete with the daemon's own event
loop for the very work being timed; this watcher asks the kernel (one GETSET per poll, the element count
the kernel keeps) and touches neither daemon. It observes fail2ban the same way.

Run inside the namespace: `ip netns exec NS python bench/setwatch.py TABLE SET[,SET...] N [TIMEOUT] [INTERVAL]`
With `--timeline` first, it prints "TIME COUNT" at every change of the count until it reaches N: when bans
reach a set in a known order (the fleet's stream order), the i-th one arrived when the count first reached
base + i, so one cheap count per poll times every ban to within the poll interval.
(several sets: their element counts are added up, e.g. the IPv4 and IPv6 sets of one blocklist).
Prints "ready" once its netlink socket is open (the set may not exist yet: fail2ban creates its table on
the first ban), so the caller knows polling has started.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nftblockd.kernel.nfmsg as m
from nftblockd.kernel.netlink import NftSocket


def count(sock: NftSocket, table: str, set_name: str) -> int:
    """The set's element count: one GETSET of that set (not a dump of the table's sets: 16 us a poll instead of
    40, and the watchers poll every millisecond on the machine whose daemons they time)."""
    body = m.strz(m.NFTA_SET_TABLE, table) + m.strz(m.NFTA_SET_NAME, set_name)
    reply = sock.get(m.NFT_MSG_GETSET, m.NFPROTO_INET, body)
    if reply is None:  # no table or set yet
        return -1
    raw = m.attrs_dict(reply.payload[4:]).get(m.NFTA_SET_COUNT)
    if raw is not None:
        return m.read_be32(raw)
    return len(sock.dump_elements(table, set_name))  # kernels without NFTA_SET_COUNT


def main() -> int:
    args = sys.argv[1:]
    timeline = bool(args) and args[0] == "--timeline"
    if timeline:
        args = args[1:]
    table, set_names, n = args[0], args[1].split(","), int(args[2])
    timeout = float(args[3]) if len(args) > 3 else 120.0
    interval = float(args[4]) if len(args) > 4 else 0.002
    sock = NftSocket()
    deadline = time.monotonic() + timeout
    print("ready", flush=True)
    last = -1
    out: list[str] = []  # a timeline is printed at the end: writing while polling would slow the polls
    while time.monotonic() < deadline:
        c = sum(max(0, count(sock, table, name)) for name in set_names)
        if timeline and c != last:
            out.append(f"{time.monotonic():.6f} {c}")
            last = c
        if c >= n:
            if timeline:
                print("\n".join(out), flush=True)
            print(f"{time.monotonic():.6f}", flush=True)
            return 0
        time.sleep(interval)
    if timeline:
        print("\n".join(out), flush=True)
    print("timeout", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
