"""nf_tables netlink wire format: constants, attribute encoding, element templates and reply parsing.

Pure: bytes in, bytes out. This module never opens a socket (that is `netlink.py`). Element batches are encoded
by hand with precomputed templates because per-element cost is where Python spends its time (see
docs/netlink.md §1, §9: a template encoder is ~50x faster than generic attribute encoders).
Host-order fields (nlmsghdr, nlattr headers) use native byte order; keys, timeouts and flags are big-endian.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from nftblockd import optional_c

# --- netlink / nfnetlink -------------------------------------------------------------------------------
NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33

NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_APPEND = 0x800
NLM_F_ACK_TLVS = 0x200  # on NLMSG_ERROR replies

NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSGERR_ATTR_MSG = 1
NLMSGERR_ATTR_OFFS = 2

NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF

NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN = 0x10
NFNL_MSG_BATCH_END = 0x11
NFNL_BATCH_GENID = 1

NFPROTO_INET = 1
NFPROTO_IPV4 = 2
NFPROTO_IPV6 = 10

# nf_tables message types (include/uapi/linux/netfilter/nf_tables.h; DESTROY* are >= 6.3 and missing from
# Debian 12's headers, hence spelled out here)
NFT_MSG_NEWTABLE = 0
NFT_MSG_GETTABLE = 1
NFT_MSG_DELTABLE = 2
NFT_MSG_NEWCHAIN = 3
NFT_MSG_GETCHAIN = 4
NFT_MSG_DELCHAIN = 5
NFT_MSG_NEWRULE = 6
NFT_MSG_GETRULE = 7
NFT_MSG_DELRULE = 8
NFT_MSG_NEWSET = 9
NFT_MSG_GETSET = 10
NFT_MSG_DELSET = 11
NFT_MSG_NEWSETELEM = 12
NFT_MSG_GETSETELEM = 13
NFT_MSG_DELSETELEM = 14
NFT_MSG_NEWGEN = 15
NFT_MSG_GETGEN = 16
NFT_MSG_DESTROYSETELEM = 30

# attributes
NFTA_TABLE_NAME = 1
NFTA_TABLE_FLAGS = 2
NFTA_TABLE_USERDATA = 6
NFT_TABLE_F_OWNER = 0x2
NFT_TABLE_F_PERSIST = 0x4

NFTA_CHAIN_TABLE = 1
NFTA_CHAIN_NAME = 3
NFTA_CHAIN_HOOK = 4
NFTA_CHAIN_POLICY = 5
NFTA_CHAIN_TYPE = 7
NFTA_HOOK_HOOKNUM = 1
NFTA_HOOK_PRIORITY = 2
NFTA_HOOK_DEV = 3
NFTA_HOOK_DEVS = 4
NF_INET_PRE_ROUTING = 0
NF_INET_LOCAL_IN = 1
NF_INET_FORWARD = 2
NF_INET_INGRESS = 5
HOOKS = {"prerouting": NF_INET_PRE_ROUTING, "input": NF_INET_LOCAL_IN, "forward": NF_INET_FORWARD,
         "ingress": NF_INET_INGRESS}

NFTA_SET_TABLE = 1
NFTA_SET_NAME = 2
NFTA_SET_FLAGS = 3
NFTA_SET_KEY_TYPE = 4
NFTA_SET_KEY_LEN = 5
NFTA_SET_POLICY = 8
NFTA_SET_DESC = 9
NFTA_SET_ID = 10
NFTA_SET_TIMEOUT = 11
NFTA_SET_GC_INTERVAL = 12
NFTA_SET_USERDATA = 13
NFTA_SET_COUNT = 20  # element count, returned by recent kernels (not in Debian 12's headers)
NFTA_SET_DESC_SIZE = 1
NFT_SET_INTERVAL = 0x4
NFT_SET_TIMEOUT = 0x10
NFT_SET_POL_PERFORMANCE = 0
TYPE_IPADDR = 7
TYPE_IP6ADDR = 8
# nftables stores the key's byte order in set userdata so that `nft list` prints addresses correctly
NFTNL_UDATA_SET_KEYBYTEORDER = 0
NFT_BYTEORDER_BIG_ENDIAN = 2

NFTA_SET_ELEM_LIST_TABLE = 1
NFTA_SET_ELEM_LIST_SET = 2
NFTA_SET_ELEM_LIST_ELEMENTS = 3
NFTA_LIST_ELEM = 1
NFTA_SET_ELEM_KEY = 1
NFTA_SET_ELEM_FLAGS = 3
NFTA_SET_ELEM_TIMEOUT = 4
NFTA_SET_ELEM_EXPIRATION = 5
NFTA_SET_ELEM_USERDATA = 6
NFT_SET_ELEM_INTERVAL_END = 0x1
NFTA_DATA_VALUE = 1
NFTA_DATA_VERDICT = 2
NFTA_VERDICT_CODE = 1
NFTNL_UDATA_SET_ELEM_COMMENT = 0
NFT_USERDATA_MAXLEN = 256

NFTA_GEN_ID = 1

NFTA_RULE_TABLE = 1
NFTA_RULE_CHAIN = 2
NFTA_RULE_EXPRESSIONS = 4
NFTA_RULE_USERDATA = 7
NFTNL_UDATA_RULE_COMMENT = 0
NFTA_EXPR_NAME = 1
NFTA_EXPR_DATA = 2
NFTA_LOOKUP_FLAGS = 5
NFT_LOOKUP_F_INV = 1
NFT_REG_VERDICT = 0
NFT_REG_1 = 1
NF_DROP = 0
NF_ACCEPT = 1
NFT_RETURN = -5
NFT_META_IIFNAME = 6

MAX_NEST = 0xFFFF  # an attribute's length field is 16 bits: a message's ELEMENTS nest must stay below it

_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG = struct.Struct("=BBH")  # family, version, res_id (big-endian value written by hand)
_NLA = struct.Struct("=HH")
# the C loops of range and timed elements (kernel/_nlenc.c; None: not built, or NFTBLOCK_NATIVE=0)
_NLENC = optional_c.load("nftblockd.kernel._nlenc")
NATIVE = _NLENC is not None  # as feeds/delta.NATIVE and fleet/rawread.NATIVE: the package build checks it
_BE32 = struct.Struct(">I")
_BE64 = struct.Struct(">Q")


# --- attribute encoding --------------------------------------------------------------------------------

def _pad(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return _NLA.pack(length, kind) + payload + b"\0" * (_pad(length) - length)


def nest(kind: int, *children: bytes) -> bytes:
    return attr(kind | NLA_F_NESTED, b"".join(children))


def strz(kind: int, text: str) -> bytes:
    return attr(kind, text.encode() + b"\0")


def be32(kind: int, value: int) -> bytes:
    return attr(kind, _BE32.pack(value))


def be64(kind: int, value: int) -> bytes:
    return attr(kind, _BE64.pack(value))


def comment_udata(kind: int, text: str) -> bytes:
    """A libnftnl userdata TLV holding a comment: {u8 type, u8 len, text + NUL}."""
    raw = text.encode()[: NFT_USERDATA_MAXLEN - 3] + b"\0"
    return bytes((kind, len(raw))) + raw


def message(msg_type: int, flags: int, seq: int, family: int, body: bytes, res_id: int = 0) -> bytes:
    """One nfnetlink message; `msg_type` is the nf_tables type (the subsystem is added here)."""
    full_type = (NFNL_SUBSYS_NFTABLES << 8) | msg_type
    head = _NFGENMSG.pack(family, 0, 0) if res_id == 0 else struct.pack("=BB", family, 0) + struct.pack(
        ">H", res_id)
    length = 16 + len(head) + len(body)
    return _NLMSGHDR.pack(length, full_type, flags, seq, 0) + head + body


def batch_marker(begin: bool, seq: int, genid: int | None = None) -> bytes:
    body = be32(NFNL_BATCH_GENID, genid) if (begin and genid is not None) else b""
    head = struct.pack("=BB", 0, 0) + struct.pack(">H", NFNL_SUBSYS_NFTABLES)
    msg_type = NFNL_MSG_BATCH_BEGIN if begin else NFNL_MSG_BATCH_END
    length = 16 + len(head) + len(body)
    return _NLMSGHDR.pack(length, msg_type, NLM_F_REQUEST, seq, 0) + head + body


# --- set element encoding -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Element:
    """One element operation in wire terms. `key` is the network-order address; `end` (interval sets only)
    is the first address after the range, or None when the range reaches the top of the address space."""

    key: bytes
    timeout_ms: int | None = None  # None: no TIMEOUT attribute (only for deletes and permanent bans)
    refresh: bool = False  # also send EXPIRATION=timeout so that a re-add restarts the countdown (>= 6.12)
    comment: str = ""
    end: bytes | None = None
    interval: bool = False


def encode_element(e: Element) -> bytes:
    """The element nest(s): one for a hash set, start + end for an interval set."""
    inner = nest(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, e.key))
    if e.timeout_ms is not None:
        inner += _timeout_attrs(e.timeout_ms, e.refresh)
    if e.comment:
        inner += attr(NFTA_SET_ELEM_USERDATA, comment_udata(NFTNL_UDATA_SET_ELEM_COMMENT, e.comment))
    out = nest(NFTA_LIST_ELEM, inner)
    if e.interval and e.end is not None:
        out += nest(NFTA_LIST_ELEM, nest(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, e.end)),
                    be32(NFTA_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END))
    return out


_BE_TIMEOUT_HDR = _NLA.pack(12, NFTA_SET_ELEM_TIMEOUT)
_BE_EXPIRATION_HDR = _NLA.pack(12, NFTA_SET_ELEM_EXPIRATION)


def _timeout_attrs(remaining_ms: int, refresh: bool) -> bytes:
    """TIMEOUT rounded up to whole seconds (so `nft list` shows `timeout 1h`, not 59m59s980ms) and, when
    that differs from the exact remaining time or a re-add must restart the countdown, EXPIRATION = the
    remaining time. EXPIRATION <= TIMEOUT always holds (the kernel answers ERANGE otherwise)."""
    timeout = -(-remaining_ms // 1000) * 1000
    out = _BE_TIMEOUT_HDR + _BE64.pack(timeout)
    if refresh or timeout != remaining_ms:
        out += _BE_EXPIRATION_HDR + _BE64.pack(remaining_ms)
    return out


_INTERVAL_END_FLAGS = be32(NFTA_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END)


def element_tail(timeout_ms: int | None, refresh: bool, comment: str = "") -> bytes:
    """The attributes after an element's key: timeout (+ expiration) and comment."""
    tail = b"" if timeout_ms is None else _timeout_attrs(timeout_ms, refresh)
    if comment:
        tail += attr(NFTA_SET_ELEM_USERDATA, comment_udata(NFTNL_UDATA_SET_ELEM_COMMENT, comment))
    return tail


