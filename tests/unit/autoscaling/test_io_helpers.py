"""The pure helpers around the autoscaler's I/O: the PromQL it runs, the pods it marks."""

from kiln_operator.autoscaling.deletion_cost import DELETION_COST_ANNOTATION, deletion_costs
from kiln_operator.autoscaling.prometheus import Queries


def test_queries_select_one_service_and_sum_buckets_by_le() -> None:
    queries = Queries("shop", "ranker", window_seconds=60)
    assert queries.p99_seconds == (
        "histogram_quantile(0.99, sum by (le) (rate(kiln_request_duration_seconds_bucket"
        '{namespace="shop",inferenceservice="ranker"}[60s])))'
    )
    assert queries.requests_per_second == (
        'sum(rate(kiln_requests_total{namespace="shop",inferenceservice="ranker"}[60s]))'
    )
    assert (
        queries.queue_depth == 'sum(kiln_queue_depth{namespace="shop",inferenceservice="ranker"})'
    )


def pod(name: str, cost: str | None = None, deleting: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"name": name}
    if cost is not None:
        meta["annotations"] = {DELETION_COST_ANNOTATION: cost}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


def test_idle_pods_get_the_lowest_cost_and_unchanged_ones_are_not_rewritten() -> None:
    pods = [pod("busy"), pod("idle"), pod("same", cost="3"), pod("gone", deleting=True)]
    assert deletion_costs(pods, {"busy": 11.6, "same": 3.0}) == {"busy": 12, "idle": 0}
