"""kernel/_nlenc.c (the range elements' C loop) against the Python loop of kernel/nfmsg.py, the reference:
wherever the C loop answers, the messages are the same bytes; where it declines (the top of the address
space, a bad key), the Python loop runs and decides, exactly as without the C module."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.kernel import nfmsg as m

pytestmark = pytest.mark.skipif(not m.NATIVE, reason="kernel/_nlenc.c not built")

TAILS = [b"", m.element_tail(3_600_000, False), m.element_tail(86_400_000, True)]


def net_key(addr: int, plen: int) -> int:
    return addr << 8 | plen


@st.composite
def family_keys(draw: st.DrawFn) -> tuple[int, list[int]]:
    """(key_len, keys): valid networks of one family, with edges (the top of the space, /0, host routes)."""
    key_len = draw(st.sampled_from([4, 16]))
    bits = key_len * 8
    plens = st.one_of(st.integers(1, bits), st.sampled_from([1, bits - 1, bits]))

    @st.composite
    def one(d: st.DrawFn) -> int:
        plen = d(plens)
        net = d(st.one_of(st.integers(0, (1 << plen) - 1), st.sampled_from([0, (1 << plen) - 1])))
        return net_key(net << (bits - plen), plen)

    return key_len, draw(st.lists(one(), max_size=60))


def both(keys: list[Any], key_len: int, tail: bytes, seq: int = 7) -> tuple[Any, Any]:
    """(C path's answer, Python's), each an exception type when it raised."""
    out: list[Any] = []
    for fn in (m.uniform_range_messages, m.uniform_range_messages_py):
        try:
            out.append(fn(m.NFT_MSG_NEWSETELEM, m.NFPROTO_INET, "nftblock", "feeds_net", keys, key_len, tail, seq,
                          m.NLM_F_REQUEST))
        except Exception as exc:  # the same exception type on both sides is the claim
            out.append(type(exc))
    return out[0], out[1]


@settings(max_examples=300, deadline=None)
@given(family_keys(), st.sampled_from(TAILS))
def test_the_c_loop_gives_the_python_loops_bytes(fk: tuple[int, list[int]], tail: bytes) -> None:
    key_len, keys = fk
    c, py = both(keys, key_len, tail)
    assert c == py


def test_the_c_loop_answers_for_ordinary_ranges_and_declines_the_edges() -> None:
    elem = m._NLENC.range_elements  # type: ignore[union-attr]
    head, mid, fl = b"H", b"M", b"F"
    assert elem([net_key(0x0A000000, 8)], 4, head, mid, fl) == b"H\x0a\x00\x00\x00M\x0b\x00\x00\x00F"
    assert elem([net_key(1 << 64, 64)], 16, head, mid, fl) == (
        b"H" + (1 << 64).to_bytes(16, "big") + b"M" + (2 << 64).to_bytes(16, "big") + b"F")
    for key_len, keys in [(4, [net_key(0xFF000000, 8)]),  # reaches the top of the space: no end element
                          (4, [net_key(0, 0)]), (16, [net_key(0, 0)]),  # /0
                          (4, [net_key(0, 33)]), (16, [net_key(0, 129)]),  # beyond the family
                          (4, [net_key(1 << 32, 32)]), (16, [net_key(1 << 128, 128)]),  # too wide
                          (4, [-1]), (16, [-1]), (4, [True]), (4, [1.5]),  # not a key at all
                          (8, [net_key(1, 64)])]:
        assert elem(keys, key_len, head, mid, fl) is None, (key_len, keys)


@pytest.mark.parametrize("keys,key_len", [
    ([net_key(0xFF000000, 8), net_key(0x0A000000, 8)], 4),  # the top: the general packer, on both sides
    ([net_key(0, 33)], 4), ([net_key(1 << 32, 32)], 4), ([-1], 4), ([net_key(1 << 128, 128)], 16),  # raise alike
])
def test_what_the_c_loop_declines_the_python_loop_decides(keys: list[int], key_len: int) -> None:
    c, py = both(keys, key_len, b"")
    assert c == py


def test_messages_split_at_the_same_boundaries() -> None:
    keys = [net_key(a << 8, 24) for a in range(0, 6000, 2)]  # several messages' worth
    c, py = both(keys, 4, TAILS[1])
    assert isinstance(c, list) and len(c) > 1 and c == py


# --- timed hash elements (timed_hash_messages): each element its own timeout -------------------------------

def both_timed(keys: list[Any], key_len: int, remaining: list[Any]) -> tuple[Any, Any]:
    """(C path's answer, Python's), each an exception type when it raised."""
    out: list[Any] = []
    for fn in (m.timed_hash_messages, m.timed_hash_messages_py):
        try:
            out.append(fn(m.NFT_MSG_NEWSETELEM, m.NFPROTO_INET, "nftblock", "jail_v4", keys, key_len, remaining, 3,
                          m.NLM_F_REQUEST))
        except Exception as exc:  # the same exception type on both sides is the claim
            out.append(type(exc))
    return out[0], out[1]


@st.composite
def timed_cases(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    key_len = draw(st.sampled_from([4, 16]))
    top = (1 << (8 * key_len)) - 1
    n = draw(st.integers(0, 40))
    keys = draw(st.lists(st.one_of(st.integers(0, top), st.sampled_from([0, top])), min_size=n, max_size=n))
    ms = st.one_of(st.integers(1, 10**10), st.sampled_from([1, 999, 1000, 1001, 2**64 - 1000]))
    return key_len, keys, draw(st.lists(ms, min_size=n, max_size=n))


@settings(max_examples=300, deadline=None)
@given(timed_cases())
def test_the_timed_c_loop_gives_the_python_loops_bytes(case: tuple[int, list[int], list[int]]) -> None:
    key_len, keys, remaining = case
    c, py = both_timed(keys, key_len, remaining)
    assert c == py


def test_the_timed_c_loop_declines_what_python_treats_otherwise() -> None:
    timed = m._NLENC.timed_elements  # type: ignore[union-attr]
    args = (b"H", b"T", b"E")
    assert timed([1], 4, *args, [1001]) == b"H\x00\x00\x00\x01T" + (2000).to_bytes(8, "big") + b"E" + (
        1001).to_bytes(8, "big")
    for key_len, keys, rem in [(4, [1 << 32], [5]), (16, [1 << 128], [5]), (4, [-1], [5]), (16, [-1], [5]),
                               (4, [True], [5]), (4, [1], [-5]), (4, [1], [2**64 - 999]), (4, [1], [2**64]),
                               (4, [1], [5.0]), (4, [1, 2], [5]), (8, [1], [5])]:
        assert timed(keys, key_len, *args, rem) is None, (key_len, keys, rem)
    for key_len, keys, rem in [(4, [1 << 32], [5]), (16, [-1], [5]), (4, [1], [-5]), (4, [1], [2**64 - 999])]:
        c, py = both_timed(keys, key_len, rem)
        assert c == py  # declined: Python decides (here: it raises, the same way)