def encode_range(start: bytes, end: bytes | None, tail: bytes) -> bytes:
    """An interval-set range from raw keys: start element (+ tail) and INTERVAL_END element at `end` (the
    first address after the range; None when the range reaches the top of the address space)."""
    klen = len(start)
    key = _NLA.pack(8 + klen, NFTA_SET_ELEM_KEY | NLA_F_NESTED) + _NLA.pack(4 + klen, NFTA_DATA_VALUE)
    out = _NLA.pack(4 + len(key) + klen + len(tail), NFTA_LIST_ELEM | NLA_F_NESTED) + key + start + tail
    if end is not None:
        out += _NLA.pack(4 + len(key) + klen + 8, NFTA_LIST_ELEM | NLA_F_NESTED) + key + end + _INTERVAL_END_FLAGS
    return out


def uniform_range_messages(msg_type: int, family: int, table: str, set_name: str, keys: Sequence[int],
                           key_len: int, tail: bytes, seq_start: int, flags: int) -> list[bytes]:
    """Messages for many interval-set ranges that share one tail (`element_tail`): a feed refresh's deletions
    or additions. `keys` are net keys (address << 8 | prefix length, as `addr.net_key`).

    Exactly the bytes of `encode_range` per range packed by `split_set_messages`, without its per-element
    bookkeeping: each range (start element + INTERVAL_END element) is one struct pack, and since every range
    has the same length (only one reaching the top of the address space has no end element: then the general
    packer runs), message boundaries are arithmetic. Measured on the 1 % refresh of bench_feeds_kernel.py (678
    additions and 543 deletions in two sets; two runs of 41 interleaved rounds on the shared VM, medians):
    0.34-0.60 ms against 1.3-2.2 ms for `encode_range` per range + `split_set_messages`; the writer's general
    path around them took 1.7-3.1 ms in all, this path 0.55 ms.

    The elements of each message come from the optional C loop (kernel/_nlenc.c) when it is built: ~1,200
    ranges of that refresh, 0.47 ms here in Python (330 ns an IPv4 range, 520 ns an IPv6 one), ~0.03 ms
    there. It answers None for whatever this loop treats otherwise (the top of the space, a bad key), and
    this loop, the reference, runs (tests/unit/test_nlenc.py).
    """
    if _NLENC is not None and type(keys) is list:
        out = _uniform_ranges(msg_type, family, table, set_name, keys, key_len, tail, seq_start, flags,
                              _NLENC.range_elements)
        if out is not None:
            return out
    return uniform_range_messages_py(msg_type, family, table, set_name, keys, key_len, tail, seq_start, flags)


