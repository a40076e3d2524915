"""spec.warmup: the gate a new pod passes before it receives traffic.

Why it exists: a cold pod (lazy CUDA init, allocator growth, compilation) serves its first
requests many times slower than its steady state. A pod is Ready only after it answered
`requests` synthetic requests with a p99 under `p99Milliseconds` (issue 5 runs the gate).
"""

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from kiln_operator.api.v1alpha1.base import ApiModel


class WarmupSpec(ApiModel):
    """The warm-up gate."""

    requests: Annotated[int, Field(ge=0, le=100_000)] = 200
    """Synthetic requests sent to a new pod before it is marked warmed-up; 0 disables the gate."""
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 8
    """Requests in flight at once during warm-up (so batching warms up too)."""
    p99_milliseconds: Annotated[float | None, Field(gt=0, le=600_000)] = None
    """The p99 latency the last warm-up requests must meet; empty uses spec.slo's target."""
    timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = 300
    """Longest one warm-up attempt may take."""
    retries: Annotated[int, Field(ge=0, le=10)] = 2
    """Attempts after the first before the pod is reported as failing warm-up."""
    batch_sizes: Annotated[
        list[Annotated[int, Field(ge=1, le=4096)]], Field(max_length=16, default_factory=list)
    ]
    """Batch sizes the runtime itself runs once before reporting ready (graph capture, autotune);
    empty: 1 and runtime.batching.maxBatchSize."""

    @field_validator("batch_sizes")
    @classmethod
    def _ascending(cls, sizes: list[int]) -> list[int]:
        if sizes != sorted(set(sizes)):
            raise ValueError("batch sizes must be strictly ascending without repeats")
        return sizes

    @model_validator(mode="after")
    def _requests_cover_concurrency(self) -> "WarmupSpec":
        if 0 < self.requests < self.concurrency:
            raise ValueError(
                f"requests ({self.requests}) is below concurrency ({self.concurrency}): "
                "warm-up would never reach its concurrency"
            )
        return self


class WarmupStatus(ApiModel):
    """What the warm-up gate found on the service's pods; written by the gate only."""

    warm_replicas: Annotated[int, Field(ge=0)] = 0
    """Pods whose warm-up passed: their readiness gate is open."""
    failed_replicas: Annotated[int, Field(ge=0)] = 0
    """Pods whose last warm-up attempt failed; they stay unready until replaced."""
    failure_message: Annotated[str | None, Field(max_length=2048)] = None
    """The reason and message of one failed pod, e.g. the measured p99 against the bound."""
    last_cold_start_seconds: Annotated[float | None, Field(ge=0)] = None
    """Creation to warmed-up of the pod that warmed most recently."""
    cold_start_p50_seconds: Annotated[float | None, Field(ge=0)] = None
    """Median creation-to-warmed-up time of the warm pods."""
    cold_start_p90_seconds: Annotated[float | None, Field(ge=0)] = None
    """90th percentile creation-to-warmed-up time of the warm pods: the autoscaler's pre-warm
    lead time when a schedule sets none."""
    last_download_seconds: Annotated[float | None, Field(ge=0)] = None
    """The model download's share of lastColdStartSeconds (s3:// and https:// models): the
    fetch init container's own time, 0 when the pod's volume already held the model."""
    last_download_bytes: Annotated[int | None, Field(ge=0)] = None
    """Bytes that download fetched."""
