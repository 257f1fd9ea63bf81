# Fail2Ban action: bans go to nftblockd over its control socket, in batches, from one open connection.
#
# No process is spawned per ban: on a restart that restores thousands of tickets, they reach nftblockd as
# a few requests of up to `batch_max` addresses each, and nftblockd writes them to the kernel in one
# netlink transaction per batch. Bans then expire in the kernel (nftables set timeouts) even if fail2ban
# is not running.
#
# jail.local:
#
#   [DEFAULT]
#   banaction = nftblock.py
#   banaction_allports = nftblock.py
#
#   # or per jail, with options (all optional):
#   [sshd]
#   action = nftblock.py[set=default, socket=/run/nftblockd/control.sock]
#
# jail.conf gives a few jails (nsd, asterisk, freeswitch, counter-strike, murmur) two banactions, one for
# tcp and one for udp. fail2ban names a Python action after its file, so the second one fails with "Action
# nftblock already exists"; nftblockd bans whole addresses anyway, so give such a jail a single action:
#   [asterisk]
#   action = nftblock.py
#
# Options
#   socket          nftblockd's control socket                            /run/nftblockd/control.sock
#   set             nftblockd blocklist for bans *and* unbans             default
#                   (a blocklist of its own, e.g. `fail2ban`, keeps fail2ban's unbans away from bans
#                   that nftblockd's own jails and feeds made for the same address)
#   comment         recorded with each ban                                f2b <jail name>
#   keep_on_stop    on fail2ban stop, leave the bans in nftblockd; they   true
#                   expire in the kernel at the end of their ban time and fail2ban restores them on
#                   start. false: unban them all at stop (fail2ban's usual behaviour; one request)
#   sync            wait for nftblockd's answer before fail2ban's ban()   false
#                   returns (errors then show as "Failed to execute ban"; no batching across bans)
#   batch_delay     seconds to collect more bans into one request         0.005
#   batch_max       addresses per request                                 1000
#   queue_max       pending addresses before ban() blocks                 100000
#   request_timeout seconds to wait for nftblockd's answer                30
#   stop_timeout    seconds fail2ban's stop waits for pending requests    10
#
# Ordering: requests go one at a time on one connection and each waits for its answer; bans and unbans
# of one address are never reordered (unrelated addresses may be merged into an earlier request). If
# nftblockd is unreachable, requests are kept (up to queue_max) and re-sent after reconnecting; bans and
# unbans are idempotent, so a re-sent request is harmless.
#
# Ban times: a ban is sent with the time fail2ban has left for it (ticket time + bantime - now), so the
# kernel lets it go when fail2ban would; bantime = -1 (never) is sent as "permanent".
#
# Protocol (nftblockd's control socket, one JSON object per line):
#   {"v":1,"id":N,"cmd":"ban","args":{"targets":[{"target":"192.0.2.1","timeout":600,"jail":"sshd"}],
#     "set":"default","comment":"f2b sshd","origin":"fail2ban"}}
#   {"v":1,"id":N,"cmd":"unban","args":{"targets":["192.0.2.1"],"set":"default","origin":"fail2ban",
#     "jail":"sshd"}}
#   → {"v":1,"id":N,"ok":true,"result":{...}}  or  {"v":1,"id":N,"ok":false,"error":{"code":..,"message":..}}
#
# Fail2Ban loads this file itself (it need not be importable), with the python fail2ban runs on; it uses the
# standard library only and keeps to Python 3.6 syntax (f-strings, no walrus).

import json
import math
import socket as _socket
import threading
import time
from collections import deque

from fail2ban.server.actions import ActionBase

DEFAULT_SOCKET = "/run/nftblockd/control.sock"
PROTOCOL_VERSION = 1
MAX_REPLY = 64 * 1024 * 1024
# Error codes after which re-sending the same request cannot help (the request itself is refused).
FINAL_ERRORS = frozenset({"bad_request", "unknown_set", "invalid_address", "allowlisted", "never_ban", "forbidden",
                          "not_found", "internal"})
BACKOFF_FIRST, BACKOFF_MAX = 0.1, 5.0
MAX_LOGGED = 10  # per answer: refusals logged one by one, then a count
OPTIONS = ("socket", "set", "comment", "keep_on_stop", "sync", "batch_delay", "batch_max", "queue_max",
           "request_timeout", "stop_timeout")
# What jail.conf's action shortcuts pass to every banaction; nftblockd drops all traffic from a banned
# address, so ports, protocols and chains do not apply.
IGNORED_OPTIONS = ("port", "protocol", "chain", "name", "actname", "blocktype", "bantime")