def uniform_range_messages_py(msg_type: int, family: int, table: str, set_name: str, keys: Sequence[int],
                              key_len: int, tail: bytes, seq_start: int, flags: int) -> list[bytes]:
    """`uniform_range_messages` in Python alone: the reference the C loop is held to."""
    bits = key_len * 8
    top = 1 << bits
    kfmt = "I" if key_len == 4 else f"{key_len}s"

    def elements(part: Sequence[int], _key_len: int, start_head: bytes, mid: bytes, fl: bytes) -> bytes | None:
        ends = [(k >> 8) + (1 << (bits - (k & 0xFF))) for k in part]
        if ends and max(ends) >= top:
            return None  # a range reaching the top of the space: the general packer, below
        pack = struct.Struct(f">{len(start_head)}s{kfmt}{len(mid)}s{kfmt}{len(fl)}s").pack
        if key_len == 4:
            return b"".join([pack(start_head, k >> 8, mid, e, fl) for k, e in zip(part, ends, strict=True)])
        return b"".join([pack(start_head, (k >> 8).to_bytes(key_len, "big"), mid, e.to_bytes(key_len, "big"), fl)
                         for k, e in zip(part, ends, strict=True)])

    out = _uniform_ranges(msg_type, family, table, set_name, keys, key_len, tail, seq_start, flags, elements)
    if out is not None:
        return out
    ends = [(k >> 8) + (1 << (bits - (k & 0xFF))) for k in keys]
    blobs = [encode_range((k >> 8).to_bytes(key_len, "big"), e.to_bytes(key_len, "big") if e < top else None, tail)
             for k, e in zip(keys, ends, strict=True)]
    return [sm.data for sm in split_set_messages(msg_type, family, table, set_name, blobs, seq_start, flags)]


