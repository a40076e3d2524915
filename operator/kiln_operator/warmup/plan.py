"""What a warm-up sends and how its result is judged. Pure: no I/O, no clock.

Why it exists: the gate's decisions — the tensors of a warm-up request, which latencies count,
pass or fail and why, how long to wait before the next attempt — must be the same in the
operator, its tests and its docs, and testable without a cluster.
"""

import math
from dataclasses import dataclass

from kiln_operator.api.v1alpha1.inferenceservice import InferenceServiceSpec
from kiln_operator.api.validation import tensor_bytes, warmup_attempt_bytes

# Reasons on the pod condition (serving.kiln.dev/warmed-up); `kubectl describe pod` shows them.
REASON_WARMED_UP = "WarmedUp"
"""Every judged request succeeded and their p99 met the bound."""
REASON_WARMING = "WarmingUp"
"""An attempt is under way (or waiting for its retry)."""
REASON_P99_OVER_BOUND = "P99OverBound"
"""The attempt finished but its p99 exceeded the bound."""
REASON_REQUEST_ERRORS = "RequestErrors"
"""Some warm-up requests failed; the message has the first error."""
REASON_RUNTIME_NOT_READY = "RuntimeNotReady"
"""The runtime never reported ready within the attempt's timeout."""
REASON_ATTEMPT_TIMED_OUT = "AttemptTimedOut"
"""The attempt's timeout passed before every request was answered; the message says how many
were, and their p99."""
REASON_GATE_DISABLED = "GateDisabled"
"""spec.warmup.requests is 0: the pod is marked warmed-up without traffic."""

MAX_BACKOFF_SECONDS = 60.0


@dataclass(frozen=True)
class TensorPlan:
    """One input of a warm-up request: name, protocol datatype and full shape (batch of 1)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class WarmupPlan:
    """Everything one pod's warm-up needs, derived from the InferenceService spec."""

    model_name: str
    inputs: tuple[TensorPlan, ...]
    outputs: tuple[str, ...]
    requests: int
    concurrency: int
    p99_bound_ms: float
    attempt_timeout_s: float
    retries: int
    input_bytes: int = 0
    """Bytes of one request's input tensors."""
    output_bytes: int = 0
    """Bytes of one response's output tensors."""

    @property
    def enabled(self) -> bool:
        return self.requests > 0

    def attempt_bytes(self, in_flight: int) -> int:
        """What an attempt holds of the operator's warm-up budget with `in_flight` requests."""
        return warmup_attempt_bytes(self.input_bytes, self.output_bytes, in_flight)

    def in_flight_within(self, budget_bytes: int) -> int:
        """The concurrency an attempt runs at: the spec's, or fewer requests in flight when
        the spec's would not fit the budget on its own (at least 1: validation refused specs
        whose single request does not fit)."""
        fitting = next(
            (n for n in range(self.concurrency, 0, -1) if self.attempt_bytes(n) <= budget_bytes),
            1,
        )
        return fitting


@dataclass(frozen=True)
class WarmupResult:
    """What one attempt measured."""

    latencies_ms: tuple[float, ...]
    """Latencies of the successful requests, in completion order."""
    errors: int = 0
    """Requests that failed with their own error (refused, a wrong tensor, a lost connection)."""
    first_error: str = ""
    runtime_ready: bool = True
    unanswered: int = 0
    """Requests the attempt's timeout left without an answer: cut in flight, or never sent."""


@dataclass(frozen=True)
class Verdict:
    """The judgement of one attempt, as the pod condition will carry it."""

    passed: bool
    reason: str
    message: str
    p50_ms: float | None = None
    p99_ms: float | None = None


def plan_for(spec: InferenceServiceSpec, model_name: str) -> WarmupPlan:
    """The warm-up of a pod of ``spec``. A variable dimension (-1) is sent with size 1."""
    bound = spec.warmup.p99_milliseconds or spec.slo.p99_latency_milliseconds
    return WarmupPlan(
        model_name=model_name,
        inputs=tuple(
            TensorPlan(t.name, t.datatype, (1, *(d if d > 0 else 1 for d in t.shape)))
            for t in spec.model.inputs
        ),
        outputs=tuple(t.name for t in spec.model.outputs),
        requests=spec.warmup.requests,
        concurrency=spec.warmup.concurrency,
        p99_bound_ms=float(bound),
        attempt_timeout_s=float(spec.warmup.timeout_seconds),
        retries=spec.warmup.retries,
        input_bytes=tensor_bytes(spec.model.inputs),
        output_bytes=tensor_bytes(spec.model.outputs),
    )


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending list: a value that was measured."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def judged_latencies(result: WarmupResult) -> list[float]:
    """The second half of the attempt's requests: the first half is the warm-up proper (first
    connections, allocator growth, lazy initialisation) and the second half is what a client
    arriving right after the gate opens would see."""
    latencies = list(result.latencies_ms)
    return sorted(latencies[len(latencies) // 2 :])


def judge(plan: WarmupPlan, result: WarmupResult) -> Verdict:
    """Pass when the runtime was ready, no request failed and the judged p99 meets the bound."""
    if not result.runtime_ready:
        return Verdict(
            False,
            REASON_RUNTIME_NOT_READY,
            f"runtime not ready within {plan.attempt_timeout_s:.0f}s",
        )
    if result.errors:
        return Verdict(
            False,
            REASON_REQUEST_ERRORS,
            f"{result.errors} of {plan.requests} warm-up requests failed: {result.first_error}",
        )
    if result.unanswered:
        answered = len(result.latencies_ms)
        so_far = (
            f" (their p99 {percentile(sorted(result.latencies_ms), 99):.2f} ms)" if answered else ""
        )
        return Verdict(
            False,
            REASON_ATTEMPT_TIMED_OUT,
            f"{answered} of {plan.requests} warm-up requests answered{so_far} within the "
            f"attempt's {plan.attempt_timeout_s:.0f}s: raise spec.warmup.timeoutSeconds or lower "
            "spec.warmup.requests",
        )
    judged = judged_latencies(result)
    if not judged:
        return Verdict(False, REASON_REQUEST_ERRORS, "no warm-up request completed")
    p50, p99 = percentile(judged, 50), percentile(judged, 99)
    measured = f"warm-up p99 {p99:.2f} ms (p50 {p50:.2f} ms) over {len(judged)} requests"
    if p99 > plan.p99_bound_ms:
        return Verdict(
            False,
            REASON_P99_OVER_BOUND,
            f"{measured} exceeds the bound {plan.p99_bound_ms:g} ms",
            p50,
            p99,
        )
    return Verdict(True, REASON_WARMED_UP, f"{measured} within {plan.p99_bound_ms:g} ms", p50, p99)


def backoff_seconds(failed_attempts: int) -> float:
    """Wait before the next attempt: 2, 4, 8 … seconds, at most a minute."""
    return min(MAX_BACKOFF_SECONDS, 2.0 ** max(1, failed_attempts))
