"""A lean HTTP/2 server connection (RFC 9113) for gRPC's exchanges, unary ones first.

Why not grpcio's server: on one core it answers at most 3,000-3,500 empty calls per second
(``bench/grpc_floor.py``), less than the runtime's HTTP/1.1 path answers with a model behind
it. This connection is an asyncio protocol like ``httpserver``: it parses frames in place,
decodes headers with ``hpack``, hands each complete request to a handler, and writes each
answer (headers, data, trailers) in one write. It keeps what an HTTP/2 peer relies on: the
SETTINGS exchange, flow control in both directions (a response larger than the client's window
waits for its WINDOW_UPDATE), PING, RST_STREAM (the request's task is cancelled), a stream
limit, GOAWAY on shutdown and on protocol errors, the request checks of RFC 9113 8.2-8.3 (h2spec
passes in full). It serves prior-knowledge cleartext HTTP/2 (``h2c``), which is what gRPC
clients speak without TLS. Streamed calls (``Streaming``: health Watch, reflection) are handed
on from their headers, their body as it arrives, and may send data before their end.

Every input is bounded (``config.Http2Limits``): connections per port, the header list (a list
over the limit fails its own stream, not the connection), memory held per connection and per
process for request bodies and unsent responses, the time a preface, a header block, a body
or an idle connection may take, and flood budgets for resets, empty frames and control
frames, which end in GOAWAY ENHANCE_YOUR_CALM as Go, nginx and Envoy do. Memory stays within
the budgets through flow control: the connection's receive window is reopened only as
buffered requests are consumed (answered); answers the client does not take (its window
closed, or its TCP not read: ``pause_writing``) are held within the budget while no new call
starts (and, with its TCP unread, its socket is not read either).

Out of scope, because gRPC never needs them: server push, priorities (checked, then ignored, as
RFC 9113 allows), HTTP/1.1 upgrade.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kiln_runtime.config import Http2Limits
from kiln_runtime.protocol import hpack

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9

END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SELF_DEPENDENT = 0x100  # not on the wire: marks a HEADERS whose priority names its own stream

SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

MAX_STREAM_ID = 0x7FFF_FFFF
AGE_JITTER = 0.1
AGE_GOAWAY_GAP_SECONDS = 1.0
DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1
DEFAULT_MAX_FRAME = 16_384

# What this server announces. A window of 1 MiB lets a request of a few MiB arrive in a few
# loopback round trips; it is also what a connection may have in flight beyond its budget.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 1 << 20
MAX_FRAME_SIZE = DEFAULT_MAX_FRAME  # larger frames save little next to a call's other costs
RECENT_STREAMS = 1024  # closed streams remembered: late frames on them are told apart
# A compressed header block may be this many times the header list limit (indexed fields make
# a block smaller than its list); past it the block is refused unread, ending the connection.
HEADER_BLOCK_FACTOR = 2
WRITE_HIGH_WATER = 1 << 20  # bytes in the socket's send buffer before pause_writing
FLOOD_BURST_SECONDS = 10.0  # each flood budget holds this many seconds of its rate
TICK_SECONDS = 1.0  # how often a connection checks its timeouts
# Calls one connection may start per event-loop turn: the rest of what it sent waits for the
# next turn (its socket unread meanwhile), so other connections' calls interleave with a flood.
CALLS_PER_TURN = 32

_FRAME_HEADER = struct.Struct(">BHBBL")  # length is 24 bits: high byte + low 16 bits

REQUEST_PSEUDO_HEADERS = frozenset((b":method", b":scheme", b":path", b":authority"))
# RFC 9113 8.2.2: HTTP/1.1 connection-specific fields have no meaning in HTTP/2.
CONNECTION_SPECIFIC = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)


def malformed(fields: tuple[tuple[bytes, bytes], ...], trailers: bool = False) -> str | None:
    """Why a request's header (or trailer) list is malformed (RFC 9113 8.2-8.3), or None."""
    seen: set[bytes] = set()
    regular = False
    for name, value in fields:
        if name[:1] == b":":
            if trailers or regular:
                return f"pseudo-header {name!r} after regular fields or in trailers"
            if name not in REQUEST_PSEUDO_HEADERS or name in seen:
                return f"unknown or repeated pseudo-header {name!r}"
            if name == b":path" and not value:
                return "empty :path"
            seen.add(name)
            continue
        regular = True
        if name != name.lower():
            return f"uppercase field name {name!r}"
        if name in CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
            return f"connection-specific field {name!r}"
    if trailers:
        return None
    if len(seen & {b":method", b":scheme", b":path"}) != 3:
        return "a request needs :method, :scheme and :path"
    return None


