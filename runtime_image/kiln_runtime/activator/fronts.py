"""The activator's two client-facing ports: HTTP/1.1 and gRPC, on the runtime's own servers.

Why it exists: while a service has no ready pod, the operator points its Service at the
activator, so the activator speaks what the runtime speaks, through the runtime's servers
(``protocol.httpserver``, ``protocol.http2``: the same limits on connections, headers, bodies
and buffers), with a handler that holds each request (``hold.Holds``) and sends it on to the
first ready pod (``forward``). A request names its service by its Host (HTTP) or :authority
(gRPC): ``NAME.NAMESPACE`` as in-cluster DNS gives it (``NAME.NAMESPACE.svc``,
``NAME.NAMESPACE.svc.cluster.local``, with or without a port).
"""

from __future__ import annotations

import asyncio
import time

import grpc
from prometheus_client import Counter, Histogram

from kiln_runtime import errors
from kiln_runtime.activator.forward import (
    PASSED_RESPONSE_HEADERS,
    ForwardFailed,
    GrpcChannels,
    PodSlots,
    forward_http,
)
from kiln_runtime.activator.hold import Holds, Refused, ServiceKey
from kiln_runtime.config import HttpLimits
from kiln_runtime.errors import InferError
from kiln_runtime.protocol import hpack
from kiln_runtime.protocol.grpcserver import ACCEPT_ENCODING, grpc_timeout, inflate, percent_encode
from kiln_runtime.protocol.http2.messages import Request, Response
from kiln_runtime.protocol.rest import HttpResponse, json_response

REFUSED = Counter(
    "kiln_activator_refused_total",
    "Requests the activator refused while their service was waking, by the bound they passed "
    "(requests, bytes, services, deadline) or the host they named (unknown).",
    ["reason"],
)
VIA = (b"Via", b"1.1 kiln-activator")
"""On every answer the activator passes on (RFC 9110's Via, as a proxy adds it): a client or
a test can tell an answer that came through the activator from one straight from a pod."""
HELD_SECONDS = Histogram(
    "kiln_activator_held_seconds",
    "How long a released request waited in the activator for a ready pod.",
    buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
)
FORWARD_FAILED = Counter(
    "kiln_activator_forward_failures_total",
    "Released requests the pod could not be reached for (answered 502 / UNAVAILABLE).",
    ["protocol"],
)

_OK_HEADERS = hpack.encode(
    [(b":status", b"200"), (b"content-type", b"application/grpc"),
     (b"grpc-accept-encoding", ACCEPT_ENCODING)]
)  # fmt: skip
_OK_TRAILERS = hpack.encode([(b"grpc-status", b"0")])


REFUSE_AHEAD_SECONDS = 0.5
"""A held gRPC call is refused this long before its own deadline (at most a tenth of it), so
that UNAVAILABLE ("waking") reaches the client before the client gives up with
DEADLINE_EXCEEDED and learns nothing."""


def refuse_by(started: float, timeout: float | None) -> float | None:
    """When a call with ``grpc-timeout`` ``timeout`` (seconds, from ``started``) stops waiting in
    the hold: a margin before its deadline, so its refusal arrives in time; None: no deadline."""
    if timeout is None:
        return None
    return started + timeout - min(REFUSE_AHEAD_SECONDS, timeout / 10)


def service_of(host: str) -> ServiceKey | None:
    """(namespace, name) from a Host or :authority, or None if it names no namespace."""
    name = host.rsplit("]", 1)[-1].split(":", 1)[0] if host.startswith("[") else host
    name = name.split(":", 1)[0].lower()
    labels = name.split(".")
    if len(labels) < 2 or not labels[0] or not labels[1]:
        return None
    if len(labels) > 2 and labels[2] != "svc":
        return None
    return labels[1], labels[0]


def _unknown(host: str) -> str:
    return (
        f"the activator serves services at zero by their in-cluster name; host {host[:200]!r} "
        "names none: address the service as NAME.NAMESPACE (or NAME.NAMESPACE.svc)"
    )


