"""The hand-written HTTP/2 server connection against an independent peer.

``kiln_runtime.protocol.http2`` replaces grpcio's server, so nothing else checks that it speaks
HTTP/2 correctly. These tests talk to it over real loopback TCP: well-formed exchanges through
hyper-h2's client state machine (which itself raises if the server breaks flow control or frame
size limits), malformed ones as raw frames whose answer is parsed by hand.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest

from kiln_runtime.config import Http2Limits
from kiln_runtime.protocol import hpack
from kiln_runtime.protocol.http2 import wire
from kiln_runtime.protocol.http2.budgets import HealthReserve, MemoryBudget
from kiln_runtime.protocol.http2.connection import DRAIN_PING_TIMEOUT_SECONDS, Http2Connection
from kiln_runtime.protocol.http2.messages import (
    AnswersEarly,
    Handler,
    Request,
    Response,
    Streaming,
)
from kiln_runtime.protocol.http2.settings import MAX_FRAME_SIZE
from kiln_runtime.protocol.http2.state import LINGER_SECONDS, ConnectionState

TIMEOUT = 5.0
OK = hpack.encode([(b":status", b"200"), (b"content-type", b"application/grpc")])
TRAILERS = hpack.encode([(b"grpc-status", b"0")])
RAW_START = wire.PREFACE + wire.frame(wire.SETTINGS, 0, 0)
END = wire.END_STREAM | wire.END_HEADERS

Frame = tuple[int, int, int, bytes]  # type, flags, stream id, payload
Event = h2.events.Event
E = TypeVar("E", bound=Event)
P = TypeVar("P", bound="Peer")


def request_fields(path: bytes) -> list[tuple[bytes, bytes]]:
    return [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"t")]


def raw_block(block: bytes, stream_id: int = 1) -> bytes:
    return wire.frame(wire.HEADERS, END, stream_id, block)


def raw_headers(stream_id: int, path: bytes) -> bytes:
    return raw_block(hpack.encode(request_fields(path)), stream_id)


async def echo(request: Request) -> Response:
    answer = b"too large" if request.too_large else request.headers[b":path"] + b" " + request.body
    return Response(OK, answer, TRAILERS)


def answering(response: Response) -> Handler:
    async def handler(request: Request) -> Response:
        return response

    return handler


class Peer:
    """One TCP connection to the server under test; it parses every frame the server sends."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames: list[Frame] = []
        self.eof = False
        self._buffer = b""

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    async def read(self, deadline: float) -> bytes:
        remaining = max(deadline - asyncio.get_running_loop().time(), 0)
        data = await asyncio.wait_for(self.reader.read(1 << 16), remaining)
        self.eof = not data
        self._buffer += data
        while len(self._buffer) >= 9:
            high, low, kind, flags, stream_id = struct.unpack_from(">BHBBL", self._buffer)
            end = 9 + (high << 16 | low)
            if len(self._buffer) < end:
                break
            self.frames.append((kind, flags, stream_id & 0x7FFFFFFF, self._buffer[9:end]))
            self._buffer = self._buffer[end:]
        return data

    async def frames_until(self, done: Callable[[list[Frame]], bool] | None) -> list[Frame]:
        """Read until ``done(frames)`` holds or, when ``done`` is None, until the server closes."""
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while not (done(self.frames) if done else self.eof):
            assert not self.eof, f"the server closed the connection; frames: {self.frames}"
            await self.read(deadline)
        return self.frames


class H2Client(Peer):
    """A Peer driven by hyper-h2's client state machine."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config)
        self.events: list[Event] = []
        self.conn.initiate_connection()
        self.send()

    def send(self) -> None:
        self.write(self.conn.data_to_send())

    def request(self, path: bytes, *chunks: bytes, end: bool = True) -> int:
        """Open a stream with one DATA frame per chunk; ``end`` ends the request."""
        stream_id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream_id, request_fields(path), end_stream=end and not chunks)
        for i, chunk in enumerate(chunks, 1):
            self.conn.send_data(stream_id, chunk, end_stream=end and i == len(chunks))
        self.send()
        return stream_id

    async def events_until(self, done: Callable[[list[Event]], bool]) -> list[Event]:
        """Read until ``done(all events so far)`` holds; h2's own replies (ACKs) go out."""
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while not done(self.events):
            data = await self.read(deadline)
            assert data, f"the server closed the connection; events: {self.events}"
            self.events += self.conn.receive_data(data)
            self.send()
        return self.events


