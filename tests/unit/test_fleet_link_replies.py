"""The reply shapes the fleet link reads, as the redis-py releases it runs on hand them over."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from nftblockd.config import FleetConfig
from nftblockd.fleet.countlink import CountLink
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


def test_a_tls_host_without_a_certificate_dropped_at_connect_is_told_to_set_one() -> None:
    # TLS 1.3: the server's CERTIFICATE_REQUIRED alert races the client's first command, so a host without a
    # certificate sees either the alert or only a dropped connection; both must say what to set.
    from redis.exceptions import ConnectionError as RedisConnectionError

    from nftblockd.config import FleetConfig, FleetTLS
    from nftblockd.fleet.link import _connect_error

    reset = RedisConnectionError("Error 104 while writing to socket. Connection reset by peer.")
    no_cert = FleetConfig("prod", "web-01", url="rediss://r:6380", tls=FleetTLS(ca="/etc/ca.crt"))
    err = _connect_error(reset, no_cert)
    assert err.refused and "requires a client certificate" in str(err) and "fleet.tls.cert" in str(err)
    alert = RedisConnectionError("[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required")
    assert "requires a client certificate" in str(_connect_error(alert, no_cert))
    # With a certificate the same race hides UNKNOWN_CA or CERTIFICATE_EXPIRED (seen in a loaded run): the
    # certificate is what to check. Without TLS a dropped connection is the network's fault, as before.
    with_cert = FleetConfig("prod", "web-01", url="rediss://r:6380",
                            tls=FleetTLS(ca="/etc/ca.crt", cert="/etc/c.crt", key="/etc/c.key"))
    err = _connect_error(reset, with_cert)
    assert err.refused and "fleet.tls.cert" in str(err) and "another CA" in str(err) and "expired" in str(err)
    unknown_ca = RedisConnectionError("[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca")
    assert "signed by another CA" in str(_connect_error(unknown_ca, with_cert))
    plain = FleetConfig("prod", "web-01", url="redis://r:6379")
    assert not _connect_error(reset, plain).refused


class _Swallowing:
    """A client that loses a stop the way redis-py sometimes does while it waits for a reply: the CancelledError
    is caught and an empty reply returned (the task's cancel request stays counted). `broken` ends a loop that
    did not stop, so a failing test fails instead of hanging."""

    broken = False

    async def execute_command(self, *args: object) -> object:
        if self.broken:
            raise OSError("the test is over")
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.02)
        return [] if args[0] != "SCAN" else (0, [])


@pytest.mark.parametrize("call", ["read", "members"])
async def test_a_loop_over_the_count_link_stops_though_the_client_swallowed_the_cancel(call: str) -> None:
    link = CountLink(FleetConfig("prod", "web-01", url="redis://r:6379"))
    client = _Swallowing()
    link.cmd = link.reader = client  # type: ignore[assignment]

    async def loop() -> None:  # as the counter's read loop goes round
        while True:
            if call == "read":
                await link.read({"k": "0-0"}, 10, 1000)
            else:
                await link.members("k*", 10, lambda k: True)

    task = asyncio.ensure_future(loop())
    await asyncio.sleep(0.01)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    client.broken = True
    with contextlib.suppress(BaseException):
        await task
    assert done and task.cancelled()
