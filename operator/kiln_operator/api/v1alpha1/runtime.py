"""spec.runtime: the serving container — image, graph optimisation, numeric precision, batching.

Why it exists: these settings are rendered verbatim into the runtime's config (the
operator/runtime contract), so their ranges are checked here, before a pod ever starts.
"""

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from kiln_operator.api.dotsegments import IMAGE_RULE, image_has_dot_segment
from kiln_operator.api.v1alpha1.base import ApiModel
from kiln_operator.api.v1alpha1.model import DNS_SUBDOMAIN

IMAGE_PATTERN = r"^[a-z0-9]+([._/:@-][a-zA-Z0-9_.-]+)*$"


class OptimizationSpec(ApiModel):
    """How the runtime prepares the model's graph before serving."""

    mode: Literal["eager", "script", "compile"] = "eager"
    """eager: run as loaded (any format); script: freeze and optimize_for_inference (torchscript
    only); compile: torch.compile (torch_export only). onnx runs eager."""
    precision: Literal["fp32", "fp16", "bf16", "int8"] = "fp32"
    """Numeric precision of the weights and activations. fp16/bf16 cast the model and its floating
    inputs, on a GPU or the CPU alike; on the CPU (gpuCount 0) bf16 suits CPUs with bf16
    instructions, and fp16 is emulated, usually slower than fp32. int8 is dynamic quantisation of
    linear layers, CPU only (gpuCount 0) and torchscript only. onnx: fp32 only."""
    cuda_graphs: bool = False
    """Capture CUDA graphs per batch size (needs gpuCount > 0; not for onnx). Needs static input
    shapes."""


class BatchingSpec(ApiModel):
    """Dynamic batching: requests wait at most maxQueueDelayMicroseconds to share a batch."""

    max_batch_size: Annotated[int, Field(ge=1, le=4096)] = 32
    """Largest batch the model runs at once."""
    max_queue_delay_microseconds: Annotated[int, Field(ge=0, le=1_000_000)] = 2000
    """Longest a request waits for others to fill a batch: the cap on latency batching adds."""
    max_queue_size: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    """Requests allowed to wait; beyond it the runtime rejects at once (429, RESOURCE_EXHAUSTED)."""

    @model_validator(mode="after")
    def _queue_holds_a_batch(self) -> "BatchingSpec":
        if self.max_batch_size > self.max_queue_size:
            raise ValueError(
                f"maxBatchSize ({self.max_batch_size}) exceeds maxQueueSize "
                f"({self.max_queue_size}): a full batch could never form"
            )
        return self


class ConnectionsSpec(ApiModel):
    """How long a client's gRPC connection lives. kube-proxy balances connections, not requests:
    a client that connected before a scale-up keeps every request on its first pod until its
    connection ends. The runtime ends each connection after maxAgeSeconds (±10 % jitter) with a
    GOAWAY that lets in-flight calls finish; gRPC clients reconnect at once, through the Service,
    and so spread over the new replicas."""

    max_age_seconds: Annotated[int, Field(ge=0, le=86_400)] = 30
    """Age at which the runtime asks a gRPC client to reconnect; 0 keeps connections forever."""
    max_age_grace_seconds: Annotated[int, Field(ge=1, le=3_600)] = 10
    """How long calls still running on an aged connection may take before it is closed."""


Seconds = Annotated[int | None, Field(ge=1, le=86_400)]
MIB = 1 << 20
GRPC_CONNECTION_BUFFER_DEFAULT = 64 * MIB  # the runtime's defaults (its Http2Limits)
GRPC_PROCESS_BUFFER_DEFAULT = 512 * MIB


