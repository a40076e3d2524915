"""The autoscaler's Prometheus adapter: one grouped query per endpoint and window, shared.

Why it exists: this is the one place that talks to Prometheus (with `prometheus-api-client`).
Each Prometheus endpoint has one `PrometheusSource`: one reused client, one worker thread of
its own (a slow or unreachable Prometheus occupies only its own thread, so services read from
other endpoints are not delayed), and per rate window one snapshot of every service's signals
(`autoscaling.signals.grouped_query`). A service's evaluation takes the snapshot if it is
younger than half the service's interval; otherwise it refreshes it, and every evaluation that
asks meanwhile waits for that same refresh. So a cycle costs a constant number of queries per
endpoint and window, whatever the number of services.

Every failure (Prometheus down, a query error, a timeout) becomes data — the snapshot's
`error` — never an exception, so the policy can apply the declared missing-metrics behaviour.
"""

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.adapters import Retry

from kiln_operator import telemetry
from kiln_operator.autoscaling.capacity import BatchWindow
from kiln_operator.autoscaling.inputs import MetricsObservation
from kiln_operator.autoscaling.signals import ServiceKey, ServiceSignals, fan_out, grouped_query
from kiln_operator.rollout.machine import CanaryMetrics
from kiln_operator.rollout.signals import canary_query, parse

QUERY_TIMEOUT_SECONDS = 5
"""One query's limit; the grouped query is the only one per refresh."""


@dataclass(frozen=True)
class Snapshot:
    """Every service's signals from one grouped query, or why it failed."""

    taken_at: float
    """`time.monotonic()` when the query was sent."""
    services: dict[ServiceKey, ServiceSignals] = field(default_factory=dict)
    error: str | None = None


class PrometheusSource:
    """One Prometheus endpoint: a client, a thread, a snapshot per rate window."""

    def __init__(self, url: str) -> None:
        self.url = url
        # No retries inside a refresh: the client's default retries a broken connection three
        # times with backoff (26 s against a hung endpoint); the next evaluation is the retry.
        self._prometheus = PrometheusConnect(
            url=url, disable_ssl=True, timeout=QUERY_TIMEOUT_SECONDS, retry=Retry(total=0)
        )
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prometheus")
        self._snapshots: dict[int, Snapshot] = {}
        self._refreshing: dict[int, asyncio.Future[Snapshot]] = {}

    async def snapshot(self, window_seconds: int, max_age_seconds: float) -> Snapshot:
        """The signals of every service over this window, at most `max_age_seconds` old."""
        current = self._snapshots.get(window_seconds)
        if current is not None and time.monotonic() - current.taken_at <= max_age_seconds:
            return current
        pending = self._refreshing.get(window_seconds)
        if pending is None:
            pending = asyncio.ensure_future(self._refresh(window_seconds))
            self._refreshing[window_seconds] = pending
        return await asyncio.shield(pending)

    async def _refresh(self, window_seconds: int) -> Snapshot:
        try:
            loop = asyncio.get_running_loop()
            snapshot = await loop.run_in_executor(self._thread, self._query, window_seconds)
            self._snapshots[window_seconds] = snapshot
            return snapshot
        finally:
            self._refreshing.pop(window_seconds, None)

    def _query(self, window_seconds: int) -> Snapshot:
        taken_at = time.monotonic()
        try:
            with telemetry.prometheus_query("signals"):
                result = self._prometheus.custom_query(grouped_query(window_seconds))
            return Snapshot(taken_at, services=fan_out(result))
        except (requests.RequestException, PrometheusApiClientException, ValueError) as error:
            return Snapshot(taken_at, error=f"Prometheus at {self.url} unreadable: {error}")

    async def canary(self, namespace: str, name: str, window_seconds: int) -> CanaryMetrics:
        """Both versions' signals of one service over the window (spec.rollout.canary), on this
        endpoint's thread; a failure is the result's `error`, never an exception."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._thread, self._canary, namespace, name, window_seconds
        )

    def _canary(self, namespace: str, name: str, window_seconds: int) -> CanaryMetrics:
        try:
            result = self._prometheus.custom_query(canary_query(namespace, name, window_seconds))
            return parse(result, window_seconds)
        except (requests.RequestException, PrometheusApiClientException, ValueError) as error:
            return CanaryMetrics(
                window_seconds, error=f"Prometheus at {self.url} unreadable: {error}"
            )

    def load_by_pod(self, namespace: str, service: str, window_seconds: int) -> dict[str, float]:
        """Each pod's load: requests it answered per second over the window plus its requests
        in flight (for pod-deletion-cost, before a scale-down only); empty when unreadable.
        Blocking: call it in a thread.

        The rate is what tells pods apart under light load, where the in-flight gauge, sampled
        at scrape instants, reads 0 on every pod. The in-flight count is each pod's last sample
        in the window, so that a pod whose newest scrape failed (its series then stale) still
        counts; a pod already gone is not a candidate anyway."""
        selector = f'{{namespace="{namespace}",inferenceservice="{service}"}}'
        answered = f"sum by (pod) (rate(kiln_requests_total{selector}[{window_seconds}s]))"
        inflight = (
            f"sum by (pod) (last_over_time(kiln_inflight_requests{selector}[{window_seconds}s]))"
        )
        query = f"({answered} + on (pod) {inflight}) or {answered} or {inflight}"
        try:
            with telemetry.prometheus_query("load_by_pod"):
                result = self._prometheus.custom_query(query)
        except (requests.RequestException, PrometheusApiClientException):
            return {}
        return {
            item["metric"].get("pod", ""): float(item["value"][1])
            for item in result
            if item["metric"].get("pod") and not math.isnan(float(item["value"][1]))
        }

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def observation(snapshot: Snapshot, key: ServiceKey, ready_replicas: int) -> MetricsObservation:
    """The MetricsObservation for `decide` of one service, from its endpoint's snapshot."""
    if snapshot.error is not None:
        return MetricsObservation(ready_replicas=ready_replicas, metrics_error=snapshot.error)
    signals = snapshot.services.get(key)
    if signals is None or signals.freshest is None:
        namespace, name = key
        return MetricsObservation(
            ready_replicas=ready_replicas,
            metrics_error=f"no kiln_queue_depth series for {namespace}/{name} in Prometheus",
        )
    queue = signals.queue_depth
    return MetricsObservation(
        ready_replicas=ready_replicas,
        observed_at=datetime.fromtimestamp(signals.freshest, UTC),
        p99_latency_seconds=signals.p99_seconds,
        queue_depth_per_replica=None if queue is None else queue / max(ready_replicas, 1),
        requests_per_second=signals.requests_per_second,
        batches=_batches(signals),
    )


def _batches(signals: ServiceSignals) -> BatchWindow | None:
    values = (
        signals.rows_per_second,
        signals.batches_per_second,
        signals.compute_seconds_per_second,
        signals.ok_per_second,
    )
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    rows, batches, compute, ok = (float(v or 0.0) for v in values)
    return BatchWindow(rows, batches, compute, ok)
