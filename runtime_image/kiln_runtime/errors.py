"""The one table that maps a data-plane failure to its HTTP status, gRPC code and metric label.

Every failure the data plane reports is an ``InferError`` of one ``ErrorKind``; the REST and
gRPC adapters only look the kind up here, so both protocols always agree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorMapping:
    http_status: int
    grpc_code: str  # a ``grpc.StatusCode`` member name; this module must not import grpc
    metric_code: str  # the ``code`` label of ``kiln_requests_total``


class ErrorKind(enum.Enum):
    INVALID = ErrorMapping(400, "INVALID_ARGUMENT", "invalid")
    NOT_FOUND = ErrorMapping(404, "NOT_FOUND", "invalid")  # a client error, like INVALID
    REJECTED = ErrorMapping(429, "RESOURCE_EXHAUSTED", "overloaded")
    UNAVAILABLE = ErrorMapping(503, "UNAVAILABLE", "overloaded")
    DEADLINE = ErrorMapping(504, "DEADLINE_EXCEEDED", "deadline")
    INTERNAL = ErrorMapping(500, "INTERNAL", "internal")

    @property
    def mapping(self) -> ErrorMapping:
        value: ErrorMapping = self.value
        return value


OK_METRIC_CODE = "ok"
# The client went away (closed its connection, reset its stream) before the answer was sent.
CANCELLED_METRIC_CODE = "cancelled"
# The runtime failed a valid request: a model or runtime error, or an answer it cannot encode.
INTERNAL_METRIC_CODE = ErrorKind.INTERNAL.mapping.metric_code
# Every ``code`` label value, in the order the docs list them; each request ends in one.
METRIC_CODES = ("ok", "invalid", "overloaded", "deadline", "cancelled", "internal")
# What an error message may quote of a value the client sent (a model name, a path, a tensor
# name): its first characters, then how long it was; and the longest message any error carries.
QUOTE_CHARS = 128
MAX_MESSAGE_CHARS = 1024


def clip(text: str, limit: int = QUOTE_CHARS) -> str:
    """``text`` as an error message may quote it: whole if short, else a bounded prefix.

    A client that sends a 100 KB model name must not get (and make the server build, log
    and send) a 100 KB error message."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


class InferError(Exception):
    """A request failed; ``kind`` decides what each protocol answers."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        message = clip(message, MAX_MESSAGE_CHARS)  # a backstop: values are clipped when quoted
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __repr__(self) -> str:
        return f"InferError({self.kind.name}, {self.message!r})"


def invalid(message: str) -> InferError:
    return InferError(ErrorKind.INVALID, message)


def not_found(message: str) -> InferError:
    return InferError(ErrorKind.NOT_FOUND, message)
