"""pyroute2's nf_tables message classes against nftblockd's own codec (nftblockd/kernel/nfmsg.py).

The measurement behind docs/netlink.md's "Why the netlink code is the project's own": it decided that pyroute2
is not a dependency. Not part of `make bench` (pyroute2 is not installed by the project any more); to rerun:

    .venv/bin/pip install pyroute2 && .venv/bin/python bench/netlink_pyroute2.py

Measured, each side on the same input, alternately, median of ROUNDS:
- encoding a 10,000-element NEWSETELEM batch (IPv4 keys, one timeout) with nfmsg's bulk path and with its
  per-element path (what a batch of mixed operations takes) against pyroute2's `nft_set_elem_list_msg`
  built from attribute lists and `.encode()`d, in messages of the same size as ours; the two results are
  decoded by nfmsg and compared, so both sides do the same work;
- decoding a set dump of 10,000 elements (key, TIMEOUT and EXPIRATION per element, the shape of the kernel's
  NEWSETELEM dump parts): pyroute2's class `.decode()`d per message (its socket's marshal would only add to
  this) against nfmsg.iter_messages + parse_elements; both must give the same (key, expiration) list;
- import time and resident memory of pyroute2 (its nftables module) in a fresh interpreter against nfmsg's.
"""

from __future__ import annotations

import importlib
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import alternating, record
from nftblockd.kernel import nfmsg

ROOT = Path(__file__).resolve().parents[1]

ROUNDS = int(os.environ.get("NFTBLOCK_BENCH_ROUNDS", "5"))
N = 10_000
TABLE, SET = "nftblockd", "blocklist_v4"
TIMEOUT_MS = 3_600_000
KEYS = [0x0A000000 + 7 * i for i in range(N)]  # 10.0.0.0 onwards, distinct
PYROUTE2_NFT = "pyroute2.netlink.nfnetlink.nftsocket"


def alternate(ours: Callable[[], object], theirs: Callable[[], object]) -> tuple[float, float]:
    """(ours, theirs) in milliseconds, each the median of ROUNDS runs taken in turn."""
    a, b = alternating(ours, theirs, ROUNDS)
    return a * 1e3, b * 1e3


def elements(messages: list[bytes]) -> list[tuple[bytes, int | None, int | None]]:
    """(key, timeout, expiration) of every element in encoded messages, read by nfmsg."""
    return [(e.key, e.timeout_ms, e.expiration_ms) for m in messages for r in nfmsg.iter_messages(m)
            for e in nfmsg.parse_elements(r.payload)]


def ours_encode() -> list[bytes]:
    return nfmsg.uniform_hash_messages(nfmsg.NFT_MSG_NEWSETELEM, nfmsg.NFPROTO_INET, TABLE, SET, KEYS, 4,
                                       TIMEOUT_MS, False, 1, nfmsg.NLM_F_REQUEST | nfmsg.NLM_F_CREATE)


def ours_encode_general() -> list[bytes]:
    """The general path (any element: comments, ranges, own timeouts): one Element encoded at a time."""
    encoded = [nfmsg.encode_element(nfmsg.Element(k.to_bytes(4, "big"), TIMEOUT_MS)) for k in KEYS]
    return [m.data for m in nfmsg.split_set_messages(nfmsg.NFT_MSG_NEWSETELEM, nfmsg.NFPROTO_INET, TABLE, SET,
                                                     encoded, 1, nfmsg.NLM_F_REQUEST | nfmsg.NLM_F_CREATE)]


def pyroute2_encode(nft: Any, per_msg: int) -> list[bytes]:
    out = []
    msg_type = (nfmsg.NFNL_SUBSYS_NFTABLES << 8) | nfmsg.NFT_MSG_NEWSETELEM
    for seq, i in enumerate(range(0, N, per_msg), start=1):
        msg = nft.nft_set_elem_list_msg()
        msg["header"]["type"] = msg_type
        msg["header"]["flags"] = nfmsg.NLM_F_REQUEST | nfmsg.NLM_F_CREATE
        msg["header"]["sequence_number"] = seq
        msg["nfgen_family"] = nfmsg.NFPROTO_INET
        msg["attrs"] = [
            ("NFTA_SET_ELEM_LIST_TABLE", TABLE),
            ("NFTA_SET_ELEM_LIST_SET", SET),
            ("NFTA_SET_ELEM_LIST_ELEMENTS", [
                {"attrs": [("NFTA_SET_ELEM_KEY", {"attrs": [("NFTA_DATA_VALUE", k.to_bytes(4, "big"))]}),
                           ("NFTA_SET_ELEM_TIMEOUT", TIMEOUT_MS)]}
                for k in KEYS[i: i + per_msg]]),
        ]
        msg.encode()
        out.append(bytes(msg.data))
    return out


