"""The one module that speaks to the fleet server (Redis >= 6.2 or Valkey), over `redis.asyncio`.

Keys (schema 2). Every key of one fleet shares the hash tag `{<fleet>}`, so the MULTI blocks below stay
legal on a cluster too. Each host H writes only keys under its own prefix, which its ACL user is limited to
(`~nftblock:{F}:h:H:*`, read-only `%R~nftblock:{F}:*` for the rest): the origin of an entry is the stream it
is in, never a field, and no member can remove, trim or overwrite another's keys (docs/fleet.md, threat model).
- `nftblock:{F}:h:H:events`   STREAM: H's bans and unbans in order, ids `*` (the server's); trimmed by age
- `nftblock:{F}:h:H:active`   ZSET: H's bans, member = canonical address/prefix, score = end (inf = permanent)
- `nftblock:{F}:h:H:unbanned` ZSET: H's unbans (tombstones), score = unban time, trimmed to the history
- `nftblock:{F}:h:H:epoch`    STRING: a token H sets at each connect; gone means the server lost H's state
- `nftblock:{F}:op:events`, `op:active`, `op:unbanned`: the operator role (its own ACL user): an operator
  unban lifts any host's ban, and removes the member from every host's `active` (it may write every key)

Every write of a host is one MULTI: its stream entry and its sorted sets never disagree. `ZADD GT` keeps the
later end when a host bans an address again. A burst is one pipelined MULTI per `CHUNK` events.

Two connections: `cmd` (publish, snapshot, INFO) and `reader`, dedicated to `XREAD BLOCK` over every member's
stream so a blocked read never delays a publish. redis-py's own reconnect-and-retry is turned off: a silent
reconnect could land on a restarted or failed-over server and carry on from cursors that mean nothing there.
Every connection error surfaces as `LinkError`, and the service runs catch-up (which re-reads the server's run
id) before reading on.

This module decides nothing: no gate, no reconcile, no clock (time is an argument). Connection secrets are
read from files at connect time and never logged.
"""

from __future__ import annotations

import asyncio  # noqa: TID251 (the IO edge to the server: a task's stop, honoured after redis-py)
import contextlib
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from nftblockd import boundedread
from nftblockd.addr import format_target
from nftblockd.config import FleetConfig
from nftblockd.config.sections import FLEET_HOST_RE
from nftblockd.fleet.catchup import ServerView, StreamId, format_id, parse_id
from nftblockd.fleet.codec import SCHEMA, FleetEvent, encode
from nftblockd.fleet.rawread import Entry, RawEntries

CHUNK = 1000  # events per MULTI: big enough to amortise the round trip, small enough not to stall the server
# The reader is the liveness probe: a silent server (a partition, a host that died without a FIN) is noticed
# when a read outlives BLOCK + grace. With 5 s + 5 s a partition was noticed after 8-10 s and a failover
# stalled as long (issue #23); an idle XREAD a second is nothing for the server.
BLOCK_MS = 1000  # XREAD BLOCK: an idle host reads again every second
READ_GRACE = 1.0  # seconds beyond BLOCK before the reader's socket gives up on a silent server
# A connect attempt during a partition waits this long for its SYN: above the kernel's first SYN retransmit
# (1 s), so a heal is met by that retransmit or by the next attempt within ~1 s.
CONNECT_TIMEOUT = 1.5
COMMAND_TIMEOUT = 5.0


class LinkError(Exception):
    """The server is unreachable, refused us, or answered something unusable (the network's fault or the
    operator's: wrong password, ACL, TLS). `str()` is a sentence without secrets. `not_primary`: the server
    answered that it is not (or no longer) the primary (READONLY, MASTERDOWN): reconnect, asking the Sentinels."""

    def __init__(self, message: str, *, not_primary: bool = False, refused: bool = False,
                 stream_full: bool = False) -> None:
        super().__init__(message)
        self.not_primary = not_primary
        self.refused = refused  # the server or its TLS refused this host (credentials, certificates): not the network
        # this host's own stream refuses appends: its last id is the last possible one (someone with this host's
        # credentials wrote it); the publisher re-creates the stream (`RedisLink.reset_stream`)
        self.stream_full = stream_full


# a stream id more than this ahead of the server's TIME is not the server's (a member may XADD an explicit id to its
# own streams): the ban receiver refuses such entries (`future_id`) and the failure counter skips them
FUTURE_MS = 60_000
OPERATOR = "@operator"  # the owner label of the operator role's keys: no host id can be it (FLEET_HOST_RE)
MAX_MEMBERS = 4096  # streams a host follows at most (a bound on what discovery takes from the server)


