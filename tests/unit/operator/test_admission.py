"""The validating webhook's verdict (profiles/admission.py): every spec of the invalid corpus
is refused at CREATE and UPDATE with the message its InvalidSpec condition would show, a valid
one is admitted; a five-line service is judged as resolved with its profiles, a policy's limit
is refused naming the rule, a missing profile is only a warning; and what must never be blocked
is admitted whatever the spec: a DELETE, a status or scale write, and an UPDATE that leaves the
spec as it was (an object stored before the webhook existed stays editable)."""

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln_operator.api.validation import SpecError, parse_spec
from kiln_operator.profiles.admission import AdmissionRequest, Verdict, admission_verdict
from kiln_operator.profiles.effective import PlatformState
from tests.unit.operator.conftest import corpus, expectation, load_sample
from tests.unit.operator.test_platform import MODEL, PLATFORM, TEAM, policy

NO_PLATFORM = PlatformState()


def problems(request: AdmissionRequest, platform: PlatformState = NO_PLATFORM, **kw: int) -> str:
    """The refusal's message; fails if the write was admitted."""
    verdict = admission_verdict(request, platform, **kw)
    assert verdict.refusal is not None, "the write was admitted"
    assert verdict.warnings == ()
    return verdict.refusal


def admitted(request: AdmissionRequest, platform: PlatformState = NO_PLATFORM, **kw: int) -> bool:
    return admission_verdict(request, platform, **kw) == Verdict()


