"""What one HTTP/2 connection holds, and the accounting that keeps it within its budgets.

Why it exists: ``Http2Connection`` is one object built in layers, each a class of this package
that calls only the layers below it: ``ConnectionState`` here (what the connection and each
stream hold, and its memory), ``answering.Answering`` (requests to the handler, answers to the
socket within the peer's windows), ``receiving.Receiving`` (frames from the socket) and
``connection.Http2Connection`` (the asyncio protocol, timeouts, shutdown). Everything the
connection holds is set in ``ConnectionState.__init__``, in one place.

The memory rules live here: request bytes are held until their call is answered, answer bytes
until the peer's window takes them, both charged to the connection's and the process's
budgets. The connection's receive window is reopened only as held bytes are released, and the
socket is not read while the peer does not read its own.
"""

from __future__ import annotations

import abc
import asyncio
import struct
from typing import TYPE_CHECKING

from kiln_runtime.config import Http2Limits
from kiln_runtime.protocol import hpack
from kiln_runtime.protocol.http2.budgets import FloodBudget, HealthReserve, MemoryBudget
from kiln_runtime.protocol.http2.messages import AnswersEarly, Handler, Request, Streaming
from kiln_runtime.protocol.http2.settings import CONNECTION_WINDOW
from kiln_runtime.protocol.http2.wire import (
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    GOAWAY,
    frame,
    window_update,
)

if TYPE_CHECKING:
    from kiln_runtime.protocol.http2.connection import Http2Connection

LINGER_SECONDS = 1.0  # after its last frame, how long a closing connection still reads
RECENT_STREAMS = 1024  # closed streams remembered: late frames on them are told apart
# A compressed header block may be this many times the header list limit: up to it, a list
# over the limit fails only its own stream (the block is decoded for the table, its oversized
# fields skipped, and counted in the connection's memory while it arrives); past it the block
# is refused unread, ending the connection (256 KiB at the default 16 KiB: no client's
# metadata, only a flood, is that large).
HEADER_BLOCK_FACTOR = 16


class Stream:
    """One stream's request and what the connection tracks of it until its answer is out.

    A plain class, not a dataclass: mypyc compiles this ``__init__`` to C, while a dataclass's
    runs as interpreted Python (``protocol.types`` says more)."""

    def __init__(self, request: Request, send_window: int, opened: float) -> None:
        self.request = request
        self.send_window = send_window
        self.opened = opened  # loop time of its headers: the body timeout counts from here
        self.remote_closed = False
        self.dispatched = False
        self.unacked = 0  # bytes received since the last stream WINDOW_UPDATE
        self.received = 0  # body bytes received (unpadded), against content-length
        self.content_length: int | None = None
        self.buffered = 0  # request bytes this stream holds of the connection's budget
        self.parked = 0  # answer bytes this stream holds, waiting for the peer
        self.headers_sent = False  # a streamed answer's headers are out
        self.open_ended = False  # a streamed answer: more data may follow what is pending
        self.task: asyncio.Task[None] | None = None
        self.pending: memoryview | None = None  # response data waiting for the peer's window
        self.pending_trailers: bytes | None = None


