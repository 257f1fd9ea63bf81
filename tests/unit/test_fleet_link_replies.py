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