class HttpLimitsSpec(ApiModel):
    """What one client may cost the HTTP/1.1 port (8000). Each field left out keeps the runtime's
    default; what a client sees when it trips a limit is in docs/runtime.md ("HTTP/1.1 limits
    and hardening")."""

    max_connections: Annotated[int | None, Field(ge=1, le=1_000_000)] = None
    """Connections the port serves at once (runtime default 1024, fewer when the pod's open-file
    limit is lower); past it and the health budget a new connection gets 503 and is closed."""
    health_connections: Annotated[int | None, Field(ge=0, le=1024)] = None
    """Connections admitted past maxConnections for /v2/health/* only, so the kubelet's probes
    are always answered (default 32; 0: none)."""
    max_header_bytes: Annotated[int | None, Field(ge=1024, le=16 * MIB)] = None
    """Largest request line plus headers, in bytes (default 65536); larger: 431."""
    header_timeout_seconds: Seconds = None
    """Seconds a request's headers may take to arrive (default 10); later: 408."""
    body_timeout_seconds: Seconds = None
    """Seconds a request's body may take after its headers (default 60); later: 408."""
    keep_alive_timeout_seconds: Seconds = None
    """Seconds an idle keep-alive connection is kept (default 75)."""
    write_timeout_seconds: Seconds = None
    """Seconds a client may read nothing of its answers before it is disconnected (default 60)."""
    max_pipelined_requests: Annotated[int | None, Field(ge=1, le=1024)] = None
    """Pipelined requests waiting on one connection before the server stops reading it
    (default 16)."""
    connection_buffer_bytes: Annotated[int | None, Field(ge=64 << 10, le=1024 * MIB)] = None
    """Request and unread answer bytes one connection may hold (default 4 MiB)."""
    process_buffer_bytes: Annotated[int | None, Field(ge=MIB, le=64 << 30)] = None
    """The same summed over every connection (default 1 GiB, at most an eighth of the pod's
    memory limit); keep it well under that limit. A body that would exceed it gets 503."""
    max_decompressed_bytes: Annotated[int | None, Field(ge=0, le=4 << 30)] = None
    """Largest size a gzip/deflate request body may inflate to (default 0: the largest request
    body the model accepts); past it: 400."""
    off_loop_decode_bytes: Annotated[int | None, Field(ge=0, le=1024 * MIB)] = None
    """Bodies at least this large are parsed in the runtime's decoding process, off the event
    loop (default 262144)."""


class GrpcLimitsSpec(ApiModel):
    """What one client may cost the gRPC port (8001, HTTP/2). Each field left out keeps the
    runtime's default; what a client sees when it trips a limit is in docs/runtime.md ("The gRPC
    port: limits and hardening")."""

    max_connections: Annotated[int | None, Field(ge=1, le=1_000_000)] = None
    """Connections the port serves at once (runtime default 1024, fewer when the pod's open-file
    limit is lower); at it the oldest idle connection is closed to admit a new one; past it and
    the health budget, with none idle, a new connection is closed at accept."""
    health_connections: Annotated[int | None, Field(ge=0, le=1024)] = None
    """Connections admitted past maxConnections for grpc.health.v1.Health/Check only, so the
    kubelet's gRPC probes are always answered (default 32; 0: none)."""
    max_concurrent_streams: Annotated[int | None, Field(ge=1, le=65_536)] = None
    """Calls one connection may have open at once (default 128); more are refused."""
    max_header_list_size: Annotated[int | None, Field(ge=1024, le=MIB)] = None
    """Largest request metadata (header list), in bytes (default 16384); larger fails its call
    with RESOURCE_EXHAUSTED."""
    connection_buffer_bytes: Annotated[int | None, Field(ge=64 << 10, le=4096 * MIB)] = None
    """Request and unsent answer bytes one connection may hold (default 64 MiB, raised to the
    largest request plus 1 MiB)."""
    process_buffer_bytes: Annotated[int | None, Field(ge=MIB, le=64 << 30)] = None
    """The same summed over every connection (default 512 MiB, at most an eighth of the pod's
    memory limit; at least connectionBufferBytes); keep it well under that limit."""
    idle_timeout_seconds: Seconds = None
    """Seconds a connection with no open call is kept (default 300); then GOAWAY."""
    header_timeout_seconds: Seconds = None
    """Seconds a connection's preface, and each header block, may take (default 10)."""
    body_timeout_seconds: Seconds = None
    """Seconds a request body may take after its headers (default 60); later the call is
    cancelled."""
    resets_per_second: Annotated[int | None, Field(ge=1, le=100_000)] = None
    """Calls a client may cancel, or open past maxConcurrentStreams, per second, with a burst of
    ten seconds' worth (default 100; rapid reset, CVE-2023-44487); more: GOAWAY."""
    empty_frames_per_second: Annotated[int | None, Field(ge=1, le=100_000)] = None
    """Empty DATA/CONTINUATION frames per second, burst ten seconds' worth (default 10)."""
    control_frames_per_second: Annotated[int | None, Field(ge=1, le=100_000)] = None
    """PING and SETTINGS frames per second, burst ten seconds' worth (default 100)."""

    @model_validator(mode="after")
    def _process_holds_a_connection(self) -> "GrpcLimitsSpec":
        connection = self.connection_buffer_bytes or GRPC_CONNECTION_BUFFER_DEFAULT
        process = self.process_buffer_bytes or GRPC_PROCESS_BUFFER_DEFAULT
        if process < connection:
            raise ValueError(
                f"processBufferBytes ({process}) is less than connectionBufferBytes "
                f"({connection}): the runtime refuses it (unset fields are the runtime's "
                "defaults, 512 MiB and 64 MiB)"
            )
        return self


class LimitsSpec(ApiModel):
    """What one client may cost each port of the runtime: connections, time, memory, floods.
    The runtime's defaults suit most services; raise them for many clients, lower them to fit a
    small memory limit."""

    http: HttpLimitsSpec = HttpLimitsSpec()
    """The HTTP/1.1 port's limits."""
    grpc: GrpcLimitsSpec = GrpcLimitsSpec()
    """The gRPC port's limits."""


