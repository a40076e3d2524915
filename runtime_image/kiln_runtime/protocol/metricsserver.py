"""The metrics port (Prometheus' text format) on the event loop, with the other ports' limits.

It replaces ``prometheus_client.start_http_server``, which runs a thread per connection with no
cap and no timeout: about 1,000 idle sockets on it used every file descriptor of the process
(readiness probes were reset, new gRPC clients timed out). Here every connection is a coroutine
on the loop, and each is bounded: at most ``max_connections`` (at the cap the oldest connection
not being answered is closed to admit the new one, so a scraper always gets in), the request
head within ``HEADER_BYTES`` and ``header_timeout`` seconds, an idle keep-alive connection
closed after ``idle_timeout``. Any ``GET`` path answers the metrics, as the client library's
server did (``/metrics`` is what Prometheus asks).
"""

from __future__ import annotations

import asyncio
import collections
import logging

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kiln_runtime.protocol.listening import listening_port

log = logging.getLogger(__name__)

HEADER_BYTES = 16 << 10  # request line and headers; a scrape sends a few hundred bytes


class MetricsServer:
    """Serves ``registry`` over HTTP/1.1 on one port."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        max_connections: int = 64,
        header_timeout: float = 10.0,
        idle_timeout: float = 75.0,
    ) -> None:
        self._registry = registry
        self.max_connections = max_connections
        self._header_timeout = header_timeout
        self._idle_timeout = idle_timeout
        # connection -> answering now; in the order they came (the oldest first)
        self._connections: collections.OrderedDict[asyncio.StreamWriter, bool] = (
            collections.OrderedDict()
        )
        self.evicted = 0  # connections closed at the cap to admit a new one
        self.refused = 0  # connections refused at the cap (every one was being answered)
        self.refused_at = 0.0  # the loop's clock when the last was refused
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port, limit=HEADER_BYTES)
        return listening_port(self._server)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._connections):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def connections(self) -> int:
        return len(self._connections)

    def port_status(self) -> tuple[int, int, int, float]:
        """Open connections, idle ones closed at the cap, refused ones, when the last was."""
        return len(self._connections), self.evicted, self.refused, self.refused_at

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        if len(self._connections) >= self.max_connections:
            idle = next((w for w, busy in self._connections.items() if not busy), None)
            if idle is None:
                self.refused += 1
                self.refused_at = asyncio.get_running_loop().time()
                return False
            self.evicted += 1
            self._connections.pop(idle)
            idle.close()
            if self.evicted == 1 or self.evicted % 100 == 0:
                log.warning(
                    "metrics port at its cap of %d connections: the oldest idle one closed "
                    "(%d so far)", self.max_connections, self.evicted,
                )  # fmt: skip
        self._connections[writer] = False
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            writer.close()
            return
        try:
            first = True
            while True:
                timeout = self._header_timeout if first else self._idle_timeout
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
                except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    return  # idle, too slow, closed, or a head over HEADER_BYTES
                first = False
                self._connections[writer] = True
                keep_alive = self._answer(head, writer)
                await asyncio.wait_for(writer.drain(), self._idle_timeout)  # a reader that stops
                if not keep_alive:
                    return
                if writer in self._connections:
                    self._connections[writer] = False
        except (ConnectionError, ValueError, TimeoutError):
            return
        finally:
            self._connections.pop(writer, None)
            writer.close()

    def _answer(self, head: bytes, writer: asyncio.StreamWriter) -> bool:
        line, _, rest = head.partition(b"\r\n")
        parts = line.split(b" ")
        headers = rest.lower()
        keep_alive = b"connection: close" not in headers and line.endswith(b"HTTP/1.1")
        if len(parts) != 3 or b"content-length:" in headers or b"transfer-encoding:" in headers:
            status, body, kind = b"400 Bad Request", b"bad request\n", b"text/plain"
            keep_alive = False
        elif parts[0] not in (b"GET", b"HEAD"):
            status, body, kind = b"405 Method Not Allowed", b"GET only\n", b"text/plain"
        else:
            status, body, kind = b"200 OK", generate_latest(self._registry), b""
            kind = CONTENT_TYPE_LATEST.encode()
            if parts[0] == b"HEAD":
                body = b""
        writer.write(
            b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
            % (status, kind, len(body), b"" if keep_alive else b"Connection: close\r\n")
            + body
        )
        return keep_alive
