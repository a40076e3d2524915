"""TCP relays from the real node's bridge address to the cluster's loopback services.

Why it exists: the API server and Prometheus listen on loopback only, which a pod cannot reach
(its loopback is its own). An operator running as a pod reaches the API server as in any
cluster, through the `kubernetes` Service's cluster IP, and Prometheus at a URL it is given; so
on the real node the cluster relays each of those ports from the bridge's address (an address
the cluster owns, on a bridge it made: nothing outside this machine reaches it) to loopback,
byte for byte (TLS stays end to end), and publishes the API server's relay as the `kubernetes`
Service's endpoint (the API server's own endpoint reconciler refuses a loopback address).
"""

import asyncio
import contextlib
import functools
import json
import urllib.parse

CONNECT_TIMEOUT_SECONDS = 5.0
CHUNK = 65536


def node_url(url: str, node_ip: str) -> str:
    """``url`` (a loopback service of this machine) as a pod reaches it through the relay."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{node_ip}:{parts.port}"))


def kubernetes_endpoint_slice(node_ip: str, port: int) -> str:
    """The `kubernetes` Service's EndpointSlice: the API server's relay on the node's address."""
    return json.dumps({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes",
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "kiln-localcluster",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [node_ip], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    })  # fmt: skip


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


async def _relay_one(
    target_port: int, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
) -> None:
    try:
        server_reader, server_writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", target_port), CONNECT_TIMEOUT_SECONDS
        )
    except (OSError, TimeoutError):
        client_writer.close()
        return
    try:
        await asyncio.gather(
            _pipe(client_reader, server_writer), _pipe(server_reader, client_writer)
        )
    finally:
        for writer in (client_writer, server_writer):
            with contextlib.suppress(OSError):
                writer.close()


async def _serve(node_ip: str, ports: list[int]) -> None:
    servers = [
        await asyncio.start_server(
            functools.partial(_relay_one, port), node_ip, port, reuse_address=True
        )
        for port in ports
    ]
    await asyncio.gather(*(server.serve_forever() for server in servers))


def relay_forever(node_ip: str, ports: list[int]) -> None:
    """Relay each of ``ports`` from ``node_ip`` to the same port on loopback, until killed."""
    asyncio.run(_serve(node_ip, ports))
