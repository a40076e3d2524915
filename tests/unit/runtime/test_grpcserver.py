"""gRPC over HTTP/2: what a request that reaches the service gets back, as the gRPC HTTP/2
protocol spells it (status in trailers, Trailers-Only for errors, grpc-message percent-encoded).
"""

import gzip
import random
from typing import Any

import pytest
from tritonclient.grpc import service_pb2

from kiln_runtime import errors
from kiln_runtime.protocol import hpack
from kiln_runtime.protocol.grpcserver import (
    GrpcService,
    UnaryMethod,
    grpc_timeout,
    percent_encode,
)
from kiln_runtime.protocol.http2.messages import Request, Response

PATH = b"/inference.GRPCInferenceService/ModelReady"


async def model_ready(request: Any, time_left: float | None) -> Any:
    if request.name == "missing":
        raise errors.not_found("unknown model 'missing'")
    if request.name == "crash":
        raise RuntimeError("a bug")
    return service_pb2.ModelReadyResponse(ready=time_left is None or time_left > 1)


def service() -> GrpcService:
    methods = {"ModelReady": UnaryMethod(service_pb2.ModelReadyRequest, model_ready)}
    return GrpcService("inference.GRPCInferenceService", methods, max_message=1000)


def request(
    body: bytes, path: bytes = PATH, extra: dict[bytes, bytes] | None = None, **flags: Any
) -> Request:
    headers = {b":method": b"POST", b":path": path, b"content-type": b"application/grpc"}
    return Request(1, {**headers, **(extra or {})}, [body], len(body), **flags)


def framed(message: Any, compressed: bool = False) -> bytes:
    payload: bytes = message.SerializeToString()
    return bytes([compressed]) + len(payload).to_bytes(4, "big") + payload


def headers(block: bytes) -> dict[bytes, bytes]:
    return dict(hpack.Decoder().decode(block))


def status(response: Response) -> tuple[int, str]:
    """grpc-status and the decoded grpc-message of a Trailers-Only response."""
    assert not response.data and response.trailers is None
    fields = headers(response.headers)
    assert fields[b":status"] == b"200"
    assert fields[b"content-type"] == b"application/grpc"
    message = fields.get(b"grpc-message", b"").decode()
    return int(fields[b"grpc-status"]), message


async def test_a_call_answers_headers_message_and_ok_trailers() -> None:
    body = framed(service_pb2.ModelReadyRequest(name="mlp"))
    response = await service().handle(request(body))
    assert headers(response.headers)[b":status"] == b"200"
    assert response.trailers is not None
    assert headers(response.trailers) == {b"grpc-status": b"0"}
    assert response.data[0] == 0
    assert int.from_bytes(response.data[1:5], "big") == len(response.data) - 5
    assert service_pb2.ModelReadyResponse.FromString(response.data[5:]).ready


async def test_the_deadline_reaches_the_method() -> None:
    body = framed(service_pb2.ModelReadyRequest(name="mlp"))
    response = await service().handle(request(body, extra={b"grpc-timeout": b"500m"}))
    assert not service_pb2.ModelReadyResponse.FromString(response.data[5:]).ready  # 0.5 s left


@pytest.mark.parametrize(
    ("name", "code", "message"),
    [("missing", 5, "unknown model 'missing'"), ("crash", 13, "internal error; see server log")],
)
async def test_method_failures_become_statuses(name: str, code: int, message: str) -> None:
    body = framed(service_pb2.ModelReadyRequest(name=name))
    assert status(await service().handle(request(body))) == (code, message)


async def test_unknown_methods_are_unimplemented() -> None:
    body = framed(service_pb2.ModelReadyRequest(name="mlp"))
    code, message = status(await service().handle(request(body, path=b"/x.Y/Z")))
    assert code == 12
    assert "/x.Y/Z" in message


@pytest.mark.parametrize(
    ("body", "code", "needle"),
    [
        (b"", 3, "no gRPC message"),
        (framed(service_pb2.ModelReadyRequest(name="mlp"), compressed=True), 12, "compressed"),
        (framed(service_pb2.ModelReadyRequest(name="mlp")) + b"\0", 3, "exactly one"),
        (b"\0\0\0\0\x03\xff\xff\xff", 3, "malformed ModelReadyRequest"),
    ],
)
async def test_bad_framing_and_messages_are_refused(body: bytes, code: int, needle: str) -> None:
    got_code, message = status(await service().handle(request(body)))
    assert got_code == code
    assert needle in message


async def test_an_oversized_request_is_refused_with_the_limit() -> None:
    code, message = status(await service().handle(request(b"", too_large=True)))
    assert (code, message) == (8, "request message exceeds the limit of 1000 bytes")  # EXHAUSTED


async def test_a_malformed_deadline_is_refused() -> None:
    body = framed(service_pb2.ModelReadyRequest(name="mlp"))
    code, message = status(await service().handle(request(body, extra={b"grpc-timeout": b"9x"})))
    assert code == 3
    assert "grpc-timeout" in message


@pytest.mark.parametrize(
    ("extra", "http_status"),
    [({b":method": b"GET"}, b"405"), ({b"content-type": b"application/json"}, b"415")],
)
async def test_requests_that_are_not_grpc_get_http_errors(
    extra: dict[bytes, bytes], http_status: bytes
) -> None:
    response = await service().handle(request(b"", extra=extra))
    assert headers(response.headers) == {b":status": http_status, b"content-type": b"text/plain"}
    assert b"gRPC server" in response.data
    assert response.trailers is None


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(b"1H", 3600.0), (b"2M", 120.0), (b"3S", 3.0), (b"250m", 0.25), (b"7u", 7e-6), (b"9n", 9e-9)],
)
def test_timeouts_in_every_unit(value: bytes, seconds: float) -> None:
    assert grpc_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"S", b"123456789S", b"-1S", b"1s", b"1.5S"])