class ActivatorHttp:
    """The HTTP/1.1 port's handler (``protocol.httpserver.HttpHandler``)."""

    def __init__(
        self,
        holds: Holds,
        slots: PodSlots,
        limits: HttpLimits,
        max_body: int,
        max_response_bytes: int,
    ) -> None:
        self.holds = holds
        self.slots = slots
        self.http_limits = limits
        self.max_body = max_body
        self.max_response_bytes = max_response_bytes

    def refused(self, code: str) -> None:
        """The transport refused a request (too large, too slow): counted by its code."""
        REFUSED.labels(f"http-{code}").inc()

    async def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> HttpResponse:
        host = headers.get("host", "")
        key = service_of(host)
        if key is None:
            REFUSED.labels("unknown").inc()
            return json_response(404, {"error": _unknown(host)})
        try:
            release = await self.holds.wait(key, len(body), grpc=False, deadline=None)
        except Refused as refused:
            REFUSED.labels(refused.reason).inc()
            answer = json_response(503, {"error": str(refused)})
            answer.extra_headers = ((b"Retry-After", b"%d" % refused.retry_after),)
            return answer
        HELD_SECONDS.observe(release.held_seconds)
        seconds = self.holds.limits.timeout_seconds
        try:
            async with asyncio.timeout(seconds), self.slots.of(release.address):
                status, answered, data = await forward_http(
                    release.address, method, path, headers, body,
                    seconds=seconds, max_response_bytes=self.max_response_bytes,
                )  # fmt: skip
        except TimeoutError:
            FORWARD_FAILED.labels("http").inc()
            return json_response(
                504, {"error": f"the pod {release.address} did not answer in time"}
            )
        except ForwardFailed as error:
            FORWARD_FAILED.labels("http").inc()
            return json_response(502, {"error": f"the activator could not reach a pod: {error}"})
        passed = (
            *(
                (name.encode("latin-1"), answered[name].encode("latin-1"))
                for name in PASSED_RESPONSE_HEADERS
                if name in answered
            ),
            VIA,
        )
        content_type = answered.get("content-type", "application/json").encode("latin-1")
        return HttpResponse(status, [data], content_type=content_type, extra_headers=passed)


def grpc_status(code: grpc.StatusCode, message: str) -> Response:
    """A Trailers-Only answer with any gRPC status (the pod's own, passed through)."""
    value: int = code.value[0]
    return Response(
        hpack.encode(
            [
                (b":status", b"200"),
                (b"content-type", b"application/grpc"),
                (b"grpc-status", b"%d" % value),
                (b"grpc-message", percent_encode(message[:1024])),
            ]
        )
    )


class ActivatorGrpc:
    """The gRPC port's handler (``protocol.http2`` ``Handler``): unary calls only."""

    def __init__(
        self, holds: Holds, slots: PodSlots, channels: GrpcChannels, max_message: int
    ) -> None:
        self.holds = holds
        self.slots = slots
        self.channels = channels
        self.max_message = max_message

    async def handle(self, request: Request) -> Response:
        headers = request.headers
        if request.over_capacity:
            return grpc_status(grpc.StatusCode.UNAVAILABLE, "the activator is at its limit")
        if request.headers_too_large or request.too_large:
            return grpc_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "request exceeds the limit")
        if headers.get(b":method") != b"POST" or not headers.get(b"content-type", b"").startswith(
            b"application/grpc"
        ):
            return grpc_status(grpc.StatusCode.UNIMPLEMENTED, "the activator serves gRPC only")
        host = headers.get(b":authority", b"").decode("latin-1")
        key = service_of(host)
        if key is None:
            REFUSED.labels("unknown").inc()
            return grpc_status(grpc.StatusCode.NOT_FOUND, _unknown(host))
        started = time.monotonic()
        try:
            timeout = grpc_timeout(headers[b"grpc-timeout"]) if b"grpc-timeout" in headers else None
            message = self._message(b"".join(request.chunks))
        except InferError as error:
            return grpc_status(grpc.StatusCode.INVALID_ARGUMENT, error.message)
        deadline = None if timeout is None else started + timeout
        try:
            release = await self.holds.wait(
                key, len(message), grpc=True, deadline=refuse_by(started, timeout)
            )
        except Refused as refused:
            REFUSED.labels(refused.reason).inc()
            return grpc_status(grpc.StatusCode.UNAVAILABLE, str(refused))
        HELD_SECONDS.observe(release.held_seconds)
        left = self.holds.limits.timeout_seconds
        if deadline is not None:
            left = max(0.001, deadline - time.monotonic())
        path = headers.get(b":path", b"").decode("latin-1")
        until = time.monotonic() + left
        try:
            async with asyncio.timeout(left), self.slots.of(release.address):
                code, details, reply = await self.channels.call(
                    release.address, path, message, max(0.001, until - time.monotonic())
                )
        except TimeoutError:
            return grpc_status(grpc.StatusCode.DEADLINE_EXCEEDED, "the pod did not answer in time")
        except asyncio.CancelledError:
            raise
        except Exception as error:  # grpcio's own failures (a closed channel) end this call
            FORWARD_FAILED.labels("grpc").inc()
            return grpc_status(grpc.StatusCode.UNAVAILABLE, f"the activator could not reach a "
                               f"pod: {error}")  # fmt: skip
        if code != "OK":
            return grpc_status(grpc.StatusCode[code], details)
        return Response(_OK_HEADERS, b"\0" + len(reply).to_bytes(4, "big") + reply, _OK_TRAILERS)

    def _message(self, framed: bytes) -> bytes:
        """The one message of a unary call, inflated if it came compressed."""
        if len(framed) < 5:
            raise errors.invalid("the call carries no length-prefixed message")
        length = int.from_bytes(framed[1:5], "big")
        if len(framed) != 5 + length:
            raise errors.invalid("a unary call carries exactly one message")
        payload = framed[5:]
        if framed[0] == 1:
            try:
                return inflate(payload, self.max_message)
            except InferError:
                raise
            except Exception as error:  # the transport's refusal: it inflates past the limit
                raise errors.invalid(str(error)) from None
        return payload
