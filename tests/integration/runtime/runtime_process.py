"""Start ``python -m kiln_runtime serve`` as a real process on loopback, and stop it."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kiln_localcluster.processes import free_ports

HOST = "127.0.0.1"


@dataclass
class Runtime:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log: Path

    @property
    def http_url(self) -> str:
        return f"{HOST}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    def status(self, path: str) -> int:
        """HTTP status of GET ``path``; 0 if the server does not answer."""
        try:
            connection = http.client.HTTPConnection(HOST, self.http_port, timeout=5)
            connection.request("GET", path)
            return connection.getresponse().status
        except OSError:
            return 0

    def grpc_health(self, service: str) -> int:
        """grpc.health.v1.Health/Check's status for ``service`` on a new connection, as the
        kubelet's gRPC probe asks it (-1 if the call fails)."""
        import grpc

        from kiln_runtime.protocol import health

        with grpc.insecure_channel(self.grpc_url) as channel:
            call = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=health.HealthCheckRequest.SerializeToString,
                response_deserializer=health.HealthCheckResponse.FromString,
            )
            try:
                return int(call(health.HealthCheckRequest(service=service), timeout=5).status)
            except grpc.RpcError:
                return -1

    def metrics(self) -> str:
        connection = http.client.HTTPConnection(HOST, self.metrics_port, timeout=5)
        connection.request("GET", "/metrics")
        return connection.getresponse().read().decode()

    def wait_for(self, path: str, status: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.status(path) != status:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"runtime exited ({self.process.returncode}):\n{self.output()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} never answered {status}:\n{self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def terminate(self, seconds: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(seconds)


def start(
    model_path: Path,
    log_dir: Path,
    *,
    config: Path | None = None,
    name: str = "mlp",
    env: dict[str, str] | None = None,
    open_files: int | None = None,
) -> Runtime:
    """``open_files``: the process's RLIMIT_NOFILE, soft and hard (``ulimit -n``)."""
    http_port, grpc_port, metrics_port = free_ports(3)
    log = log_dir / f"runtime-{http_port}.log"
    command = [
        sys.executable, "-m", "kiln_runtime", "serve", "--model-path", str(model_path),
        "--model-name", name, "--host", HOST, "--http-port", str(http_port),
        "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port), "--torch-threads", "1",
    ]  # fmt: skip
    if config is not None:
        command += ["--config", str(config)]
    with log.open("wb") as sink:
        if open_files is not None:  # util-linux's prlimit: the limits, then exec
            command = ["prlimit", f"--nofile={open_files}:{open_files}", *command]
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    return Runtime(process, http_port, grpc_port, metrics_port, log=log)


@contextmanager
def running(model_dir: Path, log_dir: Path, *, name: str = "mlp") -> Iterator[Runtime]:
    """A runtime serving ``model_dir`` (model.pt + config.json), ready, stopped afterwards."""
    runtime = start(model_dir / "model.pt", log_dir, config=model_dir / "config.json", name=name)
    try:
        runtime.wait_for("/v2/health/ready", 200, seconds=60)
        yield runtime
    finally:
        if runtime.process.poll() is None:
            runtime.process.send_signal(signal.SIGTERM)
            try:
                runtime.process.wait(30)
            except subprocess.TimeoutExpired:
                runtime.process.kill()
                runtime.process.wait(10)
