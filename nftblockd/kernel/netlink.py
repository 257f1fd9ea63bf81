"""The only module that speaks to the kernel: one long-lived NETLINK_NETFILTER socket.

All calls are blocking and must be made from one thread at a time (the daemon runs them on a single worker
thread). Facts this code relies on are in docs/netlink.md:
- a batch is processed synchronously inside send(); success means *no* error reply for any of its sequence
  numbers, which a GETGEN barrier sent right after the batch makes observable (F1.3-F1.5);
- replies can be lost when the receive buffer overflows (ENOBUFS): we then compare generations (F1.9);
- a table created with OWNER is bound to this socket's portid, so every write goes through this socket (F7.3).
"""

from __future__ import annotations

import errno as errno_mod
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from nftblockd.kernel import nfmsg as m

RCVBUF = 16 * 1024 * 1024
RECV_CHUNK = 1024 * 1024  # >= 64 KiB, or dumps are silently truncated (F6.2)


class KernelError(Exception):
    """The kernel refused a request. `errno` is positive; `text` is the extack message if any."""

    def __init__(self, errno: int, what: str, text: str = "") -> None:
        reason = os.strerror(errno) + (f" ({text})" if text else "")
        super().__init__(f"{what}: {reason}")
        self.errno = errno
        self.what = what
        self.text = text


# Reading or changing nftables takes CAP_NET_ADMIN in the network namespace; without it every request, the
# first GETGEN included, fails with EPERM. Said in the error, since "get type 16" names nothing an operator
# can act on.
NEEDS_CAP = ("nftblockd needs the CAP_NET_ADMIN capability in this network namespace: run it as root, or "
             "grant it with AmbientCapabilities=CAP_NET_ADMIN in its systemd unit")
_WHAT = {m.NFT_MSG_GETGEN: "reading the ruleset generation", m.NFT_MSG_GETTABLE: "reading tables",
         m.NFT_MSG_GETSET: "reading sets", m.NFT_MSG_GETSETELEM: "reading set elements",
         m.NFT_MSG_GETCHAIN: "reading chains", m.NFT_MSG_GETRULE: "reading rules"}


def _refused(errno: int, verb: str, msg_type: int, text: str) -> KernelError:
    what = _WHAT.get(msg_type, f"{verb} type {msg_type}")
    if errno == errno_mod.EPERM:
        return KernelError(errno, what, text or NEEDS_CAP)
    return KernelError(errno, what, text)


class RepliesLost(Exception):
    """The receive buffer overflowed (ENOBUFS); whether a batch committed must be decided another way."""


@dataclass(frozen=True, slots=True)
class TxOutcome:
    errors: tuple[m.ErrorReply, ...]  # empty = committed
    generation: int
    replies_lost: bool = False

    @property
    def committed(self) -> bool:
        return not self.errors


@dataclass(frozen=True, slots=True)
class KernelSetInfo:
    name: str
    flags: int
    key_type: int
    key_len: int
    size: int | None
    count: int | None