@dataclass(frozen=True, slots=True)
class Keys:
    """The keys of one fleet, as host `host` sees them: its own (`events` ... `epoch`) and everyone's."""

    base: str
    host: str
    events: str
    active: str
    unbanned: str
    epoch: str

    @classmethod
    def for_fleet(cls, name: str, host: str) -> Keys:
        base = f"nftblock:{{{name}}}"
        own = f"{base}:h:{host}"
        return cls(base, host, f"{own}:events", f"{own}:active", f"{own}:unbanned", f"{own}:epoch")

    def prefix(self, owner: str) -> str:
        return f"{self.base}:op" if owner == OPERATOR else f"{self.base}:h:{owner}"

    def events_of(self, owner: str) -> str:
        return self.prefix(owner) + ":events"

    def active_of(self, owner: str) -> str:
        return self.prefix(owner) + ":active"

    def unbanned_of(self, owner: str) -> str:
        return self.prefix(owner) + ":unbanned"

    @property
    def bell(self) -> str:
        """The doorbell channel: after each write a host PUBLISHes its id there (a hint, not data)."""
        return f"{self.base}:bell"

    @property
    def stream_pattern(self) -> str:
        return f"{self.base}:h:*:events"

    def owner_of(self, key: bytes | str) -> str | None:
        """The owner of a stream key, read strictly: a host's (`...:h:<host id>:events`, the id as the config
        allows it) or the operator's; anything else (`h:c:x:events`, which C's key pattern lets it create) is
        None, never followed."""
        k = key.decode("ascii", "replace") if isinstance(key, bytes) else key
        if k == f"{self.base}:op:events":
            return OPERATOR
        head, tail = f"{self.base}:h:", ":events"
        if not (k.startswith(head) and k.endswith(tail)):
            return None
        host = k[len(head):-len(tail)]
        return host if FLEET_HOST_RE.fullmatch(host) else None


@dataclass(frozen=True, slots=True)
class SnapshotPart:
    """What the server holds for one owner, read atomically with its stream's last id."""

    last_id: StreamId
    active: dict[str, float]  # member text -> end (math.inf permanent)
    tombstones: dict[str, float]  # member text -> unban time


@dataclass(frozen=True, slots=True)
class SnapshotData:
    run_id: str
    parts: dict[str, SnapshotPart]  # owner -> what its keys hold


@dataclass(frozen=True, slots=True)
class OwnHealth:
    """What the server holds of this host's own keys (the healing check, `FleetService._heal`)."""

    epoch: str | None  # the token set at connect; None: gone (the server lost this host's state)
    active: int  # members of the own `active` set still running
    last_id: StreamId | None  # the own stream's last generated id; None: no stream
    server_ms: int  # the server's TIME, in ms


class Engine(Protocol):
    """What the fleet service needs from a server; `RedisLink` is the one engine today. Owners are host ids
    and `OPERATOR`; every write goes to this host's own keys."""

    async def connect(self) -> str: ...
    async def close(self) -> None: ...
    async def members(self) -> list[str]: ...
    async def server_views(self, cursors: Mapping[str, StreamId | None]) -> tuple[int, dict[str, ServerView]]: ...
    async def scores(self, members: Sequence[str]) -> tuple[dict[str, float], dict[str, float]]: ...
    async def publish(self, events: Sequence[FleetEvent], now: float) -> None: ...
    async def read(self, after: Mapping[str, StreamId], count: int, block_ms: int | None = None
                   ) -> list[tuple[str, Sequence[Entry]]]: ...
    async def snapshot(self, owners: Sequence[str], now: float) -> SnapshotData: ...
    async def health(self, now: float) -> OwnHealth: ...
    async def mark_epoch(self, token: str) -> None: ...
    async def reset_stream(self) -> None: ...
    async def announce(self) -> None: ...
    async def role(self) -> str: ...


