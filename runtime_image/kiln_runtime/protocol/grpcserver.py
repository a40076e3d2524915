"""gRPC over HTTP/2: message framing, deadlines, status trailers; unary and streaming methods.

The transport under ``grpc.InferenceServicer`` (as ``httpserver`` is under ``rest``): it routes
``:path`` to a method, unframes the one length-prefixed protobuf message, reads
``grpc-timeout``, and answers with ``grpc-status``/``grpc-message`` trailers as the gRPC
HTTP/2 protocol specifies, so grpcio clients (``tritonclient.grpc``) and h2load see a gRPC
server. It accepts gzip-compressed messages (announced in ``grpc-accept-encoding``; the
inflated size is bounded by the message limit, and large messages inflate off the event loop)
and answers uncompressed, which every client accepts. A call to a method it does not serve
gets UNIMPLEMENTED from its headers, without waiting for its body. Streaming methods
(``StreamMethod``) read messages as they arrive and send answers as they go.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from kiln_runtime import errors
from kiln_runtime.config import Http2Limits
from kiln_runtime.protocol import hpack
from kiln_runtime.protocol.http2.budgets import HealthReserve, MemoryBudget
from kiln_runtime.protocol.http2.connection import Http2Connection
from kiln_runtime.protocol.http2.messages import Handler, Request, Response
from kiln_runtime.protocol.http2.state import ConnectionState
from kiln_runtime.protocol.listening import listening_port
from kiln_runtime.protocol.tracecontext import TRACEPARENT, traceparent_of

log = logging.getLogger(__name__)

# grpc.StatusCode values (the gRPC status codes are part of the wire protocol).
STATUS_CODES = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "RESOURCE_EXHAUSTED": 8, "UNIMPLEMENTED": 12, "INTERNAL": 13,
    "UNAVAILABLE": 14,
}  # fmt: skip

INVALID_METRIC_CODE = errors.ErrorKind.INVALID.mapping.metric_code
OVERLOADED_METRIC_CODE = errors.ErrorKind.UNAVAILABLE.mapping.metric_code
# The one call a connection admitted past maxConnections may make (Kubernetes' gRPC probe).
HEALTH_CHECK_PATH = b"/grpc.health.v1.Health/Check"
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}

ACCEPT_ENCODING = b"identity,gzip"
# Compressed messages at least this large inflate in a worker thread, not on the event loop.
INFLATE_OFF_LOOP_BYTES = 64 << 10

_OK_HEADERS = hpack.encode(
    [(b":status", b"200"), (b"content-type", b"application/grpc"),
     (b"grpc-accept-encoding", ACCEPT_ENCODING)]
)  # fmt: skip
_OK_TRAILERS = hpack.encode([(b"grpc-status", b"0")])


class _Refused(Exception):
    """A request the transport refuses before any method sees it (``code``: its gRPC status;
    each is the client's doing, so an infer call refused so is counted ``invalid``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class UnaryMethod:
    """A method's request message type and its implementation.

    ``call(request, time_left)``, ``time_left`` being the seconds until the call's deadline
    if it has one, returns the response message or raises ``InferError``. ``refused(code,
    seconds)``, if given, hears of each call the transport refuses before ``call`` (metadata
    or message too large, malformed framing, compression or protobuf), with the
    ``kiln_requests_total`` code it ends in: the infer method counts those as ``call`` counts
    the rest, so that each call is counted exactly once.
    """

    request_type: Any
    call: Callable[[Any, float | None], Awaitable[Any]]
    refused: Callable[[str, float], None] | None = None
    traced: bool = False
    """Hand the call's `traceparent` metadata to ``call`` (``tracecontext``)."""


@dataclass(frozen=True)
class StreamMethod:
    """A streaming method (server-streaming or bidirectional): ``call(messages, send)`` reads
    request messages from the async iterator ``messages`` as they arrive and answers each
    with ``send(message)`` (False once the call is gone); it returns when it is done, or
    raises ``InferError`` (the call then ends with that status)."""

    request_type: Any
    call: Callable[[AsyncIterator[Any], Callable[[Any], bool]], Awaitable[None]]


def grpc_timeout(value: bytes) -> float:
    """Seconds from a ``grpc-timeout`` header (up to 8 digits and a unit)."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        raise errors.invalid(f"malformed grpc-timeout {value.decode('latin-1')!r}")
    return int(digits) * _TIMEOUT_UNITS[unit]


def percent_encode(message: str) -> bytes:
    """``grpc-message`` encoding: printable ASCII except '%' as is, every other byte %XX."""
    return b"".join(
        bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
        for b in message.encode("utf-8")
    )


def status_response(code: str, message: str) -> Response:
    """A Trailers-Only answer: one HEADERS frame carrying the status, ending the stream."""
    return Response(
        hpack.encode(
            [
                (b":status", b"200"),
                (b"content-type", b"application/grpc"),
                (b"grpc-status", b"%d" % STATUS_CODES[code]),
                (b"grpc-message", percent_encode(message[:1024])),
                (b"grpc-accept-encoding", ACCEPT_ENCODING),
            ]
        )
    )


def status_trailers(code: str, message: str) -> bytes:
    """The trailers ending a call whose headers are already out (a streamed answer)."""
    return hpack.encode(
        [
            (b"grpc-status", b"%d" % STATUS_CODES[code]),
            (b"grpc-message", percent_encode(message[:1024])),
        ]
    )


def http_error(status: int) -> Response:
    """An answer to a request that is not gRPC, with a body saying what this server is."""
    return Response(
        hpack.encode([(b":status", b"%d" % status), (b"content-type", b"text/plain")]),
        b"this is a gRPC server: POST application/grpc\n",
    )


class GrpcService:
    """Answers the HTTP/2 requests of gRPC services' unary methods."""

    def __init__(self, service: str, methods: dict[str, UnaryMethod], max_message: int) -> None:
        self._methods: dict[bytes, UnaryMethod] = {}
        self._streams: dict[bytes, StreamMethod] = {}
        self.add(service, methods)
        self.max_message = max_message

    def add(self, service: str, methods: dict[str, UnaryMethod]) -> None:
        """Serve another service's methods on the same port (e.g. ``grpc.health.v1.Health``)."""
        self._methods.update({f"/{service}/{name}".encode(): m for name, m in methods.items()})

    @property
    def unary_methods(self) -> dict[bytes, UnaryMethod]:
        """Each unary method by its ``:path`` (for another transport: ``grpcio_server``)."""
        return dict(self._methods)

    @property
    def streaming_methods(self) -> dict[bytes, StreamMethod]:
        return dict(self._streams)

    def add_streaming(self, service: str, methods: dict[str, StreamMethod]) -> None:
        self._streams.update({f"/{service}/{name}".encode(): m for name, m in methods.items()})

    def streaming(self, headers: dict[bytes, bytes]) -> bool:
        """A call to a streaming method: the transport hands it on from its headers."""
        return headers.get(b":path", b"") in self._streams and self._is_grpc(headers)

    @staticmethod
    def _is_grpc(headers: dict[bytes, bytes]) -> bool:
        return headers.get(b":method") == b"POST" and headers.get(b"content-type", b"").startswith(
            b"application/grpc"
        )

    def answers_early(self, headers: dict[bytes, bytes]) -> bool:
        """A gRPC call to a method this service does not serve: answered before its body
        (other requests are answered, with an HTTP error, once complete)."""
        path = headers.get(b":path", b"")
        return self._is_grpc(headers) and path not in self._methods and path not in self._streams

    async def handle(self, request: Request) -> Response:
        started = time.perf_counter()
        headers = request.headers
        if request.over_capacity:  # the connection is told to go away (GOAWAY) as well
            return _refuse(
                self._methods.get(headers.get(b":path", b"")), "UNAVAILABLE",
                "the server is at its connection limit: this connection may only call "
                "grpc.health.v1.Health/Check", OVERLOADED_METRIC_CODE, started,
            )  # fmt: skip
        if request.headers_too_large:  # grpc-go's answer: the call fails, the channel lives
            return _refuse(
                self._methods.get(headers.get(b":path", b"")), "RESOURCE_EXHAUSTED",
                "request metadata exceeds the limit", INVALID_METRIC_CODE, started,
            )  # fmt: skip
        if headers.get(b":method") != b"POST":
            return http_error(405)
        if not headers.get(b"content-type", b"").startswith(b"application/grpc"):
            return http_error(415)
        path = headers.get(b":path", b"")
        streamed = self._streams.get(path)
        if streamed is not None and request.send is not None:
            return await self._stream(request, streamed)
        method = self._methods.get(path)
        if method is None:
            unknown = errors.clip(path.decode("latin-1"))
            return status_response("UNIMPLEMENTED", f"unknown method {unknown}")
        try:
            if request.too_large:  # refused at its length prefix, or as it passed the limit
                raise _Refused(
                    "RESOURCE_EXHAUSTED",
                    f"request message exceeds the limit of {self.max_message} bytes",
                )
            timeout = grpc_timeout(headers[b"grpc-timeout"]) if b"grpc-timeout" in headers else None
            message = await self._unframe(request, method.request_type)
        except errors.InferError as error:
            mapping = error.kind.mapping
            return _refuse(method, mapping.grpc_code, error.message, mapping.metric_code, started)
        except _Refused as refused:
            return _refuse(method, refused.code, str(refused), INVALID_METRIC_CODE, started)
        if method.traced:
            TRACEPARENT.set(traceparent_of(headers.get(b"traceparent")))
        try:
            reply = await method.call(message, timeout)
        except errors.InferError as error:
            return status_response(error.kind.mapping.grpc_code, error.message)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("unhandled error in %s", path.decode("latin-1"))
            return status_response("INTERNAL", "internal error; see server log")
        payload: bytes = reply.SerializeToString()
        return Response(
            _OK_HEADERS, b"\0" + len(payload).to_bytes(4, "big") + payload, _OK_TRAILERS
        )

    async def _stream(self, request: Request, method: StreamMethod) -> Response:
        send = request.send
        assert send is not None

        def answer(message: Any) -> bool:
            payload: bytes = message.SerializeToString()
            return send(_OK_HEADERS, b"\0" + len(payload).to_bytes(4, "big") + payload)

        try:
            await method.call(self._messages(request, method.request_type), answer)
        except errors.InferError as error:
            trailers = status_trailers(error.kind.mapping.grpc_code, error.message)
        except _Refused as refused:
            trailers = status_trailers(refused.code, str(refused))
        else:
            trailers = _OK_TRAILERS
        return Response(_OK_HEADERS, b"", trailers)

    def _messages(self, request: Request, request_type: Any) -> AsyncIterator[Any]:
        """A streamed request's messages, each as soon as it is complete."""
        return _StreamedMessages(request, request_type, self._unframe)

    async def _unframe(self, request: Request, request_type: Any) -> Any:
        body = request.body
        if len(body) < 5:
            raise errors.invalid("request carries no gRPC message")
        length = int.from_bytes(body[1:5], "big")
        if len(body) != 5 + length:
            raise errors.invalid("a unary request carries exactly one gRPC message")
        payload = body[5:]
        if body[0]:
            encoding = request.headers.get(b"grpc-encoding", b"identity")
            if encoding != b"gzip":
                raise _Refused(
                    "UNIMPLEMENTED",
                    f"message compressed with {encoding.decode('latin-1')!r}; "
                    f"this server accepts {ACCEPT_ENCODING.decode()}",
                )
            if len(payload) >= INFLATE_OFF_LOOP_BYTES:
                payload = await asyncio.to_thread(inflate, payload, self.max_message)
            else:
                payload = inflate(payload, self.max_message)
        return parse_message(request_type, payload)


def parse_message(request_type: Any, payload: bytes) -> Any:
    """The request message from its bytes; malformed ones are INVALID_ARGUMENT naming the type,
    on either transport."""
    try:
        return request_type.FromString(payload)
    except DecodeError as error:
        raise errors.invalid(f"malformed {request_type.DESCRIPTOR.name}: {error}") from None


def _refuse(
    method: UnaryMethod | None, code: str, message: str, metric_code: str, started: float
) -> Response:
    """The status answering a call refused before its method ran, told to the method."""
    if method is not None and method.refused is not None:
        method.refused(metric_code, time.perf_counter() - started)
    return status_response(code, message)


def inflate(data: bytes, limit: int) -> bytes:
    """A gzip message inflated, refused once it passes ``limit`` bytes (a zip bomb stops
    there: memory and time are bounded by the limit, not by the ratio)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        message = inflater.decompress(data, limit + 1)
    except zlib.error as error:
        raise errors.invalid(f"malformed gzip message: {error}") from None
    if len(message) > limit:
        raise _Refused("RESOURCE_EXHAUSTED", f"inflated message exceeds {limit} bytes")
    if not inflater.eof:
        raise errors.invalid("truncated gzip message")
    return message


class GrpcServer:
    """Owns the listening socket and the HTTP/2 connections of one gRPC service."""

    def __init__(
        self,
        service: GrpcService,
        max_connection_age: float = 0.0,
        max_age_grace: float = 10.0,
        limits: Http2Limits | None = None,
        handler: Handler | None = None,
    ) -> None:
        """``handler``, if given, answers every request in place of the service's methods
        (Kiln's activator passes each call on whole): nothing is answered early or streamed."""
        self._service = service
        self._handler = handler
        self._limits = limits or Http2Limits()
        self.budget = MemoryBudget(self._limits.process_buffer_bytes)
        self.health: HealthReserve[ConnectionState] = HealthReserve(frozenset({HEALTH_CHECK_PATH}))
        self._max_connection_age = max_connection_age
        self._max_age_grace = max_age_grace
        self._connections: set[Http2Connection] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        service, handler = self._service, self._handler
        whole = handler is not None
        self._server = await loop.create_server(
            lambda: Http2Connection(
                service.handle if handler is None else handler, service.max_message,
                self._connections, self._max_connection_age, self._max_age_grace,
                limits=self._limits, budget=self.budget,
                answers_early=None if whole else service.answers_early,
                streaming=None if whole else service.streaming, health=self.health,
            ),
            host, port, backlog=1024,
        )  # fmt: skip
        return listening_port(self._server)

    def port_status(self) -> tuple[int, int, int, float]:
        """Open connections, idle ones closed at the cap, refused ones, when the last was."""
        health = self.health
        return len(self._connections), health.evicted, health.refused, health.refused_at

    async def stop(self, grace: float) -> None:
        """Stop listening, GOAWAY every connection, close them when answered or at ``grace``."""
        if self._server is None:
            return
        self._server.close()
        connections = list(self._connections)
        for connection in connections:
            connection.shut_down()
        if connections:
            await asyncio.wait([c.closed for c in connections], timeout=grace)
            for connection in connections:
                if not connection.closed.done():
                    connection.abort()
        await self._server.wait_closed()


class _StreamedMessages:
    """A streamed request's messages as an async iterator, each as soon as it is complete.

    A class rather than an async generator: mypyc compiles no async generators (setup.py).
    """

    def __init__(
        self,
        request: Request,
        request_type: Any,
        unframe: Callable[[Request, Any], Awaitable[Any]],
    ) -> None:
        assert request.arrived is not None
        self._request = request
        self._request_type = request_type
        self._unframe = unframe  # GrpcService._unframe: one message, as a unary request's body
        self._arrived: asyncio.Event = request.arrived
        self._buffer = b""

    def __aiter__(self) -> _StreamedMessages:
        return self

    async def __anext__(self) -> Any:
        request = self._request
        while True:
            if request.chunks:
                self._buffer += b"".join(request.chunks)
                request.chunks.clear()
            buffer = self._buffer
            end = 5 + int.from_bytes(buffer[1:5], "big") if len(buffer) >= 5 else -1
            if 0 < end <= len(buffer):
                framed, self._buffer = buffer[:end], buffer[end:]
                one = Request(request.stream_id, request.headers, [framed], len(framed))
                return await self._unframe(one, self._request_type)
            if request.ended:
                if buffer:
                    raise errors.invalid("the stream ends inside a gRPC message")
                raise StopAsyncIteration
            if request.too_large:
                raise _Refused("RESOURCE_EXHAUSTED", "the stream exceeds its size limit")
            self._arrived.clear()
            await self._arrived.wait()
