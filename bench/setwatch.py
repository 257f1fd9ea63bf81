"""Watch a kernel set from inside a namespace; print the CLOCK_MONOTONIC time at which it first holds `n`
elements (or "timeout"), then exit.

The end-to-end benchmarks time "last log line written → every ban in the kernel". Asking the daemon
(`nftblock status`) every few milliseconds would make the observer compete with the daemon's own event
loop for the very work being timed; this watcher asks the kernel (one GETSET per poll, the element count
the kernel keeps) and touches neither daemon. It observes fail2ban the same way.

Run inside the namespace: `ip netns exec NS python bench/setwatch.py TABLE SET[,SET...] N [TIMEOUT] [INTERVAL]`
(several sets: their element counts are added up, e.g. the IPv4 and IPv6 sets of one blocklist).
Prints "ready" once its netlink socket is open (the set may not exist yet: fail2ban creates its table on
the first ban), so the caller knows polling has started.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nftblockd.kernel.netlink import NftSocket


def count(sock: NftSocket, table: str, set_name: str) -> int:
    info = sock.list_sets(table).get(set_name)
    if info is None:
        return -1
    if info.count is not None:
        return info.count
    return len(sock.dump_elements(table, set_name))  # kernels without NFTA_SET_COUNT


def main() -> int:
    table, set_names, n = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    timeout = float(sys.argv[4]) if len(sys.argv) > 4 else 120.0
    interval = float(sys.argv[5]) if len(sys.argv) > 5 else 0.002
    sock = NftSocket()
    deadline = time.monotonic() + timeout
    print("ready", flush=True)
    while time.monotonic() < deadline:
        if sum(max(0, count(sock, table, name)) for name in set_names) >= n:
            print(f"{time.monotonic():.6f}", flush=True)
            return 0
        time.sleep(interval)
    print("timeout", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