class NftblockdError(Exception):
    """nftblockd answered ok:false; `code` says whether trying again can help."""

    def __init__(self, code, message):
        Exception.__init__(self, f"{code}: {message}")
        self.code = code
        self.message = message


class ConnectionLost(Exception):
    """The socket failed, closed or answered out of turn; reconnect and send again."""


class _Op:
    __slots__ = ("cmd", "target", "timeout", "done", "error")

    def __init__(self, cmd, target, timeout=None, wait=False):
        self.cmd = cmd
        self.target = target
        self.timeout = timeout
        self.done = threading.Event() if wait else None
        self.error = None

    def finish(self, error=None):
        self.error = error
        if self.done is not None:
            self.done.set()


class Connection:
    """One UNIX stream connection to nftblockd speaking newline-delimited JSON, a request at a time."""

    def __init__(self, path, timeout):
        self.path = path
        self.timeout = timeout
        self._sock = None
        self._buf = b""
        self._next_id = 1

    @property
    def connected(self):
        return self._sock is not None

    def close(self):
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._buf = b""

    def request(self, cmd, args):
        """Send one request and return its result dict; raises NftblockdError or ConnectionLost."""
        try:
            if self._sock is None:
                sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
                sock.settimeout(self.timeout)
                try:
                    sock.connect(self.path)
                except Exception:
                    sock.close()
                    raise
                self._sock = sock
            rid = self._next_id
            self._next_id += 1
            line = json.dumps({"v": PROTOCOL_VERSION, "id": rid, "cmd": cmd, "args": args},
                              separators=(",", ":"), ensure_ascii=False) + "\n"
            self._sock.sendall(line.encode("utf-8"))
            reply = self._read_line()
        except (OSError, ValueError) as exc:  # socket.timeout is an OSError
            self.close()
            raise ConnectionLost(str(exc) or exc.__class__.__name__) from None
        try:
            obj = json.loads(reply.decode("utf-8"))
        except ValueError:
            self.close()
            raise ConnectionLost("nftblockd's reply is not JSON") from None
        if not isinstance(obj, dict) or obj.get("id") != rid or not isinstance(obj.get("ok"), bool):
            self.close()
            raise ConnectionLost(f"nftblockd's reply does not answer request {rid}")
        if obj["ok"]:
            result = obj.get("result")
            return result if isinstance(result, dict) else {}
        err = obj.get("error") if isinstance(obj.get("error"), dict) else {}
        raise NftblockdError(str(err.get("code") or "unknown"), str(err.get("message") or ""))

    def _read_line(self):
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_REPLY:
                raise ValueError(f"nftblockd's reply is larger than {MAX_REPLY} bytes")
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ValueError("nftblockd closed the connection")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line


def _as_bool(value, name):
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"nftblock action: {name} must be true or false, got {value!r}")


def _as_number(value, name, lo, kind=float):
    try:
        v = kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"nftblock action: {name} must be a number, got {value!r}") from None
    if not v >= lo:
        raise ValueError(f"nftblock action: {name} must be at least {lo}, got {value!r}")
    return v


def ban_timeout(bantime, ticket_time, now):
    """Seconds fail2ban has left for a ban (at least 1), or "permanent" for a negative bantime."""
    bantime = int(bantime)
    if bantime < 0:
        return "permanent"
    return max(1, int(math.ceil(float(ticket_time) + bantime - now)))


