"""The metrics port on the event loop, bounded like the others (issue 39, item 2): a cap on
connections where the oldest idle one makes room, header and idle timeouts."""

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from kiln_runtime.protocol.metricsserver import MetricsServer

SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture
async def served() -> AsyncIterator[tuple[MetricsServer, int]]:
    registry = CollectorRegistry()
    Counter("kiln_test", "a counter", registry=registry).inc()
    server = MetricsServer(registry, max_connections=8, header_timeout=0.3, idle_timeout=0.5)
    port = await server.start("127.0.0.1", 0)
    yield server, port
    await server.stop()


async def scrape(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(SCRAPE)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        return head + await asyncio.wait_for(reader.readexactly(length), 2)
    finally:
        writer.close()


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), seconds) == b""
    except (TimeoutError, ConnectionError):
        return False


async def test_a_scrape_is_answered_and_the_connection_kept(
    served: tuple[MetricsServer, int],
) -> None:
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(2):  # keep-alive: two scrapes on one connection
        writer.write(SCRAPE)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        assert head.startswith(b"HTTP/1.1 200")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        assert b"kiln_test_total 1.0" in await reader.readexactly(length)
    writer.close()


async def test_idle_sockets_at_the_cap_make_room_for_a_scrape(
    served: tuple[MetricsServer, int],
) -> None:
    """Sockets that send nothing fill the cap; a new scrape evicts the oldest of them (it
    used to cost a thread and a file descriptor each, with no cap)."""
    server, port = served
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
    await asyncio.sleep(0.05)
    assert server.connections <= server.max_connections
    assert (await scrape(port)).startswith(b"HTTP/1.1 200")
    assert server.evicted >= 12
    assert await closed_within(idle[0][0], 1)  # the oldest were closed
    for _, writer in idle:
        writer.close()


async def test_a_silent_client_is_closed_after_the_header_timeout(
    served: tuple[MetricsServer, int],
) -> None:
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\n")  # the head never ends
    assert await closed_within(reader, 2)
    writer.close()


async def test_a_head_over_the_limit_and_a_body_are_refused(
    served: tuple[MetricsServer, int],
) -> None:
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"v" * (64 << 10))
    assert await closed_within(reader, 2)
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
    assert (await asyncio.wait_for(reader.read(), 2)).startswith(b"HTTP/1.1 400")
    writer.close()
