"""Open-loop overload: requests at a fixed rate regardless of answers, bounded in time.

A closed loop slows down with the server and can never overload it; this one keeps sending at
``rate`` per second (several times capacity) for ``seconds`` over a bounded pool of keep-alive
connections, and records every status and latency. Run pinned to the client core.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class OverloadResult:
    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    client_dropped: int = 0  # no free connection within the pool's bound: never sent
    ok_latencies_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    await reader.readexactly(length)
    return status


async def open_loop(
    host: str, port: int, path: str, body: bytes, header_length: int, *,
    rate: float, seconds: float, max_connections: int = 512,
) -> OverloadResult:  # fmt: skip
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {header_length}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    opened = 0
    result = OverloadResult()
    pending: set[asyncio.Task[None]] = set()

    async def one() -> None:
        nonlocal opened
        if idle:
            reader, writer = idle.pop()
        elif opened < max_connections:
            opened += 1
            reader, writer = await asyncio.open_connection(host, port)
        else:
            result.client_dropped += 1
            return
        started = time.perf_counter()
        writer.write(request)
        try:
            status = await asyncio.wait_for(_read_response(reader), timeout=30)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            result.statuses[0] += 1
            writer.close()
            opened -= 1
            return
        result.statuses[status] += 1
        if status == 200:
            result.ok_latencies_ms.append((time.perf_counter() - started) * 1e3)
        idle.append((reader, writer))

    loop = asyncio.get_running_loop()
    start = loop.time()
    total = int(rate * seconds)
    for index in range(total):
        delay = start + index / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = loop.create_task(one())
        pending.add(task)
        task.add_done_callback(pending.discard)
        result.sent += 1
    if pending:
        await asyncio.wait(pending, timeout=60)
    result.seconds = loop.time() - start
    for _, writer in idle:
        writer.close()
    return result
