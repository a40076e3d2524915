"""HTTP/2 abuse patterns, each bounded in time and count, against one loopback port.

Run as ``python -m tests.integration.runtime.attacks NAME PORT SECONDS`` (its own process, so
the attacker shares no interpreter with the probe that measures the server meanwhile); prints
one line saying how the server ended the attack, e.g. ``goaway 11`` for ENHANCE_YOUR_CALM.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from collections.abc import Callable

from kiln_runtime.protocol import hpack
from kiln_runtime.protocol.http2 import wire
from kiln_runtime.protocol.http2.settings import MAX_FRAME_SIZE

MAX_FRAMES = 2_000_000  # every loop stops at this count, or at its time limit
HEADERS_BLOCK = hpack.encode(
    [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/inference.GRPCInferenceService/ServerLive"),
        (b":authority", b"attack"),
        (b"content-type", b"application/grpc"),
    ]
)
EMPTY_CALL = b"\0\0\0\0\0"  # a gRPC message of zero bytes: ServerLiveRequest


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(wire.PREFACE + wire.frame(wire.SETTINGS, 0, 0))
    return sock


def goaway_code(sock: socket.socket, seconds: float) -> str:
    """Read what the server sends until it closes: ``goaway CODE``, ``closed`` or ``open``."""
    sock.settimeout(seconds)
    buffer = b""
    try:
        while chunk := sock.recv(1 << 16):
            buffer += chunk
    except TimeoutError:
        return "open"
    except OSError:
        pass
    pos, code = 0, None
    while len(buffer) - pos >= 9:
        high, low, kind, _, _ = struct.unpack_from(">BHBBL", buffer, pos)
        length = high << 16 | low
        if kind == wire.GOAWAY and len(buffer) >= pos + 9 + 8:
            code = struct.unpack_from(">L", buffer, pos + 9 + 4)[0]
        pos += 9 + length
    return f"goaway {code}" if code is not None else "closed"


def flood(port: int, seconds: float, frames: Callable[[int], bytes]) -> str:
    """Send ``frames(i)`` as fast as the server takes them until it hangs up or time runs out."""
    sock = connect(port)
    deadline = time.monotonic() + seconds
    batch = 200
    try:
        for i in range(0, MAX_FRAMES, batch):
            if time.monotonic() > deadline:
                break
            sock.sendall(b"".join(frames(i + j) for j in range(batch)))
    except OSError:
        pass  # the server closed: read its last words
    return goaway_code(sock, 5)


def rapid_reset(i: int) -> bytes:
    sid = 2 * i + 1
    headers = wire.frame(wire.HEADERS, wire.END_HEADERS, sid, HEADERS_BLOCK)
    return headers + wire.frame(wire.RST_STREAM, 0, sid, struct.pack(">L", wire.CANCEL))


def empty_data(i: int) -> bytes:
    opening = wire.frame(wire.HEADERS, wire.END_HEADERS, 1, HEADERS_BLOCK) if i == 0 else b""
    return opening + wire.frame(wire.DATA, 0, 1, b"")


def empty_continuation(i: int) -> bytes:
    opening = wire.frame(wire.HEADERS, 0, 1, HEADERS_BLOCK) if i == 0 else b""
    return opening + wire.frame(wire.CONTINUATION, 0, 1, b"")


def ping(i: int) -> bytes:
    return wire.frame(wire.PING, 0, 0, struct.pack(">Q", i))


def settings(i: int) -> bytes:
    return wire.frame(wire.SETTINGS, 0, 0)


def unread_answers(port: int, seconds: float, *, window: bool = True) -> str:
    """Calls sent as fast as possible on one connection whose answers are never read.

    With ``window`` the client grants the largest flow-control windows first (as a client
    sure to read everything would), so the answers go to the socket until its buffers are full
    and the server must stop on TCP's backpressure alone. Without, HTTP/2's default 64 KiB
    window stops the answers after a few thousand calls; the client, reading nothing, never
    learns that its streams are still open and goes on opening streams beyond the server's
    concurrency limit."""
    sock = connect(port)
    if window:
        largest = 2**31 - 1
        sock.sendall(
            wire.frame(wire.SETTINGS, 0, 0, struct.pack(">HL", wire.SETTINGS_INITIAL_WINDOW_SIZE,
                                                         largest))
            + wire.frame(wire.WINDOW_UPDATE, 0, 0, struct.pack(">L", largest - 65_535))
        )  # fmt: skip
    deadline = time.monotonic() + seconds
    sock.settimeout(0.5)
    sent = 0
    try:
        for i in range(MAX_FRAMES):
            if time.monotonic() > deadline:
                break
            sid = 2 * i + 1
            sock.sendall(
                wire.frame(wire.HEADERS, wire.END_HEADERS, sid, HEADERS_BLOCK)
                + wire.frame(wire.DATA, wire.END_STREAM, sid, EMPTY_CALL)
            )
            sent += 1
    except TimeoutError:
        pass  # the server stopped reading: backpressure reached the client
    except OSError:
        return f"{goaway_code(sock, 1)} after {sent} calls"
    sock.close()
    return f"server stopped reading after {sent} calls"


HEALTH_CHECK_BLOCK = hpack.encode(
    [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/grpc.health.v1.Health/Check"),
        (b":authority", b"kubelet"),
        (b"content-type", b"application/grpc"),
    ]
)
SERVING = b"\0\0\0\0\x02\x08\x01"  # HealthCheckResponse{status: SERVING}, framed


def health_check(port: int) -> bool:
    """What the kubelet's gRPC probe does: a new connection, one Health/Check; SERVING?"""
    try:
        sock = connect(port)
        sock.sendall(
            wire.frame(wire.HEADERS, wire.END_HEADERS, 1, HEALTH_CHECK_BLOCK)
            + wire.frame(wire.DATA, wire.END_STREAM, 1, EMPTY_CALL)
        )
        sock.settimeout(1)
        buffer = b""
        while SERVING not in buffer and len(buffer) < 1 << 16:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            buffer += chunk
        sock.close()
    except OSError:
        return False
    return SERVING in buffer


