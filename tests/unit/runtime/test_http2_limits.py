"""The HTTP/2 connection's limits and RFC 9113 checks against hostile and careless peers, over
real loopback TCP.

Each test trips one limit of ``Http2Limits`` and checks what the peer sees (GOAWAY
ENHANCE_YOUR_CALM, a refused connection, a failed stream) and, where it matters, that the
connection or another one keeps serving, and that the memory the server holds stays within
the budget (``MemoryBudget.peak``).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import h2.events
import h2.settings
import pytest

from kiln_runtime.config import Http2Limits
from kiln_runtime.protocol import hpack
from kiln_runtime.protocol.http2 import connection, wire
from kiln_runtime.protocol.http2.budgets import HealthReserve
from kiln_runtime.protocol.http2.messages import Request, Response
from kiln_runtime.protocol.http2.receiving import CALLS_PER_TURN
from kiln_runtime.protocol.http2.settings import CONNECTION_WINDOW

from .test_http2 import (
    OK,
    RAW_START,
    TIMEOUT,
    TRAILERS,
    Frame,
    H2Client,
    Harness,
    Peer,
    body,
    echo,
    goaway,
    has,
    raw_headers,
    request_fields,
)

CALM = wire.ENHANCE_YOUR_CALM


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    harness = Harness()
    yield harness
    await harness.close()


@pytest.fixture
def fast_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timeouts are checked every 20 ms instead of every second."""
    monkeypatch.setattr(connection, "TICK_SECONDS", 0.02)


def open_stream(stream_id: int, path: bytes = b"/open") -> bytes:
    """HEADERS that leave the request open (a body would follow)."""
    return wire.frame(wire.HEADERS, wire.END_HEADERS, stream_id, hpack.encode(request_fields(path)))


def reset(stream_id: int) -> bytes:
    return wire.frame(wire.RST_STREAM, 0, stream_id, struct.pack(">L", wire.CANCEL))


def settings(**values: int) -> bytes:
    keys = {"initial_window": wire.SETTINGS_INITIAL_WINDOW_SIZE}
    payload = b"".join(struct.pack(">HL", keys[k], v) for k, v in values.items())
    return wire.frame(wire.SETTINGS, 0, 0, payload)


