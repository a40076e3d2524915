"""What this HTTP/2 server announces to its peer: its SETTINGS and the windows it grants.

Why it exists: these are Kiln's fixed choices, read both by the preface that announces them
and by the receiving side that holds the peer to them. The protocol's own defaults are in
``wire``; the limits a deployment may change are ``config.Http2Limits``.
"""

from __future__ import annotations

import struct

from kiln_runtime.config import Http2Limits
from kiln_runtime.protocol.http2.wire import (
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    frame,
    window_update,
)

# What this server announces. A window of 1 MiB lets a request of a few MiB arrive in a few
# loopback round trips; it is also what a connection may have in flight beyond its budget.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 1 << 20
MAX_FRAME_SIZE = DEFAULT_MAX_FRAME  # larger frames save little next to a call's other costs


def server_preface(limits: Http2Limits) -> bytes:
    """The server's first frames: its SETTINGS, and the connection window opened to
    ``CONNECTION_WINDOW`` (the RFC starts every connection at ``DEFAULT_WINDOW``)."""
    entries = (
        (SETTINGS_ENABLE_PUSH, 0),
        (SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
        (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
        (SETTINGS_MAX_FRAME_SIZE, MAX_FRAME_SIZE),
        (SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
    )
    settings = frame(SETTINGS, 0, 0, b"".join(struct.pack(">HL", k, v) for k, v in entries))
    return settings + window_update(0, CONNECTION_WINDOW - DEFAULT_WINDOW)
