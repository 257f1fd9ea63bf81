"""The one module that speaks to the fleet server (Redis >= 6.2 or Valkey), over `redis.asyncio`.

Keys of one fleet share the hash tag `{<fleet>}`, so the MULTI blocks below stay legal on a cluster too:
- `nftblock:{F}:events`   STREAM: the ordered event log, trimmed by age (MINID ~ now - history)
- `nftblock:{F}:active`   ZSET: member = canonical address/prefix, score = end of the ban (inf = permanent)
- `nftblock:{F}:unbanned` ZSET: tombstones, score = unban time, trimmed to the history horizon

Every write is one MULTI: the stream entry and the sorted sets never disagree. `ZADD GT` keeps the later end
when two hosts ban one address. A burst is one pipelined MULTI per `CHUNK` events (one round trip).

Two connections: `cmd` (publish, snapshot, INFO) and `reader`, dedicated to `XREAD BLOCK` so a blocked read
never delays a publish. redis-py's own reconnect-and-retry is turned off: a silent reconnect could land on a
restarted or failed-over server and carry on from a cursor that means nothing there. Every connection error
surfaces as `LinkError`, and the service runs catch-up (which re-reads the server's run id) before reading on.

This module decides nothing: no gate, no reconcile, no clock (time is an argument). Connection secrets are
read from files at connect time and never logged.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from nftblockd import boundedread
from nftblockd.addr import format_target
from nftblockd.config import FleetConfig
from nftblockd.fleet.catchup import ServerView, StreamId, format_id, parse_id
from nftblockd.fleet.codec import FleetEvent, encode
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

    def __init__(self, message: str, *, not_primary: bool = False, refused: bool = False) -> None:
        super().__init__(message)
        self.not_primary = not_primary
        self.refused = refused  # the server or its TLS refused this host (credentials, certificates): not the network


@dataclass(frozen=True, slots=True)
class Keys:
    events: str
    active: str
    unbanned: str

    @classmethod
    def for_fleet(cls, name: str) -> Keys:
        base = f"nftblock:{{{name}}}"
        return cls(f"{base}:events", f"{base}:active", f"{base}:unbanned")


@dataclass(frozen=True, slots=True)
class SnapshotData:
    """What the server holds, read atomically with the stream position it corresponds to."""

    run_id: str
    last_id: StreamId
    active: dict[str, float]  # member text -> end (math.inf permanent)
    tombstones: dict[str, float]  # member text -> unban time


class Engine(Protocol):
    """What the fleet service needs from a server; `RedisLink` is the one engine today."""

    async def connect(self) -> str: ...
    async def close(self) -> None: ...
    async def server_view(self, cursor: StreamId | None = None) -> ServerView: ...
    async def scores(self, members: Sequence[str]) -> tuple[dict[str, float], dict[str, float]]: ...
    async def publish(self, events: Sequence[FleetEvent], now: float) -> None: ...
    async def read(self, after: StreamId, count: int, block_ms: int | None = None) -> Sequence[Entry]: ...
    async def snapshot(self, now: float) -> SnapshotData: ...
    async def role(self) -> str: ...


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
        self.keys = Keys.for_fleet(cfg.name)
        self.block_ms = block_ms
        self.cmd: Redis | None = None
        self.reader: Redis | None = None
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
            info = await self.cmd.execute_command("INFO", "server")
            if self.cfg.url is not None:
                kw = self.cmd.connection_pool.connection_kwargs
                self.server = f"{kw.get('host', '')}:{kw.get('port', '')}"
            else:  # the primary the Sentinels name now
                pool = self.cmd.connection_pool
                host, port = await pool.get_master_address()  # type: ignore[attr-defined]
                self.server = f"{host}:{port}"
            return _info_field(info, "run_id")
        except (rexc.RedisError, OSError) as exc:
            await self.close()
            raise _connect_error(exc, self.cfg) from None

    async def close(self) -> None:
        clients = [c for c in (self.cmd, self.reader) if c is not None]
        self.cmd = self.reader = None
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

    async def server_view(self, cursor: StreamId | None = None) -> ServerView:
        """Run id and stream bounds, and whether the stream holds the entry `cursor` names. Raises LinkError."""
        cmd = self._need(self.cmd)
        at = format_id(cursor) if cursor is not None else "0-0"
        try:
            pipe = cmd.pipeline(transaction=True)
            pipe.execute_command("INFO", "server")
            pipe.execute_command("XINFO", "STREAM", self.keys.events)
            pipe.execute_command("XRANGE", self.keys.events, at, at, "COUNT", 1)
            info, xinfo, held = await pipe.execute(raise_on_error=False)
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        finally:
            await self._done_with(cmd)
        if isinstance(info, Exception):
            raise _error(info)
        run_id = _info_field(info, "run_id")
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

    async def read(self, after: StreamId, count: int, block_ms: int | None = None) -> Sequence[Entry]:
        """Entries after `after` (at most `count`), waiting up to `block_ms` for the first. Raises LinkError."""
        reader = self._need(self.reader)
        block = self.block_ms if block_ms is None else block_ms
        try:
            r = await reader.execute_command("XREAD", "COUNT", count, "BLOCK", block, "STREAMS", self.keys.events,
                                             format_id(after))
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        finally:
            await self._done_with(reader)
        if not r:
            return []
        # RESP3: {key: [[id, [f, v, ...]], ...]}; RESP2: [[key, [[id, [f, v, ...]], ...]]]
        entries = next(iter(r.values())) if isinstance(r, dict) else r[0][1]
        # as the parser gave them: an entry's fields become a dict only if the receive loop asks for that
        # entry (a catch-up's plain bans are read a column at a time, fleet/rawread.py)
        return RawEntries(entries)

    async def snapshot(self, now: float) -> SnapshotData:
        """Active bans, tombstones, the stream's last id and the run id, in one MULTI. Raises LinkError."""
        cmd = self._need(self.cmd)
        k = self.keys
        try:
            pipe = cmd.pipeline(transaction=True)
            pipe.execute_command("INFO", "server")
            pipe.execute_command("ZRANGE", k.active, repr(now), "+inf", "BYSCORE", "WITHSCORES")
            pipe.execute_command("ZRANGE", k.unbanned, "-inf", "+inf", "BYSCORE", "WITHSCORES")
            pipe.execute_command("XINFO", "STREAM", k.events)
            info, active, tomb, xinfo = await pipe.execute(raise_on_error=False)
        except (rexc.RedisError, OSError) as exc:
            raise _error(exc) from None
        finally:
            await self._done_with(cmd)
        for r in (info, active, tomb):
            if isinstance(r, Exception):
                raise _error(r)
        if isinstance(xinfo, Exception):
            if "no such key" not in str(xinfo).lower():
                raise _error(xinfo)
            last = (0, 0)
        else:
            last = parse_id(_xget(xinfo, "last-generated-id") or "0-0")
        return SnapshotData(_info_field(info, "run_id"), last, _zmap(_pairs(active)), _zmap(_pairs(tomb)))


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


__all__ = ["BLOCK_MS", "CHUNK", "Engine", "Entry", "Keys", "LinkError", "RedisLink", "SnapshotData",
           "chunk_commands", "chunk_commands_plain", "connection_kwargs"]