def test_malformed_timeouts(value: bytes) -> None:
    with pytest.raises(errors.InferError, match="grpc-timeout"):
        grpc_timeout(value)


def test_messages_are_percent_encoded() -> None:
    assert percent_encode("shape [2, 3] is 100% wrong: ü\n") == (
        b"shape [2, 3] is 100%25 wrong: %C3%BC%0A"
    )


async def test_metadata_over_the_limit_fails_the_call_only() -> None:
    oversized = Request(1, {}, headers_too_large=True)  # what the transport hands on
    assert status(await service().handle(oversized)) == (
        8, "request metadata exceeds the limit"
    )  # fmt: skip


def gzipped(message: Any) -> bytes:
    payload = gzip.compress(message.SerializeToString())
    return b"\1" + len(payload).to_bytes(4, "big") + payload


GZIP = {b"grpc-encoding": b"gzip"}


async def test_gzip_messages_are_inflated() -> None:
    body = gzipped(service_pb2.ModelReadyRequest(name="mlp"))
    response = await service().handle(request(body, extra=GZIP))
    assert service_pb2.ModelReadyResponse.FromString(response.data[5:]).ready


@pytest.mark.parametrize(
    ("body", "extra", "code", "needle"),
    [
        (b"\1" + (24).to_bytes(4, "big") + gzip.compress(b"\0" * 4000, mtime=0)[:24], GZIP, 3,
         "gzip"),
        (framed(service_pb2.ModelReadyRequest(name="m"), compressed=True),
         {b"grpc-encoding": b"snappy"}, 12, "'snappy'"),
    ],
    ids=["truncated-gzip", "unknown-encoding"],  # the gzip bytes carry no stable test id
)  # fmt: skip
async def test_bad_compression_is_refused(
    body: bytes, extra: dict[bytes, bytes], code: int, needle: str
) -> None:
    got_code, message = status(await service().handle(request(body, extra=extra)))
    assert got_code == code
    assert needle in message


@pytest.mark.parametrize(
    "inflated",
    [b"\0" * 2000, b"\0" * (64 << 20), random.Random(0).randbytes(100_000)],
    ids=["small", "bomb", "large-inflated-in-a-thread"],
)
async def test_a_message_inflating_past_the_limit_is_refused(inflated: bytes) -> None:
    bomb = gzip.compress(inflated)
    body = b"\1" + len(bomb).to_bytes(4, "big") + bomb
    assert status(await service().handle(request(body, extra=GZIP))) == (
        8, "inflated message exceeds 1000 bytes"
    )  # fmt: skip


def test_grpc_calls_it_does_not_serve_are_answered_from_their_headers() -> None:
    known = {b":method": b"POST", b":path": PATH, b"content-type": b"application/grpc"}
    assert not service().answers_early(known)
    assert service().answers_early({**known, b":path": b"/pkg.Svc/Stream"})
    assert not service().answers_early({**known, b":method": b"GET"})
    assert not service().answers_early({**known, b"content-type": b"text/plain"})


def counting() -> tuple[GrpcService, list[str]]:
    """The service whose method hears of the calls refused before it ran (as ModelInfer)."""
    heard: list[str] = []
    method = UnaryMethod(
        service_pb2.ModelReadyRequest, model_ready, refused=lambda code, _: heard.append(code)
    )
    return GrpcService("inference.GRPCInferenceService", {"ModelReady": method}, 1000), heard


@pytest.mark.parametrize(
    "refused",
    [
        Request(1, {b":path": PATH}, headers_too_large=True),
        request(b"", too_large=True),
        request(b"\0\0\0\0\3\xff\xff\xff"),  # not a protobuf message
        request(b"\0\0\0\0\1"),  # shorter than its length prefix
        request(framed(service_pb2.ModelReadyRequest()), extra={b"grpc-timeout": b"1x"}),
        request(gzipped(service_pb2.ModelReadyRequest(name="m" * 2000)), extra=GZIP),
        request(framed(service_pb2.ModelReadyRequest(), True), extra={b"grpc-encoding": b"lz4"}),
    ],
    ids=["metadata", "message", "protobuf", "framing", "deadline", "gzip-bomb", "encoding"],
)
async def test_calls_refused_before_the_method_are_told_to_it_once(refused: Request) -> None:
    answering, heard = counting()
    code, _ = status(await answering.handle(refused))
    assert code != 0
    assert heard == ["invalid"]


async def test_calls_the_method_answers_are_not_told_as_refused() -> None:
    answering, heard = counting()
    await answering.handle(request(framed(service_pb2.ModelReadyRequest(name="m"))))
    await answering.handle(request(framed(service_pb2.ModelReadyRequest(name="missing"))))
    other = Request(1, {b":path": b"/pkg.Svc/Other"}, headers_too_large=True)
    assert status(await answering.handle(other))[0] == 8  # not this method's call
    assert heard == []


async def test_a_call_refused_for_its_connection_is_unavailable_and_counted_overloaded() -> None:
    """A connection admitted past maxConnections may only check health (the transport marks
    its other calls): UNAVAILABLE, and the method hears of it as ``overloaded``."""
    heard: list[str] = []
    methods = {
        "ModelReady": UnaryMethod(
            service_pb2.ModelReadyRequest, model_ready, lambda code, _: heard.append(code)
        )
    }
    served = GrpcService("inference.GRPCInferenceService", methods, max_message=1000)
    body = framed(service_pb2.ModelReadyRequest(name="mlp"))
    code, message = status(await served.handle(request(body, over_capacity=True)))
    assert (code, heard) == (14, ["overloaded"])
    assert "grpc.health.v1.Health/Check" in message
