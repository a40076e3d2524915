"""A Deployment scaled by someone else (`kubectl scale deployment`): the autoscaler takes the
new count as the current one, corrects it by its rules, and says that the count was set outside
it; its own scale writes, seen late or at once through the cache, are never mistaken for one."""

import copy
from datetime import UTC, datetime, timedelta

from kiln_operator.k8s.autoscaler import Autoscaler
from tests.unit.operator.test_autoscaler_placement import evaluated

NOW = datetime(2026, 11, 25, tzinfo=UTC)


def scale_by_hand(autoscaler: Autoscaler, replicas: int) -> None:
    deployment = copy.deepcopy(autoscaler.cache.get("deployments", "ns", "mlp"))
    assert deployment is not None
    deployment["spec"]["replicas"] = replicas
    deployment["metadata"]["resourceVersion"] = str(replicas * 100)
    autoscaler.cache.store("deployments", deployment)


async def test_a_count_set_by_hand_is_corrected_and_named_its_own_writes_are_not() -> None:
    autoscaler, kube = evaluated([], [])  # blind, Fixed at 4, running 2
    first = await autoscaler.evaluate("ns", "mlp", NOW)
    assert first is not None and first.changed_outside is None
    assert kube.scales == [4]
    # its own write not in the cache yet: still 2 there, which it had seen
    second = await autoscaler.evaluate("ns", "mlp", NOW + timedelta(seconds=15))
    assert second is not None and second.changed_outside is None
    scale_by_hand(autoscaler, 4)  # its own write arrives
    third = await autoscaler.evaluate("ns", "mlp", NOW + timedelta(seconds=30))
    assert third is not None and third.changed_outside is None

    scale_by_hand(autoscaler, 9)  # above maxReplicas (8)
    corrected = await autoscaler.evaluate("ns", "mlp", NOW + timedelta(seconds=45))
    assert corrected is not None
    assert corrected.previous_replicas == 9
    assert corrected.decision.desired_replicas == 8
    assert corrected.changed_outside == (
        "the Deployment's replicas were set to 9 outside the autoscaler (it had left them at 4)"
    )
    assert kube.scales[-1] == 8


async def test_a_restarted_autoscaler_names_no_outside_change() -> None:
    autoscaler, _ = evaluated([], [])
    scale_by_hand(autoscaler, 9)
    evaluation = await autoscaler.evaluate("ns", "mlp", NOW)
    assert evaluation is not None and evaluation.changed_outside is None  # it knew no count
