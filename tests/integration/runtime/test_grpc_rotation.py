"""Connection rotation under real gRPC clients: the runtime ends every connection at its maximum
age (spec.runtime.connections), and no call fails for it.

Why it exists: rotation is what spreads long-lived clients over replicas added after they
connected (docs/benchmarks/grpc-pinning.md), and it happens every 30 s to every client by
default. The HTTP/2 unit tests show the frames (GOAWAY, PING, GOAWAY) against a hand-played
peer; this test shows that grpcio's own client, as ``tritonclient.grpc`` drives it, loses
nothing through them: several clients, each on its own connection, calling back to back on
loopback through several rotations each, every call answered.
"""

import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from .conftest import ModelFactory
from .runtime_process import running

pytestmark = pytest.mark.integration

MAX_AGE_SECONDS = 1.0
CLIENTS = 8
LOAD_SECONDS = 8.0  # about 7 rotations per client (the age is jittered by 10 %)
MAX_CALLS_PER_CLIENT = 4000
CALL_GAP_SECONDS = 0.002
LOCAL_SUBCHANNELS = ("grpc.use_local_subchannel_pool", 1)
"""grpcio shares one connection among a process's channels to the same target; a local pool
gives each client its own, as separate client processes have."""


def client_ports(server_port: int) -> set[int]:
    """Local ports of this host's established TCP connections to ``server_port`` (loopback:
    the clients' ends of their connections to the runtime). grpcio's sockets are IPv6 ones
    holding IPv4-mapped addresses: they are listed in tcp6."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, remote, state = line.split()[1:4]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == server_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def failure_kind(error: Exception) -> str:
    if isinstance(error, InferenceServerException):
        return f"{error.status()}: {(error.message() or '')[:100]}"
    return f"{type(error).__name__}: {str(error)[:100]}"


def test_rotating_connections_lose_no_call(example_model: ModelFactory, tmp_path: Path) -> None:
    model = example_model("mlp", connections={"maxAgeSeconds": MAX_AGE_SECONDS,
                                              "maxAgeGraceSeconds": 5})  # fmt: skip
    with running(model, tmp_path) as runtime:
        answered, failed = Counter[int](), Counter[str]()
        lock, stop = threading.Lock(), threading.Event()
        connections: set[int] = set()

        def client(index: int) -> None:
            calls = triton_grpc.InferenceServerClient(
                runtime.grpc_url, channel_args=[LOCAL_SUBCHANNELS]
            )
            tensor = triton_grpc.InferInput("INPUT__0", [1, 512], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 512), dtype=np.float32))
            try:
                for _ in range(MAX_CALLS_PER_CLIENT):
                    if stop.is_set():
                        break
                    try:
                        calls.infer("mlp", [tensor], client_timeout=10.0)
                        with lock:
                            answered[index] += 1
                    except Exception as error:
                        with lock:
                            failed[failure_kind(error)] += 1
                    time.sleep(CALL_GAP_SECONDS)
            finally:
                calls.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + LOAD_SECONDS
        while time.monotonic() < deadline:
            connections |= client_ports(runtime.grpc_port)
            time.sleep(0.02)
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)

    assert dict(failed) == {}, f"answered {sum(answered.values())}"
    assert len(answered) == CLIENTS and min(answered.values()) >= 50, answered
    # Each client went through several rotations: about LOAD_SECONDS / MAX_AGE_SECONDS
    # connections each; at least 4 each.
    assert len(connections) >= 4 * CLIENTS, len(connections)