class NftblockAction(ActionBase):
    """Fail2Ban action sending bans and unbans to nftblockd's control socket (see the top of this file)."""

    def __init__(self, jail, name, **options):
        ActionBase.__init__(self, jail, name)
        self._cond = threading.Condition()
        self._queue = deque()
        self._banned = {}  # address → None: what this action banned, for flush()
        self._thread = None
        self._stopping = False
        self._drain_deadline = None
        self._wake = threading.Event()
        self._conn = None
        self._undelivered = 0  # given up on at stop, reported once
        self._configure(options)

    # -- options ---------------------------------------------------------------------------------------------

    def _configure(self, options):
        jail_name = getattr(self._jail, "name", None) or "fail2ban"
        unknown = sorted(k for k in options if k not in OPTIONS and k not in IGNORED_OPTIONS)
        if unknown:  # a typo must not pass silently, nor stop the jail
            self._logSys.warning("[%s] nftblock: ignoring unknown options %s (known: %s)", jail_name,
                                 ", ".join(unknown), ", ".join(OPTIONS))
        self.socket_path = str(options.get("socket") or DEFAULT_SOCKET)
        self.set = str(options.get("set") or "default")
        self.jail_name = str(jail_name)
        self.comment = str(options.get("comment") or f"f2b {jail_name}")
        self.keep_on_stop = _as_bool(options.get("keep_on_stop", True), "keep_on_stop")
        self.sync = _as_bool(options.get("sync", False), "sync")
        self.batch_delay = _as_number(options.get("batch_delay", 0.005), "batch_delay", 0.0)
        self.batch_max = _as_number(options.get("batch_max", 1000), "batch_max", 1, int)
        self.queue_max = _as_number(options.get("queue_max", 100000), "queue_max", 1, int)
        self.request_timeout = _as_number(options.get("request_timeout", 30), "request_timeout", 0.001)
        self.stop_timeout = _as_number(options.get("stop_timeout", 10), "stop_timeout", 0.0)
        with self._cond:
            if self._conn is not None and self._conn.path != self.socket_path:
                self._conn.close()
            self._conn = Connection(self.socket_path, self.request_timeout)

    def clearAllParams(self):  # noqa: N802 - fail2ban's name; with reload(), keeps the action on reload
        pass

    def reload(self, **options):
        """fail2ban-client reload: new options, same queue, thread and banned addresses."""
        self._configure(options)
        self._logSys.info("[%s] nftblock: reloaded options (socket %s, blocklist %s)",
                          self.jail_name, self.socket_path, self.set)

    # -- fail2ban's interface --------------------------------------------------------------------------------

    def start(self):
        with self._cond:
            self._stopping = False
            self._drain_deadline = None
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="f2b/nftblock." + self.jail_name)
                self._thread.daemon = True
                self._thread.start()

    def stop(self):
        """Send what is pending (for up to stop_timeout seconds), then close the connection."""
        with self._cond:
            self._stopping = True
            self._drain_deadline = time.monotonic() + self.stop_timeout
            self._cond.notify_all()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(self.stop_timeout + self.request_timeout + 1)
        with self._cond:
            ops = list(self._queue)
            self._queue.clear()
            lost, self._undelivered = self._undelivered + len(ops), 0
            self._conn.close()
        for op in ops:
            op.finish("fail2ban stopped before nftblockd could be reached")
        if lost:
            self._logSys.error("[%s] nftblock: stopped with %d bans/unbans not delivered to nftblockd",
                               self.jail_name, lost)

    def ban(self, aInfo):
        now = time.time()
        ip = str(aInfo["ip"])
        self._submit(_Op("ban", ip, ban_timeout(aInfo["bantime"], aInfo["time"], now), self.sync))

    def reban(self, aInfo):
        return self.ban(aInfo)

    @property
    def _prolongable(self):
        return True

    def prolong(self, aInfo):
        """bantime.increment made a ban longer: send it again with the new time (nftblockd updates it)."""
        return self.ban(aInfo)

    def unban(self, aInfo):
        self._submit(_Op("unban", str(aInfo["ip"]), None, self.sync))

    def flush(self):
        """All of this jail's bans go at once: on stop (kept, if keep_on_stop), `unban --all`, or removal."""
        # fail2ban sets its actions thread's `active` to False when the jail stops (None: never started).
        stopping = getattr(getattr(self._jail, "actions", None), "active", None) is False
        if stopping and self.keep_on_stop:
            with self._cond:
                n = len(self._banned)
            self._logSys.info("[%s] nftblock: leaving %d bans in nftblockd; they expire in the kernel",
                              self.jail_name, n)
            return True
        with self._cond:
            targets = list(self._banned)
        for ip in targets:
            self._submit(_Op("unban", ip, None, False))
        return True

    # -- the queue -------------------------------------------------------------------------------------------

    def _submit(self, op):
        with self._cond:
            deadline = None
            while len(self._queue) >= self.queue_max and not self._stopping:
                deadline = deadline or time.monotonic() + self.request_timeout
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"nftblock: {len(self._queue)} requests wait for nftblockd at "
                                       f"{self.socket_path}; is it running?")
                self._cond.wait(left)
            if self._stopping and self._thread is not None and not self._thread.is_alive():
                raise RuntimeError("nftblock: the action is stopped")
            if op.cmd == "ban":
                self._banned[op.target] = None
            else:
                self._banned.pop(op.target, None)
            self._queue.append(op)
            self._cond.notify_all()
        if op.done is not None:
            if not op.done.wait(self.request_timeout * 2 + self.batch_delay):
                raise RuntimeError(f"nftblock: no answer from nftblockd at {self.socket_path}")
            if op.error:
                raise RuntimeError(f"nftblock: {op.cmd} {op.target}: {op.error}")

    def _next_batch(self):
        """Wait for work; return (cmd, ops) or None once stopping with nothing left to send."""
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                self._cond.wait()
            # Collect for batch_delay after the first op, unless full, stopping or a caller waits (sync).
            end = time.monotonic() + (0 if self.sync else self.batch_delay)
            while len(self._queue) < self.batch_max and not self._stopping:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._take()

    def _take(self):
        """Take ops of the first op's kind, skipping (and then keeping behind) any address that has an
        op of the other kind earlier in the queue, so one address's ops never change order."""
        cmd = self._queue[0].cmd
        taken, kept, blocked = [], deque(), set()
        scanned = 0
        while self._queue and len(taken) < self.batch_max and scanned < 4 * self.batch_max:
            op = self._queue.popleft()
            scanned += 1
            if op.cmd == cmd and op.target not in blocked:
                taken.append(op)
            else:
                blocked.add(op.target)
                kept.append(op)
        kept.extend(self._queue)
        self._queue = kept
        self._cond.notify_all()  # room in the queue for a blocked _submit
        return cmd, taken

    # -- the sender thread -----------------------------------------------------------------------------------

    def _run(self):
        down_since = None
        while True:
            batch = self._next_batch()
            if batch is None:
                break
            cmd, ops = batch
            backoff = BACKOFF_FIRST
            while True:
                try:
                    result = self._conn.request(cmd, self._args(cmd, ops))
                except ConnectionLost as exc:
                    if down_since is None:
                        down_since = time.monotonic()
                        self._logSys.error("[%s] nftblock: cannot reach nftblockd at %s (%s); %d requests "
                                           "wait and are sent once it answers", self.jail_name,
                                           self.socket_path, exc, len(ops) + len(self._queue))
                    if self._give_up():
                        with self._cond:
                            self._undelivered += len(ops)
                        for op in ops:
                            op.finish(f"nftblockd unreachable: {exc}")
                        break
                    self._wake.wait(backoff)
                    self._wake.clear()
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    continue
                except NftblockdError as exc:
                    if exc.code not in FINAL_ERRORS:  # e.g. unavailable: nftblockd is starting or stopping
                        if self._give_up():
                            with self._cond:
                                self._undelivered += len(ops)
                            for op in ops:
                                op.finish(str(exc))
                            break
                        self._wake.wait(backoff)
                        self._wake.clear()
                        backoff = min(backoff * 2, BACKOFF_MAX)
                        continue
                    self._logSys.error("[%s] nftblock: nftblockd refused to %s %d addresses: %s",
                                       self.jail_name, cmd, len(ops), exc)
                    for op in ops:
                        op.finish(str(exc))
                    break
                if down_since is not None:
                    self._logSys.notice("[%s] nftblock: nftblockd at %s answers again after %.1fs",
                                        self.jail_name, self.socket_path, time.monotonic() - down_since)
                    down_since = None
                self._report(cmd, ops, result)
                break
        with self._cond:
            self._conn.close()

    def _give_up(self):
        with self._cond:
            deadline = self._drain_deadline
            return self._stopping and (deadline is None or time.monotonic() >= deadline)

    def _args(self, cmd, ops):
        if cmd == "unban":
            # jail and origin: the audit line names who unbanned (nftblockd >= 0.1 reads them)
            return {"targets": list(dict.fromkeys(op.target for op in ops)), "set": self.set,
                    "origin": "fail2ban", "jail": self.jail_name}
        items = {}
        for op in ops:  # the last word on an address wins
            items[op.target] = {"target": op.target, "timeout": op.timeout, "jail": self.jail_name}
        return {"targets": list(items.values()), "set": self.set, "comment": self.comment,
                "origin": "fail2ban"}

    def _report(self, cmd, ops, result):
        refused = {}
        for r in result.get("refused") or []:
            if isinstance(r, dict) and r.get("target") is not None:
                refused[str(r["target"])] = f"{r.get('code')}: {r.get('message') or ''}"
        for i, (target, why) in enumerate(sorted(refused.items())):
            if i == MAX_LOGGED:
                self._logSys.warning("[%s] nftblock: ... and %d more refused", self.jail_name,
                                     len(refused) - MAX_LOGGED)
                break
            self._logSys.warning("[%s] nftblock: nftblockd refused to %s %s (%s)", self.jail_name, cmd,
                                 target, why)
        if cmd == "unban" and result.get("not_found"):
            # Expected: the kernel let the ban expire when fail2ban's time ran out, or an operator unbanned.
            self._logSys.debug("[%s] nftblock: already gone from nftblockd: %s", self.jail_name,
                               ", ".join(map(str, result["not_found"][:MAX_LOGGED])))
        self._logSys.debug("[%s] nftblock: %s of %d addresses done", self.jail_name, cmd, len(ops))
        for op in ops:
            op.finish(refused.get(op.target))


Action = NftblockAction