def dump_parts() -> list[bytes]:
    """A 10,000-element set dump as the kernel sends it: NEWSETELEM parts (NLM_F_MULTI), each element with
    its key, TIMEOUT and EXPIRATION (remaining times all different, as in a real blocklist)."""
    remaining = [86_400_000 - 997 * i for i in range(N)]
    return nfmsg.timed_hash_messages(nfmsg.NFT_MSG_NEWSETELEM, nfmsg.NFPROTO_INET, TABLE, SET, KEYS, 4,
                                     remaining, 1, nfmsg.NLM_F_MULTI)


def ours_decode(parts: list[bytes]) -> list[tuple[bytes, int | None]]:
    return [(e.key, e.expiration_ms) for part in parts for r in nfmsg.iter_messages(part)
            for e in nfmsg.parse_elements(r.payload)]


def pyroute2_decode(nft: Any, parts: list[bytes]) -> list[tuple[bytes, int | None]]:
    out = []
    for part in parts:
        msg = nft.nft_set_elem_list_msg(part)
        msg.decode()
        for elem in msg.get_attr("NFTA_SET_ELEM_LIST_ELEMENTS"):
            key = elem.get_attr("NFTA_SET_ELEM_KEY").get_attr("NFTA_DATA_VALUE")
            out.append((bytes(key), elem.get_attr("NFTA_SET_ELEM_EXPIRATION")))
    return out


PROBE = """
import sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
before, n = rss(), len(sys.modules)
t = time.perf_counter()
import {module}
print(time.perf_counter() - t, rss() - before, len(sys.modules) - n)
"""


def import_cost(module: str) -> tuple[float, float, int]:
    """(ms, KiB of RSS, modules) that importing `module` adds to a fresh interpreter: medians of ROUNDS."""
    runs = []
    for _ in range(ROUNDS):
        out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True,
                             check=True, cwd=ROOT).stdout.split()
        runs.append((float(out[0]) * 1e3, float(out[1]), int(out[2])))
    return (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
            int(statistics.median(r[2] for r in runs)))


def main() -> int:
    try:
        nft = importlib.import_module(PYROUTE2_NFT)
        version = importlib.import_module("pyroute2").__version__
    except ImportError:
        print("pyroute2 is not installed: `.venv/bin/pip install pyroute2`, then run this again")
        return 0
    print(f"pyroute2 {version}, Python {sys.version.split()[0]}, {N} IPv4 elements, median of {ROUNDS}")

    mine = ours_encode()
    per_msg = len(elements(mine[:1]))
    theirs = pyroute2_encode(nft, per_msg)
    assert elements(theirs) == elements(mine), "the two encoders disagree"
    ours_ms, theirs_ms = alternate(ours_encode, lambda: pyroute2_encode(nft, per_msg))
    record("pyroute2: encode a 10k-element NEWSETELEM batch, nfmsg bulk path", ours_ms, "ms",
           reference="pyroute2 nft_set_elem_list_msg", reference_value=theirs_ms)
    assert elements(ours_encode_general()) == elements(mine)
    ours_ms, theirs_ms = alternate(ours_encode_general, lambda: pyroute2_encode(nft, per_msg))
    record("pyroute2: encode a 10k-element NEWSETELEM batch, nfmsg per-element path", ours_ms, "ms",
           reference="pyroute2 nft_set_elem_list_msg", reference_value=theirs_ms)

    parts = dump_parts()
    assert pyroute2_decode(nft, parts) == ours_decode(parts), "the two decoders disagree"
    ours_ms, theirs_ms = alternate(lambda: ours_decode(parts), lambda: pyroute2_decode(nft, parts))
    record("pyroute2: decode a 10k-element set dump, nfmsg", ours_ms, "ms",
           reference="pyroute2 nft_set_elem_list_msg", reference_value=theirs_ms)

    for label, module in (("pyroute2 (nftables module)", PYROUTE2_NFT), ("pyroute2 (package)", "pyroute2"),
                          ("nfmsg", "nftblockd.kernel.nfmsg")):
        ms, kib, mods = import_cost(module)
        record(f"pyroute2: import time, {label}", ms, "ms")
        record(f"pyroute2: import RSS, {label}", kib / 1024, "MiB", note=f"{mods} modules")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