def window_update(stream_id: int, increment: int) -> bytes:
    return wire.frame(wire.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", increment))


def trailers_seen(frames: list[Frame]) -> set[int]:
    """Streams whose answer has ended (the trailers' HEADERS carry END_STREAM)."""
    return {f[2] for f in frames if f[0] == wire.HEADERS and f[1] & wire.END_STREAM}


async def probe(harness: Harness) -> None:
    """A well-behaved client on its own connection is still answered."""
    client = await harness.connect(H2Client)
    sid = client.request(b"/probe", b"ok")
    events = await client.events_until(has(h2.events.StreamEnded, sid))
    assert body(events, sid) == b"/probe ok"


FLOODS = {  # limits, what the peer sends after the preface, many times over
    "rapid-reset": (
        Http2Limits(resets_per_second=2),  # a burst of 20
        lambda i: open_stream(2 * i + 1) + reset(2 * i + 1),
    ),
    "empty-data": (
        Http2Limits(empty_frames_per_second=2),
        lambda i: (open_stream(1) if i == 0 else b"") + wire.frame(wire.DATA, 0, 1, b""),
    ),
    "empty-continuation": (
        Http2Limits(empty_frames_per_second=2),
        lambda i: (
            (wire.frame(wire.HEADERS, wire.END_STREAM, 1, b"") if i == 0 else b"")
            + wire.frame(wire.CONTINUATION, 0, 1, b"")
        ),
    ),
    "ping": (
        Http2Limits(control_frames_per_second=2),
        lambda i: wire.frame(wire.PING, 0, 0, b"8 bytes!"),
    ),
    "settings": (
        Http2Limits(control_frames_per_second=2),
        lambda i: wire.frame(wire.SETTINGS, 0, 0),
    ),
}


@pytest.mark.parametrize(("limits", "flood"), FLOODS.values(), ids=FLOODS.keys())
async def test_a_flood_ends_in_enhance_your_calm_and_others_are_served(
    harness: Harness, limits: Http2Limits, flood: object
) -> None:
    assert callable(flood)
    await harness.serve(limits=limits)
    peer = await harness.connect(Peer)
    peer.write(RAW_START + b"".join(flood(i) for i in range(200)))
    frames = await peer.frames_until(None)  # until the server closes
    assert goaway(frames)[1] == CALM
    await probe(harness)


async def test_a_budget_refills_with_time(harness: Harness) -> None:
    await harness.serve(limits=Http2Limits(control_frames_per_second=100))  # a burst of 1000
    peer = await harness.connect(Peer)
    ping = wire.frame(wire.PING, 0, 0, b"8 bytes!")
    peer.write(RAW_START + ping * 900)
    await peer.frames_until(lambda frames: sum(f[0] == wire.PING for f in frames) == 900)
    await asyncio.sleep(0.5)  # 50 more tokens
    peer.write(ping * 140)
    await peer.frames_until(lambda frames: sum(f[0] == wire.PING for f in frames) == 1040)
    assert wire.GOAWAY not in [f[0] for f in peer.frames]


async def test_connections_over_the_limit_are_refused_at_accept_when_none_is_idle(
    harness: Harness,
) -> None:
    await harness.serve(limits=Http2Limits(max_connections=2, health_connections=0))
    first = await harness.connect(H2Client)
    second = await harness.connect(H2Client)
    for client in (first, second):  # each serving a call: none may be closed to make room
        client.request(b"/open", b"x", end=False)
        await client.events_until(has(h2.events.RemoteSettingsChanged))
    await asyncio.sleep(0.05)
    refused = await harness.connect(Peer)
    assert await refused.frames_until(None) == []  # closed without a byte
    assert harness.health.refused == 1
    assert harness.health.refused_at > 0  # the port's saturation, for metrics and readiness
    first.request(b"/open", b"", end=True)  # (ends its call)

    first.writer.close()
    await asyncio.wait_for(first.writer.wait_closed(), TIMEOUT)
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while len(harness.connections) > 1:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    await probe(harness)


HEALTH = b"/health"


async def over_capacity_marked(request: Request) -> Response:
    """Echo, but a call refused for its connection answers ``refused``."""
    if request.over_capacity:
        return Response(OK, b"refused", TRAILERS)
    return await echo(request)


async def answered(client: H2Client, path: bytes) -> tuple[bytes, list[h2.events.Event]]:
    sid = client.request(path, b"x")
    events = await client.events_until(has(h2.events.StreamEnded, sid))
    return body(events, sid), events


async def test_past_the_cap_a_connection_may_only_check_health(harness: Harness) -> None:
    """The kubelet's gRPC probe is served while clients hold every connection: a connection
    past ``max_connections`` is admitted on the health budget, its health check answered; any
    other call on it is refused and the connection told to go away."""
    limits = Http2Limits(max_connections=1, health_connections=1)
    await harness.serve(
        over_capacity_marked, limits=limits, health=HealthReserve(frozenset({HEALTH}))
    )
    busy = await harness.connect(H2Client)
    assert (await answered(busy, b"/infer"))[0] == b"/infer x"  # within the cap: anything
    busy.request(b"/long", b"x", end=False)  # a call in progress: not closed to make room
    await asyncio.sleep(0.05)

    prober = await harness.connect(H2Client)
    assert (await answered(prober, HEALTH))[0] == HEALTH + b" x"
    assert (await answered(prober, HEALTH))[0] == HEALTH + b" x"  # the connection lives on
    assert (await answered(prober, b"/infer"))[0] == b"refused"
    events = await prober.events_until(has(h2.events.ConnectionTerminated))
    assert next(e for e in events if isinstance(e, h2.events.ConnectionTerminated)).error_code == 0
    await prober.frames_until(None)  # and closed
    assert (await answered(busy, b"/infer"))[0] == b"/infer x"  # the capped one is untouched


async def test_when_the_health_budget_is_full_the_oldest_idle_one_makes_room(
    harness: Harness,
) -> None:
    limits = Http2Limits(max_connections=1, health_connections=2)
    await harness.serve(
        over_capacity_marked, limits=limits, health=HealthReserve(frozenset({HEALTH}))
    )
    serving = await harness.connect(H2Client)
    await answered(serving, b"/infer")
    serving.request(b"/long", b"x", end=False)  # a call in progress: not closed to make room
    oldest = await harness.connect(Peer)  # idle: a preface and nothing more
    oldest.write(RAW_START)
    await oldest.frames_until(lambda frames: any(f[0] == wire.SETTINGS for f in frames))
    busy = await harness.connect(Peer)  # an open stream: serving a call, never dropped
    busy.write(RAW_START + open_stream(1, HEALTH))
    await busy.frames_until(lambda frames: any(f[0] == wire.SETTINGS for f in frames))
    assert len(harness.health.connections) == 2  # both made (their prefaces came)

    newest = await harness.connect(H2Client)  # the budget is full: the idle one goes
    assert (await answered(newest, HEALTH))[0] == HEALTH + b" x"
    await oldest.frames_until(None)  # closed by the server
    assert not busy.writer.is_closing()
    assert len(harness.connections) == 3  # one within the cap, two on the health budget

    newest.request(HEALTH, b"x", end=False)  # a call in progress on each: none is idle
    await asyncio.sleep(0.05)
    refused = await harness.connect(Peer)  # refused at accept
    refused.write(RAW_START)
    assert await refused.frames_until(None) == []


async def test_an_idle_connection_is_closed(harness: Harness, fast_ticks: None) -> None:
    await harness.serve(limits=Http2Limits(idle_timeout_seconds=0.2))
    peer = await harness.connect(Peer)
    peer.write(RAW_START + raw_headers(1, b"/one"))
    started = asyncio.get_running_loop().time()
    frames = await peer.frames_until(None)
    assert goaway(frames) == (1, wire.NO_ERROR)
    assert asyncio.get_running_loop().time() - started >= 0.2


async def test_a_silent_client_is_dropped_after_the_header_timeout(
    harness: Harness, fast_ticks: None
) -> None:
    await harness.serve(limits=Http2Limits(header_timeout_seconds=0.1))
    peer = await harness.connect(Peer)
    peer.write(wire.PREFACE[:10])  # slowloris: a preface that never completes
    frames = await peer.frames_until(None)
    assert [f[0] for f in frames] == [wire.SETTINGS, wire.WINDOW_UPDATE]  # the server's preface


async def test_an_unfinished_header_block_times_out(harness: Harness, fast_ticks: None) -> None:
    await harness.serve(limits=Http2Limits(header_timeout_seconds=0.1))
    peer = await harness.connect(Peer)
    block = hpack.encode(request_fields(b"/slow"))
    peer.write(RAW_START + wire.frame(wire.HEADERS, wire.END_STREAM, 1, block[:5]))
    frames = await peer.frames_until(None)
    assert goaway(frames)[1] == CALM
    assert not harness.requests


async def test_a_body_that_never_ends_resets_its_stream_only(
    harness: Harness, fast_ticks: None
) -> None:
    await harness.serve(limits=Http2Limits(body_timeout_seconds=0.1))
    peer = await harness.connect(Peer)
    peer.write(RAW_START + open_stream(1) + wire.frame(wire.DATA, 0, 1, b"part"))
    cancelled = (wire.RST_STREAM, 0, 1, struct.pack(">L", wire.CANCEL))
    await peer.frames_until(lambda frames: cancelled in frames)
    peer.write(raw_headers(3, b"/next"))
    frames = await peer.frames_until(lambda frames: 3 in trailers_seen(frames))
    assert (wire.DATA, 0, 3, b"/next ") in frames
    assert not harness.requests[1:]  # the stalled request never reached the handler


async def test_a_header_list_over_the_limit_fails_its_stream_only(harness: Harness) -> None:
    async def handler(request: Request) -> Response:
        if request.headers_too_large:
            return Response(OK, b"headers too large", TRAILERS)
        return await echo(request)

    await harness.serve(handler, limits=Http2Limits(max_header_list_size=1024))
    peer = await harness.connect(Peer)
    big = hpack.encode([*request_fields(b"/big"), (b"x-big", b"v" * 2000)])
    assert len(big) <= 2 * 1024  # within the block limit: decoded, then refused
    peer.write(RAW_START + wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, 1, big))
    peer.write(raw_headers(3, b"/small"))
    frames = await peer.frames_until(lambda frames: {1, 3} <= trailers_seen(frames))
    assert (wire.DATA, 0, 1, b"headers too large") in frames
    assert (wire.DATA, 0, 3, b"/small ") in frames
    assert wire.GOAWAY not in [f[0] for f in frames]


