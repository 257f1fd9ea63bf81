"""The reply shapes the fleet link reads, as the redis-py releases it runs on hand them over."""

from __future__ import annotations

import pytest

from nftblockd.fleet.link import LinkError, _xget

FIELDS = [b"length", 2, b"last-generated-id", b"5-0", b"entries-added", 3, b"first-entry", [b"4-0", [b"k", b"v"]]]


def test_xinfo_stream_as_a_dict_and_as_redis_py_6_1s_flat_list() -> None:
    as_dict = dict(zip(FIELDS[::2], FIELDS[1::2], strict=True))  # redis-py 8.x
    for reply in (as_dict, FIELDS):  # FIELDS: 6.1 (Debian 13) leaves `XINFO STREAM` unparsed
        assert _xget(reply, "last-generated-id") == b"5-0"
        assert _xget(reply, "first-entry")[0] == b"4-0"
        assert _xget(reply, "entries-added") == 3 and _xget(reply, "length") == 2
    assert _xget({"length": 1}, "length") == 1  # a decoding client keys by str


@pytest.mark.parametrize("reply", [None, b"x", [b"odd"], 3])
def test_anything_else_is_a_link_error(reply: object) -> None:
    with pytest.raises(LinkError, match="unexpected XINFO reply"):
        _xget(reply, "length")
