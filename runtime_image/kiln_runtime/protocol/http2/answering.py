"""The answering side of an HTTP/2 connection: complete requests in, answers out.

Why it exists: a request is handed to the handler as a task once complete (or at once, when
its headers decide it), queued while the peer does not take its answers; the answer is written
as headers, data and trailers within the peer's flow-control windows, its remainder parked until
a WINDOW_UPDATE. A stream's end (answered, reset or refused) releases what it held. This layer
calls only ``state``; the frames that drive it arrive through ``receiving``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from kiln_runtime.protocol.http2.messages import Response
from kiln_runtime.protocol.http2.state import ConnectionState, Stream
from kiln_runtime.protocol.http2.wire import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    HEADERS,
    INTERNAL_ERROR,
    NO_ERROR,
    frame,
    rst_stream,
)

log = logging.getLogger(__name__)

# Every call's task is built with this name: without one, the task formats a "Task-N" name
# of its own, and uvloop's create_task always builds it so, then renames it. Building the task
# directly, named, skips both (about a microsecond per call). Final: compiled, a constant.
_ANSWER_TASK_NAME: Final = "kiln-answer"


class Answering(ConnectionState):
    """Requests to the handler, answers to the socket within the peer's windows."""

    def _dispatch(self, stream: Stream) -> None:
        if stream.dispatched:
            return
        stream.dispatched = True
        self._turn_calls += 1
        if self._congested():
            self._queued[stream.request.stream_id] = stream  # started when the peer catches up
            self._update_reading()
            return
        self._start(stream)

    def _start_queued(self) -> None:
        while self._queued and not self._congested():
            stream_id = next(iter(self._queued))
            self._start(self._queued.pop(stream_id))

    def _start(self, stream: Stream) -> None:
        stream.task = asyncio.Task(self._answer(stream), loop=self._loop, name=_ANSWER_TASK_NAME)

    async def _answer(self, stream: Stream) -> None:
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
        if stream.request.over_capacity:  # refused: the client is to go elsewhere
            self._goaway(NO_ERROR)
            if not self._streams and self._transport is not None:
                self._flush()
                self._transport.close()
                return
        self._flush_soon()

    def _respond(self, stream: Stream, response: Response) -> None:
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
        data = response.data
        if (
            0 < size <= stream.send_window
            and size <= self._send_window
            and size <= self._peer_max_frame
            and response.trailers is not None
            and not stream.headers_sent
            and not self._parked
            and not self._write_paused
        ):
            # The usual unary answer: it fits the peer's windows and one frame, nothing waits
            # before it, so it goes out whole, with nothing to park or account.
            self._header_frames(stream_id, response.headers, 0)
            self._out.append(frame(DATA, 0, stream_id, data))
            self._header_frames(stream_id, response.trailers, END_STREAM)
            stream.send_window -= size
            self._send_window -= size
            self._finish(stream)
            return
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

    def _queue_data(self, stream: Stream, data: bytes) -> None:
        """Answer bytes held (and charged to the budgets) until they go to the socket."""
        if stream.pending is not None and len(stream.pending):
            data = bytes(stream.pending) + data
        stream.pending = memoryview(data)
        added = len(data) - stream.parked
        stream.parked = len(data)
        self._parked += added
        self._hold(added)

    def _send_message(self, stream: Stream, headers: bytes, data: bytes) -> bool:
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

    def _send_pending(self, stream: Stream) -> None:
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

    def _unhold(self, stream: Stream, size: int) -> None:
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

    def _forget(self, stream: Stream) -> None:
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

    def _finish(self, stream: Stream) -> None:
        """The response is out: forget the stream (and stop an unread request body)."""
        self._forget(stream)
        self._remember(stream.request.stream_id, reset_here=not stream.remote_closed)
        if not stream.remote_closed:
            self._out.append(rst_stream(stream.request.stream_id, NO_ERROR))
        if self._going_away and not self._streams:
            self._close()

    def _reset(self, stream: Stream, code: int) -> None:
        self._forget(stream)
        self._remember(stream.request.stream_id, reset_here=True)
        self._out.append(rst_stream(stream.request.stream_id, code))
        if stream.task is not None:
            stream.task.cancel()
