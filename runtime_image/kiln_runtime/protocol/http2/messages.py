"""An HTTP/2 request and its answer as the handler sees them, and which requests are malformed.

Why it exists: this is the boundary between the HTTP/2 connection and what it serves (the gRPC
server, ``grpcserver``): a ``Handler`` receives a ``Request`` (headers, body, or for a streamed
call a body that grows) and returns a ``Response`` of already encoded header blocks. The checks
of RFC 9113 8.2-8.3 decide, from the header list alone, whether a request is malformed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

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


class Request:
    """One stream's request: its headers and, once complete, its body.

    A plain class, not a dataclass: mypyc compiles this ``__init__`` to C, while a dataclass's
    runs as interpreted Python (``protocol.types`` says more)."""

    def __init__(
        self,
        stream_id: int,
        headers: dict[bytes, bytes],
        chunks: list[bytes] | None = None,
        size: int = 0,
        *,
        too_large: bool = False,
        headers_too_large: bool = False,
        over_capacity: bool = False,
    ) -> None:
        self.stream_id = stream_id
        self.headers = headers
        self.chunks: list[bytes] = [] if chunks is None else chunks
        self.size = size
        self.too_large = too_large  # the body passed the limit; what arrived of it was dropped
        # the header list passed the limit: ``headers`` holds at most its ``:path``
        self.headers_too_large = headers_too_large
        # a call its connection may not make: admitted past ``maxConnections`` on the health
        # budget, it may only call the health paths (``HealthReserve``); answered at once,
        # refused
        self.over_capacity = over_capacity
        # A streamed request (``Streaming``) is handed on from its headers: ``chunks`` grows
        # as its body arrives (``arrived`` is set each time), ``ended`` once the client
        # half-closed, and ``send(headers, data)`` writes answer data before the final
        # Response (False: the stream is gone).
        self.arrived: asyncio.Event | None = None
        self.ended = False
        self.send: Callable[[bytes, bytes], bool] | None = None

    @property
    def body(self) -> bytes:
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)


class Response:
    """An answer as header blocks already HPACK-encoded (``hpack.encode``), so constant
    blocks are encoded once. ``trailers`` None means the headers end the stream."""

    def __init__(self, headers: bytes, data: bytes = b"", trailers: bytes | None = None) -> None:
        self.headers: Final = headers
        self.data: Final = data
        self.trailers: Final = trailers


Handler = Callable[[Request], Awaitable[Response]]
# Whether a request is answered from its headers alone, without waiting for its body: gRPC's
# unknown (e.g. streaming) methods get UNIMPLEMENTED at once, not when the client half-closes.
AnswersEarly = Callable[[dict[bytes, bytes]], bool]
# Whether a request is streamed (server-streaming or bidirectional gRPC methods).
Streaming = Callable[[dict[bytes, bytes]], bool]