async def test_metadata_far_over_the_limit_fails_its_stream_only(harness: Harness) -> None:
    """64 KiB of metadata (four times the default limit, in HEADERS and CONTINUATION frames)
    fails its own call while another call on the connection is answered (it used to end the
    connection with GOAWAY ENHANCE_YOUR_CALM past twice the limit)."""

    async def handler(request: Request) -> Response:
        if request.headers_too_large:
            return Response(OK, b"headers too large", TRAILERS)
        return await echo(request)

    await harness.serve(handler, limits=Http2Limits())
    peer = await harness.connect(Peer)
    peer.write(RAW_START + open_stream(1, b"/inflight"))  # a call in progress
    big = hpack.encode([*request_fields(b"/big"), (b"x-big", b"v" * (64 << 10))])
    pieces = [big[i : i + 16384] for i in range(0, len(big), 16384)]
    frames = wire.frame(wire.HEADERS, wire.END_STREAM, 3, pieces[0])
    for i, piece in enumerate(pieces[1:], 1):
        frames += wire.frame(wire.CONTINUATION, wire.END_HEADERS if i == len(pieces) - 1 else 0,
                             3, piece)  # fmt: skip
    peer.write(frames + wire.frame(wire.DATA, wire.END_STREAM, 1, b"done"))
    seen = await peer.frames_until(lambda frames: {1, 3} <= trailers_seen(frames))
    assert (wire.DATA, 0, 3, b"headers too large") in seen
    assert (wire.DATA, 0, 1, b"/inflight done") in seen
    assert wire.GOAWAY not in [f[0] for f in seen]
    assert harness.budget.peak >= 48 << 10  # the block was counted while it arrived
    assert harness.budget.used == 0  # and freed


