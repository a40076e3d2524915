"""The pinning benchmark's stand-in for cluster DNS, checked against grpc's own resolver: a
`round_robin` channel naming the server in its target reaches every address it answers."""

import socket
import struct
from collections import Counter
from concurrent import futures

import grpc

from tests.e2e.headless_dns import HeadlessDns, answer

NAME = "pin-pods.bench.svc.cluster.local"
METHOD = "/bench.Echo/Call"


def query(name: str, qtype: int) -> bytes:
    labels = b"".join(bytes([len(part)]) + part.encode() for part in name.split("."))
    return (
        struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", qtype, 1)
    )


def test_a_records_for_the_name_none_for_aaaa_nxdomain_for_others() -> None:
    addresses = ["10.245.0.5", "10.245.0.6"]
    reply = answer(query(NAME.upper(), 1), NAME, lambda: addresses)
    ident, flags, _, count, _, _ = struct.unpack_from("!HHHHHH", reply)
    assert (ident, flags & 0x000F, count) == (7, 0, 2)
    assert [socket.inet_ntoa(reply[i - 4 : i]) for i in (len(reply) - 16, len(reply))] == addresses
    _, flags, _, count, _, _ = struct.unpack_from("!HHHHHH", answer(query(NAME, 28), NAME, list))
    assert (flags & 0x000F, count) == (0, 0)
    _, flags, _, count, _, _ = struct.unpack_from(
        "!HHHHHH", answer(query("other.svc", 1), NAME, lambda: addresses)
    )
    assert (flags & 0x000F, count) == (3, 0)


def test_grpc_round_robin_through_it_reaches_every_address() -> None:
    calls: Counter[str] = Counter()

    def server(host: str, port: int) -> grpc.Server:
        def call(request: bytes, context: grpc.ServicerContext) -> bytes:
            calls[host] += 1
            return request

        handler = grpc.method_handlers_generic_handler(
            "bench.Echo", {"Call": grpc.unary_unary_rpc_method_handler(call)}
        )
        started = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
        assert started.add_insecure_port(f"{host}:{port}") == port
        started.start()
        return started

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    servers = [server(host, port) for host in ("127.0.0.1", "127.0.0.2")]
    try:
        with HeadlessDns(NAME, lambda: ["127.0.0.1", "127.0.0.2"]) as dns:
            options = [("grpc.lb_policy_name", "round_robin")]
            with grpc.insecure_channel(dns.target(port), options=options) as channel:
                echo = channel.unary_unary(METHOD)
                for _ in range(20):
                    assert echo(b"x", timeout=5, wait_for_ready=True) == b"x"
            assert dns.queries >= 1
    finally:
        for started in servers:
            started.stop(grace=None)
    assert set(calls) == {"127.0.0.1", "127.0.0.2"}
    assert min(calls.values()) >= 8, calls