class NftSocket:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, m.NETLINK_NETFILTER)
        self.sock.bind((0, 0))
        self.portid: int = self.sock.getsockname()[0]
        self.sock.setsockopt(m.SOL_NETLINK, m.NETLINK_EXT_ACK, 1)
        self.sock.setsockopt(m.SOL_NETLINK, m.NETLINK_CAP_ACK, 1)
        self._setbuf(m.SO_RCVBUFFORCE, socket.SO_RCVBUF, RCVBUF)
        self._sndbuf = 0
        self._ensure_sndbuf(4 * 1024 * 1024)
        self._seq = int.from_bytes(os.urandom(2), "big") << 8
        self._seq_lock = threading.Lock()
        self._buf = bytearray(RECV_CHUNK)
        self._owner_thread: int | None = None
        self.generation = 0

    def close(self) -> None:
        self.sock.close()

    # -- plumbing ---------------------------------------------------------------------------------------

    def _setbuf(self, force_opt: int, opt: int, size: int) -> None:
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, force_opt, size)
        except PermissionError:  # without CAP_NET_ADMIN (unit tests as non-root): best effort
            self.sock.setsockopt(socket.SOL_SOCKET, opt, size)

    def _ensure_sndbuf(self, need: int) -> None:
        # netlink_sendmsg refuses len > sk_sndbuf - 32 with EMSGSIZE (F1.8); the kernel doubles the value
        if need + 4096 > self._sndbuf:
            want = max(need + 65536, 4 * 1024 * 1024)
            self._setbuf(m.SO_SNDBUFFORCE, socket.SO_SNDBUF, want)
            self._sndbuf = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)

    def next_seq(self, n: int = 1) -> int:
        # under a lock: a restore encodes its messages on the event loop's thread while the kernel thread
        # sends earlier ones (writer.encode_timed_hosts), and both number them
        with self._seq_lock:
            seq = self._seq
            self._seq = (self._seq + n) & 0x7FFFFFFF or 1
        return seq

    def _check_thread(self) -> None:
        # One thread at a time: interleaved replies would be attributed to the wrong request.
        me = threading.get_ident()
        if self._owner_thread is None:
            self._owner_thread = me

    def _recv(self) -> Iterator[m.Reply]:
        try:
            n = self.sock.recv_into(self._buf)
        except OSError as exc:
            if exc.errno == errno_mod.ENOBUFS:
                raise RepliesLost() from None
            raise
        yield from m.iter_messages(bytes(self._buf[:n]))

    # -- requests ---------------------------------------------------------------------------------------

    def get_generation(self) -> int:
        r = self.get(m.NFT_MSG_GETGEN, 0, b"")
        if r is None:
            raise KernelError(errno_mod.ENOENT, "GETGEN")
        self.generation = _generation(r)
        return self.generation

    def transact(self, messages: Sequence[bytes], *, genid: int | None = None) -> TxOutcome:
        """Send BATCH_BEGIN + messages + BATCH_END in one send(), then a GETGEN barrier.

        Returns every error reply that carried a non-zero errno. The batch is atomic: any error means
        nothing was applied (F1.5).
        """
        self._check_thread()
        begin_seq = self.next_seq()
        payload = b"".join((m.batch_marker(True, begin_seq, genid), *messages,
                            m.batch_marker(False, self.next_seq())))
        self._ensure_sndbuf(len(payload))
        before = self.generation
        try:
            self.sock.send(payload)
        except OSError as exc:
            raise KernelError(exc.errno or errno_mod.EIO, "sending a batch") from None
        errors: list[m.ErrorReply] = []
        lost = False
        barrier = self.next_seq()
        self.sock.send(m.message(m.NFT_MSG_GETGEN, m.NLM_F_REQUEST, barrier, 0, b""))
        done = False
        while not done:
            try:
                for r in self._recv():
                    if r.msg_type == m.NLMSG_ERROR:
                        e = m.parse_error(r)
                        if e.errno:
                            errors.append(e)
                    elif r.seq == barrier and r.nft_type == m.NFT_MSG_NEWGEN:
                        self.generation = _generation(r)
                        done = True
            except RepliesLost:
                lost = True
                # The barrier reply may itself be lost; ask again. A committed batch bumped the generation.
                barrier = self.next_seq()
                self.sock.send(m.message(m.NFT_MSG_GETGEN, m.NLM_F_REQUEST, barrier, 0, b""))
        if lost and not errors and self.generation == before:
            # Replies were dropped and the generation did not move: nothing was committed.
            errors.append(m.ErrorReply(begin_seq, errno_mod.ENOBUFS, None, "replies lost"))
        return TxOutcome(tuple(errors), self.generation, lost)

    def dump(self, msg_type: int, family: int, body: bytes) -> list[m.Reply]:
        """A NLM_F_DUMP request; returns the parts (raises KernelError on an error reply)."""
        seq = self.next_seq()
        self.sock.send(m.message(msg_type, m.NLM_F_REQUEST | m.NLM_F_DUMP, seq, family, body))
        parts: list[m.Reply] = []
        while True:
            for r in self._recv():
                if r.seq != seq:
                    continue
                if r.msg_type == m.NLMSG_DONE:
                    return parts
                if r.msg_type == m.NLMSG_ERROR:
                    e = m.parse_error(r)
                    if e.errno:
                        raise _refused(e.errno, "dump", msg_type, e.text)
                    continue
                parts.append(r)

    def get(self, msg_type: int, family: int, body: bytes) -> m.Reply | None:
        """A plain GET (no dump); None when the kernel answers ENOENT."""
        seq = self.next_seq()
        self.sock.send(m.message(msg_type, m.NLM_F_REQUEST | m.NLM_F_ACK, seq, family, body))
        reply: m.Reply | None = None
        while True:
            for r in self._recv():
                if r.seq != seq:
                    continue
                if r.msg_type == m.NLMSG_ERROR:
                    e = m.parse_error(r)
                    if e.errno == errno_mod.ENOENT:
                        return None
                    if e.errno:
                        raise _refused(e.errno, "get", msg_type, e.text)
                    return reply
                reply = r

    # -- typed helpers ---------------------------------------------------------------------------------

    def table_exists(self, table: str) -> tuple[bool, int]:
        """(exists, flags)."""
        r = self.get(m.NFT_MSG_GETTABLE, m.NFPROTO_INET, m.strz(m.NFTA_TABLE_NAME, table))
        if r is None:
            return False, 0
        a = m.attrs_dict(r.payload[4:])
        return True, m.read_be32(a[m.NFTA_TABLE_FLAGS]) if m.NFTA_TABLE_FLAGS in a else 0

    def list_sets(self, table: str) -> dict[str, KernelSetInfo]:
        try:
            parts = self.dump(m.NFT_MSG_GETSET, m.NFPROTO_INET, m.strz(m.NFTA_SET_TABLE, table))
        except KernelError as exc:
            if exc.errno == errno_mod.ENOENT:
                return {}
            raise
        out = {}
        for r in parts:
            info = parse_set_info(r)
            out[info.name] = info
        return out

    def list_chains(self, table: str) -> dict[str, m.ChainHook | None]:
        """The table's chains and where each is attached (None: a regular chain)."""
        try:
            parts = self.dump(m.NFT_MSG_GETCHAIN, m.NFPROTO_INET, m.strz(m.NFTA_CHAIN_TABLE, table))
        except KernelError as exc:
            if exc.errno == errno_mod.ENOENT:
                return {}
            raise
        out: dict[str, m.ChainHook | None] = {}
        for r in parts:
            a = m.attrs_dict(r.payload[4:])
            if m.read_strz(a.get(m.NFTA_CHAIN_TABLE, b"")) == table:
                out[m.read_strz(a[m.NFTA_CHAIN_NAME])] = parse_chain_hook(a.get(m.NFTA_CHAIN_HOOK))
        return out

    def count_rules(self, table: str, chain: str) -> int:
        try:
            parts = self.dump(m.NFT_MSG_GETRULE, m.NFPROTO_INET,
                              m.strz(m.NFTA_RULE_TABLE, table) + m.strz(m.NFTA_RULE_CHAIN, chain))
        except KernelError as exc:
            if exc.errno == errno_mod.ENOENT:
                return 0
            raise
        return len(parts)

    def list_rules(self, table: str) -> list[tuple[str, str | None]]:
        """(chain, comment) of every rule in `table`."""
        try:
            parts = self.dump(m.NFT_MSG_GETRULE, m.NFPROTO_INET, m.strz(m.NFTA_RULE_TABLE, table))
        except KernelError as exc:
            if exc.errno == errno_mod.ENOENT:
                return []
            raise
        return [m.parse_rule_comment(r.payload) for r in parts]

    def dump_elements(self, table: str, set_name: str) -> list[m.DumpedElement]:
        """Every element of a set. Cost grows with the square of the size (F6.5): not for polling.

        Retries when the ruleset generation changed in the middle (res_id differs between parts, F6.4).
        """
        body = m.strz(m.NFTA_SET_ELEM_LIST_TABLE, table) + m.strz(m.NFTA_SET_ELEM_LIST_SET, set_name)
        for _attempt in range(5):
            parts = self.dump(m.NFT_MSG_GETSETELEM, m.NFPROTO_INET, body)
            if len({m.res_id(p) for p in parts}) <= 1:
                return [e for p in parts for e in m.parse_elements(p.payload)]
        raise KernelError(errno_mod.EAGAIN, f"dumping set {set_name}", "ruleset kept changing during the dump")

    def get_element(self, table: str, set_name: str, key: bytes) -> m.DumpedElement | None:
        """A point lookup (GETSETELEM without DUMP): cheap, unlike a dump."""
        body = (m.strz(m.NFTA_SET_ELEM_LIST_TABLE, table) + m.strz(m.NFTA_SET_ELEM_LIST_SET, set_name)
                + m.nest(m.NFTA_SET_ELEM_LIST_ELEMENTS,
                         m.nest(m.NFTA_LIST_ELEM, m.nest(m.NFTA_SET_ELEM_KEY, m.attr(m.NFTA_DATA_VALUE, key)))))
        r = self.get(m.NFT_MSG_GETSETELEM, m.NFPROTO_INET, body)
        if r is None:
            return None
        for e in m.parse_elements(r.payload):
            return e
        return None