def _uniform_ranges(msg_type: int, family: int, table: str, set_name: str, keys: Sequence[int], key_len: int,
                    tail: bytes, seq_start: int, flags: int,
                    elements: Callable[[Sequence[int], int, bytes, bytes, bytes], bytes | None]) -> list[bytes] | None:
    """The messages around `elements(part, key_len, start_head, mid, flags)`, which encodes one message's ranges
    (None: it declines, and so does this)."""
    key = _NLA.pack(8 + key_len, NFTA_SET_ELEM_KEY | NLA_F_NESTED) + _NLA.pack(4 + key_len, NFTA_DATA_VALUE)
    start_head = _NLA.pack(4 + len(key) + key_len + len(tail), NFTA_LIST_ELEM | NLA_F_NESTED) + key
    mid = tail + _NLA.pack(4 + len(key) + key_len + 8, NFTA_LIST_ELEM | NLA_F_NESTED) + key
    elem_len = len(start_head) + len(mid) + len(_INTERVAL_END_FLAGS) + 2 * key_len
    per_msg = (MAX_NEST - 4) // elem_len
    head_attrs = strz(NFTA_SET_ELEM_LIST_TABLE, table) + strz(NFTA_SET_ELEM_LIST_SET, set_name)
    out = []
    seq = seq_start
    for i in range(0, len(keys), per_msg):
        elems = elements(keys[i: i + per_msg], key_len, start_head, mid, _INTERVAL_END_FLAGS)
        if elems is None:
            return None
        body = head_attrs + _NLA.pack(4 + len(elems), NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED) + elems
        out.append(message(msg_type, flags, seq, family, body))
        seq += 1
    return out