class ProtocolViolation(Exception):
    """The peer broke the protocol: the connection ends with GOAWAY and this error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Request:
    """One stream's request: its headers and, once complete, its body."""

    stream_id: int
    headers: dict[bytes, bytes]
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    too_large: bool = False  # the body passed the limit; what arrived of it was dropped
    # the header list passed the limit: ``headers`` holds at most its ``:path``
    headers_too_large: bool = False
    # A streamed request (``Streaming``) is handed on from its headers: ``chunks`` grows as its
    # body arrives (``arrived`` is set each time), ``ended`` once the client half-closed, and
    # ``send(headers, data)`` writes answer data before the final Response (False: the
    # stream is gone).
    arrived: asyncio.Event | None = None
    ended: bool = False
    send: Callable[[bytes, bytes], bool] | None = None

    @property
    def body(self) -> bytes:
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)


@dataclass(frozen=True)
class Response:
    """An answer as header blocks already HPACK-encoded (``hpack.encode``), so constant
    blocks are encoded once. ``trailers`` None means the headers end the stream."""

    headers: bytes
    data: bytes = b""
    trailers: bytes | None = None


Handler = Callable[[Request], Awaitable[Response]]
# Whether a request is answered from its headers alone, without waiting for its body: gRPC's
# unknown (e.g. streaming) methods get UNIMPLEMENTED at once, not when the client half-closes.
AnswersEarly = Callable[[dict[bytes, bytes]], bool]
# Whether a request is streamed (server-streaming or bidirectional gRPC methods).
Streaming = Callable[[dict[bytes, bytes]], bool]


@dataclass
class _Stream:
    request: Request
    send_window: int
    opened: float  # loop time of its headers: the body timeout counts from here
    remote_closed: bool = False
    dispatched: bool = False
    unacked: int = 0  # bytes received since the last stream WINDOW_UPDATE
    received: int = 0  # body bytes received (unpadded), against content-length
    content_length: int | None = None
    buffered: int = 0  # request bytes this stream holds of the connection's budget
    parked: int = 0  # answer bytes this stream holds, waiting for the peer
    headers_sent: bool = False  # a streamed answer's headers are out
    open_ended: bool = False  # a streamed answer: more data may follow what is pending
    task: asyncio.Task[None] | None = None
    pending: memoryview | None = None  # response data waiting for the peer's window
    pending_trailers: bytes | None = None


