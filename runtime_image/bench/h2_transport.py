"""The same gRPC service over python-hyper's ``h2`` state machine: the other side of the
transport decision (``docs/runtime.md``, "HTTP/2 transport: hand-written or h2").

A minimal asyncio protocol around ``h2.connection.H2Connection`` that hands each complete
request to the runtime's own ``GrpcService.handle`` and writes its answer, so the floor
benchmark (``bench.grpc_floor``, variant ``h2``) compares the transports alone: the same
handler, the same pre-serialised answer, only the HTTP/2 framing, HPACK and state machine
differ. It returns flow-control credit as soon as a request is complete, sends each answer
within the peer's windows or not at all (benchmark answers are a few dozen bytes), and has
none of the runtime transport's limits: it is a measuring instrument, not a server to deploy.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from kiln_runtime.protocol import hpack
from kiln_runtime.protocol.http2.messages import Handler, Request, Response


class H2Connection(asyncio.Protocol):
    def __init__(self, handler: Handler) -> None:
        # Its fastest configuration that still checks what clients send (RFC 9113 8.2-8.3):
        # the answers' own headers are the service's constants and need no checking.
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_inbound_headers=True,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self._conn = h2.connection.H2Connection(config)
        self._handler = handler
        self._transport: asyncio.Transport | None = None
        self._requests: dict[int, Request] = {}
        self._blocks: dict[bytes, list[tuple[bytes, bytes]]] = {}  # encoded -> header list

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 128,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 16 << 10,
            },
        )
        self._conn.initiate_connection()
        self._conn.increment_flow_control_window((1 << 20) - 65_535)
        transport.write(self._conn.data_to_send())

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        try:
            events = self._conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._flush()
            if self._transport is not None:
                self._transport.close()
            return
        for event in events:
            self._event(event)
        self._flush()

    def _event(self, event: Any) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._requests[event.stream_id] = Request(event.stream_id, dict(event.headers))
        elif isinstance(event, h2.events.DataReceived):
            request = self._requests.get(event.stream_id)
            if request is not None and event.data:
                request.chunks.append(event.data)
                request.size += len(event.data)
            self._conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            request = self._requests.pop(event.stream_id, None)
            if request is not None:
                asyncio.get_running_loop().create_task(self._answer(request))
        elif isinstance(event, h2.events.StreamReset):
            self._requests.pop(event.stream_id, None)

    def _headers(self, block: bytes) -> list[tuple[bytes, bytes]]:
        fields = self._blocks.get(block)
        if fields is None:  # the service's answers are a handful of constant blocks
            fields = self._blocks[block] = list(hpack.Decoder().decode(block))
        return fields

    async def _answer(self, request: Request) -> None:
        response: Response = await self._handler(request)
        if self._transport is None or self._conn.state_machine.state.name == "CLOSED":
            return
        stream_id = request.stream_id
        ends = not response.data and response.trailers is None
        self._conn.send_headers(stream_id, self._headers(response.headers), end_stream=ends)
        if response.data:
            self._conn.send_data(stream_id, response.data, end_stream=response.trailers is None)
        if response.trailers is not None:
            self._conn.send_headers(stream_id, self._headers(response.trailers), end_stream=True)
        self._flush()

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)