def encode_hash_elements(keys: Sequence[bytes], timeouts_ms: Sequence[int | None], refresh: bool) -> list[bytes]:
    """Fast path for hash sets without comments: one template per (key length, timeout)."""
    out = []
    cache: dict[tuple[int, int | None], tuple[bytes, bytes]] = {}
    for key, t in zip(keys, timeouts_ms, strict=True):
        tpl = cache.get((len(key), t))
        if tpl is None:
            tail = b"" if t is None else _timeout_attrs(t, refresh)
            key_nest_len = 4 + 4 + len(key)
            total = 4 + key_nest_len + len(tail)
            head = _NLA.pack(total, NFTA_LIST_ELEM | NLA_F_NESTED) + _NLA.pack(
                key_nest_len, NFTA_SET_ELEM_KEY | NLA_F_NESTED) + _NLA.pack(4 + len(key), NFTA_DATA_VALUE)
            tpl = cache[(len(key), t)] = (head, tail)
        out.append(tpl[0] + key + tpl[1])
    return out


def uniform_hash_messages(msg_type: int, family: int, table: str, set_name: str, keys: Sequence[int],
                          key_len: int, timeout_ms: int | None, refresh: bool, seq_start: int,
                          flags: int) -> list[bytes]:
    """Messages for many hash-set elements that share one timeout: the bulk fast path.

    Every element has the same length, so message boundaries are arithmetic and the elements of a message are
    one template (shared head, room for the key, shared tail) repeated, with the keys written into it by
    `_fill_keys`: no Python per element (the per-element concatenation it replaces was ~2 ms per 10,000
    elements of the kernel thread's time, in series with every bulk commit; bench/bench_addr.py).
    """
    tail = b"" if timeout_ms is None else _timeout_attrs(timeout_ms, refresh)
    key_nest_len = 8 + key_len
    elem_len = 4 + key_nest_len + len(tail)
    head = _NLA.pack(elem_len, NFTA_LIST_ELEM | NLA_F_NESTED) + _NLA.pack(
        key_nest_len, NFTA_SET_ELEM_KEY | NLA_F_NESTED) + _NLA.pack(4 + key_len, NFTA_DATA_VALUE)
    per_msg = (MAX_NEST - 4) // elem_len
    head_attrs = strz(NFTA_SET_ELEM_LIST_TABLE, table) + strz(NFTA_SET_ELEM_LIST_SET, set_name)
    out = []
    seq = seq_start
    for i in range(0, len(keys), per_msg):
        part = keys[i: i + per_msg]
        elems = _fill_keys(head, tail, _key_blob(part, key_len), key_len)
        body = head_attrs + _NLA.pack(4 + len(elems), NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED) + elems
        out.append(message(msg_type, flags, seq, family, body))
        seq += 1
    return out