async def test_a_header_block_far_over_the_limit_is_refused_from_its_frame_header(
    harness: Harness,
) -> None:
    await harness.serve(limits=Http2Limits(max_header_list_size=512))  # a block of 8 KiB at most
    peer = await harness.connect(Peer)
    huge = wire.frame(wire.HEADERS, wire.END_STREAM, 1, b"\0" * 9000)
    peer.write(RAW_START + huge[:9])  # only the frame header: the block is never buffered
    frames = await peer.frames_until(None)
    assert goaway(frames)[1] == CALM


def connection_credit(frames: list[Frame]) -> int:
    return sum(
        struct.unpack(">L", f[3])[0] for f in frames if f[0] == wire.WINDOW_UPDATE and f[2] == 0
    )


async def test_the_receive_window_reopens_only_within_the_budget(harness: Harness) -> None:
    release = asyncio.Event()

    async def handler(request: Request) -> Response:
        await release.wait()
        return Response(OK, b"%d" % len(request.body), TRAILERS)

    budget = window = CONNECTION_WINDOW
    await harness.serve(
        handler, max_body=600 << 10, limits=Http2Limits(process_buffer_bytes=budget)
    )
    peer = await harness.connect(Peer)
    chunk = 16 << 10
    sizes = {1: 600 << 10, 3: window - (600 << 10)}  # the whole window, in two requests
    sent = RAW_START
    for sid, size in sizes.items():
        sent += open_stream(sid)
        for start in range(0, size, chunk):
            piece = b"x" * min(chunk, size - start)
            last = start + chunk >= size
            sent += wire.frame(wire.DATA, wire.END_STREAM if last else 0, sid, piece)
    peer.write(sent + wire.frame(wire.PING, 0, 0, b"in order"))
    frames = await peer.frames_until(lambda frames: wire.PING in [f[0] for f in frames])
    preface = window - wire.DEFAULT_WINDOW
    # Half the window came back while the first half was held under the budget; with the
    # budget spent (both bodies held, neither answered) no more does.
    assert connection_credit(frames) - preface == window // 2
    assert harness.budget.used == budget

    release.set()
    frames = await peer.frames_until(lambda frames: {1, 3} <= trailers_seen(frames))
    assert connection_credit(frames) - preface == window  # answered: all of it is back
    assert harness.budget.peak == budget
    assert harness.budget.used == 0