def honour_cancel() -> None:
    """Raise CancelledError if the current task was asked to stop. redis-py can swallow a CancelledError that
    lands while it waits for a reply (seen with XREAD BLOCK on 8.1 and 8.2, about one stop in ten): the request
    is still counted on the task, so every call into redis-py that a loop repeats is followed by this check, or
    the loop goes round again and its stop waits forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _password(cfg: FleetConfig) -> str | None:
    if cfg.password_file is None:
        return None
    try:
        return boundedread.read_text(cfg.password_file, boundedread.SECRET_MAX_BYTES).strip()
    except OSError as exc:
        raise LinkError(f"cannot read the fleet password file {cfg.password_file}: {exc.strerror}") from None


def connection_kwargs(cfg: FleetConfig) -> dict[str, Any]:
    """Keyword arguments for every connection to the server (and, for TLS, to the Sentinels)."""
    kw: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
        "client_name": None,
    }
    if cfg.username is not None:
        kw["username"] = cfg.username
    pw = _password(cfg)
    if pw is not None:
        kw["password"] = pw
    if cfg.tls is not None:
        kw["ssl"] = True
        if cfg.tls.ca:
            kw["ssl_ca_certs"] = cfg.tls.ca
        if cfg.tls.cert:
            kw["ssl_certfile"] = cfg.tls.cert
            kw["ssl_keyfile"] = cfg.tls.key
    return kw


# TLS failures as redis-py reports them (a ConnectionError around the ssl module's text) -> what to check
_TLS = (
    ("CERTIFICATE_VERIFY_FAILED", "the server's certificate is not trusted by fleet.tls.ca"),
    ("CERTIFICATE_EXPIRED", "the server refused this host's certificate (fleet.tls.cert): it has expired"),
    ("CERTIFICATE_REQUIRED", "the server requires a client certificate: set fleet.tls.cert and fleet.tls.key"),
    ("UNKNOWN_CA", "the server does not trust this host's certificate (fleet.tls.cert): signed by another CA"),
    ("BAD_CERTIFICATE", "the server refused this host's certificate (fleet.tls.cert)"),
    ("WRONG_VERSION_NUMBER", "TLS to a port that does not speak it (or plain text to a TLS port)"),
)


# How a connection the peer dropped reads in redis-py's and the ssl module's words
_DROPPED = ("reset by peer", "Connection closed by server", "EOF occurred", "Broken pipe")


def _connect_error(exc: BaseException, cfg: FleetConfig) -> LinkError:
    """`_error` for a failed connect. With TLS 1.3 a server that refuses a client certificate (none, expired,
    another CA) sends its alert after the client's side of the handshake is done: whether the client reads the
    alert or only sees the connection dropped at its first command is a race (both seen on loopback, the drop
    more often on a loaded machine). A TLS host dropped at once is told what to check, whichever way it went."""
    err = _error(exc)
    if err.refused or cfg.tls is None or not any(marker in str(exc) for marker in _DROPPED):
        return err
    if not cfg.tls.cert:
        return LinkError("TLS: the server dropped the connection at once, as one that requires a client "
                         f"certificate does: set fleet.tls.cert and fleet.tls.key ({exc})", refused=True)
    return LinkError("TLS: the server dropped the connection right after the handshake, as one that refuses this "
                     "host's certificate does: check fleet.tls.cert (expired, or signed by another CA than the "
                     f"server trusts) ({exc})", refused=True)


def _error(exc: BaseException) -> LinkError:
    if isinstance(exc, rexc.AuthenticationError | rexc.AuthorizationError):
        return LinkError(f"the fleet server refused our credentials: {exc}", refused=True)
    text = str(exc)
    for marker, sentence in _TLS:
        if marker in text:  # one sentence the operator can act on, the library's text after it
            return LinkError(f"TLS: {sentence} ({text})", refused=True)
    if isinstance(exc, rexc.NoPermissionError):
        return LinkError(f"the fleet server's ACL refused a command: {exc}", refused=True)
    # (a pipeline's error names the command first: "Command # 2 (XADD ...) of pipeline caused error: ...")
    if isinstance(exc, rexc.ReadOnlyError) or "MASTERDOWN" in str(exc):
        return LinkError(f"the fleet server is not the primary: {exc}", not_primary=True)
    if "exhausted the last possible ID" in text or "equal or smaller than the target stream top item" in text:
        return LinkError(f"this host's fleet stream refuses appends ({exc})", stream_full=True)
    if "NOREPLICAS" in str(exc):
        return LinkError(f"the fleet server refused the write: not enough replicas ({exc})")
    return LinkError(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def _f(v: bytes | str | float) -> float:
    if isinstance(v, float | int):
        return float(v)
    s = v.decode() if isinstance(v, bytes) else v
    return math.inf if s in ("inf", "+inf") else float(s)


def _zmap(pairs: Any) -> dict[str, float]:
    return {(m.decode() if isinstance(m, bytes) else str(m)): _f(s) for m, s in pairs}


def _info_field(info: Any, key: str) -> str:
    if isinstance(info, dict):
        return str(info.get(key, ""))
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return ""


class RedisLink:
    """`Engine` over redis.asyncio: a plain server (`url`) or the primary named by Sentinels."""

    def __init__(self, cfg: FleetConfig, *, block_ms: int = BLOCK_MS, extra: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        self.extra = extra or {}  # more connection kwargs (the benchmark picks the reply parser this way)
        self.keys = Keys.for_fleet(cfg.name, cfg.host_id)
        self.block_ms = block_ms
        self.cmd: Redis | None = None
        self.reader: Redis | None = None
        self._bell: PubSub | None = None  # subscribed to the doorbell, on a connection of the reader's pool
        self._hints: set[str] = set()  # owners rung since the last read of them
        self._swept_at = -math.inf  # (monotonic) the last XREAD over every followed stream
        self.server = ""  # host:port we talk to, for status

    def _clients(self) -> tuple[Redis, Redis]:
        kw = connection_kwargs(self.cfg) | self.extra
        read_timeout = self.block_ms / 1000 + READ_GRACE
        if self.cfg.url is not None:
            # with a URL the scheme picks the connection class: TLS settings mean rediss://
            url = self.cfg.url
            if kw.pop("ssl", False) and url.startswith("redis://"):
                url = "rediss://" + url[len("redis://"):]
            cmd = Redis.from_url(url, socket_timeout=COMMAND_TIMEOUT, **kw)
            reader = Redis.from_url(url, socket_timeout=read_timeout, **kw)
            return cmd, reader
        skw: dict[str, Any] = {"socket_connect_timeout": CONNECT_TIMEOUT, "socket_timeout": COMMAND_TIMEOUT}
        for k in ("ssl", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            if k in kw:
                skw[k] = kw[k]
        # its Sentinel clients are closed with the primary's clients (`_close_client`)
        sentinel = Sentinel(list(self.cfg.sentinel_hosts), sentinel_kwargs=skw)
        svc = self.cfg.sentinel_service
        return (sentinel.master_for(svc, socket_timeout=COMMAND_TIMEOUT, **kw),
                sentinel.master_for(svc, socket_timeout=read_timeout, **kw))

    async def connect(self) -> str:
        """Open both connections and return the server's run id. Raises LinkError."""
        await self.close()
        try:
            self.cmd, self.reader = self._clients()
            # XREAD's reply as the parser hands it: redis-py's callback rebuilt every entry through Python
            # helpers (10 % of a 100k replay); `read` takes the two shapes itself
            self.reader.set_response_callback("XREAD", _raw)
            await self.cmd.ping()
            await self.reader.ping()
            self._bell = self.reader.pubsub(ignore_subscribe_messages=True)
            await self._bell.subscribe(self.keys.bell)
            self._hints.clear()
            self._swept_at = -math.inf
            info = await self.cmd.execute_command("INFO", "server")
            if self.cfg.url is not None:
                kw = self.cmd.connection_pool.connection_kwargs
                self.server = f"{kw.get('host', '')}:{kw.get('port', '')}"
            else:  # the primary the Sentinels name now
                pool = self.cmd.connection_pool
                host, port = await pool.get_master_address()  # type: ignore[attr-defined]
                self.server = f"{host}:{port}"
            run_id = _info_field(info, "run_id")
        except (rexc.RedisError, OSError) as exc:
            await self.close()
            raise _connect_error(exc, self.cfg) from None
        honour_cancel()  # the receive loop connects again after an error: a lost stop would loop for ever
        return run_id

    async def close(self) -> None:
        clients = [c for c in (self.cmd, self.reader) if c is not None]
        bell, self._bell = self._bell, None
        self.cmd = self.reader = None
        if bell is not None:
            with contextlib.suppress(rexc.RedisError, OSError):
                await bell.aclose()
        for c in clients:
            await _close_client(c)

    def _need(self, c: Redis | None) -> Redis:
        if c is None:
            raise LinkError("not connected to the fleet server")
        return c

    async def _done_with(self, c: Redis) -> None:
        """After a call that used client `c`: if the link was closed or reconnected meanwhile, close `c` again.
        The receiver closes the link on an error while the publisher may be between two chunks of a publish;
        the next chunk, sent through the closed client, makes its pool open a new connection that nothing
        would ever close (one socket per reconnect under traffic, found left open at the end of a test run)."""
        if c is not self.cmd and c is not self.reader:
            await _close_client(c)

    async def role(self) -> str:
        cmd = self._need(self.cmd)
        try:
            r = await cmd.execute_command("ROLE")
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        finally:
            await self._done_with(cmd)
        role = r[0]
        return role.decode() if isinstance(role, bytes) else str(role)

    async def members(self) -> list[str]:
        """The owners whose stream exists (hosts and the operator): SCAN of the stream keys (TYPE stream), at
        most MAX_MEMBERS. Raises LinkError."""
        cmd = self._need(self.cmd)
        owners: set[str] = set()
        try:
            cursor: Any = 0
            while True:
                cursor, keys = await cmd.scan(cursor, match=self.keys.stream_pattern, count=1000, _type="STREAM")
                for k in keys:
                    o = self.keys.owner_of(k)
                    if o is not None and len(owners) < MAX_MEMBERS:
                        owners.add(o)
                if int(cursor) == 0:
                    break
            if await cmd.exists(self.keys.events_of(OPERATOR)):
                owners.add(OPERATOR)
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        finally:
            await self._done_with(cmd)
        return sorted(owners)

    async def server_views(self, cursors: Mapping[str, StreamId | None]) -> tuple[int, dict[str, ServerView]]:
        """The server's TIME (ms) and, per owner, its stream's bounds and whether it holds the entry the cursor
        names (one MULTI). Raises LinkError."""
        cmd = self._need(self.cmd)
        owners = list(cursors)
        try:
            pipe = cmd.pipeline(transaction=True)
            pipe.execute_command("INFO", "server")
            pipe.execute_command("TIME")
            for o in owners:
                c = cursors[o]
                at = format_id(c) if c is not None else "0-0"
                pipe.execute_command("XINFO", "STREAM", self.keys.events_of(o))
                pipe.execute_command("XRANGE", self.keys.events_of(o), at, at, "COUNT", 1)
            replies = await pipe.execute(raise_on_error=False)
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        finally:
            await self._done_with(cmd)
        info, t = replies[0], replies[1]
        for r in (info, t):
            if isinstance(r, Exception):
                raise _error(r)
        run_id = _info_field(info, "run_id")
        views = {o: _view(run_id, cursors[o], replies[2 + 2 * i], replies[3 + 2 * i]) for i, o in enumerate(owners)}
        return _time_ms(t), views

    async def scores(self, members: Sequence[str]) -> tuple[dict[str, float], dict[str, float]]:
        """The `active` ends and the tombstones the server holds for `members` (one ZMSCORE each, per CHUNK, in
        one MULTI): what a re-assert compares this host's own bans with, without a snapshot. Raises LinkError."""
        active: dict[str, float] = {}
        tombs: dict[str, float] = {}
        if not members:
            return active, tombs
        cmd = self._need(self.cmd)
        try:
            pipe = cmd.pipeline(transaction=True)
            for i in range(0, len(members), CHUNK):
                part = members[i:i + CHUNK]
                pipe.execute_command("ZMSCORE", self.keys.active, *part)
                pipe.execute_command("ZMSCORE", self.keys.unbanned, *part)
            replies = await pipe.execute(raise_on_error=False)
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        finally:
            await self._done_with(cmd)
        for j, r in enumerate(replies):
            if isinstance(r, Exception):
                raise _error(r)
            part = members[(j // 2) * CHUNK:(j // 2 + 1) * CHUNK]
            into = active if j % 2 == 0 else tombs
            for m, v in zip(part, r, strict=True):
                if v is not None:
                    into[m] = _f(v)
        return active, tombs

    async def publish(self, events: Sequence[FleetEvent], now: float) -> None:
        """Append `events` in order, one MULTI (one round trip) per CHUNK. Raises LinkError."""
        if not events:
            return
        cmd = self._need(self.cmd)
        minid = str(max(0, int((now - self.cfg.history) * 1000)))
        try:
            for i in range(0, len(events), CHUNK):
                pipe = cmd.pipeline(transaction=True)
                for args in chunk_commands(events[i:i + CHUNK], self.keys, minid, now, self.cfg.history):
                    pipe.execute_command(*args)
                try:
                    replies = await pipe.execute(raise_on_error=False)
                except (rexc.RedisError, OSError) as exc:
                    raise _error(exc) from None
                for r in replies:
                    if isinstance(r, Exception):
                        raise _error(r)
        finally:
            await self._done_with(cmd)

    async def read(self, after: Mapping[str, StreamId], count: int, block_ms: int | None = None
                   ) -> list[tuple[str, Sequence[Entry]]]:
        """Entries after each owner's cursor (at most `count` per stream), waiting up to `block_ms` for the
        first: (owner, entries) for each stream that has some. Raises LinkError.

        Followers do not block in XREAD over every stream: a blocked XREAD is run again over all its streams
        each time one of them gets an entry, so with H hosts each publish cost the server H XREADs over H
        streams (1,000 hosts: 0.57 ms each, 0.57 s per publish, bench_fleet_hosts.py). They wait for the
        doorbell instead (each host PUBLISHes its id in every publish MULTI) and read only the streams rung,
        without BLOCK; every `sweep_every` seconds, and whenever `block_ms` passes without a ring, one XREAD over
        every stream catches anything a ring did not announce (it is also the liveness probe: a silent server
        fails it). A ring is a hint, never data: a forged one costs one XREAD of that stream."""
        reader = self._need(self.reader)
        bell = self._bell
        if bell is None:
            raise LinkError("not connected to the fleet server")
        block = (self.block_ms if block_ms is None else block_ms) / 1000
        try:
            if self._hints:
                rung, self._hints = [o for o in self._hints if o in after], set()
                if rung:
                    got = await self._xread(reader, after, rung, count)
                    if got:
                        return got
            wait = min(block, self._swept_at + self.sweep_every(len(after)) - time.monotonic())
            msg = await bell.get_message(timeout=max(0.0, wait)) if wait > 0 else None
            if msg is None:
                self._swept_at = time.monotonic()
                return await self._xread(reader, after, list(after), count)
            while msg is not None:  # every ring already here: one read of the streams rung
                data = msg.get("data") if isinstance(msg, dict) else None
                if isinstance(data, bytes | str):
                    self._hints.add(data.decode("ascii", "replace") if isinstance(data, bytes) else data)
                msg = await bell.get_message(timeout=0.0)
            rung, self._hints = [o for o in self._hints if o in after], set()
            return await self._xread(reader, after, rung, count) if rung else []
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        finally:
            await self._done_with(reader)

    @staticmethod
    def sweep_every(streams: int) -> float:
        """Seconds between two XREADs over every stream: 1 s, more in a large fleet (2 ms per stream: at 1,000
        hosts each sweep costs the server ~0.6 ms, every 2 s)."""
        return max(1.0, streams * 0.002)

    async def _xread(self, reader: Redis, after: Mapping[str, StreamId], owners: list[str], count: int
                     ) -> list[tuple[str, Sequence[Entry]]]:
        r = await reader.execute_command("XREAD", "COUNT", count, "STREAMS",
                                         *[self.keys.events_of(o) for o in owners],
                                         *[format_id(after[o]) for o in owners])
        if not r:
            return []
        # RESP3: {key: [[id, [f, v, ...]], ...]}; RESP2: [[key, [[id, [f, v, ...]], ...]], ...]
        pairs = r.items() if isinstance(r, dict) else ((p[0], p[1]) for p in r)
        out: list[tuple[str, Sequence[Entry]]] = []
        for key, entries in pairs:
            owner = self.keys.owner_of(key)
            if owner is not None and owner in after and entries:
                # as the parser gave them: an entry's fields become a dict only if the receive loop asks for
                # that entry (a catch-up's plain bans are read a column at a time, fleet/rawread.py)
                out.append((owner, RawEntries(entries)))
                if len(entries) >= count:  # a backlog: read on at once, not at the next ring or sweep
                    self._hints.add(owner)
        return out

    async def snapshot(self, owners: Sequence[str], now: float) -> SnapshotData:
        """Per owner: its running bans, its tombstones and its stream's last id, with the run id, in one MULTI.
        Raises LinkError."""
        cmd = self._need(self.cmd)
        k = self.keys
        try:
            pipe = cmd.pipeline(transaction=True)
            pipe.execute_command("INFO", "server")
            for o in owners:
                pipe.execute_command("ZRANGE", k.active_of(o), repr(now), "+inf", "BYSCORE", "WITHSCORES")
                pipe.execute_command("ZRANGE", k.unbanned_of(o), "-inf", "+inf", "BYSCORE", "WITHSCORES")
                pipe.execute_command("XINFO", "STREAM", k.events_of(o))
            replies = await pipe.execute(raise_on_error=False)
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        finally:
            await self._done_with(cmd)
        info = replies[0]
        if isinstance(info, Exception):
            raise _error(info)
        parts: dict[str, SnapshotPart] = {}
        for i, o in enumerate(owners):
            active, tomb, xinfo = replies[1 + 3 * i:4 + 3 * i]
            for r in (active, tomb):
                if isinstance(r, Exception):
                    raise _error(r)
            if isinstance(xinfo, Exception):
                if "no such key" not in str(xinfo).lower():
                    raise _error(xinfo)
                last = (0, 0)
            else:
                last = parse_id(_xget(xinfo, "last-generated-id") or "0-0")
            parts[o] = SnapshotPart(last, _zmap(_pairs(active)), _zmap(_pairs(tomb)))
        return SnapshotData(_info_field(info, "run_id"), parts)

    async def health(self, now: float) -> OwnHealth:
        """The epoch token, the count of running own bans and the own stream's last id, with the server's
        TIME (one MULTI). Raises LinkError."""
        cmd = self._need(self.cmd)
        k = self.keys
        try:
            pipe = cmd.pipeline(transaction=True)
            pipe.execute_command("GET", k.epoch)
            pipe.execute_command("ZCOUNT", k.active, f"({now!r}", "+inf")
            pipe.execute_command("XINFO", "STREAM", k.events)
            pipe.execute_command("TIME")
            epoch, active, xinfo, t = await pipe.execute(raise_on_error=False)
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        finally:
            await self._done_with(cmd)
        for r in (epoch, active, t):
            if isinstance(r, Exception):
                raise _error(r)
        last: StreamId | None = None
        if isinstance(xinfo, Exception):
            if "no such key" not in str(xinfo).lower():
                raise _error(xinfo)
        else:
            last = parse_id(_xget(xinfo, "last-generated-id") or "0-0")
        token = epoch.decode("ascii", "replace") if isinstance(epoch, bytes) else epoch
        return OwnHealth(token, int(active), last, _time_ms(t))

    async def mark_epoch(self, token: str) -> None:
        await self._own_write(["SET", self.keys.epoch, token])

    async def reset_stream(self) -> None:
        """Delete this host's own stream (it refuses appends, or its ids run ahead of the server's clock): the
        next publish makes it again with the server's ids, and the re-assert fills it."""
        await self._own_write(["DEL", self.keys.events])

    async def announce(self) -> None:
        """Make this host's stream exist (empty: the entry is trimmed by the same command), so the others'
        discovery follows it before its first ban."""
        await self._own_write(["XADD", self.keys.events, "MAXLEN", "0", "*", "v", SCHEMA])

    async def _own_write(self, args: list[Any]) -> None:
        cmd = self._need(self.cmd)
        try:
            await cmd.execute_command(*args)
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        finally:
            await self._done_with(cmd)


def _time_ms(t: Any) -> int:
    """TIME's reply ([seconds, microseconds] as bytes, or the tuple redis-py's callback makes) in ms."""
    return int(t[0]) * 1000 + int(t[1]) // 1000


def _view(run_id: str, cursor: StreamId | None, xinfo: Any, held: Any) -> ServerView:
    holds = cursor is not None and isinstance(held, list) and len(held) == 1
    if isinstance(xinfo, rexc.ResponseError) and "no such key" in str(xinfo).lower():
        return ServerView(run_id, None, (0, 0))
    if isinstance(xinfo, Exception):
        raise _error(xinfo)
    first = _xget(xinfo, "first-entry")
    first_id = parse_id(first[0]) if first else None
    last_gen = parse_id(_xget(xinfo, "last-generated-id") or "0-0")
    added, length = _xget(xinfo, "entries-added"), _xget(xinfo, "length")
    removed = int(added) - int(length) if added is not None and length is not None else None
    return ServerView(run_id, first_id, last_gen, removed, holds)


async def _close_client(c: Redis) -> None:
    """Close a client and every connection of its pool, in use or idle, and for a client of the primary the
    Sentinels name, the Sentinel clients it asks: a call that outlived the link's close reconnects through
    them too (`RedisLink._done_with`). A failing close is not an error."""
    with contextlib.suppress(rexc.RedisError, OSError):
        await c.aclose()
    with contextlib.suppress(rexc.RedisError, OSError):
        await c.connection_pool.disconnect()
    manager = getattr(c.connection_pool, "sentinel_manager", None)
    for sentinel in list(getattr(manager, "sentinels", ())):
        await _close_client(sentinel)


def chunk_commands(events: Sequence[FleetEvent], k: Keys, minid: str, now: float, history: float
                   ) -> list[list[Any]]:
    """The commands of one MULTI that publishes `events` in order.

    Every event is one XADD; the sorted sets are written once per run of consecutive bans (one `ZADD GT` with
    all their (end, member) pairs, one `ZREM` of their tombstones) or unbans (one `ZREM` from `active`, one
    `ZADD` of tombstones): within a run the order does not matter (GT keeps the later end of duplicates) and
    runs keep theirs. Per event ZADD + ZREM (three commands and six replies per ban, counting QUEUED) made
    redis-py's packing and reply parsing 70 % of publishing a burst; `chunk_commands_plain` is that form,
    kept as the reference the tests hold this one to."""
    out: list[list[Any]] = []
    head = ["XADD", k.events, "MINID", "~", minid, "*"]
    run_op = ""
    pairs: list[str] = []
    members: list[str] = []

    def flush() -> None:
        if not members:
            return
        if run_op == "ban":
            out.append(["ZADD", k.active, "GT", *pairs])
            out.append(["ZREM", k.unbanned, *members])
        else:
            out.append(["ZREM", k.active, *members])
            out.append(["ZADD", k.unbanned, *[x for m in members for x in (repr(now), m)]])
        pairs.clear()
        members.clear()

    for ev in events:
        fields = encode(ev)
        if ev.op != run_op:
            flush()
            run_op = ev.op
        out.append(head + [x for kv in fields.items() for x in kv])
        member = fields["net"]
        members.append(member)
        if ev.op == "ban":
            pairs += (fields["until"].replace("inf", "+inf"), member)
    flush()
    out.append(["ZREMRANGEBYSCORE", k.active, "-inf", f"({now!r}"])
    if any(ev.op == "unban" for ev in events):
        out.append(["ZREMRANGEBYSCORE", k.unbanned, "-inf", f"({now - history!r}"])
    out.append(["PUBLISH", k.bell, k.host])  # (at EXEC, after the entries: a follower woken by it finds them)
    return out


def chunk_commands_plain(events: Sequence[FleetEvent], k: Keys, minid: str, now: float, history: float
                         ) -> list[list[Any]]:
    """The reference form of `chunk_commands`: the sorted sets written per event."""
    out: list[list[Any]] = []
    for ev in events:
        fields = encode(ev)
        out.append(["XADD", k.events, "MINID", "~", minid, "*", *[x for kv in fields.items() for x in kv]])
        member = format_target(ev.net)
        if ev.op == "ban":
            out.append(["ZADD", k.active, "GT", fields["until"].replace("inf", "+inf"), member])
            out.append(["ZREM", k.unbanned, member])
        else:
            out.append(["ZREM", k.active, member])
            out.append(["ZADD", k.unbanned, repr(now), member])
    out.append(["ZREMRANGEBYSCORE", k.active, "-inf", f"({now!r}"])
    if any(ev.op == "unban" for ev in events):
        out.append(["ZREMRANGEBYSCORE", k.unbanned, "-inf", f"({now - history!r}"])
    out.append(["PUBLISH", k.bell, k.host])
    return out


def _raw(response: Any, **_options: Any) -> Any:
    return response


def _xget(d: Any, key: str) -> Any:
    """A field of an XINFO reply, whichever way the parser keyed it (bytes by default, str when decoding)."""
    if isinstance(d, list) and len(d) % 2 == 0:
        # redis-py 6.1 (Debian 13's python3-redis) applies no callback to `XINFO STREAM` sent through
        # execute_command (8.x does): the reply stays the flat [field, value, ...] list
        d = dict(zip(d[::2], d[1::2], strict=True))
    if not isinstance(d, dict):
        raise LinkError(f"unexpected XINFO reply: {type(d).__name__}")
    v = d.get(key.encode())
    return d.get(key) if v is None else v


def _pairs(r: Any) -> list[tuple[Any, Any]]:
    """ZRANGE ... WITHSCORES as (member, score) pairs, whether the parser paired them or not."""
    if r and not isinstance(r[0], list | tuple):
        return list(zip(r[::2], r[1::2], strict=True))
    return [tuple(p) for p in r]


__all__ = ["BLOCK_MS", "CHUNK", "MAX_MEMBERS", "OPERATOR", "Engine", "Entry", "Keys", "LinkError", "OwnHealth",
           "RedisLink", "SnapshotData", "SnapshotPart", "chunk_commands", "chunk_commands_plain",
           "connection_kwargs"]
