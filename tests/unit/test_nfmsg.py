"""The netlink wire encoders: fast paths produce exactly the bytes of the general encoder."""

from __future__ import annotations

import ipaddress
import struct

from hypothesis import given
from hypothesis import strategies as st

from nftblockd.kernel import nfmsg as m
from nftblockd.kernel.writer import _interval_element

nets = st.one_of(
    st.builds(lambda a, p: ipaddress.IPv4Network((a, p), strict=False), st.integers(0, 2**32 - 1), st.integers(0, 32)),
    st.builds(lambda a, p: ipaddress.IPv6Network((a, p), strict=False), st.integers(0, 2**128 - 1),
              st.integers(0, 128)),
)


@given(nets, st.one_of(st.none(), st.integers(1, 10**9)), st.booleans(), st.text(max_size=20))
def test_encode_range_matches_the_general_encoder(net, timeout, refresh, comment) -> None:  # type: ignore[no-untyped-def]
    end_int = int(net.broadcast_address) + 1
    end = end_int.to_bytes(net.max_prefixlen // 8, "big") if end_int < (1 << net.max_prefixlen) else None
    fast = m.encode_range(net.network_address.packed, end, m.element_tail(timeout, refresh, comment))
    assert fast == m.encode_element(_interval_element(net, timeout, comment, refresh))


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=3000, unique=True), st.integers(1, 10**9))
def test_uniform_hash_messages_match_the_general_splitter(keys: list[int], timeout: int) -> None:
    fast = m.uniform_hash_messages(m.NFT_MSG_NEWSETELEM, m.NFPROTO_INET, "t", "s", keys, 4, timeout, True, 100,
                                   m.NLM_F_REQUEST)
    blobs = m.encode_hash_elements([k.to_bytes(4, "big") for k in keys], [timeout] * len(keys), True)
    general = [sm.data for sm in m.split_set_messages(m.NFT_MSG_NEWSETELEM, m.NFPROTO_INET, "t", "s", blobs, 100,
                                                      m.NLM_F_REQUEST)]
    assert fast == general


@given(st.sampled_from([4, 16]).flatmap(lambda n: st.tuples(st.just(n), st.lists(
    st.integers(0, 2 ** (8 * n) - 1), min_size=1, max_size=2500, unique=True))),
    st.one_of(st.none(), st.integers(1, 10**9)), st.booleans())
def test_uniform_hash_messages_are_the_per_element_concatenation(case: tuple[int, list[int]], timeout: int | None,
                                                                   refresh: bool) -> None:
    # the keys written into a repeated template against one `head + key + tail` per element (the plain version)
    klen, keys = case
    fast = m.uniform_hash_messages(m.NFT_MSG_NEWSETELEM, m.NFPROTO_INET, "t", "s", keys, klen, timeout, refresh, 7,
                                   m.NLM_F_REQUEST)
    tail = b"" if timeout is None else m._timeout_attrs(timeout, refresh)
    nla = struct.Struct("=HH")
    head = nla.pack(4 + 8 + klen + len(tail), m.NFTA_LIST_ELEM | m.NLA_F_NESTED) + nla.pack(
        8 + klen, m.NFTA_SET_ELEM_KEY | m.NLA_F_NESTED) + nla.pack(4 + klen, m.NFTA_DATA_VALUE)
    plain = b"".join(head + k.to_bytes(klen, "big") + tail for k in keys)
    got = b""
    for msg in fast:  # nlmsghdr and nfgenmsg (20 bytes), then table, set and the ELEMENTS nest
        got += m.attrs_dict(msg[20:])[m.NFTA_SET_ELEM_LIST_ELEMENTS]
    assert got == plain


@given(st.sampled_from([4, 16]).flatmap(lambda n: st.tuples(st.just(n), st.lists(
    st.tuples(st.integers(0, 2 ** (8 * n) - 1), st.integers(1, 10**10)), min_size=1, max_size=2500,
    unique_by=lambda kt: kt[0]))))
def test_timed_hash_messages_match_the_general_encoder(case: tuple[int, list[tuple[int, int]]]) -> None:
    # restored bans, every one with its own end: one struct pack per element against the per-end templates
    klen, pairs = case
    keys, remaining = [k for k, _t in pairs], [t for _k, t in pairs]
    fast = m.timed_hash_messages(m.NFT_MSG_NEWSETELEM, m.NFPROTO_INET, "t", "s", keys, klen, remaining, 100,
                                 m.NLM_F_REQUEST)
    blobs = m.encode_hash_elements([k.to_bytes(klen, "big") for k in keys], remaining, True)
    general = [sm.data for sm in m.split_set_messages(m.NFT_MSG_NEWSETELEM, m.NFPROTO_INET, "t", "s", blobs, 100,
                                                      m.NLM_F_REQUEST)]
    assert fast == general


def test_timeout_is_whole_seconds_and_expiration_exact() -> None:
    blob = m.encode_hash_elements([bytes(4)], [59_980], True)[0]
    attrs = dict(m.iter_attrs(next(v for _k, v in m.iter_attrs(blob))))
    assert m.read_be64(attrs[m.NFTA_SET_ELEM_TIMEOUT]) == 60_000
    assert m.read_be64(attrs[m.NFTA_SET_ELEM_EXPIRATION]) == 59_980


def test_parse_error_reads_extack_offset() -> None:
    import struct
    req = struct.pack("=IHHII", 100, 0x0A0C, 5, 77, 0)
    tlv = m.attr(m.NLMSGERR_ATTR_OFFS, struct.pack("=I", 56)) + m.attr(m.NLMSGERR_ATTR_MSG, b"bad\0")
    payload = struct.pack("=i", -17) + req + tlv
    r = m.Reply(m.NLMSG_ERROR, 0x100 | m.NLM_F_ACK_TLVS, 77, payload)
    e = m.parse_error(r)
    assert (e.seq, e.errno, e.offset, e.text) == (77, 17, 56, "bad")


def _net_keys(bits: int) -> st.SearchStrategy[list[int]]:
    # net keys (start << 8 | prefix) of arbitrary networks, the top of the address space included sometimes
    def key(a: int, p: int) -> int:
        return (a >> (bits - p) << (bits - p) if p else 0) << 8 | p
    return st.lists(st.builds(key, st.integers(0, 2**bits - 1), st.integers(0, bits)), min_size=1, max_size=1500,
                    unique=True)


@given(st.sampled_from([4, 16]).flatmap(lambda n: st.tuples(st.just(n), _net_keys(8 * n))),
       st.one_of(st.none(), st.integers(1, 10**9)), st.booleans())
def test_uniform_range_messages_match_the_general_encoder(case: tuple[int, list[int]], timeout: int | None,
                                                          refresh: bool) -> None:
    klen, keys = case
    bits = 8 * klen
    tail = m.element_tail(timeout, refresh)
    fast = m.uniform_range_messages(m.NFT_MSG_NEWSETELEM, m.NFPROTO_INET, "t", "s", keys, klen, tail, 100,
                                    m.NLM_F_REQUEST)
    blobs = []
    for k in keys:
        start, end = k >> 8, (k >> 8) + (1 << (bits - (k & 0xFF)))
        blobs.append(m.encode_range(start.to_bytes(klen, "big"), end.to_bytes(klen, "big") if end < 1 << bits
                                    else None, tail))
    general = [sm.data for sm in m.split_set_messages(m.NFT_MSG_NEWSETELEM, m.NFPROTO_INET, "t", "s", blobs, 100,
                                                      m.NLM_F_REQUEST)]
    assert fast == general