class Harness:
    """One server on an ephemeral loopback port and the peers connected to it."""

    def __init__(self) -> None:
        self.connections: set[Http2Connection] = set()
        self.requests: list[Request] = []  # every request a handler was called with
        self._server: asyncio.Server | None = None
        self._peers: list[Peer] = []

    async def serve(
        self,
        handler: Handler = echo,
        max_body: int = 1 << 20,
        max_age: float = 0.0,
        max_age_grace: float = 10.0,
        *,
        limits: Http2Limits | None = None,
        answers_early: AnswersEarly | None = None,
        streaming: Streaming | None = None,
        health: HealthReserve[ConnectionState] | None = None,
    ) -> None:
        limits = limits or Http2Limits()
        self.budget = MemoryBudget(limits.process_buffer_bytes)
        self.health = health or HealthReserve()

        async def recording(request: Request) -> Response:
            self.requests.append(request)
            return await handler(request)

        self._server = await asyncio.get_running_loop().create_server(
            lambda: Http2Connection(
                recording,
                max_body,
                self.connections,
                max_age,
                max_age_grace,
                limits=limits,
                budget=self.budget,
                answers_early=answers_early,
                streaming=streaming,
                health=self.health,
            ),
            "127.0.0.1",
            0,
        )

    async def connect(self, kind: type[P]) -> P:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        peer = kind(*await asyncio.open_connection("127.0.0.1", port))
        self._peers.append(peer)
        return peer

    async def close(self) -> None:
        for peer in self._peers:
            peer.writer.close()
        for connection in list(self.connections):
            connection.abort()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    harness = Harness()
    yield harness
    await harness.close()


def of(events: list[Event], kind: type[E], sid: int | None = None) -> list[E]:
    return [e for e in events if isinstance(e, kind) and sid in (None, getattr(e, "stream_id", 0))]


def has(kind: type[Event], stream_id: int | None = None) -> Callable[[list[Event]], bool]:
    return lambda events: bool(of(events, kind, stream_id))


def body(events: list[Event], stream_id: int) -> bytes:
    return b"".join(e.data or b"" for e in of(events, h2.events.DataReceived, stream_id))


def more_data(stream_id: int, than: int) -> Callable[[list[Event]], bool]:
    return lambda events: len(body(events, stream_id)) > than or has(h2.events.StreamEnded)(events)


def goaway(frames: list[Frame]) -> tuple[int, int]:
    """The (last stream id, error code) of the one GOAWAY, which must be the last frame."""
    assert [f[0] for f in frames].count(wire.GOAWAY) == 1, frames
    assert frames[-1][0] == wire.GOAWAY, frames
    last_stream_id, code = struct.unpack_from(">LL", frames[-1][3])
    return last_stream_id, code


async def test_post_gets_headers_data_and_trailers(harness: Harness) -> None:
    await harness.serve()
    client = await harness.connect(H2Client)
    sid = client.request(b"/pkg.Svc/Call", b"ab", b"cd", b"ef")
    events = await client.events_until(has(h2.events.StreamEnded, sid))

    (response,) = of(events, h2.events.ResponseReceived, sid)
    assert (b":status", b"200") in (response.headers or [])
    assert body(events, sid) == b"/pkg.Svc/Call abcdef"
    (trailers,) = of(events, h2.events.TrailersReceived, sid)
    assert trailers.headers == [(b"grpc-status", b"0")]
    (request,) = harness.requests
    assert request.headers[b":path"] == b"/pkg.Svc/Call"
    assert request.headers[b":method"] == b"POST"
    assert request.body == b"abcdef"


