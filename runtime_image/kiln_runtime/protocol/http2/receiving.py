"""The receiving side of an HTTP/2 connection: bytes from the socket, checked frame by frame.

Why it exists: every frame a peer may send is parsed in place and checked against RFC 9113
here (stream states, flow-control windows, header blocks and their CONTINUATIONs, SETTINGS,
padding, priorities), and a violation becomes a stream error (RST_STREAM) or a connection error
(``ProtocolViolation``: GOAWAY). Flood budgets count the frames that cost the server work and the
client nothing. A burst of calls is parsed ``CALLS_PER_TURN`` at a time, so other connections'
calls interleave with it. Complete requests go to the ``answering`` layer below.
"""

from __future__ import annotations

import asyncio
import functools
import struct

from kiln_runtime.protocol import hpack
from kiln_runtime.protocol.http2.answering import Answering
from kiln_runtime.protocol.http2.budgets import FloodBudget
from kiln_runtime.protocol.http2.messages import Request, malformed
from kiln_runtime.protocol.http2.settings import MAX_FRAME_SIZE, STREAM_WINDOW
from kiln_runtime.protocol.http2.state import Stream
from kiln_runtime.protocol.http2.wire import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_MAX_FRAME,
    DRAIN_PING,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_HEADER,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    ProtocolViolation,
    frame,
    rst_stream,
    window_update,
)

SELF_DEPENDENT = 0x100  # not on the wire: marks a HEADERS whose priority names its own stream
# Calls one connection may start per event-loop turn: the rest of what it sent waits for the
# next turn (its socket unread meanwhile), so other connections' calls interleave with a flood.
CALLS_PER_TURN = 32
CHECKED_HEADER_LISTS = 16  # header lists remembered as checked, per connection


class Receiving(Answering):
    """Frames from the socket, checked and turned into requests, window updates and resets."""

    # the frame loop --------------------------------------------------------------------------

    def _next_turn(self) -> None:
        """Parse what a previous turn left (``CALLS_PER_TURN``), then read the socket again."""
        self._parse_scheduled = False
        self._backlog = False
        if self._transport is not None:
            self.data_received(b"")
            self._update_reading()

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
        unpack = FRAME_HEADER.unpack_from
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
                self._schedule_parse()
                self._update_reading()
                break
        del buffer[:pos]

    def _flood(self, budget: FloodBudget, what: str) -> None:
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
            elif payload == DRAIN_PING and self._awaiting_drain_ping:
                self.shut_down()  # the client has read the first GOAWAY: the final one
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

    # streams that are not open ---------------------------------------------------------------

    def _stream_error(self, stream_id: int, code: int) -> None:
        """RST_STREAM for a stream, open or not (RFC 9113 5.4.2); the connection goes on."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._reset(stream, code)
            return
        self._out.append(rst_stream(stream_id, code))
        self._remember(stream_id, reset_here=True)

    def _closed_stream(self, stream_id: int, what: str) -> None:
        """A frame that only an open stream may carry, on a stream that is not open."""
        if stream_id > self._last_stream_id:
            raise ProtocolViolation(PROTOCOL_ERROR, f"{what} on idle stream {stream_id}")
        reset_here = self._recent.get(stream_id)
        if reset_here is None:  # skipped (or closed long ago): ids only grow (RFC 9113 5.1.1)
            raise ProtocolViolation(PROTOCOL_ERROR, f"{what} on stream {stream_id}, not open")
        if not reset_here:  # frames on a stream this server reset are ignored
            raise ProtocolViolation(STREAM_CLOSED, f"{what} on closed stream {stream_id}")

    # a request: DATA, HEADERS, CONTINUATION --------------------------------------------------

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
            if request.size > self._max_body or (
                request.size >= 5 > request.size - len(data)
                and self._declares_too_much(request, data)
            ):
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
            self._out.append(window_update(stream_id, stream.unacked))
            stream.unacked = 0
        self._update_reading()

    def _declares_too_much(self, request: Request, data: bytes) -> bool:
        """The request's first gRPC message declares, in its length prefix, more than the body
        limit: it is refused there, before any of it is held (a prefix declaring 4 GiB would
        otherwise be buffered up to the limit first)."""
        if not request.headers.get(b"content-type", b"").startswith(b"application/grpc"):
            return False
        head = b"".join(request.chunks)[:5] + data[:5]
        return 5 + int.from_bytes(head[1:5], "big") > self._max_body

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
            self._hold(len(block))  # an unfinished block is memory the connection holds

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuing is None:
            raise ProtocolViolation(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        _, first_flags, block = self._continuing
        block += payload
        self._hold(len(payload))
        if len(block) > self._max_block:
            raise ProtocolViolation(ENHANCE_YOUR_CALM, f"header block over {self._max_block} bytes")
        if flags & END_HEADERS:
            self._continuing = None
            self._hold(-len(block))
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
        except hpack.HpackError as bad_block:  # one name per type: mypyc (setup.py)
            raise ProtocolViolation(COMPRESSION_ERROR, str(bad_block)) from None
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
        checked = None if oversized else self._check(fields, len(block))
        if flags & SELF_DEPENDENT or (checked is not None and checked[0]):
            self._stream_error(stream_id, PROTOCOL_ERROR)
            return
        if self._going_away:
            self._stream_error(stream_id, REFUSED_STREAM)
            return
        if len(self._streams) >= self._limits.max_concurrent_streams:
            # A client over the limit it was told: refusing costs the server a header block's
            # decoding and the client nothing; one that never reads its answers (so never
            # learns its streams closed) opens streams this way at full speed. Budgeted with
            # the resets: either is a stream opened for no call.
            self._flood(self._resets, "streams over the concurrency limit")
            self._stream_error(stream_id, REFUSED_STREAM)
            return
        headers = checked[1] if checked is not None else dict(fields)
        request = Request(stream_id, headers, headers_too_large=oversized)
        if self._health_only and headers.get(b":path") not in self._health.paths:
            request.over_capacity = True  # refused by the handler; then GOAWAY
        stream = Stream(request, send_window=self._peer_window, opened=self._loop.time())
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
            or request.over_capacity
            or (self._answers_early is not None and self._answers_early(headers))
        ):
            self._dispatch(stream)  # answered at once; the body that follows is discarded

    def _check(
        self, fields: tuple[tuple[bytes, bytes], ...], block_size: int
    ) -> tuple[str | None, dict[bytes, bytes]]:
        """Why a request's header list is malformed (or None), and the list as a dict. A list
        seen before on this connection is not checked again (the dict is shared: handlers
        only read it); only lists of blocks the HPACK decoder keeps too are remembered, so
        this pins no more than its cache does."""
        known = self._checked.get(fields)
        if known is None:
            known = (malformed(fields), dict(fields))
            if block_size <= hpack.CACHED_BLOCK_BYTES:
                if len(self._checked) >= CHECKED_HEADER_LISTS:
                    self._checked.clear()
                self._checked[fields] = known
        return known

    # SETTINGS, WINDOW_UPDATE, RST_STREAM -----------------------------------------------------

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
        if self._blocked:  # grpcio sends one or two per answer: most find nothing waiting
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