def outcomes(frames: list[Frame], calls: list[int]) -> dict[int, str]:
    """Each call's end: "answered" (trailers), "calm" (RST_STREAM ENHANCE_YOUR_CALM)."""
    calm = struct.pack(">L", CALM)
    ends = {f[2]: "calm" for f in frames if f[0] == wire.RST_STREAM and f[3] == calm}
    ends.update({sid: "answered" for sid in trailers_seen(frames)})
    return {sid: ends[sid] for sid in calls if sid in ends}


ANSWER_BYTES = 256 << 10


async def big_answer(request: Request) -> Response:
    if request.headers[b":path"] == b"/probe":
        return await echo(request)
    return Response(OK, b"r" * ANSWER_BYTES, TRAILERS)


async def test_a_client_that_opens_no_window_cannot_pin_more_than_the_budget(
    harness: Harness,
) -> None:
    budget = 1000 + CONNECTION_WINDOW  # the smallest connection budget for this max_body
    await harness.serve(big_answer, max_body=1000, limits=Http2Limits(connection_buffer_bytes=1))
    peer = await harness.connect(Peer)
    calls = [2 * i + 1 for i in range(40)]  # 10 MiB of answers
    peer.write(
        wire.PREFACE
        + settings(initial_window=0)
        + b"".join(raw_headers(sid, b"/big") for sid in calls)
    )
    frames = await peer.frames_until(lambda frames: len(outcomes(frames, calls)) == 36)
    assert harness.budget.peak <= budget
    assert set(outcomes(frames, calls).values()) == {"calm"}  # the 4 first answers are parked

    peer.write(settings(initial_window=1 << 20) + window_update(0, 2**31 - 1 - 65_535))
    frames = await peer.frames_until(lambda frames: len(outcomes(frames, calls)) == 40)
    assert list(outcomes(frames, calls).values()).count("answered") == 4
    assert sum(len(f[3]) for f in frames if f[0] == wire.DATA) == 4 * ANSWER_BYTES
    assert harness.budget.used == 0
    await probe(harness)


