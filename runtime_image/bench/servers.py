"""Start the servers under test on loopback, pinned to the server core, and stop them by PID."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import proc

HOST = "127.0.0.1"
BENCH_DIR = Path(__file__).resolve().parent


def exit_on_sigterm() -> None:
    """Make SIGTERM leave through the servers' context managers, which stop what they started.

    By default SIGTERM ends the benchmark at once and leaves its servers running, pinned to
    the server core, in the way of everything after it.
    """
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def build_of(code: Path) -> str:
    """Which build of kiln_runtime ``code`` holds: ``compiled`` (its request path compiled in
    place by mypyc, ``make native``: what the image ships) or ``pure`` (Python source only)."""
    return "compiled" if any((code / "kiln_runtime").glob("_compiled__mypyc*.so")) else "pure"


def pure_copy(dest: Path) -> Path:
    """A copy of this tree's kiln_runtime without its compiled modules, for ``code=``: py-spy
    reads Python frames, and a compiled function has none."""
    shutil.copytree(
        BENCH_DIR.parent / "kiln_runtime", dest / "kiln_runtime",
        ignore=shutil.ignore_patterns("*.so", "__pycache__"),
    )  # fmt: skip
    return dest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    label: str
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int

    def rss_bytes(self) -> int:
        """Resident memory of the server process and its children (Triton has several)."""
        total = 0
        for pid in [self.process.pid, *proc.descendants(self.process.pid)]:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        return total

    def cpu_seconds(self) -> float:
        """CPU time used so far by the server and its children (Triton runs several)."""
        return proc.tree_cpu_seconds(self.process.pid)


def _wait_ready(server: Server, path: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.label} exited with {server.process.returncode}")
        try:
            connection = http.client.HTTPConnection(HOST, server.http_port, timeout=2)
            connection.request("GET", path)
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{server.label} not ready within {seconds} s")


@contextmanager
def kiln(
    model_dir: Path,
    name: str,
    core: int,
    log: Path,
    optimization: dict[str, Any] | None = None,
    *,
    code: Path | None = None,
    sections: dict[str, Any] | None = None,
) -> Iterator[Server]:
    """``code``: a directory holding another ``kiln_runtime`` to serve (an A/B's other side);
    ``sections``: more config sections (``cache``), as given."""
    config = json.loads((model_dir / "config.json").read_text())
    config["optimization"] = {**config.get("optimization", {}), **(optimization or {})}
    config.update(sections or {})
    config_file = log.with_suffix(".config.json")
    config_file.write_text(json.dumps(config))
    ports = free_port(), free_port(), free_port()
    command = [
        "taskset", "-c", str(core), sys.executable, "-m", "kiln_runtime", "serve",
        "--model-path", str(model_dir / "model.pt"), "--model-name", name,
        "--config", str(config_file), "--host", HOST, "--http-port", str(ports[0]),
        "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), "--torch-threads", "1",
        "--log-level", "WARNING",
    ]  # fmt: skip
    env = None
    if code is not None:  # run from there too: ``-m`` puts the working directory first
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), str(BENCH_DIR.parent)])}
    with _started("kiln", command, ports, log, 120, env=env, cwd=code) as server:
        yield server


@contextmanager
def triton(
    model_dir: Path,
    name: str,
    core: int,
    log: Path,
    python: Path,
    *,
    optimization: dict[str, Any] | None = None,
) -> Iterator[Server]:
    """Triton via nvidia-pytriton, run by ``python`` (the benchmark virtualenv's interpreter);
    ``{"precision": "int8"}`` serves the program quantized as Kiln quantizes it."""
    ports = free_port(), free_port(), free_port()
    command = [
        "taskset", "-c", str(core), str(python), "-m", "bench.pytriton_server",
        "--model-dir", str(model_dir), "--name", name, "--host", HOST,
        "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
        "--metrics-port", str(ports[2]),
    ] + (["--int8"] if (optimization or {}).get("precision") == "int8" else [])  # fmt: skip
    libdir = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    env = {
        **os.environ,
        # Triton's Python-backend stub must load the libpython of the interpreter whose
        # standard library it runs, not another 3.x found first on the system.
        "LD_LIBRARY_PATH": os.pathsep.join(
            filter(None, [libdir, os.environ.get("LD_LIBRARY_PATH")])
        ),
        "PYTHONPATH": str(BENCH_DIR.parent),
    }
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    proc.match_autogroup(process.pid)
    server = Server("triton", process, *ports)
    try:
        _wait_ready(server, f"/v2/models/{name}/ready", 180)
        yield server
    finally:
        _stop(process, group=True)


@contextmanager
def constant(name: str, core: int, log: Path) -> Iterator[Server]:
    """``bench.constant_server``: the same answer to every call, no model (a client's ceiling)."""
    ports = free_port(), free_port(), free_port()
    command = [
        "taskset", "-c", str(core), sys.executable, "-m", "bench.constant_server",
        "--host", HOST, "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
        "--model", name,
    ]  # fmt: skip
    with _started("constant", command, ports, log, 60, cwd=BENCH_DIR.parent) as server:
        yield server


@contextmanager
def _started(
    label: str,
    command: list[str],
    ports: tuple[int, int, int],
    log: Path,
    ready_within: float,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[Server]:
    """A server of this benchmark's own (it answers ``/v2/health/ready``), stopped on exit."""
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    server = Server(label, process, *ports)
    try:
        _wait_ready(server, "/v2/health/ready", ready_within)
        yield server
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes], group: bool = False) -> None:
    if process.poll() is not None:
        return
    if group:
        os.killpg(process.pid, signal.SIGTERM)  # the session this benchmark started for Triton
    else:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        if group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
        process.wait(10)