class MemoryBudget:
    """Bytes that every connection of a port holds (request bodies, unsent responses).

    A connection over it reopens no receive window and starts no request; it waits here and
    is resumed when another connection releases memory.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._waiting: set[Http2Connection] = set()

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    def charge(self, size: int) -> None:
        self.used += size
        self.peak = max(self.peak, self.used)

    def release(self, size: int) -> None:
        self.used -= size
        if self._waiting and not self.exhausted:
            waiting, self._waiting = self._waiting, set()
            for connection in waiting:
                connection.budget_freed()

    def wait(self, connection: Http2Connection) -> None:
        self._waiting.add(connection)

    def forget(self, connection: Http2Connection) -> None:
        self._waiting.discard(connection)


class _FloodBudget:
    """A token bucket: ``rate`` events a second, a burst of ``FLOOD_BURST_SECONDS`` of them."""

    def __init__(self, rate: float) -> None:
        self._rate = rate
        self._burst = rate * FLOOD_BURST_SECONDS
        self._tokens = self._burst
        self._at = 0.0

    def spend(self, now: float) -> bool:
        """Count one event at ``now``; False once the budget is spent."""
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate) - 1
        self._at = now
        return self._tokens >= 0


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return _FRAME_HEADER.pack(length >> 16, length & 0xFFFF, kind, flags, stream_id) + payload


def server_preface(limits: Http2Limits) -> bytes:
    entries = (
        (SETTINGS_ENABLE_PUSH, 0),
        (SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
        (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
        (SETTINGS_MAX_FRAME_SIZE, MAX_FRAME_SIZE),
        (SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
    )
    settings = frame(SETTINGS, 0, 0, b"".join(struct.pack(">HL", k, v) for k, v in entries))
    return settings + _window_update(0, CONNECTION_WINDOW - DEFAULT_WINDOW)


def _window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">L", increment))


def _rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">L", code))


class Http2Connection(asyncio.Protocol):
    def __init__(
        self,
        handler: Handler,
        max_body: int,
        connections: set[Http2Connection],
        max_age: float = 0.0,
        max_age_grace: float = 10.0,
        *,
        limits: Http2Limits | None = None,
        budget: MemoryBudget | None = None,
        answers_early: AnswersEarly | None = None,
        streaming: Streaming | None = None,
    ) -> None:
        limits = limits or Http2Limits()
        self._handler = handler
        self._answers_early = answers_early
        self._streaming = streaming
        self._max_age = max_age
        self._max_age_grace = max_age_grace
        self._limits = limits
        self._timers: list[asyncio.TimerHandle] = []
        self._max_body = max_body
        self._connections = connections
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._preface_seen = False
        self._decoder = hpack.Decoder(max_header_list_size=limits.max_header_list_size)
        self._max_block = HEADER_BLOCK_FACTOR * limits.max_header_list_size
        self._streams: dict[int, _Stream] = {}
        self._blocked: dict[int, _Stream] = {}  # streams whose response waits for window
        self._queued: dict[int, _Stream] = {}  # complete requests waiting for the budget
        self._last_stream_id = 0
        # Recently closed streams: True if this server reset them (late frames are ignored,
        # RFC 9113 5.1), False if they ended or the peer reset them (late frames are errors).
        self._recent: dict[int, bool] = {}
        self._continuing: tuple[int, int, bytearray] | None = None  # stream, flags, block
        self._continuing_since = 0.0
        self._peer_window = DEFAULT_WINDOW  # the peer's initial stream window
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._send_window = DEFAULT_WINDOW  # connection-level, towards the peer
        self._receive_window = CONNECTION_WINDOW  # what the peer may still send us
        # Memory this connection holds: request bytes received and not yet answered, and
        # response bytes parked for the peer's window. Charged to the process budget too.
        self._budget = budget or MemoryBudget(limits.process_buffer_bytes)
        self._connection_budget = max(limits.connection_buffer_bytes, max_body + CONNECTION_WINDOW)
        self._held = 0
        self._parked = 0  # of which response bytes
        self._write_paused = False
        self._read_paused = False
        self._turn_calls = 0  # calls started in this turn's parse
        self._backlog = False  # frames left unparsed for the next turn
        self._resets = _FloodBudget(limits.resets_per_second)
        self._empty_frames = _FloodBudget(limits.empty_frames_per_second)
        self._control_frames = _FloodBudget(limits.control_frames_per_second)
        self._opened = self._loop.time()
        self._last_active = self._opened  # last time a stream was open
        self._out: list[bytes] = []  # frames to send, written together by _flush
        self._going_away = False
        self.closed = self._loop.create_future()

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if len(self._connections) >= self._limits.max_connections:
            log.warning("refused a connection: %d open", len(self._connections))
            transport.abort()  # refused at accept: no preface, no memory
            return
        self._transport = transport
        self._connections.add(self)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        transport.write(server_preface(self._limits))
        self._timers.append(self._loop.call_later(TICK_SECONDS, self._tick))
        if self._max_age > 0:  # jittered, so connections made together do not age together
            age = self._max_age * random.uniform(1 - AGE_JITTER, 1 + AGE_JITTER)
            self._timers.append(self._loop.call_later(age, self._age_out))

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in self._timers:
            timer.cancel()
        self._connections.discard(self)
        self._budget.forget(self)
        self._transport = None
        for stream in self._streams.values():
            if stream.task is not None:
                stream.task.cancel()
        self._streams.clear()
        self._blocked.clear()
        self._queued.clear()
        self._hold(-self._held)
        self._parked = 0
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._turn_calls = 0
        try:
            self._parse()
        except ProtocolViolation as error:
            self._fail(error)
            return
        self._flush()

    def pause_writing(self) -> None:
        """The socket's send buffer is full: the peer is not reading. Start nothing new."""
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._send_blocked()
        self._start_queued()
        self._update_reading()
        self._flush()

    def budget_freed(self) -> None:
        """The process budget has room again (``MemoryBudget``)."""
        if self._transport is None:
            return
        self._reopen_window()
        self._start_queued()
        self._update_reading()
        self._flush()

    def _fail(self, error: ProtocolViolation) -> None:
        log.info("HTTP/2 connection error %d: %s", error.code, error)
        self._goaway(error.code, str(error).encode()[:256])
        self._flush()
        if self._transport is not None:
            self._transport.close()

    # memory ----------------------------------------------------------------------------------

    def _hold(self, size: int) -> None:
        self._held += size
        if size > 0:
            self._budget.charge(size)
        elif size < 0:
            self._budget.release(-size)

    def _over_budget(self) -> bool:
        """No more request bytes may be let in (the receive window stays shut)."""
        if self._held >= self._connection_budget:
            return True
        if self._budget.exhausted:
            self._budget.wait(self)
            return True
        return False

    def _congested(self) -> bool:
        """No new call may start: the peer does not take its answers. (Request bytes never
        block a start: answering is what releases them.)"""
        return self._write_paused or self._parked >= self._connection_budget

    def _update_reading(self) -> None:
        """Stop reading the socket while the peer does not read its own (its requests wait in
        TCP) or while a burst waits for the next turn. Answers parked for the peer's window
        do not stop reading: its WINDOW_UPDATE must get through; new calls queue instead."""
        if self._transport is None:
            return
        congested = self._write_paused or self._backlog
        if congested and not self._read_paused:
            self._transport.pause_reading()
            self._read_paused = True
        elif not congested and self._read_paused:
            self._transport.resume_reading()
            self._read_paused = False
            if self._buffer:  # frames that arrived before the pause
                self._loop.call_soon(self.data_received, b"")

    def _next_turn(self) -> None:
        """Parse what a previous turn left (``CALLS_PER_TURN``), then read the socket again."""
        self._backlog = False
        if self._transport is not None:
            self.data_received(b"")
            self._update_reading()

    def _reopen_window(self) -> None:
        """Give the peer back connection window for what was consumed, within the budgets."""
        if self._over_budget():
            return
        room = min(CONNECTION_WINDOW, self._connection_budget - self._held)
        increment = room - self._receive_window
        if increment >= min(CONNECTION_WINDOW // 2, room):
            self._receive_window += increment
            self._out.append(_window_update(0, increment))

    def _release(self, stream: _Stream) -> None:
        if stream.buffered:
            self._hold(-stream.buffered)
            stream.buffered = 0
            self._reopen_window()

    # timeouts --------------------------------------------------------------------------------

    def _tick(self) -> None:
        """Once a second: the preface, header, body and idle timeouts."""
        if self._transport is None:
            return
        now = self._loop.time()
        limits = self._limits
        self._timers = [t for t in self._timers if not t.cancelled() and t.when() > now]
        self._timers.append(self._loop.call_later(TICK_SECONDS, self._tick))
        if not self._preface_seen and now - self._opened > limits.header_timeout_seconds:
            self._transport.abort()  # not an HTTP/2 client, or a silent one
            return
        header_late = now - self._continuing_since > limits.header_timeout_seconds
        if self._continuing is not None and header_late:
            self._fail(ProtocolViolation(ENHANCE_YOUR_CALM, "header block timed out"))
            return
        for stream in list(self._streams.values()):
            body_late = now - stream.opened > limits.body_timeout_seconds
            if body_late and not stream.remote_closed and not stream.dispatched:
                self._reset(stream, CANCEL)
        if self._streams:
            self._last_active = now
        elif now - self._last_active > limits.idle_timeout_seconds:
            self.shut_down()
        self._flush()

    # parsing ---------------------------------------------------------------------------------

    def _parse(self) -> None:
        buffer = self._buffer
        pos, end = 0, len(buffer)
        if not self._preface_seen:
            if end < len(PREFACE):
                if not PREFACE.startswith(bytes(buffer)):
                    raise ProtocolViolation(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if buffer[: len(PREFACE)] != PREFACE:
                raise ProtocolViolation(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._preface_seen = True
            pos = len(PREFACE)
        unpack = _FRAME_HEADER.unpack_from
        while end - pos >= 9:
            high, low, kind, flags, stream_id = unpack(buffer, pos)
            length = (high << 16) | low
            if length > MAX_FRAME_SIZE:
                raise ProtocolViolation(FRAME_SIZE_ERROR, f"frame of {length} bytes")
            if kind in (HEADERS, CONTINUATION) and length > self._max_block:
                raise ProtocolViolation(ENHANCE_YOUR_CALM, f"header block of {length} bytes")
            if end - pos - 9 < length:
                break
            payload = bytes(buffer[pos + 9 : pos + 9 + length])
            pos += 9 + length
            self._frame(kind, flags, stream_id & 0x7FFFFFFF, payload)
            if self._transport is None or self._write_paused:
                break  # what is left stays buffered until the peer reads again
            if self._turn_calls >= CALLS_PER_TURN and end - pos >= 9:
                self._backlog = True  # the rest in a later turn, after other connections
                self._loop.call_soon(self._next_turn)
                self._update_reading()
                break
        del buffer[:pos]

    def _flood(self, budget: _FloodBudget, what: str) -> None:
        if not budget.spend(self._loop.time()):
            raise ProtocolViolation(ENHANCE_YOUR_CALM, f"{what} flood")

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuing is not None and (
            kind != CONTINUATION or stream_id != self._continuing[0]
        ):
            raise ProtocolViolation(PROTOCOL_ERROR, "header block interrupted")
        if kind == DATA:
            if not payload and not flags & END_STREAM:
                self._flood(self._empty_frames, "empty DATA")
            self._on_data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            if not payload and not flags & END_HEADERS:
                self._flood(self._empty_frames, "empty CONTINUATION")
            self._on_continuation(flags, stream_id, payload)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._flood(self._control_frames, "SETTINGS")
            self._on_settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == PING:
            if len(payload) != 8 or stream_id:
                raise ProtocolViolation(FRAME_SIZE_ERROR, "malformed PING")
            if not flags & ACK:
                self._flood(self._control_frames, "PING")
                self._out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self._on_rst_stream(stream_id, payload)
        elif kind == GOAWAY:
            if stream_id:
                raise ProtocolViolation(PROTOCOL_ERROR, "GOAWAY on a stream")
            self._going_away = True  # the client opens no more streams; answer the open ones
        elif kind == PUSH_PROMISE:
            raise ProtocolViolation(PROTOCOL_ERROR, "clients must not push")
        elif kind == PRIORITY:
            self._on_priority(stream_id, payload)
        # Unknown frame types are ignored (RFC 9113 5.5)

    def _on_priority(self, stream_id: int, payload: bytes) -> None:
        """Priorities are checked, then ignored (RFC 9113 5.3.2)."""
        if stream_id == 0:
            raise ProtocolViolation(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            self._stream_error(stream_id, FRAME_SIZE_ERROR)
        elif int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == stream_id:
            self._stream_error(stream_id, PROTOCOL_ERROR)

    def _stream_error(self, stream_id: int, code: int) -> None:
        """RST_STREAM for a stream, open or not (RFC 9113 5.4.2); the connection goes on."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._reset(stream, code)
            return
        self._out.append(_rst_stream(stream_id, code))
        self._remember(stream_id, reset_here=True)

    def _remember(self, stream_id: int, reset_here: bool) -> None:
        self._recent[stream_id] = reset_here
        if len(self._recent) > RECENT_STREAMS:
            del self._recent[next(iter(self._recent))]

    def _closed_stream(self, stream_id: int, what: str) -> None:
        """A frame that only an open stream may carry, on a stream that is not open."""
        if stream_id > self._last_stream_id:
            raise ProtocolViolation(PROTOCOL_ERROR, f"{what} on idle stream {stream_id}")
        reset_here = self._recent.get(stream_id)
        if reset_here is None:  # skipped (or closed long ago): ids only grow (RFC 9113 5.1.1)
            raise ProtocolViolation(PROTOCOL_ERROR, f"{what} on stream {stream_id}, not open")
        if not reset_here:  # frames on a stream this server reset are ignored
            raise ProtocolViolation(STREAM_CLOSED, f"{what} on closed stream {stream_id}")

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise ProtocolViolation(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[1 : len(payload) - payload[0]]

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolViolation(PROTOCOL_ERROR, "DATA on stream 0")
        self._receive_window -= len(payload)
        if self._receive_window < 0:
            raise ProtocolViolation(FLOW_CONTROL_ERROR, "connection window exceeded")
        data = self._unpad(flags, payload)  # bad padding is a connection error, on any stream
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_closed:
            self._reopen_window()  # nothing of it is kept
            if stream is None:
                self._closed_stream(stream_id, "DATA")
            else:  # half-closed (remote): the peer said it had sent everything
                self._reset(stream, STREAM_CLOSED)
            return
        stream.received += len(data)
        if stream.content_length is not None and (
            stream.received > stream.content_length
            or (flags & END_STREAM and stream.received != stream.content_length)
        ):
            self._reset(stream, PROTOCOL_ERROR)  # malformed: the body and content-length differ
            self._reopen_window()
            return
        stream.unacked += len(payload)
        if stream.unacked > STREAM_WINDOW:
            raise ProtocolViolation(FLOW_CONTROL_ERROR, f"stream {stream_id} window exceeded")
        request = stream.request
        if not stream.dispatched or request.arrived is not None:  # else answered: dropped
            request.size += len(data)
            if request.size > self._max_body:
                request.too_large = True
                request.chunks.clear()
                self._release(stream)
                self._dispatch(stream)  # answer now; the rest of the body is discarded
            elif data:
                request.chunks.append(data)
                stream.buffered += len(data)
                self._hold(len(data))
        self._reopen_window()  # padding and dropped bytes are consumed at once
        if flags & END_STREAM:
            stream.remote_closed = True
            request.ended = True
            self._dispatch(stream)
        if request.arrived is not None:
            request.arrived.set()
        elif stream.unacked >= STREAM_WINDOW // 2:
            # The stream's own window reopens as its body arrives (the request is consumed
            # whole, up to the body limit); the connection's window bounds the memory.
            self._out.append(_window_update(stream_id, stream.unacked))
            stream.unacked = 0
        self._update_reading()

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0 or stream_id % 2 == 0:
            raise ProtocolViolation(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise ProtocolViolation(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if int.from_bytes(block[:4], "big") & 0x7FFFFFFF == stream_id:
                flags |= SELF_DEPENDENT  # decoded (for the table), then refused
            block = block[5:]
        if flags & END_HEADERS:
            self._on_header_block(flags, stream_id, block)
        else:
            self._continuing = (stream_id, flags, bytearray(block))
            self._continuing_since = self._loop.time()

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuing is None:
            raise ProtocolViolation(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        _, first_flags, block = self._continuing
        block += payload
        if len(block) > self._max_block:
            raise ProtocolViolation(ENHANCE_YOUR_CALM, f"header block over {self._max_block} bytes")
        if flags & END_HEADERS:
            self._continuing = None
            self._on_header_block(first_flags, stream_id, bytes(block))

    def _on_header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        fields: tuple[tuple[bytes, bytes], ...] = ()
        oversized = False
        try:  # always decoded: the decoder's table must follow the peer's encoder
            fields = self._decoder.decode(block)
        except hpack.HeaderListTooLarge as error:
            oversized = True  # the table is in step: only this stream fails
            if error.path:  # all that is kept: which method the refused call was for
                fields = ((b":path", error.path),)
        except hpack.HpackError as error:
            raise ProtocolViolation(COMPRESSION_ERROR, str(error)) from None
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers of a request: they must end it
            if stream.remote_closed:
                self._reset(stream, STREAM_CLOSED)
            elif (
                not flags & END_STREAM
                or malformed(fields, trailers=True)
                or stream.content_length not in (None, stream.received)
            ):
                self._reset(stream, PROTOCOL_ERROR)
            else:
                stream.remote_closed = True
                stream.request.ended = True
                if stream.request.arrived is not None:
                    stream.request.arrived.set()
                self._dispatch(stream)
            return
        if stream_id <= self._last_stream_id:
            self._closed_stream(stream_id, "HEADERS")
            return  # a stream this server reset: its late frames are ignored
        self._last_stream_id = stream_id
        if flags & SELF_DEPENDENT or (not oversized and malformed(fields)):
            self._stream_error(stream_id, PROTOCOL_ERROR)
            return
        if self._going_away or len(self._streams) >= self._limits.max_concurrent_streams:
            self._stream_error(stream_id, REFUSED_STREAM)
            return
        headers = dict(fields)
        request = Request(stream_id, headers, headers_too_large=oversized)
        stream = _Stream(request, send_window=self._peer_window, opened=self._loop.time())
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                self._stream_error(stream_id, PROTOCOL_ERROR)
                return
            stream.content_length = int(length)
        self._streams[stream_id] = stream
        if not oversized and self._streaming is not None and self._streaming(headers):
            request.arrived = asyncio.Event()
            request.send = functools.partial(self._send_message, stream)
        if flags & END_STREAM:
            stream.remote_closed = True
            request.ended = True
            if stream.content_length:
                self._reset(stream, PROTOCOL_ERROR)  # a body was announced, none came
                return
            self._dispatch(stream)
        elif (
            request.arrived is not None
            or oversized
            or (self._answers_early is not None and self._answers_early(headers))
        ):
            self._dispatch(stream)  # answered at once; the body that follows is discarded

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ProtocolViolation(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolViolation(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ProtocolViolation(FRAME_SIZE_ERROR, "malformed SETTINGS")
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolViolation(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self._peer_window
                self._peer_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
            elif key == SETTINGS_ENABLE_PUSH and value > 1:
                raise ProtocolViolation(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH of {value}")
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
                    raise ProtocolViolation(PROTOCOL_ERROR, f"max frame size {value}")
                self._peer_max_frame = value
            # The others need nothing: responses never index into the peer's HPACK table,
            # this server never pushes, and it opens no streams of its own.
        self._out.append(frame(SETTINGS, ACK, 0))
        self._send_blocked()

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(FRAME_SIZE_ERROR, "malformed WINDOW_UPDATE")
        increment = struct.unpack(">L", payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ProtocolViolation(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ProtocolViolation(FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            stream = self._streams.get(stream_id)
            if stream is None:
                if stream_id > self._last_stream_id:
                    raise ProtocolViolation(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle {stream_id}")
                return  # a closed stream: WINDOW_UPDATE may still arrive (RFC 9113 6.9)
            if increment == 0:
                self._reset(stream, PROTOCOL_ERROR)
                return
            stream.send_window += increment
            if stream.send_window > MAX_WINDOW:
                self._reset(stream, FLOW_CONTROL_ERROR)
                return
        self._send_blocked()

    def _on_rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(FRAME_SIZE_ERROR, "malformed RST_STREAM")
        if stream_id == 0 or stream_id > self._last_stream_id:
            raise ProtocolViolation(PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        # Rapid reset (CVE-2023-44487): opening and cancelling streams costs the server work
        # and the client nothing, so cancelled calls are budgeted per connection.
        self._flood(self._resets, "RST_STREAM")
        self._forget(stream)
        self._remember(stream_id, reset_here=False)
        if stream.task is not None:
            stream.task.cancel()  # the client gave up: so does its request

    # answering -------------------------------------------------------------------------------

    def _dispatch(self, stream: _Stream) -> None:
        if stream.dispatched:
            return
        stream.dispatched = True
        self._turn_calls += 1
        if self._congested():
            self._queued[stream.request.stream_id] = stream  # started when the peer catches up
            self._update_reading()
            return
        stream.task = self._loop.create_task(self._answer(stream))

    def _start_queued(self) -> None:
        while self._queued and not self._congested():
            stream_id = next(iter(self._queued))
            stream = self._queued.pop(stream_id)
            stream.task = self._loop.create_task(self._answer(stream))

    async def _answer(self, stream: _Stream) -> None:
        try:
            response = await self._handler(stream.request)
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("unhandled error answering stream %d", stream.request.stream_id)
            stream.task = None
            if self._streams.get(stream.request.stream_id) is stream:
                self._reset(stream, INTERNAL_ERROR)
                self._flush()
            return
        stream.task = None
        self._respond(stream, response)
        self._flush()

    def _respond(self, stream: _Stream, response: Response) -> None:
        stream_id = stream.request.stream_id
        if self._streams.get(stream_id) is not stream:
            return  # reset by the peer, or the connection is gone
        self._release(stream)  # the request is consumed: its bytes no longer count
        size = len(response.data)
        if self._parked and (
            self._parked + size > self._connection_budget
            or self._budget.used + size > self._budget.limit
        ):
            # The peer has not taken what it was already sent: an answer it would not read
            # either is dropped rather than held (each call started below the budget).
            self._reset(stream, ENHANCE_YOUR_CALM)
            return
        stream.open_ended = False
        if stream.headers_sent:  # a streamed answer: its end
            self._queue_data(stream, response.data)
            stream.pending_trailers = response.trailers
            self._send_pending(stream)
            return
        ends = not response.data and response.trailers is None
        self._header_frames(stream_id, response.headers, END_STREAM if ends else 0)
        if ends:
            self._finish(stream)
            return
        self._queue_data(stream, response.data)
        stream.pending_trailers = response.trailers
        self._send_pending(stream)

    def _queue_data(self, stream: _Stream, data: bytes) -> None:
        """Answer bytes held (and charged to the budgets) until they go to the socket."""
        if stream.pending is not None and len(stream.pending):
            data = bytes(stream.pending) + data
        stream.pending = memoryview(data)
        added = len(data) - stream.parked
        stream.parked = len(data)
        self._parked += added
        self._hold(added)

    def _send_message(self, stream: _Stream, headers: bytes, data: bytes) -> bool:
        """A streamed answer's next data (its headers first); ``Request.send``."""
        stream_id = stream.request.stream_id
        if self._streams.get(stream_id) is not stream:
            return False
        if not stream.headers_sent:
            stream.headers_sent = True
            self._header_frames(stream_id, headers, 0)
        stream.open_ended = True
        self._queue_data(stream, data)
        self._send_pending(stream)
        self._flush()
        return True

    def _header_frames(self, stream_id: int, block: bytes, flags: int) -> None:
        limit = self._peer_max_frame
        if len(block) <= limit:
            self._out.append(frame(HEADERS, flags | END_HEADERS, stream_id, block))
            return
        self._out.append(frame(HEADERS, flags, stream_id, block[:limit]))
        for start in range(limit, len(block), limit):
            last = start + limit >= len(block)
            piece = block[start : start + limit]
            self._out.append(frame(CONTINUATION, END_HEADERS if last else 0, stream_id, piece))

    def _send_pending(self, stream: _Stream) -> None:
        """Send what the windows allow of a response; park the stream if they do not, or
        while the peer does not read what was already written."""
        data = stream.pending
        assert data is not None
        stream_id = stream.request.stream_id
        sent = 0
        while sent < len(data):
            size = min(len(data) - sent, self._peer_max_frame, stream.send_window,
                       self._send_window)  # fmt: skip
            if size <= 0 or self._write_paused:
                stream.pending = data[sent:]
                self._blocked[stream_id] = stream
                self._unhold(stream, sent)
                return
            last = sent + size == len(data) and stream.pending_trailers is None
            last = last and not stream.open_ended
            self._out.append(
                frame(DATA, END_STREAM if last else 0, stream_id, bytes(data[sent : sent + size]))
            )
            sent += size
            stream.send_window -= size
            self._send_window -= size
        stream.pending = None
        self._blocked.pop(stream_id, None)
        self._unhold(stream, sent)
        if stream.open_ended:
            return  # more of a streamed answer will follow
        if not data and stream.pending_trailers is None:  # a streamed answer ends bare
            self._out.append(frame(DATA, END_STREAM, stream_id))
        if stream.pending_trailers is not None:
            self._header_frames(stream_id, stream.pending_trailers, END_STREAM)
        self._finish(stream)

    def _unhold(self, stream: _Stream, size: int) -> None:
        """``size`` bytes of a parked response went to the socket (bounded by pause_writing)."""
        if size:
            stream.parked -= size
            self._parked -= size
            self._hold(-size)

    def _send_blocked(self) -> None:
        for stream in list(self._blocked.values()):
            if self._send_window <= 0 or self._write_paused:
                break
            if stream.send_window > 0:
                self._send_pending(stream)
        self._reopen_window()
        self._start_queued()
        self._update_reading()

    def _forget(self, stream: _Stream) -> None:
        """The stream is over: drop it and what it holds."""
        stream_id = stream.request.stream_id
        self._streams.pop(stream_id, None)
        self._blocked.pop(stream_id, None)
        self._queued.pop(stream_id, None)
        if stream.buffered or stream.parked:
            self._parked -= stream.parked
            self._hold(-(stream.buffered + stream.parked))
            stream.buffered = stream.parked = 0
            self._reopen_window()
            self._start_queued()
            self._update_reading()

    def _finish(self, stream: _Stream) -> None:
        """The response is out: forget the stream (and stop an unread request body)."""
        self._forget(stream)
        self._remember(stream.request.stream_id, reset_here=not stream.remote_closed)
        if not stream.remote_closed:
            self._out.append(_rst_stream(stream.request.stream_id, NO_ERROR))
        if self._going_away and not self._streams:
            self._flush()
            if self._transport is not None:
                self._transport.close()

    def _reset(self, stream: _Stream, code: int) -> None:
        self._forget(stream)
        self._remember(stream.request.stream_id, reset_here=True)
        self._out.append(_rst_stream(stream.request.stream_id, code))
        if stream.task is not None:
            stream.task.cancel()

    def _goaway(self, code: int, debug: bytes = b"") -> None:
        self._going_away = True
        payload = struct.pack(">LL", self._last_stream_id, code) + debug
        self._out.append(frame(GOAWAY, 0, 0, payload))

    def _flush(self) -> None:
        if self._out and self._transport is not None:
            self._transport.write(b"".join(self._out) if len(self._out) > 1 else self._out[0])
        self._out.clear()

    # shutdown --------------------------------------------------------------------------------

    def shut_down(self) -> None:
        """Refuse new streams (GOAWAY), answer the open ones, then close."""
        if self._transport is None:
            return
        self._goaway(NO_ERROR)
        self._flush()
        if not self._streams:
            self._transport.close()

    def _age_out(self) -> None:
        """The connection reached its maximum age: ask the client to reconnect, as gRPC servers'
        MAX_CONNECTION_AGE does, so that a long-lived client re-enters the Service's balancing
        and reaches replicas added since it connected. First a GOAWAY naming the highest stream
        id (streams the client is opening right now are still served), a second later the final
        one; calls still running when the grace ends are cut."""
        if self._transport is None or self._going_away:
            return
        self._out.append(frame(GOAWAY, 0, 0, struct.pack(">LL", MAX_STREAM_ID, NO_ERROR)))
        self._flush()
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(AGE_GOAWAY_GAP_SECONDS, self.shut_down))
        self._timers.append(
            loop.call_later(AGE_GOAWAY_GAP_SECONDS + self._max_age_grace, self.abort)
        )

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