async def test_a_client_that_stops_reading_cannot_pin_more_than_the_budget(
    harness: Harness,
) -> None:
    budget = 1000 + CONNECTION_WINDOW
    await harness.serve(big_answer, max_body=1000, limits=Http2Limits(connection_buffer_bytes=1))
    peer = await harness.connect(Peer)
    calls = [2 * i + 1 for i in range(120)]  # 30 MiB of answers, windows wide open
    peer.write(
        wire.PREFACE
        + settings(initial_window=2**31 - 1)
        + window_update(0, 2**31 - 1 - 65_535)
        + b"".join(raw_headers(sid, b"/big") for sid in calls)
    )
    await asyncio.sleep(0.5)  # the peer reads nothing: the socket's buffers fill
    assert 0 < harness.budget.peak <= budget

    frames = await peer.frames_until(lambda frames: len(outcomes(frames, calls)) == len(calls))
    answered = list(outcomes(frames, calls).values()).count("answered")
    assert 0 < answered < len(calls)
    assert sum(len(f[3]) for f in frames if f[0] == wire.DATA) == answered * ANSWER_BYTES
    assert harness.budget.used == 0
    await probe(harness)


MALFORMED_REQUESTS = {  # request fields RFC 9113 8.2-8.3 forbids: a stream error each
    "uppercase-name": [*request_fields(b"/"), (b"X-Upper", b"1")],
    "unknown-pseudo": [*request_fields(b"/"), (b":unknown", b"1")],
    "response-pseudo": [(b":status", b"200"), *request_fields(b"/")],
    "pseudo-after-regular": [(b"x-a", b"1"), *request_fields(b"/")],
    "connection-specific": [*request_fields(b"/"), (b"connection", b"keep-alive")],
    "te-not-trailers": [*request_fields(b"/"), (b"te", b"gzip")],
    "empty-path": [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"")],
    "no-method": request_fields(b"/")[1:],
    "duplicate-path": [*request_fields(b"/"), (b":path", b"/again")],
}


@pytest.mark.parametrize("fields", MALFORMED_REQUESTS.values(), ids=MALFORMED_REQUESTS.keys())
async def test_a_malformed_request_fails_its_stream_only(
    harness: Harness, fields: list[tuple[bytes, bytes]]
) -> None:
    await harness.serve()
    peer = await harness.connect(Peer)
    bad = wire.frame(wire.HEADERS, wire.END_HEADERS | wire.END_STREAM, 1, hpack.encode(fields))
    peer.write(RAW_START + bad + raw_headers(3, b"/fine"))
    frames = await peer.frames_until(lambda frames: 3 in trailers_seen(frames))
    assert (wire.RST_STREAM, 0, 1, struct.pack(">L", wire.PROTOCOL_ERROR)) in frames
    assert [r.stream_id for r in harness.requests] == [3]


async def test_a_body_that_differs_from_its_content_length_fails_its_stream(
    harness: Harness,
) -> None:
    await harness.serve()
    peer = await harness.connect(Peer)
    fields = [*request_fields(b"/"), (b"content-length", b"10")]
    peer.write(
        RAW_START
        + wire.frame(wire.HEADERS, wire.END_HEADERS, 1, hpack.encode(fields))
        + wire.frame(wire.DATA, wire.END_STREAM, 1, b"short")
    )
    protocol_error = (wire.RST_STREAM, 0, 1, struct.pack(">L", wire.PROTOCOL_ERROR))
    await peer.frames_until(lambda frames: protocol_error in frames)
    assert not harness.requests


STREAM_STATE_ERRORS = {  # frames on streams in the wrong state: the connection's error code
    "lower-stream-id": (raw_headers(5, b"/a") + raw_headers(3, b"/b"), wire.PROTOCOL_ERROR),
    "window-update-on-idle": (window_update(7, 1), wire.PROTOCOL_ERROR),
    "goaway-on-a-stream": (wire.frame(wire.GOAWAY, 0, 1, b"\0" * 8), wire.PROTOCOL_ERROR),
    "settings-ack-with-payload": (
        wire.frame(wire.SETTINGS, wire.ACK, 0, b"\0" * 6),
        wire.FRAME_SIZE_ERROR,
    ),
}