def connection_flood(port: int, seconds: float) -> str:
    """Open connections until refused (or 2000), hold them, count how many the server kept,
    and whether a health check (the kubelet's gRPC probe) is served meanwhile."""
    held: list[socket.socket] = []
    started = time.monotonic()
    deadline = started + seconds
    while len(held) < 2000 and time.monotonic() < deadline:
        try:
            held.append(connect(port))
        except OSError:
            break
    time.sleep(0.5)
    checked = health_check(port)
    alive = 0
    for sock in held:  # the server's preface read and dropped: open, or closed after it?
        sock.settimeout(0.01)
        alive += not _drained_to_eof(sock)
        sock.close()
    served = "health check served" if checked else "health check NOT served"
    # how long the first connection had been open when the last was checked: a connection that
    # never opens a stream is closed after the server's header timeout, so past that time the
    # server may rightly have kept fewer than its cap
    return f"{alive} of {len(held)} connections kept; {served}; {time.monotonic() - started:.2f} s"


def slowloris(port: int, seconds: float) -> str:
    """Connections that send half a preface and then nothing."""
    held = []
    for _ in range(200):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(wire.PREFACE[:10])
        held.append(sock)
    time.sleep(seconds)
    closed = 0
    for sock in held:
        sock.settimeout(0.01)
        closed += _drained_to_eof(sock)
        sock.close()
    return f"{closed} of {len(held)} closed by the server"


def _drained_to_eof(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (what it sent before is read and dropped)."""
    try:
        while sock.recv(1 << 16):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def big_metadata(port: int, seconds: float, size: int = 20_000) -> str:
    """A call carrying ``size`` bytes of metadata (over the 16 KiB limit) on one connection."""
    sock = connect(port)
    block = hpack.encode([*hpack.Decoder().decode(HEADERS_BLOCK), (b"x-big", b"v" * size)])
    sid = 1
    for piece in range(0, len(block), MAX_FRAME_SIZE):
        first, last = piece == 0, piece + MAX_FRAME_SIZE >= len(block)
        kind = wire.HEADERS if first else wire.CONTINUATION
        flags = (wire.END_STREAM if first else 0) | (wire.END_HEADERS if last else 0)
        sock.sendall(wire.frame(kind, flags, sid, block[piece : piece + MAX_FRAME_SIZE]))
    return "answered, connection kept" if goaway_code(sock, 1) == "open" else "connection ended"


INFER_BLOCK = hpack.encode(
    [*hpack.Decoder().decode(HEADERS_BLOCK)[:2],
     (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
     *hpack.Decoder().decode(HEADERS_BLOCK)[3:]]
)  # fmt: skip
# the server's trailers carry grpc-status as a literal (its encoder writes no Huffman)
RESOURCE_EXHAUSTED = b"grpc-status\x018"


def huge_prefix(port: int, seconds: float) -> str:
    """A ModelInfer call whose length prefix declares 4 GiB, and its first 16 KiB: the server
    should answer from the prefix (it used to wait for, and buffer, up to 129.5 MiB)."""
    sock = connect(port)
    data = b"\0\xff\xff\xff\xff" + b"x" * (MAX_FRAME_SIZE - 5)
    sock.sendall(
        wire.frame(wire.HEADERS, wire.END_HEADERS, 1, INFER_BLOCK)
        + wire.frame(wire.DATA, 0, 1, data)
    )
    sock.settimeout(seconds)
    buffer = b""
    try:
        while RESOURCE_EXHAUSTED not in buffer and (chunk := sock.recv(1 << 16)):
            buffer += chunk
    except OSError:
        pass
    sock.close()
    if RESOURCE_EXHAUSTED in buffer:
        return "RESOURCE_EXHAUSTED from the first 16 KiB"
    return f"no RESOURCE_EXHAUSTED within {seconds:g} s"


def idle_connections(port: int, seconds: float) -> str:
    """1,100 connections that send a preface and nothing more (past the cap), then a new
    client's health check: served by closing the oldest idle one, not refused."""
    held = []
    for _ in range(1100):
        try:
            held.append(connect(port))
        except OSError:
            break
    time.sleep(min(seconds, 0.5))
    checked = health_check(port)
    for sock in held:
        sock.close()
    served = "new client served" if checked else "new client NOT served"
    return f"{len(held)} idle connections opened; {served}"


ATTACKS: dict[str, Callable[[int, float], str]] = {
    "rapid-reset": lambda port, s: flood(port, s, rapid_reset),
    "empty-data": lambda port, s: flood(port, s, empty_data),
    "empty-continuation": lambda port, s: flood(port, s, empty_continuation),
    "ping": lambda port, s: flood(port, s, ping),
    "settings": lambda port, s: flood(port, s, settings),
    "unread-answers": unread_answers,
    "streams-over-limit": lambda port, s: unread_answers(port, s, window=False),
    "connections": connection_flood,
    "slowloris": slowloris,
    "big-metadata": big_metadata,
    "huge-metadata": lambda port, s: big_metadata(port, s, 64 << 10),
    "huge-prefix": huge_prefix,
    "idle-connections": idle_connections,
}


if __name__ == "__main__":
    name, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    print(ATTACKS[name](port, seconds), flush=True)