class ConnectionState(asyncio.Protocol):
    """The state of one connection (``__init__``) and its memory accounting."""

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
        health: HealthReserve[ConnectionState] | None = None,
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
        self._health = health or HealthReserve()
        self._health_only = False  # admitted on the health budget: health checks only
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._preface_seen = False
        self._decoder = hpack.Decoder(max_header_list_size=limits.max_header_list_size)
        self._max_block = HEADER_BLOCK_FACTOR * limits.max_header_list_size
        self._streams: dict[int, Stream] = {}
        self._blocked: dict[int, Stream] = {}  # streams whose response waits for window
        self._queued: dict[int, Stream] = {}  # complete requests waiting for the budget
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
        self._parse_scheduled = False  # a parse of the buffer is due next turn
        self._resets = FloodBudget(limits.resets_per_second)
        self._empty_frames = FloodBudget(limits.empty_frames_per_second)
        self._control_frames = FloodBudget(limits.control_frames_per_second)
        self._opened = self._loop.time()
        self._last_active = self._opened  # last time a stream was open
        self._out: list[bytes] = []  # frames to send, written together by _flush
        self._flush_pending = False  # a _flush is scheduled for the end of this loop turn
        # Header lists seen on this connection, checked: clients repeat the same list call
        # after call (the HPACK decoder hands back the same tuple for a repeated block).
        self._checked: dict[
            tuple[tuple[bytes, bytes], ...], tuple[str | None, dict[bytes, bytes]]
        ] = {}
        self._going_away = False  # the final GOAWAY is out (or the peer's came): no new stream
        self._draining = False  # the first GOAWAY of a graceful drain is out (``connection``)
        self._awaiting_drain_ping = False  # its PING is not acknowledged yet
        self._lingering = False  # written to the end (FIN): reading on until the peer closes
        self.closed = self._loop.create_future()

    @property
    def idle(self) -> bool:
        """No stream is open: dropping the connection interrupts no call."""
        return not self._streams

    def evict(self) -> None:
        """Drop the connection at once to admit another (``HealthReserve.evict_idle``)."""
        self._connections.discard(self)
        self._health.connections.pop(self, None)
        if self._transport is not None:
            self._transport.abort()

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
        if self._transport is None or self._lingering:
            return
        congested = self._write_paused or self._backlog
        if congested and not self._read_paused:
            self._transport.pause_reading()
            self._read_paused = True
        elif not congested and self._read_paused:
            self._transport.resume_reading()
            self._read_paused = False
            if self._buffer:  # frames that arrived before the pause
                self._schedule_parse()

    def _schedule_parse(self) -> None:
        """Parse the buffer in the next turn, once however often it is asked for in this one:
        each parse may start ``CALLS_PER_TURN`` calls, so two in one turn would double a
        flood's share of the event loop (and four in the next, and so on)."""
        if not self._parse_scheduled:
            self._parse_scheduled = True
            self._loop.call_soon(self._next_turn)

    @abc.abstractmethod
    def _next_turn(self) -> None:
        """Parse what the buffer holds (``receiving``)."""

    def _reopen_window(self) -> None:
        """Give the peer back connection window for what was consumed, within the budgets."""
        if self._over_budget():
            return
        room = min(CONNECTION_WINDOW, self._connection_budget - self._held)
        increment = room - self._receive_window
        if increment >= min(CONNECTION_WINDOW // 2, room):
            self._receive_window += increment
            self._out.append(window_update(0, increment))

    def _release(self, stream: Stream) -> None:
        if stream.buffered:
            self._hold(-stream.buffered)
            stream.buffered = 0
            self._reopen_window()

    @abc.abstractmethod
    def shut_down(self) -> None:
        """The final GOAWAY: refuse new streams, answer the open ones, then close
        (``connection``)."""

    @abc.abstractmethod
    def budget_freed(self) -> None:
        """The process budget has room again (called by ``MemoryBudget``); ``Http2Connection``
        reopens the window and starts what waited."""

    # closed streams --------------------------------------------------------------------------

    def _remember(self, stream_id: int, reset_here: bool) -> None:
        self._recent[stream_id] = reset_here
        if len(self._recent) > RECENT_STREAMS:
            del self._recent[next(iter(self._recent))]

    # frames out ------------------------------------------------------------------------------

    def _goaway(self, code: int, debug: bytes = b"") -> None:
        self._going_away = True
        payload = struct.pack(">LL", self._last_stream_id, code) + debug
        self._out.append(frame(GOAWAY, 0, 0, payload))

    def _flush(self) -> None:
        if self._out and self._transport is not None and not self._lingering:
            self._transport.write(b"".join(self._out) if len(self._out) > 1 else self._out[0])
        self._out.clear()

    def _close(self) -> None:
        """End a connection that has said GOAWAY and answered its last stream, without a TCP
        reset: write what is queued, then the end of the stream (FIN), and read on (discarding)
        until the peer closes its side too, or ``LINGER_SECONDS`` pass. Closing outright with
        the peer's bytes unread (its WINDOW_UPDATE or PING racing the GOAWAY) makes the kernel
        send RST instead of FIN, and a client that gets RST may drop what it had not read yet:
        the final GOAWAY, the last answers (grpc-go issue 5358; Go lingers the same way)."""
        transport = self._transport
        if transport is None or self._lingering:
            return
        self._flush()
        if not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:  # the peer is gone already (ENOTCONN): nothing to linger for
            transport.close()
            return
        self._lingering = True
        if self._read_paused:  # the peer's end (EOF) must be seen
            transport.resume_reading()
            self._read_paused = False
        self._timers.append(self._loop.call_later(LINGER_SECONDS, transport.close))

    def _flush_soon(self) -> None:
        """Write what is queued once this loop turn's callbacks have run: the answers of one
        batch, completed in one turn, leave in one write (one system call, one segment)
        rather than one each."""
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._flush_turn)

    def _flush_turn(self) -> None:
        self._flush_pending = False
        self._flush()
