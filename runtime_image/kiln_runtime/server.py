"""Process wiring and lifecycle: servers up, model loaded and warmed, drain on SIGTERM.

Order matters for the pod: the HTTP and gRPC listeners come up first (live, not ready), then
the model loads and warms up, and only then does ready turn true. On SIGTERM ready turns false
at once; accepted requests finish within the drain deadline; then the process exits.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kiln_runtime import container, ports
from kiln_runtime.config import RuntimeConfig
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.metrics import RuntimeMetrics
from kiln_runtime.protocol.grpc import InferenceServicer
from kiln_runtime.protocol.grpcio_server import GrpcioServer
from kiln_runtime.protocol.grpcserver import GrpcServer
from kiln_runtime.protocol.httpserver import HttpServer
from kiln_runtime.protocol.metricsserver import MetricsServer
from kiln_runtime.protocol.rest import RestAdapter
from kiln_runtime.termination import write_termination_log

log = logging.getLogger(__name__)

MODEL_FILES = {"torchscript": "model.pt", "torch_export": "model.pt2", "onnx": "model.onnx"}


@dataclass(frozen=True)
class ServeOptions:
    model_path: Path
    config: RuntimeConfig
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    grpc_transport: str = "kiln"  # or "grpcio": grpcio's own server (protocol/grpcio_server.py)
    # PEM certificate chain and private key: the gRPC port serves TLS (grpcio transport only)
    grpc_tls_cert: Path | None = None
    grpc_tls_key: Path | None = None
    torch_threads: int | None = None
    # where a start-up failure's cause goes for Kubernetes (None: nowhere but the log)
    termination_log: Path | None = None


def resolve_model_file(path: Path, fmt: str) -> Path:
    """A model file given directly, or the format's conventional file inside a directory."""
    return path / MODEL_FILES[fmt] if path.is_dir() else path


async def serve(options: ServeOptions, stop: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or ``stop`` is set); returns the process exit code."""
    from kiln_runtime.model import ModelRunner  # imports torch: keep `--help` fast

    fitted = container.fit(
        options.config, container.read_memory_limit(), container.raise_open_files()
    )
    config = fitted.config
    log.info("limits for this container: %s", json.dumps(fitted.report))
    if options.torch_threads:
        import torch

        torch.set_num_threads(options.torch_threads)
    metrics = RuntimeMetrics(config.model.name)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-model")
    dataplane = serving_dataplane(config, metrics, executor)
    dataplane.limits_report = fitted.report
    tracing = None
    if config.tracing is not None:
        from kiln_runtime.tracing import Tracing  # the SDK is imported only when tracing is on

        tracing = Tracing(config.tracing, config.model.name)
        dataplane.trace_with(tracing)
    connecting: asyncio.Task[bool] | None = None
    if config.cache is not None and config.cache.redis is not None and dataplane.cache is not None:
        from kiln_runtime.redis_cache import open_redis_tier  # only where Redis is configured

        tier = open_redis_tier(config.cache, config.model.outputs, dataplane.cache.stats)
        dataplane.attach_remote(tier)
        connecting = asyncio.get_running_loop().create_task(tier.connect())  # beside the load
    http = HttpServer(RestAdapter(dataplane))
    grpc_service = InferenceServicer(dataplane).service()
    age, grace = config.connections.max_age_seconds, config.connections.max_age_grace_seconds
    grpc_server: GrpcServer | GrpcioServer
    if options.grpc_transport == "grpcio":
        tls = None
        if options.grpc_tls_cert is not None and options.grpc_tls_key is not None:
            tls = (options.grpc_tls_cert.read_bytes(), options.grpc_tls_key.read_bytes())
        grpc_server = GrpcioServer(grpc_service, age, grace, limits=config.http2, tls=tls)
    else:
        grpc_server = GrpcServer(grpc_service, age, grace, limits=config.http2)
    metrics_server = MetricsServer(metrics.registry, max_connections=fitted.metrics_connections)
    metrics_port = await metrics_server.start(options.host, options.metrics_port)
    http_port = await http.start(options.host, options.http_port)
    grpc_port = await grpc_server.start(options.host, options.grpc_port)
    port_status: dict[str, ports.PortStatus] = {
        "http": http.port_status, "metrics": metrics_server.port_status,
    }  # fmt: skip
    if isinstance(grpc_server, GrpcServer):  # grpcio's server keeps its own connections
        port_status["grpc"] = grpc_server.port_status
    metrics.registry.register(ports.PortsCollector(config.model.name, port_status))
    dataplane.saturated = lambda: bool(ports.saturated(port_status))
    metrics.ready.set_function(lambda: float(dataplane.ready))  # saturation included
    log.info(
        "kiln_runtime for model %r listening: http %s:%d grpc %s:%d metrics %s:%d",
        config.model.name, options.host, http_port, options.host, grpc_port,
        options.host, metrics_port,
    )  # fmt: skip

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    model_file = resolve_model_file(options.model_path, config.model.format)
    starting = loop.create_task(dataplane.start(lambda: ModelRunner(config, model_file)))
    stopping = loop.create_task(stop.wait())
    exit_code = 0
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done() and starting.exception() is not None:
            cause = f"model {config.model.name!r} failed to start: {starting.exception()}"
            log.error("%s", cause)
            write_termination_log(options.termination_log, cause)
            exit_code = 1
        else:
            log.info("ready: warm-up took %.3f s", dataplane.warmup_seconds or 0.0)
            freeze_startup_objects()
            await stopping
        dataplane.begin_drain()
        log.info("draining: not ready; %d request(s) in flight", dataplane.inflight)
        timeout = config.drain.timeout_seconds
        if not await dataplane.wait_idle(timeout):
            log.warning("drain deadline of %.1f s passed with %d in flight", timeout,
                        dataplane.inflight)  # fmt: skip
    finally:
        starting.cancel()
        stopping.cancel()
        if connecting is not None:
            connecting.cancel()
        await grpc_server.stop(grace=1.0)
        await http.stop()
        await dataplane.stop()
        await metrics_server.stop()
        if tracing is not None:
            tracing.shutdown()
        executor.shutdown(wait=False, cancel_futures=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("stopped")
    return exit_code


def freeze_startup_objects() -> None:
    """Exempt what start-up created (torch, the model, the libraries) from garbage collection.

    Those objects live as long as the process. Left to the collector, every full collection
    walks all of them (about 200 000 with torch loaded; tens of milliseconds during which the
    event loop answers no one); frozen, a full collection walks only what requests allocate.
    """
    gc.collect()
    gc.freeze()


def serving_dataplane(
    config: RuntimeConfig, metrics: RuntimeMetrics, executor: ThreadPoolExecutor
) -> DataPlane:
    """The data plane as ``serve`` runs it: told torch's thread count (set before this) and
    the CPUs the process may use, which set its inline limit. Tools that drive the data plane
    in process (``bench.replay``) build it here too, so they measure what the server runs."""
    import torch  # here, as in serve: keep `--help` fast

    return DataPlane(
        config, metrics, executor, compute_threads=torch.get_num_threads(), cpus=usable_cpus()
    )


def usable_cpus() -> int:
    """The CPUs this process may run on (respects taskset and cgroups' cpuset): by default one
    compute thread each."""
    return max(1, len(os.sched_getaffinity(0)))
