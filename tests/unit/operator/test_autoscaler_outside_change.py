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


async def test_a_correction_the_hold_window_delays_still_names_the_outside_change() -> None:
    autoscaler, kube = evaluated([], [])  # blind, Fixed at 4: it never scales down
    await autoscaler.evaluate("ns", "mlp", NOW)
    scale_by_hand(autoscaler, 4)  # its own write arrives
    await autoscaler.evaluate("ns", "mlp", NOW + timedelta(seconds=15))
    scale_by_hand(autoscaler, 6)  # within the bounds: blind, it keeps 6
    for seconds in (30, 45):
        kept = await autoscaler.evaluate("ns", "mlp", NOW + timedelta(seconds=seconds))
        assert kept is not None and kept.decision.desired_replicas == 6
        assert kept.changed_outside is not None and "set to 6" in kept.changed_outside
    # the spec's bound lowered: the correction comes, and names what happened
    body = autoscaler.cache.get("inferenceservices", "ns", "mlp")
    assert body is not None
    lowered = copy.deepcopy(body)
    lowered["spec"]["autoscaling"]["maxReplicas"] = 5
    lowered["spec"]["autoscaling"]["whenMetricsMissing"] = {"policy": "Hold"}
    lowered["metadata"]["generation"] = 2
    autoscaler.cache.store("inferenceservices", lowered)
    corrected = await autoscaler.evaluate("ns", "mlp", NOW + timedelta(seconds=60))
    assert corrected is not None and corrected.decision.desired_replicas == 5
    assert corrected.changed_outside == (
        "the Deployment's replicas were set to 6 outside the autoscaler (it had left them at 4)"
    )
    after = await autoscaler.evaluate("ns", "mlp", NOW + timedelta(seconds=75))
    assert after is not None and after.changed_outside is None
    assert kube.scales[-1] == 5
