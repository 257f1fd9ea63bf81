"""Private network namespaces for kernel tests: every nftables object a test makes lives in one of these.

`NetNS` wraps `ip netns add/exec/del`; `inside(ns)` switches the calling thread into the namespace just long
enough to open sockets there (a socket stays in the namespace it was created in).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, overload

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class NetNS:
    def __init__(self, prefix: str = "nbt") -> None:
        self.name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        self.run("ip", "link", "set", "lo", "up")

    def run(self, *cmd: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.name, *cmd], check=check, capture_output=True,
                              text=True, input=input)

    @overload
    def popen(self, *cmd: str, text: Literal[True], **kw: Any) -> subprocess.Popen[str]: ...
    @overload
    def popen(self, *cmd: str, text: Literal[False] = ..., **kw: Any) -> subprocess.Popen[bytes]: ...

    def popen(self, *cmd: str, text: bool = False, **kw: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(["ip", "netns", "exec", self.name, *cmd], text=text, **kw)

    def nft(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("nft", *args, check=check)

    def nft_json(self, *args: str) -> list[dict[str, Any]]:
        out = self.run("nft", "-j", *args).stdout
        return list(json.loads(out)["nftables"])

    def set_elements(self, table: str, set_name: str) -> dict[str, dict[str, Any]]:
        """Element text ("1.2.3.4" or "10.0.0.0/8") -> {"timeout": s, "expires": s} as nft -j shows them."""
        out: dict[str, dict[str, Any]] = {}
        for obj in self.nft_json("list", "set", "inet", table, set_name):
            s = obj.get("set")
            if not s:
                continue
            for e in s.get("elem", []):
                info: dict[str, Any] = {}
                val = e
                if isinstance(e, dict) and "elem" in e:
                    info = {k: v for k, v in e["elem"].items() if k != "val"}
                    val = e["elem"]["val"]
                if isinstance(val, dict) and "prefix" in val:
                    key = f"{val['prefix']['addr']}/{val['prefix']['len']}"
                elif isinstance(val, dict) and "range" in val:
                    key = f"{val['range'][0]}-{val['range'][1]}"
                else:
                    key = str(val)
                out[key] = info
        return out

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False)


@contextlib.contextmanager
def inside(ns: NetNS) -> Iterator[None]:
    """Run the block with the calling thread in `ns` (for creating sockets there)."""
    with open("/proc/thread-self/ns/net") as orig, open(f"/var/run/netns/{ns.name}") as target:
        _setns(target.fileno())
        try:
            yield
        finally:
            _setns(orig.fileno())


@contextlib.contextmanager
def http_server(ns: NetNS, handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """A threaded HTTP server on the loopback of `ns` (its socket made inside it); yields its port."""
    with inside(ns):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "") -> Any:
    """Poll `pred` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or pred}")
        time.sleep(interval)


class Peer:
    """A second namespace joined to `ns` by a veth pair whose end in `ns` is named `dev`: a device that
    appears in `ns` (the end is made in the peer's namespace and moved over) and traffic that arrives on it.

    Addresses: the peer end (`peer0`) 10.201.0.1/24, `dev` in `ns` 10.201.0.2/24."""

    def __init__(self, ns: NetNS, dev: str) -> None:
        self.ns = ns
        self.dev = dev
        self.peer = NetNS("nbp")
        self.attached = False

    def attach(self) -> Peer:
        self.peer.run("ip", "link", "add", "peer0", "type", "veth", "peer", "name", self.dev, "netns", self.ns.name)
        self.peer.run("ip", "addr", "add", "10.201.0.1/24", "dev", "peer0")
        self.ns.run("ip", "addr", "add", "10.201.0.2/24", "dev", self.dev)
        self.peer.run("ip", "link", "set", "peer0", "up")
        self.ns.run("ip", "link", "set", self.dev, "up")
        self.attached = True
        return self

    def detach(self) -> None:
        """Delete the pair: `dev` goes away in `ns`."""
        self.peer.run("ip", "link", "del", "peer0")
        self.attached = False

    def send_udp(self, sources: list[str], dst: str = "10.201.0.2") -> None:
        """One 46-byte UDP packet from each source address (raw IPv4 with the source written in)."""
        import socket
        import struct

        with inside(self.peer):
            s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        with s:
            for src in sources:
                udp = struct.pack("!HHHH", 40000, 9, 8 + 18, 0) + b"x" * 18
                ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP, 0,
                                 socket.inet_aton(src), socket.inet_aton(dst))
                s.sendto(ip + udp, (dst, 0))

    def close(self) -> None:
        self.peer.delete()  # takes the pair, and so `dev`, with it
