"""The pure helper around the autoscaler's I/O: the pods it marks before a scale-down."""

from kiln_operator.autoscaling.deletion_cost import DELETION_COST_ANNOTATION, deletion_costs


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
