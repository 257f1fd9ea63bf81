"""Schema 2's keys and cursors: a stream key's owner is read strictly (a key C's ACL pattern lets it create is
never someone else's stream), and the cursors of every followed stream survive the store's one text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nftblockd.config.sections import FLEET_HOST_RE
from nftblockd.fleet.link import OPERATOR, Keys
from nftblockd.fleet.service import format_cursors, parse_cursors

K = Keys.for_fleet("prod", "c")
HOSTS = st.from_regex(FLEET_HOST_RE, fullmatch=True)


def test_owner_of_a_stream_key() -> None:
    assert K.events == "nftblock:{prod}:h:c:events" and K.owner_of(K.events) == "c"
    assert K.owner_of(b"nftblock:{prod}:h:web-01.x_y:events") == "web-01.x_y"
    assert K.owner_of("nftblock:{prod}:op:events") == OPERATOR
    for key in ("nftblock:{prod}:h:c:x:events",  # C may create it (~nftblock:{prod}:h:c:*): not host "c:x"
                "nftblock:{prod}:h::events", "nftblock:{prod}:h:C:events", "nftblock:{other}:h:a:events",
                "nftblock:{prod}:h:a:active", "nftblock:{prod}:events", b"\xff"):
        assert K.owner_of(key) is None, key


@given(HOSTS)
def test_a_host_keys_are_its_own_and_only_under_its_own_acl_pattern(host: str) -> None:
    k = Keys.for_fleet("prod", host)
    assert K.owner_of(k.events) == host
    pattern = f"nftblock:{{prod}}:h:{host}:"
    for key in (k.events, k.active, k.unbanned, k.epoch):
        assert key.startswith(pattern)
    assert not K.events.startswith(pattern) or host == "c"


@given(st.text(max_size=80) | st.binary(max_size=80))
def test_owner_of_never_raises(key: str | bytes) -> None:
    owner = K.owner_of(key)
    assert owner is None or owner == OPERATOR or FLEET_HOST_RE.fullmatch(owner)


@given(st.dictionaries(HOSTS | st.just(OPERATOR), st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
                       max_size=20))
def test_cursors_round_trip(cursors: dict[str, tuple[int, int]]) -> None:
    assert parse_cursors(format_cursors(cursors)) == cursors


@given(st.text(max_size=60))
def test_parse_cursors_never_raises(text: str) -> None:
    got = parse_cursors(text)
    assert got is None or all(isinstance(v, tuple) for v in got.values())


def test_a_schema_1_cursor_is_no_cursor() -> None:
    assert parse_cursors("1700000000000-3") is None
