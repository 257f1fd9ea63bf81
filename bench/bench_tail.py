"""Log source benchmarks: lines per second the file tailer and the journal source deliver to the queue.

tail: a FileTail follows an empty file; 1,000,000 sshd-style lines (~90 bytes each) are appended in bulk
(one write per MiB) and the clock runs from the first write until the consumer has taken the last line out
of the bounded queue (64 batches). Reference: the plainest Python reader of the same
file, `for raw in open(path, "rb"): raw.decode()`, which has no inotify, no queue and no position keeping.
linesplit: the pure splitter alone on 256 KiB chunks of the same bytes.
journal (root only): a real journald (tests/helpers/journald.py) holds 100,000 matching entries among
100,000 others; the JournalSource reads them from the start. Reference: `journalctl -D … -o cat` with the
same match, i.e. sd-journal in C writing to /dev/null.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import record
from nftblockd.sources.base import LineBatch, MemoryPositionStore
from nftblockd.sources.journal import JournalSource
from nftblockd.sources.linesplit import LineSplitter
from nftblockd.sources.tail import FileTail

ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_ROUNDS", "3"))
LINES = 1_000_000
JOURNAL_ENTRIES = 100_000


def make_log(n: int) -> bytes:
    out = []
    for i in range(n):
        ip = f"198.51.{(i >> 8) & 255}.{i & 255}"
        out.append(f"Dec  2 10:{(i // 60) % 60:02d}:{i % 60:02d} host sshd[{1000 + i % 5000}]: "
                   f"Failed password for invalid user admin from {ip} port {1024 + i % 60000} ssh2\n")
    return "".join(out).encode()


async def _consume(q: asyncio.Queue[LineBatch], want: int, done: asyncio.Future[float]) -> None:
    n = 0
    while n < want:
        n += len((await q.get()).texts)  # the daemon's matcher takes the batch's list of texts
    done.set_result(time.perf_counter())


async def tail_once(data: bytes, workdir: Path) -> float:
    path = workdir / "auth.log"
    path.write_bytes(b"")
    src = FileTail("bench", [str(path)], MemoryPositionStore())
    q: asyncio.Queue[LineBatch] = asyncio.Queue(maxsize=64)
    done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(src.run(q))
    consumer = asyncio.create_task(_consume(q, LINES, done))
    await src.ready.wait()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    t0 = time.perf_counter()
    mib = 1 << 20
    for off in range(0, len(data), mib):
        os.write(fd, data[off:off + mib])
        await asyncio.sleep(0)  # the writer is another process in real life: let the loop run
    os.close(fd)
    t1 = await done
    task.cancel()
    await asyncio.gather(task, consumer, return_exceptions=True)
    assert src.stats.lines == LINES, src.stats
    return t1 - t0


def plain_read(path: Path) -> float:
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb") as f:
        for raw in f:
            raw.decode()
            n += 1
    assert n == LINES
    return time.perf_counter() - t0


def split_only(data: bytes) -> float:
    sp = LineSplitter()
    chunk = 256 * 1024
    t0 = time.perf_counter()
    n = 0
    for off in range(0, len(data), chunk):
        n += len(sp.feed(data[off:off + chunk]).text)
    assert n == LINES
    return time.perf_counter() - t0


def bench_tail() -> None:
    data = make_log(LINES)
    with tempfile.TemporaryDirectory() as tmp:
        ours = statistics.median(asyncio.run(tail_once(data, Path(tmp))) for _ in range(ROUNDS))
        ref = statistics.median(plain_read(Path(tmp) / "auth.log") for _ in range(ROUNDS))
    record("tail: 1M appended lines delivered to the queue", LINES / ours, "lines/s",
           reference="python for-line-in-file + decode", reference_value=LINES / ref,
           note=f"{len(data) / LINES:.0f} B/line, queue of 64 batches, bulk append of {len(data) >> 20} MiB")
    split = statistics.median(split_only(data) for _ in range(ROUNDS))
    record("linesplit: LineSplitter.feed, 256 KiB chunks", LINES / split, "lines/s")


async def journal_once(jd_dir: Path, cursor: str) -> float:
    store = MemoryPositionStore({"journal:bench": cursor})
    src = JournalSource("bench", [("SYSLOG_IDENTIFIER", "sshd")], store, path=str(jd_dir))
    q: asyncio.Queue[LineBatch] = asyncio.Queue(maxsize=64)
    done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    t0 = time.perf_counter()
    task = asyncio.create_task(src.run(q))
    consumer = asyncio.create_task(_consume(q, JOURNAL_ENTRIES, done))
    t1 = await done
    task.cancel()
    await asyncio.gather(task, consumer, return_exceptions=True)
    return t1 - t0


async def fill_journal(jd_root: Path) -> tuple[object, str]:
    from systemd import journal

    from tests.helpers.journald import Journald

    jd = await Journald(jd_root, {"RuntimeMaxFileSize": "512M", "RuntimeMaxUse": "2G"}).start()
    jd.send("start", SYSLOG_IDENTIFIER="bench-start")
    for i in range(JOURNAL_ENTRIES):
        jd.send(f"Failed password for invalid user admin from 198.51.{(i >> 8) & 255}.{i & 255} port 22",
                SYSLOG_IDENTIFIER="sshd")
        jd.send(f"session opened for user {i}", SYSLOG_IDENTIFIER="cron")
        if i % 2000 == 0:
            await jd.sync()  # journald's socket buffer is finite: datagrams beyond it would be refused
    await jd.sync()
    r = journal.Reader(path=str(jd.journal_dir))
    r.add_match("SYSLOG_IDENTIFIER=bench-start")
    r.seek_head()
    assert r._next()
    cursor = r._get_cursor()
    r.close()
    return jd, cursor


def bench_journal() -> None:
    if os.geteuid() != 0:
        print("journal: skipped (needs root for journald in a mount namespace)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        jd, cursor = asyncio.run(fill_journal(Path(tmp) / "jd"))
        try:
            jdir = jd.journal_dir  # type: ignore[attr-defined]
            ours = statistics.median(asyncio.run(journal_once(jdir, cursor)) for _ in range(ROUNDS))
            refs = []
            for _ in range(ROUNDS):
                t0 = time.perf_counter()
                subprocess.run(["journalctl", "-D", str(jdir), "-o", "cat", "SYSLOG_IDENTIFIER=sshd"],
                               stdout=subprocess.DEVNULL, check=True)
                refs.append(time.perf_counter() - t0)
        finally:
            jd.stop()  # type: ignore[attr-defined]
    record("journal: 100k matching entries (of 200k) delivered", JOURNAL_ENTRIES / ours, "lines/s",
           reference="journalctl -o cat, same match",
           reference_value=JOURNAL_ENTRIES / statistics.median(refs))


if __name__ == "__main__":
    bench_tail()
    bench_journal()