@pytest.mark.parametrize(
    ("initial_window", "size", "first_burst"),
    [
        pytest.param(1000, 50_000, 1000, id="stream-window"),
        pytest.param(1 << 20, 100_000, 65_535, id="connection-window"),
    ],
)
async def test_response_waits_for_the_client_window(
    harness: Harness, initial_window: int, size: int, first_burst: int
) -> None:
    payload = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    await harness.serve(answering(Response(OK, payload, TRAILERS)))
    client = await harness.connect(H2Client)
    client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: initial_window})
    sid = client.request(b"/big")

    await client.events_until(lambda events: len(body(events, sid)) >= first_burst)
    client.conn.ping(b"flowctl!")  # the server answers in order: nothing more is on its way
    client.send()
    await client.events_until(has(h2.events.PingAckReceived))
    assert len(body(client.events, sid)) == first_burst
    assert not has(h2.events.StreamEnded)(client.events)

    acked = 0
    while not has(h2.events.StreamEnded, sid)(client.events):
        received = len(body(client.events, sid))  # unpadded: what the window counted
        client.conn.acknowledge_received_data(received - acked, sid)
        acked = received
        client.send()
        await client.events_until(more_data(sid, received))

    assert body(client.events, sid) == payload
    stream = [e for e in client.events if getattr(e, "stream_id", None) == sid]
    assert isinstance(stream[-2], h2.events.TrailersReceived)
    assert isinstance(stream[-1], h2.events.StreamEnded)


async def test_large_response_is_split_into_frames_the_client_accepts(harness: Harness) -> None:
    payload = bytes(range(256)) * 160  # 40 960 bytes, above the default 16 384-byte frame limit
    await harness.serve(answering(Response(OK, payload, TRAILERS)))
    client = await harness.connect(H2Client)
    sid = client.request(b"/big")
    events = await client.events_until(has(h2.events.StreamEnded, sid))

    sizes = [e.flow_controlled_length or 0 for e in of(events, h2.events.DataReceived, sid)]
    assert len(sizes) >= 3
    assert max(sizes) <= 16_384
    assert body(events, sid) == payload


async def test_large_header_block_is_split_into_continuation_frames(harness: Harness) -> None:
    # 40 000 bytes is above the 16 384-byte frame limit and below h2's 64 KiB header list limit.
    value = b"v" * 40_000
    await harness.serve(
        answering(Response(hpack.encode([(b":status", b"200"), (b"x-big", value)])))
    )
    client = await harness.connect(H2Client)
    sid = client.request(b"/headers")
    events = await client.events_until(has(h2.events.StreamEnded, sid))

    (response,) = of(events, h2.events.ResponseReceived, sid)
    assert (b"x-big", value) in (response.headers or [])
    frames = [f for f in client.frames if f[2] == sid]
    assert [(f[0], f[1]) for f in frames] == [
        (wire.HEADERS, wire.END_STREAM),
        (wire.CONTINUATION, 0),
        (wire.CONTINUATION, wire.END_HEADERS),
    ]
    assert all(len(f[3]) <= 16_384 for f in frames)


@pytest.mark.parametrize(
    "late",
    [
        pytest.param(wire.frame(wire.DATA, wire.END_STREAM, 1, b"x" * 600), id="data"),
        # request trailers; a block of literals leaves the server's HPACK table as it is
        pytest.param(raw_block(hpack.encode([(b"x-n", b"1")])), id="trailers"),
    ],
)
async def test_body_over_the_limit_is_answered_then_reset(harness: Harness, late: bytes) -> None:
    await harness.serve(max_body=1000)
    client = await harness.connect(H2Client)
    sid = client.request(b"/big", b"x" * 600, b"x" * 600, end=False)
    events = await client.events_until(has(h2.events.StreamReset, sid))

    assert sid == 1
    assert harness.requests[0].too_large
    assert body(events, sid) == b"too large"
    assert has(h2.events.TrailersReceived, sid)(events)
    (reset,) = of(events, h2.events.StreamReset, sid)
    assert reset.error_code == h2.errors.ErrorCodes.NO_ERROR

    # The rest of the request was already on its way when the server reset the stream: RFC 9113
    # 5.1 says it MUST be ignored, and the connection serves the next request.
    client.write(late)
    next_sid = client.request(b"/small", b"ok")
    events = await client.events_until(has(h2.events.StreamEnded, next_sid))
    assert body(events, next_sid) == b"/small ok"


