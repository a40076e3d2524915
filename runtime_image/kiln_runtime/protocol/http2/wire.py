"""The HTTP/2 wire format (RFC 9113): what every frame on a connection is made of.

Why it exists: frame types, flags, setting identifiers, error codes and the protocol's own
defaults are fixed by the RFC, not chosen by Kiln; kept together they read as the RFC's tables,
and a test that plays the peer builds its frames from them. ``frame`` writes one frame;
reading happens in place in ``receiving`` (it must not copy the connection's buffer). Nothing
here holds state or does I/O.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9

END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

MAX_STREAM_ID = 0x7FFF_FFFF
DRAIN_PING = b"kiln\x00drn"  # the payload of the PING following a draining GOAWAY (``connection``)
DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1
DEFAULT_MAX_FRAME = 16_384

FRAME_HEADER = struct.Struct(">BHBBL")  # length is 24 bits: high byte + low 16 bits


class ProtocolViolation(Exception):
    """The peer broke the protocol: the connection ends with GOAWAY and this error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: its 9-byte header, then ``payload``."""
    length = len(payload)
    return FRAME_HEADER.pack(length >> 16, length & 0xFFFF, kind, flags, stream_id) + payload


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">L", increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">L", code))
