"""Benchmark the state store: bulk saves, the restart load, durability cost, pruning and size on disk.

    python bench/bench_store.py            # 1,000,000 bans (about two minutes on a small VM)
    python bench/bench_store.py 100000     # a quicker run

Figures go to bench/results.json through `record`. The restart target is: a daemon with 1,000,000 saved bans
is READY within 5 s including the kernel load, so the load itself (`store.load_rows_1m`) aims at <= 1.5 s.
"""

from __future__ import annotations

import gc
import ipaddress
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import record
from nftblockd.addr import IPNet, format_target, pack_target, parse_target, unpack_target
from nftblockd.events import Ban, Origin
from nftblockd.state.store import Store
from tests.helpers.store import delete_bans, load_active_bans

NOW = 1_800_000_000.0


def make_bans(n: int, seed: int = 1) -> list[Ban]:
    """A realistic mix: 90% IPv4 hosts, 8% IPv6 /64s, 2% IPv4 ranges; jail bans expire, 10% are permanent."""
    rnd = random.Random(seed)
    seen: set[IPNet] = set()
    out: list[Ban] = []
    reasons: list[tuple[Origin, str, str]] = [
        ("jail", "5 failures in 10m", "sshd"), ("jail", "10 failures in 10m", "nginx-auth"),
        ("feed", "feed spamhaus-drop", ""), ("cli", "manual", "")]
    while len(out) < n:
        r = rnd.random()
        net: IPNet
        if r < 0.90:
            net = ipaddress.IPv4Network(rnd.getrandbits(32))
        elif r < 0.98:
            net = ipaddress.IPv6Network((rnd.getrandbits(64) << 64, 64))
        else:
            net = ipaddress.IPv4Network((rnd.getrandbits(24) << 8, 24))
        if net in seen:
            continue
        seen.add(net)
        origin, reason, jail = reasons[len(out) % len(reasons)]
        until = None if len(out) % 10 == 0 else NOW + 60 + rnd.random() * 86400 * 7
        out.append(Ban(net, "default" if net.version == 4 else "default6", until, origin, reason, jail))
    return out


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds. The CPU seconds of the same call are kept in `last_cpu` (the bench machine may be shared:
    when wall is far above CPU, other processes were running)."""
    global last_cpu
    gc.collect()
    gc.disable()  # as the store does in its bulk paths; a million live Ban objects make every collection slow
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        last_cpu = time.process_time() - c0
        return time.perf_counter() - t0
    finally:
        gc.enable()


last_cpu = 0.0


def fresh(tmp: Path, name: str, **kw: object) -> Store:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp / name}{suffix}").unlink(missing_ok=True)
    return Store.open(tmp / name, **kw)  # type: ignore[arg-type]


def bench_bulk(tmp: Path, bans: list[Ban]) -> None:
    n = len(bans)
    tag = f"{n // 1000}k" if n < 1_000_000 else f"{n // 1_000_000}m"

    store = fresh(tmp, "one.db")
    t = timed(lambda: store.save_bans(bans, created=NOW))
    record(f"store.save_{tag}_one_call", t, "s",
           note=f"one transaction, sorted multi-row upserts, synchronous=full; CPU {last_cpu:.2f} s")
    store.close()  # checkpoints the WAL into the file
    size = os.path.getsize(tmp / "one.db")
    record("store.bytes_per_ban", size / n, "B",
           note=f"{size / 1e6:.1f} MB for {n} bans (WITHOUT ROWID, packed targets, interned labels)")

    store = fresh(tmp, "chunks.db")
    chunk_times: list[float] = []

    def chunks() -> None:
        for i in range(0, n, 10_000):
            t0 = time.perf_counter()
            store.save_bans(bans[i:i + 10_000], created=NOW)
            chunk_times.append(time.perf_counter() - t0)
    t = timed(chunks)
    record(f"store.save_{tag}_10k_chunks", t, "s", note=f"{n // 10_000} transactions; CPU {last_cpu:.2f} s")
    record("store.save_10k_chunk_median", statistics.median(chunk_times) * 1000, "ms",
           note="per 10k-ban transaction while the table grows to the full size")
    store.close()

    # the restart path: open (with quick_check), then load every active ban
    t_open = timed(lambda: Store.open(tmp / "one.db").close())
    record("store.open_verify", t_open, "s",
           note=f"Store.open with PRAGMA quick_check, {n} bans; CPU {last_cpu:.2f} s")
    t_open = timed(lambda: Store.open(tmp / "one.db", verify=False).close())
    record("store.open_no_verify", t_open, "s")
    store = Store.open(tmp / "one.db")
    active = sum(1 for b in bans if b.until is None or b.until > NOW)
    loads: list[tuple[float, float]] = []
    got: list[int] = []
    for _ in range(3):
        loads.append((timed(lambda: got.append(len(store.load_active_rows(NOW)))), last_cpu))
    assert got == [active] * 3, (got, active)
    wall, cpu = min(loads)
    record(f"store.load_rows_{tag}", wall, "s", target="<= 1.5 s for 1M",
           note=f"load_active_rows: {active} tuples (blocklist, packed target, until, origin, reason, jail);"
                f" CPU {cpu:.2f} s")
    record(f"store.load_rows_{tag}_cpu", cpu, "s", target="<= 1.5 s for 1M", note="CPU time of the same call")
    compact: list[tuple[float, float]] = []
    for _ in range(3):
        compact.append((timed(lambda: got.append(len(store.load_active_compact(NOW).rows))), last_cpu))
    wall, cpu = min(compact)
    record(f"store.load_compact_{tag}", wall, "s", target="<= 1.5 s for 1M",
           note=f"load_active_compact: (label id, packed target, until) + labels; CPU {cpu:.2f} s")
    store.close()

    def restart() -> None:  # what the daemon does before READY (minus the kernel): open unchecked, load
        with Store.open(tmp / "one.db", verify=False) as s:
            got.append(len(s.load_active_compact(NOW).rows))
    wall = timed(restart)
    record(f"store.restart_open_and_load_{tag}", wall, "s", target="<= 1.5 s for 1M",
           note=f"Store.open(verify=False) + load_active_compact; CPU {last_cpu:.2f} s")
    store = Store.open(tmp / "one.db", verify=False)
    t = timed(lambda: store.verify())
    record("store.verify_after_ready", t, "s", note=f"quick_check after READY; CPU {last_cpu:.2f} s")
    t = timed(lambda: load_active_bans(store, NOW))
    record(f"store.load_bans_{tag}", t, "s",
           note=f"load_active_bans: the same as Ban objects (ipaddress); CPU {last_cpu:.2f} s")

    # deletes and a prune that empties most of the table, then the size it gives back
    t = timed(lambda: delete_bans(store, [(b.blocklist, b.target) for b in bans[:100_000]]))
    record("store.delete_100k", t, "s")
    before = store.file_size()
    t0 = time.perf_counter()
    stats = store.prune(NOW + 86400 * 8, 86400.0)
    record("store.prune_all_expired", time.perf_counter() - t0, "s",
           note=f"deleted {stats.bans} expired bans, gave back {stats.freed_pages} pages")
    record("store.size_after_prune_ratio", store.file_size() / before, "ratio",
           note=f"{before / 1e6:.1f} MB -> {store.file_size() / 1e6:.1f} MB (permanent bans stay)")
    store.close()


def bench_100k_call(tmp: Path, bans: list[Ban]) -> None:
    store = fresh(tmp, "100k.db")
    store.save_bans(bans[100_000:200_000], created=NOW)  # a table that is not empty
    t = timed(lambda: store.save_bans(bans[:100_000], created=NOW))
    record("store.save_100k_one_call", t, "s", note=f"into a table of 100k; CPU {last_cpu:.2f} s")
    store.close()


def bench_durability(tmp: Path, bans: list[Ban]) -> None:
    """Commit latency of small and batch-sized transactions, synchronous=full vs normal (WAL both)."""
    for sync in ("normal", "full"):
        store = fresh(tmp, f"sync-{sync}.db", synchronous=sync)
        for size, reps in ((10, 300), (1000, 50)):
            times = []
            for i in range(reps):
                part = bans[(i * size) % 200_000:(i * size) % 200_000 + size]
                t0 = time.perf_counter()
                store.save_bans(part, created=NOW)
                times.append(time.perf_counter() - t0)
            record(f"store.commit_{size}_{sync}_median", statistics.median(times) * 1000, "ms",
                   note=f"save_bans of {size}, synchronous={sync}")
        store.close()


def bench_representation(tmp: Path, bans: list[Ban]) -> None:
    """Why targets are stored packed: cost per ban to key it (save) and rebuild it (load), text vs packed."""
    sample = [b.target for b in bans[:100_000]]
    n = len(sample)
    t_text = timed(lambda: [format_target(t) for t in sample]) / n * 1e9
    t_pack = timed(lambda: [pack_target(t) for t in sample]) / n * 1e9
    record("store.key_text_ns", t_text, "ns", note="format_target per ban (save path, text keys)")
    record("store.key_packed_ns", t_pack, "ns", reference="text", reference_value=t_text,
           note="pack_target per ban (save path, what we store)")
    texts = [format_target(t) for t in sample]
    packed = [pack_target(t) for t in sample]
    t_text = timed(lambda: [parse_target(t) for t in texts]) / n * 1e9
    t_pack = timed(lambda: [unpack_target(k) for k in packed]) / n * 1e9
    record("store.rebuild_text_ns", t_text, "ns", note="parse_target per row (load path to IPNet, text keys)")
    record("store.rebuild_packed_ns", t_pack, "ns", reference="text", reference_value=t_text,
           note="unpack_target per row (load path to IPNet, packed keys)")
    # fetching the column itself: text vs blob, same table otherwise
    for kind, values in (("text", texts), ("blob", packed)):
        conn = sqlite3.connect(tmp / f"repr-{kind}.db")
        conn.execute(f"CREATE TABLE t(b TEXT, k {kind.upper()}, u REAL, PRIMARY KEY(b, k)) WITHOUT ROWID")
        conn.executemany("INSERT OR IGNORE INTO t VALUES('default', ?, 1.0)", ((v,) for v in values))
        conn.commit()
        t = timed(lambda: conn.execute("SELECT k, u FROM t").fetchall()) / n * 1e9  # noqa: B023
        record(f"store.fetch_{kind}_ns", t, "ns", note="per row, SELECT key, until")
        conn.close()


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    t0 = time.perf_counter()
    bans = make_bans(max(n, 200_000))
    print(f"built {len(bans)} Ban objects in {time.perf_counter() - t0:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="nftblock-bench-store-") as d:
        tmp = Path(d)
        bench_representation(tmp, bans)
        bench_durability(tmp, bans)
        bench_100k_call(tmp, bans)
        bench_bulk(tmp, bans[:n])


if __name__ == "__main__":
    main()
