"""Render the runtime's config JSON (env KILN_RUNTIME_CONFIG) from an InferenceService spec.

Why it exists: this is the operator's half of the operator/runtime contract; the keys and
values here are exactly those the runtime's config parser accepts.

A GPU service's runtime is told `device: cuda`, so it fails at start-up, loudly, on a node
without CUDA. Only where the platform declares its GPUs imitated (`imitated_gpus`, the operator's
KILN_IMITATED_GPUS) is it told `device: cpu` instead.
"""

import json
from typing import Any

from kiln_operator.api.v1alpha1 import InferenceServiceSpec, TensorSpec


def _tensor(tensor: TensorSpec) -> dict[str, Any]:
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}


def runtime_device(spec: InferenceServiceSpec, *, imitated_gpus: bool = False) -> str:
    """The device the runtime must use: CUDA for a GPU service, unless GPUs are imitated."""
    return "cuda" if spec.resources.gpu_count > 0 and not imitated_gpus else "cpu"


def build_runtime_config(
    spec: InferenceServiceSpec,
    service_name: str,
    *,
    imitated_gpus: bool = False,
    namespace: str = "",
) -> dict[str, Any]:
    """The runtime config as a dict (camelCase keys, as the contract specifies). ``namespace``
    (with ``service_name``) names the response cache's keys."""
    batching = spec.runtime.batching
    optimization = spec.runtime.optimization
    warmup_batches = spec.warmup.batch_sizes or sorted({1, batching.max_batch_size})
    config: dict[str, Any] = {
        "model": {
            "name": spec.model_name(service_name),
            "version": spec.model.version,
            "format": spec.model.format,
            "inputs": [_tensor(tensor) for tensor in spec.model.inputs],
            "outputs": [_tensor(tensor) for tensor in spec.model.outputs],
        },
        "optimization": {
            "mode": optimization.mode,
            "precision": optimization.precision,
            "cudaGraphs": optimization.cuda_graphs,
            "device": runtime_device(spec, imitated_gpus=imitated_gpus),
        },
        "batching": {
            "maxBatchSize": batching.max_batch_size,
            "maxQueueDelayMicroseconds": batching.max_queue_delay_microseconds,
            "maxQueueSize": batching.max_queue_size,
        },
        "warmup": {"batchSizes": warmup_batches},
        "drain": {"timeoutSeconds": spec.drain.max_request_seconds},
        "connections": {
            "maxAgeSeconds": spec.runtime.connections.max_age_seconds,
            "maxAgeGraceSeconds": spec.runtime.connections.max_age_grace_seconds,
        },
    }
    # Only the limits set: the rest are the runtime's defaults, and a spec that sets none
    # renders the config it rendered before limits existed (no rollout).
    limits = spec.runtime.limits
    for section, part in (("http", limits.http), ("http2", limits.grpc)):
        if set_limits := part.model_dump(by_alias=True, exclude_none=True):
            config[section] = set_limits
    if (cache := spec.runtime.cache) is not None:
        config["cache"] = {
            "maxBytes": cache.max_bytes,
            "ttlSeconds": cache.ttl_seconds,
            "maxEntryBytes": cache.max_entry_bytes,
            # The service's own keys: its pods share entries, no other service's ever answers.
            "keyPrefix": f"kiln:{namespace}/{service_name}:",
        }
        if (redis := cache.redis) is not None:
            config["cache"]["redis"] = {
                "address": redis.address,
                "timeoutMilliseconds": redis.timeout_milliseconds,
                "maxConnections": redis.max_connections,
            }
    if (tracing := spec.runtime.tracing) is not None:
        config["tracing"] = {
            "otlpEndpoint": tracing.otlp_endpoint,
            "samplingRatio": tracing.sampling_ratio,
        }
    return config


def render_runtime_config(
    spec: InferenceServiceSpec,
    service_name: str,
    *,
    imitated_gpus: bool = False,
    namespace: str = "",
) -> str:
    """The runtime config as compact, key-sorted JSON: byte-identical for an unchanged spec, so
    an unchanged spec never triggers a rollout."""
    config = build_runtime_config(
        spec, service_name, imitated_gpus=imitated_gpus, namespace=namespace
    )
    return json.dumps(config, sort_keys=True, separators=(",", ":"))