class RedisCacheSpec(ApiModel):
    """A Redis server every replica of the service shares its cached answers through. Keys start
    with kiln:<namespace>/<name>: (the service's own), values carry a checksum, and the runtime
    serves from the model whenever Redis fails or is slow."""

    address: Annotated[
        str, Field(min_length=3, max_length=261, pattern=r"^[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}$")
    ]
    """host:port of the Redis server, e.g. redis.cache.svc:6379."""
    secret_name: Annotated[str | None, Field(max_length=253, pattern=DNS_SUBDOMAIN)] = None
    """A Secret in the InferenceService's namespace with the service's Redis credentials: key
    password (required) and key username (optional; an ACL user that may use only the keys
    ~kiln:<namespace>/<name>:*). Unset: Redis without authentication."""
    timeout_milliseconds: Annotated[int, Field(ge=1, le=1000)] = 10
    """Longest a lookup or a write may take; past it the request is served from the model and
    the runtime leaves Redis alone for a second."""
    max_connections: Annotated[int, Field(ge=1, le=1024)] = 16
    """Connections each runtime pod opens to Redis at most."""


class ResponseCacheSpec(ApiModel):
    """Answers kept by the runtime and served again to identical requests, without the model.
    Requires model.deterministic: true. The key covers the model and its version, every input's
    name, datatype, shape and bytes, the requested outputs and the request's parameters (but
    timeout, priority and binary_data_output, which change how an answer is delivered, not what
    it holds). A hit never enters the batcher."""

    max_bytes: Annotated[int, Field(ge=1 << 16, le=1 << 40)] = 64 * (1 << 20)
    """Memory each pod's cache may hold (answers and bookkeeping); the least recently used
    answers go first. Counts against resources.memory."""
    ttl_seconds: Annotated[int, Field(ge=1, le=604_800)] = 300
    """Longest an answer is served from the cache after it was computed."""
    max_entry_bytes: Annotated[int, Field(ge=1, le=1 << 30)] = 1 << 20
    """Answers larger than this are not kept (nor read back from Redis)."""
    redis: RedisCacheSpec | None = None
    """Share the answers among the service's replicas through Redis; unset: each pod keeps its
    own."""

    @model_validator(mode="after")
    def _entry_fits(self) -> "ResponseCacheSpec":
        if self.max_entry_bytes > self.max_bytes:
            raise ValueError(
                f"maxEntryBytes ({self.max_entry_bytes}) exceeds maxBytes ({self.max_bytes})"
            )
        return self


class TracingSpec(ApiModel):
    """Per-request traces: each sampled request is a span with a child per stage (decode, queue,
    compute, encode), continuing the caller's W3C traceparent (HTTP header or gRPC metadata),
    exported by OpenTelemetry over OTLP/HTTP. Off unless set."""

    otlp_endpoint: Annotated[
        str, Field(min_length=8, max_length=2048, pattern=r"^https?://[^\s]+$")
    ]
    """OTLP/HTTP traces URL of a collector or tracing backend, e.g.
    http://otel-collector.observability:4318/v1/traces."""
    sampling_ratio: Annotated[float, Field(ge=0, le=1)] = 0.01
    """Share of requests traced among those that carry no traceparent; a request with one is
    traced if its caller sampled it."""


class RuntimeSpec(ApiModel):
    """The serving container."""

    image: Annotated[str, Field(min_length=1, max_length=512, pattern=IMAGE_PATTERN)]
    """Container image of Kiln's runtime (package kiln_runtime), e.g. kiln/runtime:dev. No path
    component may be `.` or `..`."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """When the kubelet pulls the image."""
    optimization: OptimizationSpec = OptimizationSpec()
    """Graph preparation and precision."""
    batching: BatchingSpec = BatchingSpec()
    """Dynamic batching limits."""
    connections: ConnectionsSpec = ConnectionsSpec()
    """gRPC connection lifetime, so long-lived clients spread over new replicas."""
    limits: LimitsSpec = LimitsSpec()
    """Per-port bounds on what clients may cost (connections, timeouts, buffers, floods)."""
    cache: ResponseCacheSpec | None = None
    """A response cache: identical requests answered from memory (each pod's, optionally a
    shared Redis) instead of the model. Off unless set; needs model.deterministic: true."""
    tracing: TracingSpec | None = None
    """Per-request traces over OTLP (docs/observability.md). Off unless set."""

    @field_validator("image")
    @classmethod
    def _no_dot_segments(cls, image: str) -> str:
        if image_has_dot_segment(image):
            raise ValueError(f"{image!r}: {IMAGE_RULE}")
        return image
