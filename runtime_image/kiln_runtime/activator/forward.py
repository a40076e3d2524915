"""Sending a released request on to a ready pod: HTTP/1.1 over a fresh connection, gRPC over a
grpcio channel per pod.

Why it exists: the activator is in the data path only while a service has no ready pod (the
operator then points the Service back at the pods), so a request it released is sent once, to
one pod, and its answer passed back as it came: the status, the body and the headers a client
reads (content type and encoding, the binary-tensor header length). Each send is bounded by
the request's deadline and the answer by ``max_response_bytes``. gRPC messages go through as
bytes (no protobuf is parsed here); grpcio is the runtime's own dependency (tritonclient).
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import httptools

PASSED_REQUEST_HEADERS = (
    "content-type",
    "content-encoding",
    "accept",
    "accept-encoding",
    "inference-header-content-length",
)
PASSED_RESPONSE_HEADERS = (
    "content-encoding",
    "inference-header-content-length",
    "retry-after",
)


class PodSlots:
    """At most ``limit`` released requests in flight to one pod at a time; the others wait
    (within their deadline) for a slot. A woken pod's batching queue is bounded
    (``spec.runtime.batching.maxQueueSize``): a thousand held requests sent to it at once would
    mostly be refused by the pod itself as overloaded."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._slots: dict[str, asyncio.Semaphore] = {}

    def of(self, address: str) -> asyncio.Semaphore:
        slot = self._slots.get(address)
        if slot is None:
            slot = self._slots[address] = asyncio.Semaphore(self.limit)
        return slot

    def keep(self, addresses: set[str]) -> None:
        """Forget the pods that are no longer backends (requests in flight keep theirs)."""
        for address in [a for a in self._slots if a not in addresses]:
            del self._slots[address]


class ForwardFailed(Exception):
    """The pod could not be reached or answered badly; the message says how."""


class _Answer:
    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.complete = False


async def forward_http(
    address: str,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    *,
    seconds: float,
    max_response_bytes: int,
) -> tuple[int, dict[str, str], bytes]:
    """One request to ``address`` (``host:port``); its status, headers (lower-case) and body."""
    host, _, port = address.rpartition(":")
    lines = [f"{method} {path} HTTP/1.1", f"host: {address}", f"content-length: {len(body)}"]
    lines += [f"{name}: {headers[name]}" for name in PASSED_REQUEST_HEADERS if name in headers]
    lines.append("connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    answer = _Answer()

    class Callbacks:
        def on_header(self, name: bytes, value: bytes) -> None:
            answer.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

        def on_body(self, chunk: bytes) -> None:
            answer.size += len(chunk)
            if answer.size > max_response_bytes:
                raise ForwardFailed(f"the pod's answer exceeds {max_response_bytes} bytes")
            answer.body.append(chunk)

        def on_message_complete(self) -> None:
            answer.complete = True

    parser = httptools.HttpResponseParser(Callbacks())
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(seconds):
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
            writer.writelines([head, body])
            await writer.drain()
            while not answer.complete:
                data = await reader.read(1 << 16)
                if not data:
                    break
                parser.feed_data(data)
    except TimeoutError as error:
        raise ForwardFailed(f"{address} did not answer within {seconds:.1f} s") from error
    except (OSError, httptools.HttpParserError) as error:
        raise ForwardFailed(f"{address}: {error}") from error
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    if not answer.complete:
        raise ForwardFailed(f"{address} closed the connection before its answer was complete")
    return parser.get_status_code(), answer.headers, b"".join(answer.body)


class GrpcChannels:
    """One grpcio channel per pod address, closed when the pod is no longer a backend."""

    def __init__(self, max_message: int) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._options = [
            ("grpc.max_send_message_length", max_message),
            ("grpc.max_receive_message_length", max_message),
        ]

    async def call(
        self, address: str, path: str, message: bytes, seconds: float
    ) -> tuple[str, str, bytes]:
        """A unary call of ``path`` with the serialized ``message``: (status code name,
        details, serialized reply)."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(
                address, options=self._options
            )
        method = channel.unary_unary(path)
        try:
            reply = await method(message, timeout=seconds)
        except grpc.aio.AioRpcError as error:
            return error.code().name, error.details() or "", b""
        return "OK", "", bytes(reply)

    async def keep(self, addresses: set[str]) -> None:
        """Close the channels of pods that are no longer backends."""
        for address in [a for a in self._channels if a not in addresses]:
            await self._channels.pop(address).close()

    async def close(self) -> None:
        await self.keep(set())
