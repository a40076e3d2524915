"""The autoscaler's Prometheus adapter: the PromQL it runs and the Observation it returns.

Why it exists: `decide` is pure and takes an `Observation`; this is the one place that talks to
Prometheus (with `prometheus-api-client`) to fill it. Every failure — Prometheus down, a query
error, NaN — becomes data in the Observation (`metrics_error`, or None for a metric), never an
exception, so the policy can apply the declared missing-metrics behaviour.

The runtime's metrics carry the labels Prometheus' standard Kubernetes pod discovery attaches
(docs/autoscaling.md gives the scrape config): `namespace`, `pod`, and `inferenceservice`
(from the pod label `serving.kiln.dev/inferenceservice`).
"""

import math
from dataclasses import dataclass
from datetime import UTC, datetime

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from kiln_operator.autoscaling.policy import Observation

QUERY_TIMEOUT_SECONDS = 5


@dataclass(frozen=True)
class Queries:
    """The PromQL for one InferenceService over one rate window."""

    namespace: str
    service: str
    window_seconds: int

    @property
    def selector(self) -> str:
        return f'namespace="{self.namespace}",inferenceservice="{self.service}"'

    @property
    def p99_seconds(self) -> str:
        """End-to-end p99 across the service's pods: buckets summed by `le`, then the quantile."""
        return (
            "histogram_quantile(0.99, sum by (le) (rate(kiln_request_duration_seconds_bucket"
            f"{{{self.selector}}}[{self.window_seconds}s])))"
        )

    @property
    def requests_per_second(self) -> str:
        return f"sum(rate(kiln_requests_total{{{self.selector}}}[{self.window_seconds}s]))"

    @property
    def queue_depth(self) -> str:
        """Requests waiting in every pod's batcher queue, summed."""
        return f"sum(kiln_queue_depth{{{self.selector}}})"

    @property
    def freshest_sample(self) -> str:
        """When the newest queue-depth sample was scraped: how stale the metrics are."""
        return f"max(timestamp(kiln_queue_depth{{{self.selector}}}))"

    @property
    def inflight_by_pod(self) -> str:
        return f"sum by (pod) (kiln_inflight_requests{{{self.selector}}})"


class PrometheusReader:
    """Reads one InferenceService's signals. Blocking (requests); call it from a thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._prometheus = PrometheusConnect(
            url=url, disable_ssl=True, timeout=QUERY_TIMEOUT_SECONDS
        )

    def _scalar(self, query: str) -> float | None:
        result = self._prometheus.custom_query(query)
        if not result:
            return None
        return float(result[0]["value"][1])

    def observe(
        self, namespace: str, service: str, window_seconds: int, ready_replicas: int
    ) -> Observation:
        """The Observation for `decide`; `metrics_error` says why Prometheus could not be read."""
        queries = Queries(namespace, service, window_seconds)
        try:
            freshest = self._scalar(queries.freshest_sample)
            p99 = self._scalar(queries.p99_seconds)
            rate = self._scalar(queries.requests_per_second)
            queue = self._scalar(queries.queue_depth)
        except (requests.RequestException, PrometheusApiClientException, ValueError) as error:
            return Observation(
                ready_replicas=ready_replicas,
                metrics_error=f"Prometheus at {self.url} unreadable: {error}",
            )
        if freshest is None:
            return Observation(
                ready_replicas=ready_replicas,
                metrics_error=f"no kiln_queue_depth series for {namespace}/{service} in Prometheus",
            )
        return Observation(
            ready_replicas=ready_replicas,
            observed_at=datetime.fromtimestamp(freshest, UTC),
            p99_latency_seconds=p99,
            queue_depth_per_replica=None if queue is None else queue / max(ready_replicas, 1),
            requests_per_second=None if rate is None or math.isnan(rate) else rate,
        )

    def inflight_by_pod(self, namespace: str, service: str) -> dict[str, float]:
        """Requests in flight per pod name (for pod-deletion-cost); empty when unreadable."""
        queries = Queries(namespace, service, window_seconds=60)
        try:
            result = self._prometheus.custom_query(queries.inflight_by_pod)
        except (requests.RequestException, PrometheusApiClientException):
            return {}
        return {
            item["metric"].get("pod", ""): float(item["value"][1])
            for item in result
            if item["metric"].get("pod")
        }