async def test_ping_is_answered_with_the_same_payload(harness: Harness) -> None:
    await harness.serve()
    client = await harness.connect(H2Client)
    client.conn.ping(b"\x01\x02\x03\x04\xfa\xfb\xfc\xfd")
    client.send()
    events = await client.events_until(has(h2.events.PingAckReceived))
    (ack,) = of(events, h2.events.PingAckReceived)
    assert ack.ping_data == b"\x01\x02\x03\x04\xfa\xfb\xfc\xfd"


async def test_client_reset_cancels_the_handler(harness: Harness) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(request: Request) -> Response:
        if request.headers[b":path"] == b"/hang":
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return await echo(request)

    await harness.serve(handler)
    client = await harness.connect(H2Client)
    sid = client.request(b"/hang")
    await asyncio.wait_for(started.wait(), TIMEOUT)
    client.conn.reset_stream(sid)
    client.send()
    await asyncio.wait_for(cancelled.wait(), TIMEOUT)

    next_sid = client.request(b"/after", b"ok")
    events = await client.events_until(has(h2.events.StreamEnded, next_sid))
    assert body(events, next_sid) == b"/after ok"


def split_request(path: bytes) -> tuple[bytes, bytes, bytes]:
    block = hpack.encode([*request_fields(path), (b"x-long", b"v" * 300)])
    return block[:100], block[100:200], block[200:]


async def test_continuation_frames_are_assembled(harness: Harness) -> None:
    await harness.serve()
    peer = await harness.connect(Peer)
    first, middle, last = split_request(b"/split")
    peer.write(
        RAW_START
        + wire.frame(wire.HEADERS, wire.END_STREAM, 1, first)
        + wire.frame(wire.CONTINUATION, 0, 1, middle)
        + wire.frame(wire.CONTINUATION, wire.END_HEADERS, 1, last)
    )
    frames = await peer.frames_until(lambda frames: any(f[2] == 1 and f[1] & 1 for f in frames))

    assert [f for f in frames if f[2] == 1] == [
        (wire.HEADERS, wire.END_HEADERS, 1, OK),
        (wire.DATA, 0, 1, b"/split "),
        (wire.HEADERS, END, 1, TRAILERS),
    ]
    assert harness.requests[0].headers[b"x-long"] == b"v" * 300


UNFINISHED = RAW_START + wire.frame(wire.HEADERS, wire.END_STREAM, 1, split_request(b"/")[0])
MALFORMED = {  # what a client sends: the error code of the server's GOAWAY
    "http1": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", wire.PROTOCOL_ERROR),
    "short-bad-preface": (b"PRI * HTTP/1.1\r\n", wire.PROTOCOL_ERROR),
    "hpack-truncated-integer": (RAW_START + raw_block(b"\xff" * 5), wire.COMPRESSION_ERROR),
    "hpack-index-62-empty-table": (RAW_START + raw_block(b"\xbe"), wire.COMPRESSION_ERROR),
    "ping-in-header-block": (
        UNFINISHED + wire.frame(wire.PING, 0, 0, b"8 bytes!"),
        wire.PROTOCOL_ERROR,
    ),
    "headers-in-header-block": (UNFINISHED + raw_headers(3, b"/other"), wire.PROTOCOL_ERROR),
    "other-stream-continuation": (
        UNFINISHED + wire.frame(wire.CONTINUATION, wire.END_HEADERS, 3, b""),
        wire.PROTOCOL_ERROR,
    ),
    "reset-of-idle-stream": (
        RAW_START + wire.frame(wire.RST_STREAM, 0, 5, b"\0\0\0\x08"),
        wire.PROTOCOL_ERROR,
    ),
    "frame-above-max-size": (  # refused from its 9-byte header, before the payload arrives
        RAW_START + wire.frame(wire.DATA, 0, 1, b"\0" * (MAX_FRAME_SIZE + 1))[:9],
        wire.FRAME_SIZE_ERROR,
    ),
}