def _key_blob(keys: Sequence[int], key_len: int) -> bytes:
    """The keys packed big-endian, `key_len` bytes each, back to back (IPv4: one array byte swap)."""
    if key_len == 4:
        arr = array.array("I", keys)
        if sys.byteorder == "little":
            arr.byteswap()
        return arr.tobytes()
    return b"".join([k.to_bytes(key_len, "big") for k in keys])


def _fill_keys(head: bytes, tail: bytes, blob: bytes, key_len: int) -> bytes:
    """`head + key + tail` for every key of `blob` (packed, `key_len` bytes each), concatenated: the template
    repeated, then byte j of every key written with one strided slice assignment per j (C-level copies)."""
    n = len(blob) // key_len
    size = len(head) + key_len + len(tail)
    buf = bytearray(head + bytes(key_len) + tail) * n
    for j in range(key_len):
        buf[len(head) + j::size] = blob[j::key_len]
    return bytes(buf)


def timed_hash_messages(msg_type: int, family: int, table: str, set_name: str, keys: Sequence[int],
                        key_len: int, remaining_ms: Sequence[int], seq_start: int, flags: int) -> list[bytes]:
    """`uniform_hash_messages` with a remaining time per element, in the refresh form (TIMEOUT rounded up to
    whole seconds and EXPIRATION, as `_timeout_attrs(t, True)`): saved bans going back after a restart, each
    with its own end. Every element has the same length, so each is one struct pack (the per-end templates of
    `encode_hash_elements` cost a dict entry and an encoding per element when every end differs).

    The elements of each message come from the optional C loop (kernel/_nlenc.c) when it is built (a fleet
    catch-up's 100k bans: 17-26 ms of struct packs, ~2 ms there); it answers None for whatever the Python
    loop, the reference, treats otherwise, and that loop runs (tests/unit/test_nlenc.py)."""
    if _NLENC is not None and type(keys) is list and type(remaining_ms) is list:
        timed = _NLENC.timed_elements
        out = _timed_hash(msg_type, family, table, set_name, keys, key_len, remaining_ms, seq_start, flags,
                          lambda part, head, rem: timed(part, key_len, head, _BE_TIMEOUT_HDR, _BE_EXPIRATION_HDR, rem))
        if out is not None:
            return out
    return timed_hash_messages_py(msg_type, family, table, set_name, keys, key_len, remaining_ms, seq_start, flags)