@pytest.mark.parametrize(
    ("sent", "code"), STREAM_STATE_ERRORS.values(), ids=STREAM_STATE_ERRORS.keys()
)
async def test_frames_in_the_wrong_state_end_the_connection(
    harness: Harness, sent: bytes, code: int
) -> None:
    await harness.serve()
    peer = await harness.connect(Peer)
    peer.write(RAW_START + sent)
    frames = await peer.frames_until(None)
    assert goaway(frames)[1] == code


async def test_data_on_a_stream_that_ended_is_stream_closed(harness: Harness) -> None:
    await harness.serve()
    peer = await harness.connect(Peer)
    peer.write(RAW_START + raw_headers(1, b"/a"))
    await peer.frames_until(lambda frames: 1 in trailers_seen(frames))
    peer.write(wire.frame(wire.DATA, 0, 1, b"late"))
    frames = await peer.frames_until(None)
    assert goaway(frames)[1] == wire.STREAM_CLOSED


async def test_a_burst_of_calls_is_started_over_several_turns_and_all_answered(
    harness: Harness,
) -> None:
    turns: set[int] = set()
    loop_turn = [0]

    def tick() -> None:  # counts event-loop turns until the calls are answered
        loop_turn[0] += 1
        if len(harness.requests) < len(calls):
            asyncio.get_running_loop().call_soon(tick)

    async def handler(request: Request) -> Response:
        turns.add(loop_turn[0])
        return await echo(request)

    calls = [2 * i + 1 for i in range(3 * CALLS_PER_TURN)]
    tick()
    await harness.serve(handler)
    peer = await harness.connect(Peer)
    peer.write(RAW_START + b"".join(raw_headers(sid, b"/burst") for sid in calls))
    frames = await peer.frames_until(lambda frames: set(calls) <= trailers_seen(frames))
    assert sum(f[0] == wire.DATA for f in frames) == len(calls)
    assert len(turns) >= 3  # at most CALLS_PER_TURN started per turn


async def test_calls_with_bodies_start_at_most_calls_per_turn_in_any_turn(
    harness: Harness,
) -> None:
    """A body's DATA frame may resume reading mid-parse; that must not schedule a second parse
    in the next turn (each would start CALLS_PER_TURN calls, and the next turn four...)."""
    started: dict[int, int] = {}
    loop_turn = [0]

    def tick() -> None:
        loop_turn[0] += 1
        if len(harness.requests) < len(calls):
            asyncio.get_running_loop().call_soon(tick)

    async def handler(request: Request) -> Response:
        started[loop_turn[0]] = started.get(loop_turn[0], 0) + 1
        return await echo(request)

    calls = [2 * i + 1 for i in range(8 * CALLS_PER_TURN)]
    tick()
    await harness.serve(handler, limits=Http2Limits(max_concurrent_streams=len(calls)))
    peer = await harness.connect(Peer)
    peer.write(
        RAW_START
        + b"".join(
            open_stream(sid, b"/burst") + wire.frame(wire.DATA, wire.END_STREAM, sid, b"x")
            for sid in calls
        )
    )
    await peer.frames_until(lambda frames: set(calls) <= trailers_seen(frames))
    assert max(started.values()) <= CALLS_PER_TURN


async def test_a_client_opening_streams_past_the_limit_is_cut_off(harness: Harness) -> None:
    """A client that never reads its answers never learns its streams closed, and may open
    streams past the concurrency limit at full speed: refused, then budgeted like resets."""
    await harness.serve(limits=Http2Limits(max_concurrent_streams=2, resets_per_second=2))
    peer = await harness.connect(Peer)
    peer.write(RAW_START + b"".join(open_stream(2 * i + 1) for i in range(100)))
    frames = await peer.frames_until(None)
    refused = [f for f in frames if f[0] == wire.RST_STREAM]
    assert 10 <= len(refused) <= 30  # a burst of 20, then GOAWAY
    assert goaway(frames)[1] == CALM
    await probe(harness)


