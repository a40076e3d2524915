"""A lean HTTP/1.1 server: asyncio protocol + httptools parser, bounded against careless clients.

Frameworks spend more per request than a small model's forward pass; this server parses with
httptools (C), keeps connections alive, answers pipelined requests in order and hands each
request to ``RestAdapter.handle``. Every input is bounded (``config.HttpLimits``, documented in
docs/runtime.md): connections per port (with a budget kept for health probes), header bytes
counted as they arrive, header/body/keep-alive/write timeouts, and the bytes one connection and
the whole process may hold in buffered requests and responses. A client that stops reading its
answers is not read either: writing pauses the connection (``pause_writing``), and so does a
pipeline deeper than the limit.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass, field
from typing import Protocol, cast

import httptools

from kiln_runtime.config import HttpLimits
from kiln_runtime.protocol.http2.budgets import HealthReserve
from kiln_runtime.protocol.listening import listening_port
from kiln_runtime.protocol.rest import HttpResponse, json_response

log = logging.getLogger(__name__)

_REASONS = {
    100: b"Continue", 200: b"OK", 400: b"Bad Request", 404: b"Not Found",
    405: b"Method Not Allowed", 408: b"Request Timeout", 413: b"Content Too Large",
    429: b"Too Many Requests", 431: b"Request Header Fields Too Large",
    500: b"Internal Server Error", 503: b"Service Unavailable", 504: b"Gateway Timeout",
}  # fmt: skip
HEALTH_PREFIX = b"/v2/health/"
# A body at least this large is joined from its chunks in a worker thread: the copy (bytes.join
# releases the GIL for it) took tens of milliseconds of the event loop for a 22 MB body.
JOIN_OFF_LOOP_BYTES = 1 << 20
# The ``kiln_requests_total`` code of an infer request refused here, before the data plane
# sees it: the client's fault (too large, malformed), too slow to arrive, or no room for it.
_REFUSAL_CODES = {
    400: "invalid", 413: "invalid", 431: "invalid", 408: "deadline", 503: "overloaded",
}  # fmt: skip
_REFUSED_BODY = b'{"error":"too many connections; retry shortly"}'
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_REFUSED_BODY), _REFUSED_BODY)
)


class HttpHandler(Protocol):
    """What the connections hand requests to: the runtime's ``RestAdapter``, or Kiln's
    activator (``kiln_runtime.activator``), which holds requests for a service at zero."""

    max_body: int
    http_limits: HttpLimits

    async def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> HttpResponse: ...

    def refused(self, code: str) -> None:
        """An infer request refused by the transport (``kiln_requests_total``'s ``code``)."""
        ...


class BufferBudget:
    """Bytes of buffered requests and responses held by every connection of one process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        self.used -= size


@dataclass
class _Shared:
    """What the connections of one listener share."""

    adapter: HttpHandler
    limits: HttpLimits
    budget: BufferBudget
    connections: set[HttpConnection] = field(default_factory=set)
    health: HealthReserve[HttpConnection] = field(default_factory=HealthReserve)
    """Connections admitted past maxConnections for `/v2/health/*` only."""


class _Request:
    """The request being read. A plain class: mypyc compiles its ``__init__`` (a dataclass's
    would run as interpreted Python; ``protocol.types``)."""

    def __init__(self) -> None:
        self.method = ""
        self.url = b""
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.size = 0
        self.keep_alive = True


class HttpConnection(asyncio.Protocol):
    def __init__(self, shared: _Shared) -> None:
        self._shared = shared
        self._limits = shared.limits
        self._adapter = shared.adapter
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._current = _Request()
        self._pending: collections.deque[_Request] = collections.deque()
        self._worker: asyncio.Task[None] | None = None
        self._refusing = False  # a request was refused; the rest of the bytes are discarded
        self._health_only = False  # admitted on the health budget: health probes only
        self._in_headers = False
        self._in_body = False
        self._header_bytes = 0
        self._held = 0  # request bytes this connection holds against the process budget
        self._held_writes = 0  # response bytes in the transport's buffer, as last measured
        self._read_paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._eof = False
        self._timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have Transport's methods without its class: no isinstance.
        transport = cast(asyncio.Transport, transport)
        shared = self._shared
        full = (
            len(shared.connections)
            >= self._limits.max_connections + self._limits.health_connections
        )
        if full and not (self._limits.health_connections and shared.health.evict_idle()):
            shared.health.refused += 1  # the port's saturation (metrics, readiness)
            shared.health.refused_at = asyncio.get_running_loop().time()
            transport.write(_REFUSED)
            transport.close()
            return
        self._health_only = len(shared.connections) >= self._limits.max_connections
        if self._health_only:
            shared.health.connections[self] = None
        self._transport = transport
        shared.connections.add(self)
        high = max(self._limits.connection_buffer_bytes // 2, 1)
        transport.set_write_buffer_limits(high=high, low=high // 4)
        self._arm(self._limits.header_timeout_seconds, "request headers")

    @property
    def idle(self) -> bool:
        """No request is being answered or waits to be (the client may be mid-headers)."""
        return self._worker is None and not self._pending

    def evict(self) -> None:
        self._shared.connections.discard(self)
        self._shared.health.connections.pop(self, None)
        if self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._shared.connections.discard(self)
        self._shared.health.connections.pop(self, None)
        self._transport = None
        self._cancel_timers()
        self._writable.set()
        if self._worker is not None:
            self._worker.cancel()  # nobody will read the answer: counted as cancelled
        for request in self._pending:
            self._release(request.size)
        self._pending.clear()
        self._release(self._current.size)
        self._current = _Request()
        self._shared.budget.release(self._held_writes)
        self._held_writes = 0

    def eof_received(self) -> bool:
        """A half-closed client still gets the answers it asked for; then the connection ends."""
        self._eof = True
        return self._worker is not None or bool(self._pending)

    def pause_writing(self) -> None:
        self._writable.clear()
        self._pause_reading()
        self._write_timer = asyncio.get_running_loop().call_later(
            self._limits.write_timeout_seconds, self._write_timed_out
        )

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self._measure_writes()
        self._writable.set()
        self._maybe_resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._refusing:
            return
        if not self._in_body:
            self._header_bytes += len(data)  # an upper bound: the chunk may end in a body
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            # RFC 9110 §7.8: a server may ignore Upgrade (h2c); the request was complete, and
            # the bytes after it are the next HTTP/1.1 request.
            self._parser = httptools.HttpRequestParser(self)
            offset = upgrade.args[0] if upgrade.args else len(data)
            if isinstance(offset, int) and offset < len(data):
                self.data_received(data[offset:])
        except httptools.HttpParserError as error:
            self._fail(400, f"malformed HTTP request: {error}")
            return
        if self._in_headers and self._header_bytes > self._limits.max_header_bytes:
            self._fail(431, f"request headers exceed {self._limits.max_header_bytes} bytes")

    # httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._current = _Request()
        self._in_headers = True
        self._arm(self._limits.header_timeout_seconds, "request headers")

    def on_url(self, url: bytes) -> None:
        self._current.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._current.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._in_body = True
        self._header_bytes = 0
        request = self._current
        request.method = self._parser.get_method().decode("ascii", "replace")
        request.keep_alive = self._parser.should_keep_alive()
        if self._health_only and not request.url.startswith(HEALTH_PREFIX):
            self._fail(503, "the server is at its connection limit; only health probes served")
            return
        length = request.headers.get("content-length", "0")
        limit = self._adapter.max_body
        if length.isdigit() and int(length) > limit:
            self._fail(413, f"request body of {length} bytes exceeds the limit of {limit} bytes")
            return
        self._arm(self._limits.body_timeout_seconds, "request body")
        if request.headers.get("expect", "").lower() == "100-continue" and self._transport:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._refusing:
            return
        request = self._current
        if request.size + len(body) > self._adapter.max_body:
            self._fail(413, f"request body exceeds the limit of {self._adapter.max_body} bytes")
            return
        if not self._shared.budget.take(len(body)):
            self._fail(503, "the server's request buffers are full; retry shortly")
            return
        request.size += len(body)
        self._held += len(body)
        request.chunks.append(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        if self._refusing:
            return
        self._cancel_timer()
        self._pending.append(self._current)
        self._current = _Request()
        if (
            len(self._pending) >= self._limits.max_pipelined_requests
            or self._held + self._held_writes > self._limits.connection_buffer_bytes
        ):
            self._pause_reading()
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._serve_pending())

    # answering -------------------------------------------------------------------------------

    async def _serve_pending(self) -> None:
        try:
            while self._pending and self._transport is not None:
                await self._writable.wait()  # the client reads its answers, or none are made
                if self._transport is None:
                    return
                request = self._pending.popleft()
                if len(request.chunks) == 1:
                    body = request.chunks[0]
                elif request.size >= JOIN_OFF_LOOP_BYTES:  # a copy of megabytes: off the loop
                    body = await asyncio.to_thread(b"".join, request.chunks)
                else:
                    body = b"".join(request.chunks)
                request.chunks.clear()
                try:
                    response = await self._adapter.handle(
                        request.method, request.url.decode("latin-1"), request.headers, body
                    )
                except Exception:
                    log.exception("unhandled error answering %s %r", request.method, request.url)
                    response = json_response(500, {"error": "internal error; see server log"})
                finally:
                    self._release(request.size)
                del body
                keep_alive = request.keep_alive and not self._health_only
                self._write(response, keep_alive)
                if not keep_alive and self._transport is not None:
                    self._transport.close()
                self._maybe_resume_reading()
        finally:
            self._worker = None
        if self._transport is not None:
            if self._eof:
                self._transport.close()
            elif not self._in_headers and not self._in_body:
                self._arm(self._limits.keep_alive_timeout_seconds, "")

    def _write(self, response: HttpResponse, keep_alive: bool) -> None:
        if self._transport is None:
            return
        self._transport.writelines([response_head(response, keep_alive), *response.body])
        self._measure_writes()

    def _fail(self, status: int, message: str) -> None:
        """Answer at once and close: the rest of this connection's bytes cannot be trusted.

        An infer request refused here is counted in ``kiln_requests_total``, as the data plane
        never sees it; others (health, metadata) are not inference requests. Only the first
        refusal answers (and counts): the connection is closing, later bytes are discarded.
        """
        if self._refusing:
            return
        if infer_target(self._current.url):
            self._adapter.refused(_REFUSAL_CODES[status])
        self._refusing = True
        self._cancel_timer()
        self._write(json_response(status, {"error": message}), keep_alive=False)
        if self._transport is not None:
            self._transport.close()

    def close(self) -> None:
        if self._transport is not None and self._worker is None:
            self._transport.close()

    # limits ----------------------------------------------------------------------------------

    def _arm(self, seconds: float, waiting_for: str) -> None:
        """(Re)start the one read timer: ``waiting_for`` names what did not arrive in time;
        empty for the keep-alive wait between requests, which ends quietly."""
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._timed_out, waiting_for)

    def _timed_out(self, waiting_for: str) -> None:
        self._timer = None
        if self._transport is None:
            return
        if waiting_for and (self._in_headers or self._in_body):
            self._fail(408, f"{waiting_for} not received in time")
        elif self._worker is None and not self._pending:
            self._transport.close()

    def _write_timed_out(self) -> None:
        """The client read nothing for the write timeout: drop it and what it holds."""
        self._write_timer = None
        if self._transport is not None:
            self._transport.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _cancel_timers(self) -> None:
        self._cancel_timer()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _release(self, size: int) -> None:
        self._held -= size
        self._shared.budget.release(size)

    def _measure_writes(self) -> None:
        """Charge the process budget with what the transport still holds of our answers."""
        if self._transport is None:
            return
        buffered = self._transport.get_write_buffer_size()
        budget = self._shared.budget
        budget.used += buffered - self._held_writes
        self._held_writes = buffered

    def _pause_reading(self) -> None:
        """Stop reading; a request half-read meanwhile is not the client's delay, so its
        timer stops too (the write timeout bounds a client that does not read)."""
        if not self._read_paused and self._transport is not None:
            self._read_paused = True
            self._transport.pause_reading()
            if self._in_headers or self._in_body:
                self._cancel_timer()

    def _maybe_resume_reading(self) -> None:
        if (
            self._read_paused
            and self._transport is not None
            and self._writable.is_set()
            and len(self._pending) < self._limits.max_pipelined_requests
            and self._held + self._held_writes <= self._limits.connection_buffer_bytes
        ):
            self._read_paused = False
            self._transport.resume_reading()
            if self._in_headers:
                self._arm(self._limits.header_timeout_seconds, "request headers")
            elif self._in_body:
                self._arm(self._limits.body_timeout_seconds, "request body")


def response_head(response: HttpResponse, keep_alive: bool) -> bytes:
    """The status line and headers written before ``response.body``."""
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
    return b"".join(head)


def infer_target(url: bytes) -> bool:
    """The request line names an infer endpoint (``/v2/models/{m}[/versions/{v}]/infer``),
    as far as it arrived before the request was refused."""
    path = url.split(b"?", 1)[0].rstrip(b"/")
    return path.startswith(b"/v2/models/") and path.endswith(b"/infer")


class HttpServer:
    """Owns the listening socket, the open connections and their shared buffer budget."""

    def __init__(self, adapter: HttpHandler, limits: HttpLimits | None = None) -> None:
        limits = limits or adapter.http_limits
        self._shared = _Shared(adapter, limits, BufferBudget(limits.process_buffer_bytes))
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpConnection(self._shared), host, port, backlog=1024
        )
        return listening_port(self._server)

    def port_status(self) -> tuple[int, int, int, float]:
        """Open connections, idle ones closed at the cap, refused ones, when the last was."""
        health = self._shared.health
        return len(self._shared.connections), health.evicted, health.refused, health.refused_at

    async def stop(self) -> None:
        """Stop listening and close idle connections (the caller drained in-flight work)."""
        if self._server is not None:
            self._server.close()
            for connection in list(self._shared.connections):
                connection.close()
            await self._server.wait_closed()