def timed_hash_messages_py(msg_type: int, family: int, table: str, set_name: str, keys: Sequence[int],
                           key_len: int, remaining_ms: Sequence[int], seq_start: int, flags: int) -> list[bytes]:
    """`timed_hash_messages` in Python alone: the reference the C loop is held to."""
    # head, key, TIMEOUT header, timeout, EXPIRATION header, remaining: one C call per element (an IPv4 key
    # packed as an integer, IPv6 as bytes)
    v4 = key_len == 4
    th, eh = _BE_TIMEOUT_HDR, _BE_EXPIRATION_HDR

    def elements(part: Sequence[int], head: bytes, rem: Sequence[int]) -> bytes:
        pack = struct.Struct(f">{len(head)}s{'I' if v4 else f'{key_len}s'}4sQ4sQ").pack
        return b"".join([pack(head, k, th, -(-t // 1000) * 1000, eh, t)
                         for k, t in zip(part if v4 else [k.to_bytes(key_len, "big") for k in part], rem,
                                         strict=True)])

    out = _timed_hash(msg_type, family, table, set_name, keys, key_len, remaining_ms, seq_start, flags, elements)
    assert out is not None  # `elements` never declines
    return out


def _timed_hash(msg_type: int, family: int, table: str, set_name: str, keys: Sequence[int], key_len: int,
                remaining_ms: Sequence[int], seq_start: int, flags: int,
                elements: Callable[[Sequence[int], bytes, Sequence[int]], bytes | None]) -> list[bytes] | None:
    """The messages around `elements(part, head, remaining part)`, which encodes one message's elements
    (None: it declines, and so does this)."""
    key_nest_len = 8 + key_len
    elem_len = 4 + key_nest_len + 24
    head = _NLA.pack(elem_len, NFTA_LIST_ELEM | NLA_F_NESTED) + _NLA.pack(
        key_nest_len, NFTA_SET_ELEM_KEY | NLA_F_NESTED) + _NLA.pack(4 + key_len, NFTA_DATA_VALUE)
    per_msg = (MAX_NEST - 4) // elem_len
    head_attrs = strz(NFTA_SET_ELEM_LIST_TABLE, table) + strz(NFTA_SET_ELEM_LIST_SET, set_name)
    out = []
    seq = seq_start
    for i in range(0, len(keys), per_msg):
        elems = elements(keys[i: i + per_msg], head, remaining_ms[i: i + per_msg])
        if elems is None:
            return None
        body = head_attrs + _NLA.pack(4 + len(elems), NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED) + elems
        out.append(message(msg_type, flags, seq, family, body))
        seq += 1
    return out


@dataclass(frozen=True, slots=True)
class SetMessage:
    """One element message plus, for each element nest it carries, the index of the op it came from and the
    nest's byte offset inside the message (the kernel's extack error offset points at it)."""

    data: bytes
    op_index: tuple[int, ...]
    offsets: tuple[int, ...]


def split_set_messages(msg_type: int, family: int, table: str, set_name: str, encoded: Sequence[bytes],
                       seq_start: int, flags: int) -> list[SetMessage]:
    """Pack encoded elements into as few messages as fit the 16-bit ELEMENTS nest, all for one batch."""
    head_attrs = strz(NFTA_SET_ELEM_LIST_TABLE, table) + strz(NFTA_SET_ELEM_LIST_SET, set_name)
    base = 16 + 4 + len(head_attrs) + 4  # nlmsghdr + nfgenmsg + names + ELEMENTS nest header
    out: list[SetMessage] = []
    chunk: list[bytes] = []
    idx: list[int] = []
    offs: list[int] = []
    size = 0
    seq = seq_start

    def close() -> None:
        nonlocal size, seq
        elems = b"".join(chunk)
        body = head_attrs + _NLA.pack(4 + len(elems), NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED) + elems
        out.append(SetMessage(message(msg_type, flags, seq, family, body), tuple(idx), tuple(offs)))
        seq += 1
        chunk.clear()
        idx.clear()
        offs.clear()
        size = 0

    for i, blob in enumerate(encoded):
        if chunk and 4 + size + len(blob) > MAX_NEST:
            close()
        offs.append(base + size)
        chunk.append(blob)
        idx.append(i)
        size += len(blob)
    if chunk:
        close()
    return out


# --- reply parsing ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Reply:
    msg_type: int
    flags: int
    seq: int
    payload: bytes  # after nlmsghdr

    @property
    def nft_type(self) -> int:
        return self.msg_type & 0xFF


@dataclass(frozen=True, slots=True)
class ErrorReply:
    seq: int
    errno: int  # positive; 0 = ACK
    offset: int | None  # byte offset of the bad attribute inside the request message
    text: str


def iter_messages(buf: bytes) -> Iterator[Reply]:
    pos = 0
    end = len(buf)
    while pos + 16 <= end:
        length, msg_type, flags, seq, _pid = _NLMSGHDR.unpack_from(buf, pos)
        if length < 16 or pos + length > end:
            break
        yield Reply(msg_type, flags, seq, buf[pos + 16: pos + length])
        pos += _pad(length)


def parse_error(r: Reply) -> ErrorReply:
    """Decode an NLMSG_ERROR payload: int error, the request's nlmsghdr (capped) and extack TLVs."""
    (err,) = struct.unpack_from("=i", r.payload, 0)
    req_len, _t, _f, req_seq, _p = _NLMSGHDR.unpack_from(r.payload, 4)
    tlv_start = 4 + 16
    if not r.flags & 0x100:  # NLM_F_CAPPED not set: the whole request was echoed
        tlv_start = 4 + _pad(req_len)
    offset = None
    text = ""
    if r.flags & NLM_F_ACK_TLVS:
        for kind, value in iter_attrs(r.payload[tlv_start:]):
            if kind == NLMSGERR_ATTR_OFFS and len(value) >= 4:
                (offset,) = struct.unpack_from("=I", value)
            elif kind == NLMSGERR_ATTR_MSG:
                text = value.rstrip(b"\0").decode(errors="replace")
    return ErrorReply(seq=req_seq, errno=-err, offset=offset, text=text)


def iter_attrs(buf: bytes) -> Iterator[tuple[int, bytes]]:
    pos = 0
    end = len(buf)
    while pos + 4 <= end:
        length, kind = _NLA.unpack_from(buf, pos)
        if length < 4 or pos + length > end:
            break
        yield kind & NLA_TYPE_MASK, buf[pos + 4: pos + length]
        pos += _pad(length)


def attrs_dict(buf: bytes) -> dict[int, bytes]:
    return dict(iter_attrs(buf))


def read_strz(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode(errors="replace")


def parse_rule_comment(payload: bytes) -> tuple[str, str | None]:
    """A dumped rule's (chain, comment): the comment is the libnftnl userdata TLV comment_udata writes."""
    a = attrs_dict(payload[4:])
    chain = read_strz(a[NFTA_RULE_CHAIN]) if NFTA_RULE_CHAIN in a else ""
    udata = a.get(NFTA_RULE_USERDATA, b"")
    i = 0
    while i + 2 <= len(udata):
        kind, length = udata[i], udata[i + 1]
        if kind == NFTNL_UDATA_RULE_COMMENT:
            return chain, read_strz(udata[i + 2:i + 2 + length])
        i += 2 + length
    return chain, None


def read_be32(b: bytes) -> int:
    return int(_BE32.unpack_from(b)[0])


def read_be64(b: bytes) -> int:
    return int(_BE64.unpack_from(b)[0])


@dataclass(frozen=True, slots=True)
class ChainHook:
    """Where a base chain is attached: hook number, priority, device (None: not a device hook)."""

    hooknum: int
    priority: int
    device: str | None


@dataclass(frozen=True, slots=True)
class DumpedElement:
    key: bytes
    flags: int
    timeout_ms: int | None
    expiration_ms: int | None
    comment: str


def parse_elements(payload: bytes) -> Iterator[DumpedElement]:
    """Elements of one NEWSETELEM dump part (payload after nlmsghdr, starting with nfgenmsg)."""
    for kind, value in iter_attrs(payload[4:]):
        if kind != NFTA_SET_ELEM_LIST_ELEMENTS:
            continue
        for _k, elem in iter_attrs(value):
            a = attrs_dict(elem)
            key = b""
            if NFTA_SET_ELEM_KEY in a:
                key = attrs_dict(a[NFTA_SET_ELEM_KEY]).get(NFTA_DATA_VALUE, b"")
            comment = ""
            ud = a.get(NFTA_SET_ELEM_USERDATA)
            if ud and len(ud) >= 2 and ud[0] == NFTNL_UDATA_SET_ELEM_COMMENT:
                comment = read_strz(ud[2: 2 + ud[1]])
            yield DumpedElement(
                key=key,
                flags=read_be32(a[NFTA_SET_ELEM_FLAGS]) if NFTA_SET_ELEM_FLAGS in a else 0,
                timeout_ms=read_be64(a[NFTA_SET_ELEM_TIMEOUT]) if NFTA_SET_ELEM_TIMEOUT in a else None,
                expiration_ms=read_be64(a[NFTA_SET_ELEM_EXPIRATION]) if NFTA_SET_ELEM_EXPIRATION in a else None,
                comment=comment,
            )


def res_id(r: Reply) -> int:
    """The nfgenmsg res_id: for nf_tables dumps, the low 16 bits of the ruleset generation."""
    return int(struct.unpack_from(">H", r.payload, 2)[0])