def _generation(r: m.Reply) -> int:
    """The ruleset generation in a NEWGEN reply."""
    return m.read_be32(m.attrs_dict(r.payload[4:])[m.NFTA_GEN_ID])


def parse_set_info(r: m.Reply) -> KernelSetInfo:
    a = m.attrs_dict(r.payload[4:])
    size = None
    if m.NFTA_SET_DESC in a:
        d = m.attrs_dict(a[m.NFTA_SET_DESC])
        if m.NFTA_SET_DESC_SIZE in d:
            size = m.read_be32(d[m.NFTA_SET_DESC_SIZE])
    count = m.read_be32(a[m.NFTA_SET_COUNT]) if m.NFTA_SET_COUNT in a else None
    return KernelSetInfo(
        name=m.read_strz(a[m.NFTA_SET_NAME]),
        flags=m.read_be32(a[m.NFTA_SET_FLAGS]) if m.NFTA_SET_FLAGS in a else 0,
        key_type=m.read_be32(a[m.NFTA_SET_KEY_TYPE]) if m.NFTA_SET_KEY_TYPE in a else 0,
        key_len=m.read_be32(a[m.NFTA_SET_KEY_LEN]) if m.NFTA_SET_KEY_LEN in a else 0,
        size=size,
        count=count,
    )


