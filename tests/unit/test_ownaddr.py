"""The machine's own addresses over rtnetlink: the decoder alone, against `ip -j addr`, and without pyroute2
(whose import logs warnings under the unit's ProcSubset=pid)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nftblockd.kernel.ownaddr import (
    IFA_ADDRESS,
    IFA_LOCAL,
    NLMSG_DONE,
    NLMSG_ERROR,
    RTM_NEWADDR,
    DumpError,
    own_addresses,
    parse_dump,
    request,
)
from tests.helpers.rtnlmsg import attr, msg

REPO = Path(__file__).resolve().parents[2]


def newaddr(seq: int, family: int, *attrs: bytes) -> bytes:
    return msg(RTM_NEWADDR, seq, struct.pack("=BBBBI", family, 24, 0, 0, 2) + b"".join(attrs))


V4 = socket.inet_pton(socket.AF_INET, "192.0.2.7")
PEER = socket.inet_pton(socket.AF_INET, "192.0.2.1")
V6 = socket.inet_pton(socket.AF_INET6, "2001:db8::7")


def test_request_is_a_dump_of_every_family() -> None:
    r = request(42)
    assert struct.unpack_from("=IHHII", r) == (24, 22, 0x301, 42, 0) and r[16] == socket.AF_UNSPEC


def test_addresses_local_before_peer_other_families_and_sequences_skipped() -> None:
    data = (newaddr(7, socket.AF_INET, attr(IFA_ADDRESS, PEER), attr(IFA_LOCAL, V4))  # point-to-point
            + newaddr(7, socket.AF_INET6, attr(IFA_ADDRESS, V6), attr(99, b"label\0"))
            + newaddr(8, socket.AF_INET, attr(IFA_ADDRESS, PEER))  # another request's answer
            + newaddr(7, socket.AF_PACKET, attr(IFA_ADDRESS, b"\1" * 6)))
    assert parse_dump(data, 7) == ([ipaddress.ip_address("192.0.2.7"), ipaddress.ip_address("2001:db8::7")],
                                   False)
    assert parse_dump(data + msg(NLMSG_DONE, 7, b"\0" * 4), 7)[1] is True


def test_an_error_answer_and_malformed_input_raise_dump_error() -> None:
    with pytest.raises(DumpError, match="Operation not permitted"):
        parse_dump(msg(NLMSG_ERROR, 3, struct.pack("=i", -1) + b"\0" * 16), 3)
    whole = newaddr(1, socket.AF_INET, attr(IFA_LOCAL, V4))
    with pytest.raises(DumpError):
        parse_dump(whole[:-2], 1)
    with pytest.raises(DumpError):
        parse_dump(whole[:24] + b"\xff\xff" + whole[26:], 1)  # an attribute longer than its message


@given(st.binary(max_size=300), st.integers(0, 3))
def test_arbitrary_bytes_never_raise_anything_but_dump_error(data: bytes, seq: int) -> None:
    with contextlib.suppress(DumpError):
        parse_dump(data, seq)


@given(st.lists(st.tuples(st.sampled_from([NLMSG_ERROR, NLMSG_DONE, RTM_NEWADDR, 99]), st.binary(max_size=60))),
       st.integers(0, 80))
def test_well_framed_messages_with_arbitrary_bodies_never_raise_anything_but_dump_error(
        parts: list[tuple[int, bytes]], cut: int) -> None:
    data = b"".join(msg(kind, 1, body) for kind, body in parts)
    with contextlib.suppress(DumpError):
        parse_dump(data, 1)
    with contextlib.suppress(DumpError):
        parse_dump(data[:len(data) - cut], 1)


@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2")
def test_same_addresses_as_ip_addr() -> None:
    shown = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout)
    expected = {ipaddress.ip_address(a["local"]) for link in shown for a in link.get("addr_info", [])}
    assert set(own_addresses()) == expected


SNIPPET = """
import logging, sys
logging.basicConfig(level=logging.WARNING)
from nftblockd.daemon.build import own_addresses
import nftblockd.daemon.main
assert own_addresses(), "no addresses"
print(sorted(m for m in sys.modules if m.split(".")[0] == "pyroute2"))
"""


def test_the_daemon_does_not_import_pyroute2() -> None:
    r = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, cwd=REPO, check=False)
    assert r.returncode == 0 and r.stdout == "[]\n" and r.stderr == "", r.stdout + r.stderr


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare to mount a proc like ProcSubset=pid")
def test_nothing_is_logged_under_procsubset_pid() -> None:
    """The unit's ProcSubset=pid is a proc mounted with subset=pid: /proc/net (psched, if_inet6) is gone."""
    script = (f"mount -t proc -o subset=pid proc /proc && test ! -e /proc/net && "
              f"exec {sys.executable} -c '{SNIPPET}'")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, cwd=REPO, check=False)
    assert r.returncode == 0 and r.stdout == "[]\n" and r.stderr == "", r.stdout + r.stderr
