"""The W3C `traceparent` of the gRPC call being answered, from the transport to the adapter.

Why it exists: a unary method is called with its message and deadline only, and the gRPC
transports (`grpcserver`, `grpcio_server`) know nothing of models or traces; for a method marked
`traced` (ModelInfer, while tracing is on) they put the call's `traceparent` metadata here, in
the call's own context, and the adapter (`grpc.py`) reads it. Off, nothing is set or read.
"""

from contextvars import ContextVar

TRACEPARENT: ContextVar[str | None] = ContextVar("kiln_traceparent", default=None)
MAX_TRACEPARENT = 256
"""Longer values are not W3C traceparents (55 characters in version 00): ignored."""


def traceparent_of(value: bytes | str | None) -> str | None:
    """The metadata value as text, or None if absent or too long to be one."""
    if value is None or len(value) > MAX_TRACEPARENT:
        return None
    return value.decode("latin-1") if isinstance(value, bytes) else value
