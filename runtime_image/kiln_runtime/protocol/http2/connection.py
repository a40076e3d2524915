"""One client's HTTP/2 connection: the asyncio protocol, its timeouts and its shutdown.

Why it exists: this is the face of the package, the object ``grpcserver`` creates per accepted
socket. It is the top layer of the connection (see ``state`` for the layers): it refuses a
connection over ``Http2Limits.max_connections`` at accept (past it, admits
``health_connections`` more for health checks only: ``budgets.HealthReserve``), sends the
server preface, feeds the socket's bytes to ``receiving``, pauses and resumes with the
socket's buffers, checks the preface, header, body and idle timeouts once a tick, and ends the
connection with GOAWAY: on shutdown, on a protocol error, and at its maximum age (gRPC's
MAX_CONNECTION_AGE), the last gracefully, as grpc-go's server drains a connection: a first
GOAWAY that still admits every stream, with a PING, and the final GOAWAY once the PING's ACK
shows the client has read the first, so that no call it sent in between is refused or lost.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
from typing import cast

from kiln_runtime.protocol.http2.receiving import Receiving
from kiln_runtime.protocol.http2.settings import server_preface
from kiln_runtime.protocol.http2.wire import (
    CANCEL,
    DRAIN_PING,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    MAX_STREAM_ID,
    NO_ERROR,
    PING,
    ProtocolViolation,
    frame,
)

log = logging.getLogger(__name__)

AGE_JITTER = 0.1  # a connection's maximum age varies by this fraction either way
# The final GOAWAY follows the drain PING's ACK; a client that sends none gets it after this.
DRAIN_PING_TIMEOUT_SECONDS = 1.0
WRITE_HIGH_WATER = 1 << 20  # bytes in the socket's send buffer before pause_writing
TICK_SECONDS = 1.0  # how often a connection checks its timeouts


class Http2Connection(Receiving):
    """One client's HTTP/2 connection: the asyncio protocol, its timeouts and its shutdown.

    Built in layers (``state``, ``answering``, ``receiving``): its constructor is
    ``ConnectionState.__init__``.
    """

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have Transport's methods without its class: no isinstance.
        transport = cast(asyncio.Transport, transport)
        limits = self._limits
        if len(self._connections) >= limits.max_connections:
            self._make_room()
        full = len(self._connections) >= limits.max_connections + limits.health_connections
        if full and not (limits.health_connections and self._health.evict_idle()):
            self._health.refused += 1
            self._health.refused_at = self._loop.time()
            if self._health.refused in (1, 10, 100) or self._health.refused % 1000 == 0:
                log.warning(
                    "gRPC port saturated: %d connections, none idle; %d refused so far",
                    len(self._connections), self._health.refused,
                )  # fmt: skip
            transport.abort()  # refused at accept: no preface, no memory
            return
        self._health_only = len(self._connections) >= limits.max_connections
        if self._health_only:
            self._health.connections[self] = None
        self._transport = transport
        self._connections.add(self)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        transport.write(server_preface(self._limits))
        self._timers.append(self._loop.call_later(TICK_SECONDS, self._tick))
        if self._max_age > 0:  # jittered, so connections made together do not age together
            age = self._max_age * random.uniform(1 - AGE_JITTER, 1 + AGE_JITTER)
            self._timers.append(self._loop.call_later(age, self._age_out))

    def _make_room(self) -> None:
        """At the cap, close the oldest connection not serving a call (one that never opened a
        stream first) to admit this one, rather than refusing every new client while idle
        sockets hold the port (GOAWAY NO_ERROR: a client that comes back reconnects)."""
        victim: Http2Connection | None = None
        for other in self._connections:
            if other in self._health.connections or not other.idle:
                continue
            if victim is None or (other._last_stream_id > 0, other._opened) < (
                victim._last_stream_id > 0,
                victim._opened,
            ):
                victim = other
        if victim is None:
            return
        self._health.evicted += 1
        if self._health.evicted in (1, 10, 100) or self._health.evicted % 1000 == 0:
            log.warning(
                "gRPC port at its cap of %d connections: the oldest idle one closed to admit a "
                "new one (%d so far)", self._limits.max_connections, self._health.evicted,
            )  # fmt: skip
        self._connections.discard(victim)
        victim.dismiss()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in self._timers:
            timer.cancel()
        self._connections.discard(self)
        self._health.connections.pop(self, None)
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
        if self._lingering:
            return  # the connection is over: read only to see the peer's end
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
        self._buffer.clear()  # the connection is over: nothing after the error is parsed
        self._goaway(error.code, str(error).encode()[:256])
        self._flush()
        if self._transport is not None:
            self._transport.close()

    # timeouts --------------------------------------------------------------------------------

    def _tick(self) -> None:
        """Once a second: the preface, header, body and idle timeouts."""
        if self._transport is None or self._lingering:
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
        never_streamed = not self._last_stream_id and self._continuing is None
        if never_streamed and now - self._opened > limits.header_timeout_seconds:
            self.dismiss()  # a connection that never opened a stream holds a slot for nothing
            return
        for stream in list(self._streams.values()):
            body_late = now - stream.opened > limits.body_timeout_seconds
            if body_late and not stream.remote_closed and not stream.dispatched:
                self._reset(stream, CANCEL)
        if self._streams:
            self._last_active = now
        elif now - self._last_active > limits.idle_timeout_seconds:
            self.dismiss()
        self._flush()

    # shutdown --------------------------------------------------------------------------------

    def dismiss(self) -> None:
        """GOAWAY and close at once a connection with no call in flight (idle, never streamed,
        or evicted at the cap): no answer can be lost to a reset, and its descriptor is freed
        now. Lingering as ``shut_down`` does would hold, for a second per connection, the
        descriptors the port's cap already counted as free: an idle flood at the file limit
        then made new connections, the kubelet's probes among them, fail at accept."""
        if self._transport is None or self._lingering:
            return
        self._goaway(NO_ERROR)
        self._flush()
        self._transport.close()

    def shut_down(self) -> None:
        """The final GOAWAY: refuse new streams, answer the open ones, then close."""
        if self._transport is None or self._lingering:
            return
        self._awaiting_drain_ping = False
        self._goaway(NO_ERROR)
        self._flush()
        if not self._streams:
            self._close()

    def _age_out(self) -> None:
        """The connection reached its maximum age: ask the client to reconnect, as gRPC servers'
        MAX_CONNECTION_AGE does, so that a long-lived client re-enters the Service's balancing
        and reaches replicas added since it connected. Drained as grpc-go drains: a GOAWAY
        naming the highest stream id (streams the client opens before it reads this are still
        served) and a PING; its ACK, which the client sends after reading the GOAWAY, shows
        that every stream it will ever open here has arrived: then the final GOAWAY, naming
        the last one (``receiving``). Calls still running ``max_age_grace`` seconds after the
        first GOAWAY are cut."""
        if self._transport is None or self._going_away or self._draining:
            return
        self._draining = self._awaiting_drain_ping = True
        self._out.append(frame(GOAWAY, 0, 0, struct.pack(">LL", MAX_STREAM_ID, NO_ERROR)))
        self._out.append(frame(PING, 0, 0, DRAIN_PING))
        self._flush()
        loop = self._loop
        self._timers.append(loop.call_later(DRAIN_PING_TIMEOUT_SECONDS, self._drain_ping_late))
        self._timers.append(loop.call_later(self._max_age_grace, self.abort))

    def _drain_ping_late(self) -> None:
        if self._awaiting_drain_ping:
            self.shut_down()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
