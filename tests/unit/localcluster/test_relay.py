"""The relay that lets pods reach the cluster's loopback services: bytes both ways, a half-close
passed on, a target that is down closes the client's connection; the URL and EndpointSlice it
publishes."""

import asyncio
import json
import socket

from kiln_localcluster import relay


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_bytes_go_both_ways_and_a_half_close_is_passed_on() -> None:
    port = free_port()

    async def upper(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # until the client's half-close reaches it
        writer.write(data.upper())
        await writer.drain()
        writer.close()

    target = await asyncio.start_server(upper, "127.0.0.1", port)
    relaying = asyncio.create_task(relay._serve("127.0.0.2", [port]))
    try:
        for _ in range(50):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.2", port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        writer.write(b"hello " * 20000)
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer == b"HELLO " * 20000
        writer.close()
    finally:
        relaying.cancel()
        target.close()


async def test_a_target_that_is_down_closes_the_clients_connection() -> None:
    port = free_port()  # nothing listens on loopback there
    relaying = asyncio.create_task(relay._serve("127.0.0.2", [port]))
    try:
        for _ in range(50):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.2", port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    finally:
        relaying.cancel()


def test_a_loopback_url_as_a_pod_reaches_it() -> None:
    assert relay.node_url("http://127.0.0.1:9090", "10.245.0.1") == "http://10.245.0.1:9090"


def test_the_kubernetes_services_endpoint_is_the_relay() -> None:
    body = json.loads(relay.kubernetes_endpoint_slice("10.245.0.1", 6443))
    assert body["metadata"]["labels"]["kubernetes.io/service-name"] == "kubernetes"
    assert body["endpoints"][0]["addresses"] == ["10.245.0.1"]
    assert body["ports"] == [{"name": "https", "port": 6443, "protocol": "TCP"}]