@pytest.mark.parametrize(("sent", "code"), MALFORMED.values(), ids=MALFORMED.keys())
async def test_malformed_input_ends_with_goaway(harness: Harness, sent: bytes, code: int) -> None:
    await harness.serve()
    peer = await harness.connect(Peer)
    peer.write(sent)
    frames = await peer.frames_until(None)  # until the server closes
    assert goaway(frames)[1] == code
    assert not [f for f in frames if f[2]], "no stream may be answered"
    assert not harness.requests


async def test_shut_down_finishes_the_open_stream_and_refuses_new_ones(harness: Harness) -> None:
    # Raw frames: h2's client state machine drops the connection's streams on GOAWAY.
    started, release = asyncio.Event(), asyncio.Event()

    async def handler(request: Request) -> Response:
        started.set()
        await release.wait()
        return Response(OK, b"done", TRAILERS)

    await harness.serve(handler)
    peer = await harness.connect(Peer)
    peer.write(RAW_START + raw_headers(1, b"/slow"))
    await asyncio.wait_for(started.wait(), TIMEOUT)
    (connection,) = harness.connections

    connection.shut_down()
    frames = await peer.frames_until(lambda frames: wire.GOAWAY in [f[0] for f in frames])
    assert goaway(frames) == (1, wire.NO_ERROR)
    peer.write(raw_headers(3, b"/late"))
    refused = (wire.RST_STREAM, 0, 3, struct.pack(">L", wire.REFUSED_STREAM))
    await peer.frames_until(lambda frames: refused in frames)

    release.set()
    frames = await peer.frames_until(None)
    assert [f for f in frames if f[2] == 1] == [
        (wire.HEADERS, wire.END_HEADERS, 1, OK),
        (wire.DATA, 0, 1, b"done"),
        (wire.HEADERS, END, 1, TRAILERS),
    ]
    await asyncio.wait_for(connection.closed, TIMEOUT)


async def test_concurrent_streams_get_their_own_answers(harness: Harness) -> None:
    arrived: list[bytes] = []
    all_in = asyncio.Event()

    async def handler(request: Request) -> Response:
        arrived.append(request.headers[b":path"])
        if len(arrived) == 5:
            all_in.set()
        await all_in.wait()  # every handler runs at once, or none answers
        return Response(OK, request.headers[b":path"], TRAILERS)

    await harness.serve(handler)
    client = await harness.connect(H2Client)
    paths = {client.request(b"/call/%d" % i): b"/call/%d" % i for i in range(5)}
    events = await client.events_until(
        lambda events: all(has(h2.events.StreamEnded, sid)(events) for sid in paths)
    )
    assert {sid: body(events, sid) for sid in paths} == paths


def goaways(frames: list[Frame]) -> list[tuple[int, int]]:
    return [struct.unpack_from(">LL", f[3]) for f in frames if f[0] == wire.GOAWAY]


def pings(frames: list[Frame]) -> list[tuple[int, bytes]]:
    return [(f[1], f[3]) for f in frames if f[0] == wire.PING]


