"""The runtime's configuration: the JSON document the operator renders from an InferenceService.

Parsing is pure and strict: an unknown key or a wrong value is a ``ConfigError`` naming the
field, raised before anything is loaded, so a bad spec never half-starts a server.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kiln_runtime.datatypes import SUPPORTED_DATATYPES

FORMATS = ("torchscript", "torch_export", "onnx")
MODES = ("eager", "script", "compile")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """The configuration is invalid; the message names the offending field."""


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output. ``shape`` excludes the batch dimension; -1 means any size."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    version: str
    format: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class OptimizationConfig:
    mode: str = "eager"
    precision: str = "fp32"
    cuda_graphs: bool = False
    device: str = "auto"


@dataclass(frozen=True)
class BatchingConfig:
    max_batch_size: int = 32
    max_queue_delay_microseconds: int = 2000
    max_queue_size: int = 256


@dataclass(frozen=True)
class WarmupConfig:
    batch_sizes: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class DrainConfig:
    timeout_seconds: float = 30.0


@dataclass(frozen=True)
class ConnectionsConfig:
    """gRPC connection lifetime: 0 keeps connections forever (the default outside Kubernetes)."""

    max_age_seconds: float = 0.0
    max_age_grace_seconds: float = 10.0


# --- HTTP/1.1 limits (issue 17, HTTP half) -------------------------------------------------


@dataclass(frozen=True)
class HttpLimits:
    """What one HTTP/1.1 client may cost the runtime; each limit is in docs/runtime.md.

    Byte sizes are bytes, times are seconds. The health budget is extra connections, beyond
    ``max_connections``, that may only ask ``/v2/health/*``: a full port still answers the
    kubelet's probes.
    """

    max_connections: int = 1024
    health_connections: int = 32
    max_header_bytes: int = 64 << 10
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 60.0
    keep_alive_timeout_seconds: float = 75.0
    write_timeout_seconds: float = 60.0
    max_pipelined_requests: int = 16
    connection_buffer_bytes: int = 4 << 20
    process_buffer_bytes: int = 1 << 30
    max_decompressed_bytes: int = 0  # 0: the largest request body the model accepts
    off_loop_decode_bytes: int = 256 << 10

    def decompressed_limit(self, max_body: int) -> int:
        return self.max_decompressed_bytes or max_body


_HTTP_INTS = {
    "maxConnections": ("max_connections", 1),
    "healthConnections": ("health_connections", 0),
    "maxHeaderBytes": ("max_header_bytes", 1024),
    "maxPipelinedRequests": ("max_pipelined_requests", 1),
    "connectionBufferBytes": ("connection_buffer_bytes", 64 << 10),
    "processBufferBytes": ("process_buffer_bytes", 1 << 20),
    "maxDecompressedBytes": ("max_decompressed_bytes", 0),
    "offLoopDecodeBytes": ("off_loop_decode_bytes", 0),
}
_HTTP_SECONDS = {
    "headerTimeoutSeconds": "header_timeout_seconds",
    "bodyTimeoutSeconds": "body_timeout_seconds",
    "keepAliveTimeoutSeconds": "keep_alive_timeout_seconds",
    "writeTimeoutSeconds": "write_timeout_seconds",
}


def _http_limits(value: Any) -> HttpLimits:
    section = _object(value, "http", set(_HTTP_INTS) | set(_HTTP_SECONDS))
    fields: dict[str, Any] = {}
    for key, (name, minimum) in _HTTP_INTS.items():
        if key in section:
            fields[name] = _int(section[key], f"http.{key}", minimum)
    for key, name in _HTTP_SECONDS.items():
        if key in section:
            fields[name] = _seconds(section[key], f"http.{key}", 0.001)
    return HttpLimits(**fields)


def _http_document(limits: HttpLimits) -> dict[str, Any]:
    document: dict[str, Any] = {k: getattr(limits, n) for k, (n, _) in _HTTP_INTS.items()}
    document.update({k: getattr(limits, n) for k, n in _HTTP_SECONDS.items()})
    return document


# --- end of HTTP/1.1 limits --------------------------------------------------------------------


@dataclass(frozen=True)
class Http2Limits:
    """What one client may cost the gRPC port (HTTP/2): connections, time, memory, floods.

    Each limit is what production HTTP/2 servers (Go, nginx, Envoy) bound; ``docs/runtime.md``
    lists what a client sees when it trips one.
    """

    max_connections: int = 1024  # per port; excess connections are closed at accept
    # more connections past max_connections, for grpc.health.v1.Health/Check calls only
    health_connections: int = 32
    max_concurrent_streams: int = 128  # SETTINGS_MAX_CONCURRENT_STREAMS; more are refused
    max_header_list_size: int = 16 << 10  # a larger request header list fails its stream only
    connection_buffer_bytes: int = 64 << 20  # requests and responses held for one connection
    process_buffer_bytes: int = 512 << 20  # the same, summed over every connection
    idle_timeout_seconds: float = 300.0  # no open stream for this long: GOAWAY and close
    header_timeout_seconds: float = 10.0  # the preface, and each header block, must arrive within
    body_timeout_seconds: float = 60.0  # a request body must arrive within this of its headers
    resets_per_second: float = 100.0  # client RST_STREAMs (burst: 10 s worth), CVE-2023-44487
    empty_frames_per_second: float = 10.0  # empty DATA/CONTINUATION frames (burst: 10 s worth)
    control_frames_per_second: float = 100.0  # PING and SETTINGS (burst: 10 s worth)


@dataclass(frozen=True)
class RedisConfig:
    """The Redis that every replica of one service shares its answers through. Credentials come
    from the environment (``KILN_CACHE_REDIS_USERNAME``, ``KILN_CACHE_REDIS_PASSWORD``: a
    Secret's keys), never from this document."""

    host: str
    port: int = 6379
    timeout_seconds: float = 0.01  # a lookup or a write slower than this counts as failed
    max_connections: int = 16


@dataclass(frozen=True)
class CacheConfig:
    """The response cache (``response_cache``): answers held in the pod, optionally in Redis.

    ``key_prefix`` names the service (the operator renders ``kiln:<namespace>/<name>:``); it
    starts every Redis key and every key's hash, so two services never share an entry."""

    max_bytes: int = 64 << 20
    ttl_seconds: float = 300.0
    max_entry_bytes: int = 1 << 20
    key_prefix: str = ""
    redis: RedisConfig | None = None


@dataclass(frozen=True)
class TracingConfig:
    """Per-request traces (``tracing``): spans exported over OTLP/HTTP to ``otlp_endpoint``
    (``http://collector:4318/v1/traces``). A request whose W3C ``traceparent`` says sampled is
    traced; one without a ``traceparent`` is traced with probability ``sampling_ratio``."""

    otlp_endpoint: str
    sampling_ratio: float = 0.01


@dataclass(frozen=True)
class RuntimeConfig:
    model: ModelSpec
    optimization: OptimizationConfig = field(default_factory=OptimizationConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)
    connections: ConnectionsConfig = field(default_factory=ConnectionsConfig)
    http: HttpLimits = field(default_factory=HttpLimits)
    http2: Http2Limits = field(default_factory=Http2Limits)
    # the limits the document set ("http.processBufferBytes", ...): start-up derives the others
    # from the container's own limits (container.py) and leaves these as they are
    explicit: frozenset[str] = field(default=frozenset(), compare=False)
    cache: CacheConfig | None = None  # None: no response cache (the default)
    tracing: TracingConfig | None = None  # None: no traces (the default)

    def max_request_bytes(self) -> int:
        """The largest request body accepted: the biggest batch as JSON text, with headroom.

        JSON spends up to ~24 characters per number; variable dimensions lift the bound to a
        fixed 64 MiB. Anything larger is refused before it is read.
        """
        per_row = 0
        for spec in self.model.inputs:
            if -1 in spec.shape:
                return 64 << 20
            count = 1
            for dim in spec.shape:
                count *= dim
            per_row += count * 24
        return per_row * self.batching.max_batch_size + (64 << 10)

    def warmup_batch_sizes(self) -> tuple[int, ...]:
        """Configured warm-up sizes within the batch cap, sorted, never empty."""
        cap = self.batching.max_batch_size
        sizes = sorted({min(size, cap) for size in self.warmup.batch_sizes})
        return tuple(sizes) if sizes else (1,)


SECTIONS = {
    "model",
    "optimization",
    "batching",
    "warmup",
    "drain",
    "connections",
    "http",
    "http2",
    "cache",
    "tracing",
}
log = logging.getLogger(__name__)


def _object(value: Any, where: str, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected an object, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    return value


def _choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{where}: {value!r} is not one of {list(choices)}")
    return str(value)


def _int(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {value}")
    return value


def _tensor(value: Any, where: str) -> TensorSpec:
    obj = _object(value, where, {"name", "datatype", "shape"})
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name: expected a non-empty string")
    datatype = _choice(obj.get("datatype"), f"{where}.datatype", SUPPORTED_DATATYPES)
    shape = obj.get("shape")
    if not isinstance(shape, list):
        raise ConfigError(f"{where}.shape: expected a list of integers (batch dimension excluded)")
    dims = []
    for i, dim in enumerate(shape):
        if isinstance(dim, bool) or not isinstance(dim, int) or (dim < 1 and dim != -1):
            raise ConfigError(f"{where}.shape[{i}]: expected a positive integer or -1, got {dim!r}")
        dims.append(dim)
    return TensorSpec(name=name, datatype=datatype, shape=tuple(dims))


def _tensors(value: Any, where: str) -> tuple[TensorSpec, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a non-empty list of tensors")
    specs = tuple(_tensor(item, f"{where}[{i}]") for i, item in enumerate(value))
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: duplicate tensor names {names}")
    return specs


def parse_config(document: Any, model_name: str | None = None) -> RuntimeConfig:
    """Build a ``RuntimeConfig`` from the decoded JSON document.

    ``model_name`` (from the command line) wins over ``model.name`` in the document.
    """
    if not isinstance(document, Mapping):
        raise ConfigError(f"config: expected an object, got {type(document).__name__}")
    # Sections this runtime does not know are features of a newer operator: an older runtime
    # image (spec.runtime.image is the user's choice) runs without them instead of crashing.
    # Inside a known section, an unknown key is still an error: it is a typo, not a feature.
    if unknown := sorted(set(document) - SECTIONS):
        log.warning("config: ignoring section(s) this runtime does not know: %s", unknown)
    root = {key: value for key, value in document.items() if key in SECTIONS}
    if "model" not in root:
        raise ConfigError("config.model: required (its inputs and outputs must be declared)")
    model = _object(root["model"], "model", {"name", "version", "format", "inputs", "outputs"})
    for key in ("inputs", "outputs"):
        if key not in model:
            raise ConfigError(f"model.{key}: required")
    name = model_name or model.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError("model.name: required (in the config or as --model-name)")
    spec = ModelSpec(
        name=name,
        version=str(model.get("version", "1")),
        format=_choice(model.get("format", "torchscript"), "model.format", FORMATS),
        inputs=_tensors(model["inputs"], "model.inputs"),
        outputs=_tensors(model["outputs"], "model.outputs"),
    )

    opt = _object(
        root.get("optimization", {}),
        "optimization",
        {"mode", "precision", "cudaGraphs", "device"},
    )
    cuda_graphs = opt.get("cudaGraphs", False)
    if not isinstance(cuda_graphs, bool):
        raise ConfigError(f"optimization.cudaGraphs: expected true or false, got {cuda_graphs!r}")
    optimization = OptimizationConfig(
        mode=_choice(opt.get("mode", "eager"), "optimization.mode", MODES),
        precision=_choice(opt.get("precision", "fp32"), "optimization.precision", PRECISIONS),
        cuda_graphs=cuda_graphs,
        device=_choice(opt.get("device", "auto"), "optimization.device", DEVICES),
    )

    bat = _object(
        root.get("batching", {}),
        "batching",
        {"maxBatchSize", "maxQueueDelayMicroseconds", "maxQueueSize"},
    )
    batching = BatchingConfig(
        max_batch_size=_int(bat.get("maxBatchSize", 32), "batching.maxBatchSize", 1),
        max_queue_delay_microseconds=_int(
            bat.get("maxQueueDelayMicroseconds", 2000), "batching.maxQueueDelayMicroseconds", 0
        ),
        max_queue_size=_int(bat.get("maxQueueSize", 256), "batching.maxQueueSize", 1),
    )

    warm = _object(root.get("warmup", {}), "warmup", {"batchSizes"})
    sizes = warm.get("batchSizes", [1])
    if not isinstance(sizes, list):
        raise ConfigError("warmup.batchSizes: expected a list of positive integers")
    warmup = WarmupConfig(
        batch_sizes=tuple(_int(s, f"warmup.batchSizes[{i}]", 1) for i, s in enumerate(sizes))
    )

    dr = _object(root.get("drain", {}), "drain", {"timeoutSeconds"})
    drain = DrainConfig(
        timeout_seconds=_seconds(dr.get("timeoutSeconds", 30), "drain.timeoutSeconds", 0)
    )

    conn = _object(
        root.get("connections", {}), "connections", {"maxAgeSeconds", "maxAgeGraceSeconds"}
    )
    connections = ConnectionsConfig(
        max_age_seconds=_seconds(conn.get("maxAgeSeconds", 0), "connections.maxAgeSeconds", 0),
        max_age_grace_seconds=_seconds(
            conn.get("maxAgeGraceSeconds", 10), "connections.maxAgeGraceSeconds", 0.001
        ),
    )

    return RuntimeConfig(
        model=spec, optimization=optimization, batching=batching, warmup=warmup, drain=drain,
        connections=connections, http=_http_limits(root.get("http", {})),
        http2=_http2_limits(root.get("http2", {})),
        explicit=frozenset(
            f"{section}.{key}" for section in ("http", "http2")
            if isinstance(root.get(section), Mapping) for key in root[section]
        ),
        cache=_cache(root["cache"]) if "cache" in root else None,
        tracing=_tracing(root["tracing"]) if "tracing" in root else None,
    )  # fmt: skip


def _tracing(value: Any) -> TracingConfig:
    section = _object(value, "tracing", {"otlpEndpoint", "samplingRatio"})
    endpoint = section.get("otlpEndpoint")
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"tracing.otlpEndpoint: expected an http(s) URL, got {endpoint!r}")
    ratio = section.get("samplingRatio", 0.01)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
        raise ConfigError(f"tracing.samplingRatio: expected a number in [0, 1], got {ratio!r}")
    return TracingConfig(otlp_endpoint=endpoint, sampling_ratio=float(ratio))


def _cache(value: Any) -> CacheConfig:
    keys = {"maxBytes", "ttlSeconds", "maxEntryBytes", "keyPrefix", "redis"}
    section = _object(value, "cache", keys)
    prefix = section.get("keyPrefix", "")
    if not isinstance(prefix, str) or len(prefix) > 512:
        raise ConfigError("cache.keyPrefix: expected a string of at most 512 characters")
    config = CacheConfig(
        max_bytes=_int(section.get("maxBytes", 64 << 20), "cache.maxBytes", 1 << 16),
        ttl_seconds=_seconds(section.get("ttlSeconds", 300), "cache.ttlSeconds", 0.001),
        max_entry_bytes=_int(section.get("maxEntryBytes", 1 << 20), "cache.maxEntryBytes", 1),
        key_prefix=prefix,
        redis=_redis(section["redis"]) if "redis" in section else None,
    )
    if config.max_entry_bytes > config.max_bytes:
        raise ConfigError("cache.maxEntryBytes: must be at most cache.maxBytes")
    return config


def _redis(value: Any) -> RedisConfig:
    section = _object(value, "cache.redis", {"address", "timeoutMilliseconds", "maxConnections"})
    address = section.get("address")
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"cache.redis.address: expected host:port, got {address!r}")
    millis = _seconds(section.get("timeoutMilliseconds", 10), "cache.redis.timeoutMilliseconds", 1)
    return RedisConfig(
        host=host.strip("[]"),
        port=int(port),
        timeout_seconds=millis / 1000,
        max_connections=_int(section.get("maxConnections", 16), "cache.redis.maxConnections", 1),
    )


# The http2 section: each key, its Http2Limits field, and whether it counts (int) or measures.
HTTP2_KEYS = {
    "maxConnections": ("max_connections", int),
    "healthConnections": ("health_connections", int),
    "maxConcurrentStreams": ("max_concurrent_streams", int),
    "maxHeaderListSize": ("max_header_list_size", int),
    "connectionBufferBytes": ("connection_buffer_bytes", int),
    "processBufferBytes": ("process_buffer_bytes", int),
    "idleTimeoutSeconds": ("idle_timeout_seconds", float),
    "headerTimeoutSeconds": ("header_timeout_seconds", float),
    "bodyTimeoutSeconds": ("body_timeout_seconds", float),
    "resetsPerSecond": ("resets_per_second", float),
    "emptyFramesPerSecond": ("empty_frames_per_second", float),
    "controlFramesPerSecond": ("control_frames_per_second", float),
}


def _http2_limits(value: Any) -> Http2Limits:
    section = _object(value, "http2", set(HTTP2_KEYS))
    fields: dict[str, Any] = {}
    for key, (name, kind) in HTTP2_KEYS.items():
        if key in section:
            where = f"http2.{key}"
            fields[name] = (
                _int(section[key], where, 0 if key == "healthConnections" else 1)
                if kind is int
                else _seconds(section[key], where, 0.001)
            )
    limits = Http2Limits(**fields)
    if limits.max_header_list_size > 1 << 20:
        raise ConfigError("http2.maxHeaderListSize: must be at most 1 MiB")
    if limits.process_buffer_bytes < limits.connection_buffer_bytes:
        raise ConfigError("http2.processBufferBytes: must be at least http2.connectionBufferBytes")
    return limits


def _seconds(value: Any, where: str, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ConfigError(f"{where}: expected a number >= {minimum:g}, got {value!r}")
    return float(value)


def parse_config_text(text: str, model_name: str | None = None) -> RuntimeConfig:
    """Parse the JSON text of a config (a file or the ``KILN_RUNTIME_CONFIG`` variable)."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"config is not valid JSON: {error}") from error
    return parse_config(document, model_name)


def to_document(config: RuntimeConfig) -> dict[str, Any]:
    """The camelCase JSON document for ``config`` (what ``parse_config`` reads back)."""

    def tensors(specs: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
        return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]

    document: dict[str, Any] = {
        "model": {
            "name": config.model.name,
            "version": config.model.version,
            "format": config.model.format,
            "inputs": tensors(config.model.inputs),
            "outputs": tensors(config.model.outputs),
        },
        "optimization": {
            "mode": config.optimization.mode,
            "precision": config.optimization.precision,
            "cudaGraphs": config.optimization.cuda_graphs,
            "device": config.optimization.device,
        },
        "batching": {
            "maxBatchSize": config.batching.max_batch_size,
            "maxQueueDelayMicroseconds": config.batching.max_queue_delay_microseconds,
            "maxQueueSize": config.batching.max_queue_size,
        },
        "warmup": {"batchSizes": list(config.warmup.batch_sizes)},
        "drain": {"timeoutSeconds": config.drain.timeout_seconds},
        "connections": {
            "maxAgeSeconds": config.connections.max_age_seconds,
            "maxAgeGraceSeconds": config.connections.max_age_grace_seconds,
        },
    }
    if config.http != HttpLimits():  # written only when set: unset limits follow the container
        document["http"] = _http_document(config.http)
    if config.http2 != Http2Limits():  # written only when set, like the operator renders it
        document["http2"] = {
            key: getattr(config.http2, name) for key, (name, _) in HTTP2_KEYS.items()
        }
    if (cache := config.cache) is not None:
        document["cache"] = {
            "maxBytes": cache.max_bytes,
            "ttlSeconds": cache.ttl_seconds,
            "maxEntryBytes": cache.max_entry_bytes,
            "keyPrefix": cache.key_prefix,
        }
        if (redis := cache.redis) is not None:
            document["cache"]["redis"] = {
                "address": f"{redis.host}:{redis.port}",
                "timeoutMilliseconds": redis.timeout_seconds * 1000,
                "maxConnections": redis.max_connections,
            }
    if (tracing := config.tracing) is not None:
        document["tracing"] = {
            "otlpEndpoint": tracing.otlp_endpoint,
            "samplingRatio": tracing.sampling_ratio,
        }
    return document
