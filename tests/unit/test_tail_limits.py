"""The tail's partial-line buffer under a writer that never ends its line (issue 33): memory stays within
max_line per file, the over-long line is counted and skipped, and the offset stays right (the next line is
read whole). Real files, real inotify."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from nftblockd.sources.linesplit import DEFAULT_MAX_LINE
from tests.helpers.sources import running, wait_for_condition
from tests.unit.test_tail import append, tail

MIB = 1 << 20


async def test_partial_lines_without_a_newline_hold_at_most_max_line_per_file(tmp_path: Path) -> None:
    logs = [tmp_path / f"l{i}.log" for i in range(4)]
    for log in logs:
        log.touch()
    tracemalloc.start()
    try:
        async with running(tail(logs)) as c:
            for log in logs:
                for _ in range(8):
                    append(log, raw=b"x" * MIB)
            await wait_for_condition(lambda: c.source.stats.bytes_read >= 4 * 8 * MIB, timeout=60,
                                     what="32 MiB read")
            held = tracemalloc.get_traced_memory()[0]
            for log in logs:
                append(log, "end of the long line", "next")
            assert await c.wait_lines(4) == ["next"] * 4
    finally:
        tracemalloc.stop()
    assert held < 4 * (DEFAULT_MAX_LINE + 512 * 1024) + 4 * MIB  # a chunk and a held line per file, not 32 MiB
    assert c.source.stats.overlong == 4
