"""spec.rollout.canary in the reconcile loop: which Deployment runs what (the plan), the canary
Deployment's shape, and what kstatus reads during and after a canary."""

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kiln_operator import constants
from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.api.v1alpha1.rollout import CanarySpec, RolloutSpec, RolloutStatus
from kiln_operator.builders import Owner, build_deployment
from kiln_operator.builders.canary import build_canary_deployment, canary_name, revision_of
from kiln_operator.builders.naming import selector_labels
from kiln_operator.k8s.reconciler import CanaryPlan, _canary_plan
from kiln_operator.status.compute import ReconcileObservation, compute_status
from tests.unit.kube_objects import deployment, pod
from tests.unit.operator.conftest import sample_spec

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
OWNER = Owner(name="mlp", namespace="vision", uid="uid-1")


def with_canary(spec: InferenceServiceSpec) -> InferenceServiceSpec:
    return spec.model_copy(update={"rollout": RolloutSpec(canary=CanarySpec(steps=[25, 50]))})


def specs() -> tuple[InferenceServiceSpec, InferenceServiceSpec]:
    """The stable version's spec and a new one (another batch size: another pod template)."""
    old = with_canary(sample_spec("minimal"))
    runtime = old.runtime.model_copy(
        update={"batching": old.runtime.batching.model_copy(update={"max_batch_size": 4})}
    )
    return old, old.model_copy(update={"runtime": runtime})


def live(spec: InferenceServiceSpec) -> dict[str, Any]:
    built = build_deployment(spec, OWNER, 2)
    built["metadata"]["uid"] = "dep-1"
    return built


def rollout(spec: InferenceServiceSpec, phase: str) -> RolloutStatus:
    revision = revision_of(build_deployment(spec, OWNER))
    return RolloutStatus.model_validate(
        {"phase": phase, "revision": revision, "step_started_at": T0}
    )


def test_without_the_strategy_nothing_changes() -> None:
    old, new = specs()
    plain = new.model_copy(update={"rollout": RolloutSpec()})
    assert _canary_plan(plain, live(old), OWNER, None, imitated_gpus=False) == CanaryPlan()


def test_a_new_template_runs_as_a_canary_and_the_stable_deployment_keeps_its_own() -> None:
    old, new = specs()
    plan = _canary_plan(new, live(old), OWNER, None, imitated_gpus=False)
    assert plan == CanaryPlan(keep_stable=True, wants_canary=True, phase="Progressing")
    running = _canary_plan(new, live(old), OWNER, rollout(new, "Progressing"), imitated_gpus=False)
    assert running == plan


def test_promoting_rolls_the_stable_deployment_and_keeps_the_canary_until_done() -> None:
    old, new = specs()
    status = rollout(new, "Promoting")
    rolling = _canary_plan(new, live(old), OWNER, status, imitated_gpus=False)
    assert rolling == CanaryPlan(keep_stable=False, wants_canary=True, phase="Promoting")
    rolled = _canary_plan(new, live(new), OWNER, status, imitated_gpus=False)
    assert rolled == CanaryPlan(keep_stable=False, wants_canary=True, phase="Promoting")
    done = _canary_plan(new, live(new), OWNER, rollout(new, "Promoted"), imitated_gpus=False)
    assert done == CanaryPlan()


def test_a_rolled_back_revision_keeps_the_stable_version_without_a_canary() -> None:
    old, new = specs()
    plan = _canary_plan(new, live(old), OWNER, rollout(new, "RolledBack"), imitated_gpus=False)
    assert plan == CanaryPlan(keep_stable=True, wants_canary=False, phase="RolledBack")


def test_a_spec_back_to_the_stable_version_removes_the_canary() -> None:
    old, new = specs()
    plan = _canary_plan(old, live(old), OWNER, rollout(new, "Progressing"), imitated_gpus=False)
    assert plan == CanaryPlan()


def test_the_canary_deployment_is_selected_by_the_service_and_apart_from_the_stable() -> None:
    _, new = specs()
    stable = build_deployment(new, OWNER)
    canary = build_canary_deployment(stable, OWNER, initial_replicas=1)
    assert canary["metadata"]["name"] == canary_name("mlp") == "mlp-canary"
    assert canary["metadata"]["ownerReferences"][0]["name"] == "mlp"
    assert canary["metadata"]["annotations"] == {constants.ANNOTATION_REVISION: revision_of(stable)}
    labels = canary["spec"]["template"]["metadata"]["labels"]
    assert selector_labels("mlp").items() <= labels.items()  # the one Service selects it
    assert labels[constants.LABEL_TRACK] == constants.TRACK_CANARY
    assert canary["spec"]["selector"]["matchLabels"][constants.LABEL_TRACK] == "canary"
    assert canary["spec"]["replicas"] == 1
    assert "replicas" not in build_canary_deployment(stable, OWNER)["spec"]
    assert canary["spec"]["template"]["spec"] == stable["spec"]["template"]["spec"]
    assert "replicas" not in stable["spec"]  # the stable one is not changed


def observation(phase: str | None) -> ReconcileObservation:
    ready = {"type": "Ready", "status": "True"}
    return ReconcileObservation(
        generation=3,
        spec_error=None,
        deployment=deployment(),
        selector="s",
        url="u",
        grpc_address="g",
        pods=(pod("a", ready), pod("b", ready)),
        min_replicas=2,
        canary_phase=phase,
        canary_message="canary of revision r: step 1 of 2",
    )


def kstatus(phase: str | None) -> dict[str, tuple[str, str]]:
    applied = compute_status({}, observation(phase), T0).applied
    return {c["type"]: (c["status"], c["reason"]) for c in applied["conditions"]}


def test_kstatus_is_reconciling_during_a_canary_and_stalled_after_a_rollback() -> None:
    assert kstatus(None)[constants.CONDITION_RECONCILING] == ("False", constants.REASON_CONVERGED)
    during = kstatus("Progressing")
    assert during[constants.CONDITION_RECONCILING] == ("True", "CanaryProgressing")
    assert during[constants.CONDITION_STALLED][0] == "False"
    assert during[constants.CONDITION_READY][0] == "True"  # the stable version serves
    promoting = kstatus("Promoting")
    assert promoting[constants.CONDITION_RECONCILING] == ("True", "CanaryPromoting")
    after = kstatus("RolledBack")
    assert after[constants.CONDITION_STALLED] == ("True", "CanaryRolledBack")
    assert after[constants.CONDITION_RECONCILING] == ("False", constants.REASON_STALLED)
    assert after[constants.CONDITION_READY][0] == "True"


def test_an_invalid_spec_is_stalled_for_its_own_reason_not_the_canarys() -> None:
    invalid = replace(observation("RolledBack"), spec_error="spec.x: bad")
    applied = compute_status({}, invalid, T0).applied
    stalled = next(c for c in applied["conditions"] if c["type"] == constants.CONDITION_STALLED)
    assert stalled["reason"] == constants.REASON_INVALID_SPEC