async def test_an_aged_connection_is_drained_goaway_ping_then_the_final_goaway(
    harness: Harness,
) -> None:
    release = asyncio.Event()

    async def handler(request: Request) -> Response:
        await release.wait()
        return Response(OK, request.headers[b":path"], TRAILERS)

    await harness.serve(handler, max_age=0.2, max_age_grace=5.0)
    peer = await harness.connect(Peer)
    peer.write(RAW_START + raw_headers(1, b"/running"))
    frames = await peer.frames_until(lambda frames: bool(pings(frames)))
    # First a GOAWAY that still admits every stream, and a PING...
    assert goaways(frames) == [(wire.MAX_STREAM_ID, wire.NO_ERROR)]
    assert pings(frames) == [(0, wire.DRAIN_PING)]
    # ...so a call the client sent before it read them is served:
    peer.write(raw_headers(3, b"/racing"))
    with pytest.raises(TimeoutError):  # no final GOAWAY before the PING's ACK
        await asyncio.wait_for(peer.frames_until(lambda frames: len(goaways(frames)) > 1), 0.5)
    peer.write(wire.frame(wire.PING, wire.ACK, 0, wire.DRAIN_PING))
    # ...then the final GOAWAY, naming the last stream the server takes.
    frames = await peer.frames_until(lambda frames: len(goaways(frames)) == 2)
    assert goaways(frames)[1] == (3, wire.NO_ERROR)
    peer.write(raw_headers(5, b"/late"))  # after the final GOAWAY: refused, so retried
    refused = (wire.RST_STREAM, 0, 5, struct.pack(">L", wire.REFUSED_STREAM))
    await peer.frames_until(lambda frames: refused in frames)
    release.set()
    frames = await peer.frames_until(None)  # both answered, then the server ends its side
    answered = {f[2]: f[3] for f in frames if f[0] == wire.DATA}
    assert answered == {1: b"/running", 3: b"/racing"}


async def test_a_client_that_never_acks_the_drain_ping_gets_the_final_goaway_anyway(
    harness: Harness,
) -> None:
    await harness.serve(max_age=0.1, max_age_grace=5.0)
    peer = await harness.connect(Peer)
    peer.write(RAW_START)
    frames = await peer.frames_until(lambda frames: bool(pings(frames)))
    sent = asyncio.get_running_loop().time()
    frames = await peer.frames_until(None)
    waited = asyncio.get_running_loop().time() - sent
    assert goaways(frames) == [(wire.MAX_STREAM_ID, wire.NO_ERROR), (0, wire.NO_ERROR)]
    assert DRAIN_PING_TIMEOUT_SECONDS - 0.1 < waited < DRAIN_PING_TIMEOUT_SECONDS + 1


async def test_a_drained_connection_ends_with_fin_and_reads_until_the_client_closes(
    harness: Harness,
) -> None:
    """No TCP reset: frames the client sends after the final GOAWAY are read (and dropped),
    and the server closes once the client has (grpc-go issue 5358)."""
    await harness.serve(max_age=0.1, max_age_grace=5.0)
    peer = await harness.connect(Peer)
    peer.write(RAW_START)
    await peer.frames_until(lambda frames: bool(pings(frames)))
    peer.write(wire.frame(wire.PING, wire.ACK, 0, wire.DRAIN_PING))
    await peer.frames_until(None)  # the final GOAWAY, then the end of the server's stream
    (connection,) = harness.connections
    peer.write(wire.window_update(0, 1000) + wire.frame(wire.PING, 0, 0, b"8 bytes!"))
    await peer.writer.drain()
    await asyncio.sleep(0.2)
    assert not connection.closed.done()  # still reading: nothing it got was left unread
    peer.writer.close()
    await asyncio.wait_for(connection.closed, LINGER_SECONDS / 2)


async def test_calls_outliving_the_age_grace_are_cut(harness: Harness) -> None:
    async def never(request: Request) -> Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    await harness.serve(never, max_age=0.1, max_age_grace=0.3)
    peer = await harness.connect(Peer)
    peer.write(RAW_START + raw_headers(1, b"/stuck"))
    started = asyncio.get_running_loop().time()
    frames = await peer.frames_until(None)
    assert asyncio.get_running_loop().time() - started < 0.3 + 1  # the grace, from the GOAWAY
    assert not [f for f in frames if f[2] == 1], "cut, unanswered"


