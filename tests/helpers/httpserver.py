"""A real HTTP server on 127.0.0.1 for feed tests (aiohttp.web, in the test's own event loop).

Each path serves a `Route` that a test sets and changes between fetches: a body, a status, validators that
turn matching conditional requests into 304s, gzip Content-Encoding, a response that never comes (for
timeouts) and a streamed body of any size without Content-Length (for the size cap). Every request's headers
are recorded. Nothing leaves loopback; the port is chosen by the kernel.

    async with FeedServer() as srv:
        srv.route("/drop.txt", body=b"1.2.3.0/24\\n", etag='"v1"')
        url = srv.url("/drop.txt")
"""

from __future__ import annotations

import asyncio
import gzip
from dataclasses import dataclass, field
from types import TracebackType

from aiohttp import web


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    etag: str | None = None  # sent as ETag; a request with a matching If-None-Match gets 304
    last_modified: str | None = None  # sent as Last-Modified; an equal If-Modified-Since gets 304
    gzip: bool = False  # Content-Encoding: gzip
    hang: bool = False  # never answer (until the server stops)
    stream: int | None = None  # send this many filler bytes in chunks, without Content-Length


@dataclass(frozen=True)
class Seen:
    path: str
    headers: dict[str, str]


class FeedServer:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[Seen] = []
        self.streamed = 0  # filler bytes actually written by `stream` routes
        self._release = asyncio.Event()
        self.hanging = asyncio.Event()  # set when a request to a `hang` route is being held
        self._runner: web.AppRunner | None = None
        self.port = 0

    def route(self, path: str, body: bytes | str = b"", **kw: object) -> Route:
        r = Route(body=body.encode() if isinstance(body, str) else body, **kw)  # type: ignore[arg-type]
        self.routes[path] = r
        return r

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def hits(self, path: str) -> list[Seen]:
        return [s for s in self.requests if s.path == path]

    async def __aenter__(self) -> FeedServer:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(Seen(request.path, dict(request.headers)))
        r = self.routes.get(request.path)
        if r is None:
            return web.Response(status=404, text="not found\n")
        if r.hang:
            self.hanging.set()
            await self._release.wait()
            return web.Response(status=503)
        headers = dict(r.headers)
        if r.etag:
            headers["ETag"] = r.etag
        if r.last_modified:
            headers["Last-Modified"] = r.last_modified
        if r.status == 200 and self._not_modified(request, r):
            return web.Response(status=304, headers=headers)
        if r.stream is not None:
            return await self._stream(request, r.stream, headers)
        body = r.body
        if r.gzip:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        return web.Response(status=r.status, body=body, headers=headers)

    @staticmethod
    def _not_modified(request: web.Request, r: Route) -> bool:
        inm = request.headers.get("If-None-Match")
        if r.etag and inm is not None:
            return inm == r.etag
        ims = request.headers.get("If-Modified-Since")
        return bool(r.last_modified and ims == r.last_modified)

    async def _stream(self, request: web.Request, size: int, headers: dict[str, str]) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=headers)
        await resp.prepare(request)
        chunk = b"1.2.3.4\n" * 8192  # 64 KiB of valid lines: only the cap can reject this body
        sent = 0
        try:
            while sent < size:  # bounded by `size`
                piece = chunk[: size - sent]
                await resp.write(piece)
                sent += len(piece)
                self.streamed += len(piece)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client hung up at its cap, as it should
        return resp