def manifest(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def valid() -> dict[str, Any]:
    return load_sample("cpu-test")


def invalid() -> dict[str, Any]:
    (path,) = [p for p in corpus("semantic") if "min-above-max" in p.name]
    return manifest(path)


def create(body: dict[str, Any]) -> AdmissionRequest:
    return AdmissionRequest(operation="CREATE", subresource=None, new=body)


def update(old: dict[str, Any], new: dict[str, Any]) -> AdmissionRequest:
    return AdmissionRequest(operation="UPDATE", subresource=None, new=new, old=old)


@pytest.mark.parametrize("path", corpus("semantic") + corpus("schema"), ids=lambda p: p.stem)
def test_every_invalid_spec_is_refused_at_create_naming_its_field(path: Path) -> None:
    message = problems(create(manifest(path)))
    assert message.startswith("InvalidSpec: ")
    assert expectation(path) in message


SPEC_PROBLEMS = [p for p in corpus("semantic") if "name-not-a-dns-label" not in p.name]
"""The semantic corpus but the bad name: an UPDATE cannot change a name."""


@pytest.mark.parametrize("path", SPEC_PROBLEMS, ids=lambda p: p.stem)
def test_an_update_to_an_invalid_spec_is_refused_with_the_conditions_message(path: Path) -> None:
    body = manifest(path)
    before = valid()
    before["metadata"] = body["metadata"]
    parsed = parse_spec(body["metadata"]["name"], body["spec"])
    assert isinstance(parsed, SpecError)
    # the same words as Ready=False/InvalidSpec would show
    assert problems(update(before, body)) == f"InvalidSpec: {parsed.message}"


@pytest.mark.parametrize("sample", ["minimal", "cpu-test", "full", "s3"])
def test_the_samples_are_admitted(sample: str) -> None:
    # the full sample names a Prometheus: the operator's allow-list has it
    platform = PlatformState(allowed_prometheus_urls=("http://prometheus.monitoring.svc:9090",))
    body = load_sample(sample)
    assert admitted(create(body), platform)
    changed = copy.deepcopy(body)
    changed["spec"]["slo"]["p99LatencyMilliseconds"] += 1
    assert admitted(update(body, changed), platform)


def test_the_warm_up_budget_is_the_operators() -> None:
    (path,) = [p for p in corpus("semantic") if "over-budget" in p.name]
    body = manifest(path)
    assert problems(create(body))
    assert admitted(create(body), warmup_budget_bytes=2**40)


def five_line_service() -> dict[str, Any]:
    return {"metadata": {"name": "mlp", "namespace": "team"}, "spec": {"model": MODEL}}


def test_a_five_line_service_is_judged_as_resolved_with_its_profiles() -> None:
    body = five_line_service()
    assert "spec.runtime" in problems(create(body))  # no profile: the image is missing
    platform = PlatformState(cluster_profiles=[PLATFORM], namespace_profiles=[TEAM])
    assert admitted(create(body), platform)
    body["spec"]["autoscaling"] = {"minReplicas": 9}  # above the profile's maxReplicas: 8
    message = problems(create(body), platform)
    assert message.startswith("InvalidSpec: spec.autoscaling: minReplicas (9) must not exceed")
    assert message.endswith(
        "(spec resolved with InferenceProfile gpu, ClusterInferenceProfile gpu)"
    )


def test_a_policys_limit_is_refused_naming_the_policy() -> None:
    platform = PlatformState(
        cluster_profiles=[PLATFORM], cluster_policies=[policy("platform-limits", maxReplicas=4)]
    )
    message = problems(create(five_line_service()), platform)
    assert message.startswith("PolicyViolation: ClusterInferencePolicy platform-limits: ")
    assert "maxReplicas" in message


def test_a_missing_profile_is_admitted_with_a_warning() -> None:
    body = five_line_service()
    body["spec"]["profile"] = "later"
    verdict = admission_verdict(create(body), PlatformState(cluster_profiles=[PLATFORM]))
    assert verdict.refusal is None
    (warning,) = verdict.warnings
    assert warning.startswith("ProfileNotFound: spec.profile: no ClusterInferenceProfile")
    assert warning.endswith("admitted, the operator waits for it")


def test_deleting_is_never_refused() -> None:
    request = AdmissionRequest(operation="DELETE", subresource=None, new=None, old=invalid())
    assert not request.judged
    assert admitted(request)


@pytest.mark.parametrize("subresource", ["status", "scale"])
def test_subresource_writes_are_not_judged(subresource: str) -> None:
    body = invalid()
    request = AdmissionRequest(operation="UPDATE", subresource=subresource, new=body, old=body)
    assert not request.judged
    assert admitted(request)


def test_an_update_that_leaves_an_invalid_spec_as_it_was_is_admitted() -> None:
    stored = invalid()
    labelled = copy.deepcopy(stored)
    labelled["metadata"]["labels"] = {"team": "search"}
    labelled["metadata"]["finalizers"] = []
    assert not update(stored, labelled).judged
    assert admitted(update(stored, labelled))
    tightened = PlatformState(cluster_policies=[policy("platform-limits", maxReplicas=1)])
    assert admitted(update(valid(), valid()), tightened)  # stored before the policy tightened


def test_an_update_that_changes_an_invalid_spec_but_leaves_it_invalid_is_refused() -> None:
    stored = invalid()
    still = copy.deepcopy(stored)
    still["spec"]["autoscaling"]["minReplicas"] = 4
    assert problems(update(stored, still)) == (
        "InvalidSpec: spec.autoscaling: minReplicas (4) must not exceed maxReplicas (2)"
    )


def test_a_name_that_cannot_name_a_service_is_refused() -> None:
    body = valid()
    body["metadata"]["name"] = "Not_A_Label"
    message = problems(create(body))
    assert message.startswith("InvalidSpec: metadata.name: 'Not_A_Label' must be a DNS-1035 label")


def test_the_refusal_names_every_problem() -> None:
    body = valid()
    body["spec"]["resources"]["cpu"] = "1.2.3"
    body["spec"]["resources"]["memory"] = "1.2.3"
    assert problems(create(body)) == (
        "InvalidSpec: spec.resources.cpu: '1.2.3' is not a Kubernetes quantity (e.g. 2, 500m, "
        "8Gi); spec.resources.memory: '1.2.3' is not a Kubernetes quantity (e.g. 2, 500m, 8Gi)"
    )