async def test_connections_without_a_max_age_stay_open(harness: Harness) -> None:
    await harness.serve()
    client = await harness.connect(H2Client)
    sid = client.request(b"/a")
    await client.events_until(has(h2.events.StreamEnded, sid))
    await asyncio.sleep(0.3)
    assert not of(client.events, h2.events.ConnectionTerminated)
    (connection,) = harness.connections
    assert not connection.closed.done()


async def test_a_request_answered_from_its_headers_does_not_wait_for_its_body(
    harness: Harness,
) -> None:
    await harness.serve(answers_early=lambda headers: headers[b":path"] == b"/stream")
    client = await harness.connect(H2Client)
    sid = client.request(b"/stream", b"first message", end=False)  # never half-closed
    events = await client.events_until(has(h2.events.StreamReset, sid))
    assert body(events, sid) == b"/stream "  # answered before the body was read
    assert of(events, h2.events.StreamReset, sid)[0].error_code == h2.errors.ErrorCodes.NO_ERROR


async def test_a_streamed_request_is_answered_message_by_message(harness: Harness) -> None:
    async def handler(request: Request) -> Response:
        assert request.arrived is not None and request.send is not None
        while True:  # each chunk echoed as it arrives, before the client half-closes
            if request.chunks:
                assert request.send(OK, b"".join(request.chunks))
                request.chunks.clear()
            if request.ended:
                return Response(OK, b"", TRAILERS)
            request.arrived.clear()
            await request.arrived.wait()

    await harness.serve(handler, streaming=lambda headers: headers[b":path"] == b"/chat")
    client = await harness.connect(H2Client)
    sid = client.request(b"/chat", b"one", end=False)
    await client.events_until(lambda events: body(events, sid) == b"one")
    client.conn.send_data(sid, b"two", end_stream=True)
    client.send()
    events = await client.events_until(has(h2.events.StreamEnded, sid))
    assert body(events, sid) == b"onetwo"
    assert len(of(events, h2.events.ResponseReceived, sid)) == 1
    (trailers,) = of(events, h2.events.TrailersReceived, sid)
    assert trailers.headers == [(b"grpc-status", b"0")]
    assert harness.budget.used == 0


class RecordingTransport(asyncio.Transport):
    """Records each write: how many system calls the connection's answers would take."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def test_the_answers_completed_in_one_turn_leave_in_one_write() -> None:
    release = asyncio.Event()

    async def handler(request: Request) -> Response:
        await release.wait()  # every call completes in the same loop turn
        return Response(OK, request.headers[b":path"], TRAILERS)

    connection = Http2Connection(handler, 1 << 20, set())
    transport = RecordingTransport()
    connection.connection_made(transport)
    calls = b"".join(
        raw_headers(sid, b"/call/%d" % sid) for sid in (1, 3, 5, 7)
    )  # fmt: skip
    connection.data_received(RAW_START + calls)
    for _ in range(3):
        await asyncio.sleep(0)
    before = len(transport.writes)
    release.set()
    for _ in range(5):
        await asyncio.sleep(0)

    answers = transport.writes[before:]
    assert len(answers) == 1
    assert [answers[0].count(b"/call/%d" % sid) for sid in (1, 3, 5, 7)] == [1, 1, 1, 1]
    connection.connection_lost(None)


async def test_a_repeated_malformed_header_list_is_refused_every_time() -> None:
    connection = Http2Connection(echo, 1 << 20, set())
    transport = RecordingTransport()
    connection.connection_made(transport)
    block = hpack.encode([*request_fields(b"/call"), (b"Upper", b"x")])  # RFC 9113 8.2.1
    connection.data_received(RAW_START + b"".join(raw_block(block, sid) for sid in (1, 3, 5)))

    sent = b"".join(transport.writes)
    resets = [
        wire.rst_stream(sid, wire.PROTOCOL_ERROR) in sent for sid in (1, 3, 5)
    ]  # fmt: skip
    assert resets == [True, True, True]
    connection.connection_lost(None)
