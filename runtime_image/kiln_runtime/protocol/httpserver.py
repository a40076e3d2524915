"""A lean HTTP/1.1 server: asyncio protocol + httptools parser, nothing per request but parsing.

Frameworks spend more per request than a small model's forward pass; this server parses with
httptools (C), keeps connections alive, answers pipelined requests in order, refuses a body
larger than the limit before reading it, and hands each request to ``RestAdapter.handle``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass, field

import httptools

from kiln_runtime.protocol.rest import HttpResponse, RestAdapter, json_response

log = logging.getLogger(__name__)

_REASONS = {
    100: b"Continue", 200: b"OK", 400: b"Bad Request", 404: b"Not Found",
    405: b"Method Not Allowed", 429: b"Too Many Requests", 500: b"Internal Server Error",
    503: b"Service Unavailable", 504: b"Gateway Timeout",
}  # fmt: skip


@dataclass
class _Request:
    method: str = ""
    url: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    keep_alive: bool = True


class HttpConnection(asyncio.Protocol):
    def __init__(self, adapter: RestAdapter, connections: set[HttpConnection]) -> None:
        self._adapter = adapter
        self._connections = connections
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._current = _Request()
        self._pending: collections.deque[_Request] = collections.deque()
        self._worker: asyncio.Task[None] | None = None
        self._refusing = False  # an oversized body is being discarded; the connection closes

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        self._transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as error:
            if not self._refusing:
                self._fail(400, f"malformed HTTP request: {error}")

    # httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._current = _Request()

    def on_url(self, url: bytes) -> None:
        self._current.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._current.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        request = self._current
        request.method = self._parser.get_method().decode("ascii", "replace")
        request.keep_alive = self._parser.should_keep_alive()
        length = request.headers.get("content-length", "0")
        limit = self._adapter.max_body
        if length.isdigit() and int(length) > limit:
            self._fail(400, f"request body of {length} bytes exceeds the limit of {limit} bytes")
            return
        if request.headers.get("expect", "").lower() == "100-continue" and self._transport:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._refusing:
            return
        request = self._current
        request.size += len(body)
        if request.size > self._adapter.max_body:
            self._fail(400, f"request body exceeds the limit of {self._adapter.max_body} bytes")
            return
        request.chunks.append(body)

    def on_message_complete(self) -> None:
        if self._refusing:
            return
        self._pending.append(self._current)
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._serve_pending())

    # answering -------------------------------------------------------------------------------

    async def _serve_pending(self) -> None:
        try:
            while self._pending and self._transport is not None:
                request = self._pending.popleft()
                body = request.chunks[0] if len(request.chunks) == 1 else b"".join(request.chunks)
                try:
                    response = await self._adapter.handle(
                        request.method, request.url.decode("latin-1"), request.headers, body
                    )
                except Exception:
                    log.exception("unhandled error answering %s %r", request.method, request.url)
                    response = json_response(500, {"error": "internal error; see server log"})
                self._write(response, request.keep_alive)
                if not request.keep_alive and self._transport is not None:
                    self._transport.close()
        finally:
            self._worker = None

    def _write(self, response: HttpResponse, keep_alive: bool) -> None:
        if self._transport is None:
            return
        length = sum(memoryview(part).nbytes for part in response.body)
        head = [
            b"HTTP/1.1 %d %s\r\n" % (response.status, _REASONS.get(response.status, b"")),
            b"Content-Type: %s\r\nContent-Length: %d\r\n" % (response.content_type, length),
        ]
        for name, value in response.extra_headers:
            head.append(b"%s: %s\r\n" % (name, value))
        if not keep_alive:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        self._transport.writelines([b"".join(head), *response.body])

    def _fail(self, status: int, message: str) -> None:
        """Answer at once and close: the rest of this connection's bytes cannot be trusted."""
        self._refusing = True
        self._write(json_response(status, {"error": message}), keep_alive=False)
        if self._transport is not None:
            self._transport.close()

    def close(self) -> None:
        if self._transport is not None and self._worker is None:
            self._transport.close()


class HttpServer:
    """Owns the listening socket and the open connections."""

    def __init__(self, adapter: RestAdapter) -> None:
        self._adapter = adapter
        self._connections: set[HttpConnection] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpConnection(self._adapter, self._connections), host, port, backlog=1024
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and close idle connections (the caller drained in-flight work)."""
        if self._server is not None:
            self._server.close()
            for connection in list(self._connections):
                connection.close()
            await self._server.wait_closed()