def parse_chain_hook(raw: bytes | None) -> m.ChainHook | None:
    """NFTA_CHAIN_HOOK: hook number, signed priority and the device (NFTA_HOOK_DEV, or the first name of
    NFTA_HOOK_DEVS, which kernels use for multi-device chains)."""
    if raw is None:
        return None
    h = m.attrs_dict(raw)
    device = None
    if m.NFTA_HOOK_DEV in h:
        device = m.read_strz(h[m.NFTA_HOOK_DEV])
    elif m.NFTA_HOOK_DEVS in h:
        names = [m.read_strz(v) for _k, v in m.iter_attrs(h[m.NFTA_HOOK_DEVS])]
        device = names[0] if names else None
    prio = m.read_be32(h[m.NFTA_HOOK_PRIORITY]) if m.NFTA_HOOK_PRIORITY in h else 0
    return m.ChainHook(m.read_be32(h[m.NFTA_HOOK_HOOKNUM]) if m.NFTA_HOOK_HOOKNUM in h else -1,
                         prio - (1 << 32) if prio >= 1 << 31 else prio, device)


def kernel_release() -> tuple[int, int]:
    rel = os.uname().release.split("-")[0].split(".")
    try:
        return int(rel[0]), int(rel[1])
    except (IndexError, ValueError):
        return 0, 0