async def test_an_answer_larger_than_the_budget_still_reaches_a_client_that_opens_its_window(
    harness: Harness,
) -> None:
    huge = Response(OK, b"h" * (2 << 20), TRAILERS)  # twice the connection budget

    async def handler(request: Request) -> Response:
        return huge if request.headers[b":path"] == b"/huge" else await echo(request)

    await harness.serve(handler, max_body=1000, limits=Http2Limits(connection_buffer_bytes=1))
    peer = await harness.connect(Peer)
    peer.write(wire.PREFACE + settings(initial_window=0) + raw_headers(1, b"/huge"))
    await asyncio.sleep(0.1)  # parked: the connection starts no new call
    peer.write(raw_headers(3, b"/small"))  # queued, not lost
    await asyncio.sleep(0.1)
    assert [r.stream_id for r in harness.requests] == [1]
    # The client's window opening must still be read while the answer is parked.
    peer.write(settings(initial_window=4 << 20) + window_update(0, 4 << 20))
    frames = await peer.frames_until(lambda frames: {1, 3} <= trailers_seen(frames))
    assert sum(len(f[3]) for f in frames if f[0] == wire.DATA and f[2] == 1) == 2 << 20
    assert harness.budget.used == 0


async def test_a_grpc_message_declaring_more_than_the_limit_is_refused_at_its_prefix(
    harness: Harness,
) -> None:
    """A length prefix declaring 4 GiB is answered from its first DATA frame: nothing of the
    message is held (it used to be buffered up to the limit first)."""
    await harness.serve(max_body=8 << 20)
    peer = await harness.connect(Peer)
    fields = [*request_fields(b"/svc/Infer"), (b"content-type", b"application/grpc")]
    headers = wire.frame(wire.HEADERS, wire.END_HEADERS, 1, hpack.encode(fields))
    first = b"\0\xff\xff\xff\xff"  # uncompressed, 4 GiB - 1
    peer.write(RAW_START + headers + wire.frame(wire.DATA, 0, 1, first + b"x" * 16000))
    frames = await peer.frames_until(lambda frames: 1 in trailers_seen(frames))
    assert (wire.DATA, 0, 1, b"too large") in frames
    assert harness.requests[0].too_large
    assert harness.budget.peak == 0  # not a byte of it was held


async def test_at_the_cap_the_oldest_idle_connection_makes_room(harness: Harness) -> None:
    """Connections that sent a preface and nothing more fill the port; a new client is
    admitted in place of the oldest of them (it used to be refused while they stayed)."""
    await harness.serve(limits=Http2Limits(max_connections=3, health_connections=0))
    used = await harness.connect(H2Client)
    assert (await answered(used, b"/infer"))[0] == b"/infer x"  # idle now, but it has served
    silent = []
    for _ in range(2):
        peer = await harness.connect(Peer)
        peer.write(RAW_START)
        await peer.frames_until(lambda frames: any(f[0] == wire.SETTINGS for f in frames))
        silent.append(peer)
    newcomer = await harness.connect(H2Client)
    assert (await answered(newcomer, b"/infer"))[0] == b"/infer x"
    frames = await silent[0].frames_until(None)  # the oldest that never opened a stream
    assert goaway(frames) == (0, wire.NO_ERROR)
    assert harness.health.evicted == 1 and harness.health.refused == 0
    assert (await answered(used, b"/infer"))[0] == b"/infer x"  # the used one stays


async def test_a_connection_that_never_opens_a_stream_is_closed(
    harness: Harness, fast_ticks: None
) -> None:
    await harness.serve(limits=Http2Limits(header_timeout_seconds=0.1))
    peer = await harness.connect(Peer)
    peer.write(RAW_START)  # a preface, then nothing: 300 s of idle timeout before
    started = asyncio.get_running_loop().time()
    frames = await peer.frames_until(None)
    assert goaway(frames) == (0, wire.NO_ERROR)
    assert asyncio.get_running_loop().time() - started < 2
