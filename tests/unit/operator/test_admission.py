"""The validating webhook's verdict (api/admission.py): every spec of the invalid corpus is
refused at CREATE and UPDATE with its field-named message, a valid one is admitted, and what must
never be blocked is admitted whatever the spec: a DELETE, a status or scale write, and an UPDATE
that leaves the spec as it was (an object stored before the webhook existed stays editable)."""

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln_operator.api.admission import AdmissionRequest, admission_problems, refusal_message
from kiln_operator.api.validation import SpecError, parse_spec
from tests.unit.operator.conftest import corpus, expectation, load_sample


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
    problems = admission_problems(create(manifest(path)))
    assert any(expectation(path) in problem for problem in problems), problems


SPEC_PROBLEMS = [p for p in corpus("semantic") if "name-not-a-dns-label" not in p.name]
"""The semantic corpus but the bad name: an UPDATE cannot change a name."""


@pytest.mark.parametrize("path", SPEC_PROBLEMS, ids=lambda p: p.stem)
def test_an_update_to_an_invalid_spec_is_refused_with_the_conditions_messages(path: Path) -> None:
    body = manifest(path)
    before = valid()
    before["metadata"] = body["metadata"]
    problems = admission_problems(update(before, body))
    parsed = parse_spec(body["metadata"]["name"], body["spec"])
    assert isinstance(parsed, SpecError)
    assert problems == parsed.problems  # the same words as Ready=False/InvalidSpec would show


@pytest.mark.parametrize("sample", ["minimal", "cpu-test", "full", "s3"])
def test_the_samples_are_admitted(sample: str) -> None:
    body = load_sample(sample)
    assert admission_problems(create(body)) == ()
    changed = copy.deepcopy(body)
    changed["spec"]["slo"]["p99LatencyMilliseconds"] += 1
    assert admission_problems(update(body, changed)) == ()


def test_the_warm_up_budget_is_the_operators() -> None:
    (path,) = [p for p in corpus("semantic") if "over-budget" in p.name]
    body = manifest(path)
    assert admission_problems(create(body))
    assert admission_problems(create(body), warmup_budget_bytes=2**40) == ()


def test_deleting_is_never_refused() -> None:
    request = AdmissionRequest(operation="DELETE", subresource=None, new=None, old=invalid())
    assert admission_problems(request) == ()


@pytest.mark.parametrize("subresource", ["status", "scale"])
def test_subresource_writes_are_not_judged(subresource: str) -> None:
    body = invalid()
    request = AdmissionRequest(operation="UPDATE", subresource=subresource, new=body, old=body)
    assert admission_problems(request) == ()


def test_an_update_that_leaves_an_invalid_spec_as_it_was_is_admitted() -> None:
    stored = invalid()
    labelled = copy.deepcopy(stored)
    labelled["metadata"]["labels"] = {"team": "search"}
    labelled["metadata"]["finalizers"] = []
    assert admission_problems(update(stored, labelled)) == ()


def test_an_update_that_changes_an_invalid_spec_but_leaves_it_invalid_is_refused() -> None:
    stored = invalid()
    still = copy.deepcopy(stored)
    still["spec"]["autoscaling"]["minReplicas"] = 4
    assert admission_problems(update(stored, still)) == (
        "spec.autoscaling: minReplicas (4) must not exceed maxReplicas (2)",
    )


def test_a_name_that_cannot_name_a_service_is_refused() -> None:
    body = valid()
    body["metadata"]["name"] = "Not_A_Label"
    (problem,) = admission_problems(create(body))
    assert problem.startswith("metadata.name: 'Not_A_Label' must be a DNS-1035 label")


def test_the_refusal_names_every_problem_and_counts_them() -> None:
    body = invalid()
    body["spec"]["resources"]["cpu"] = "lots"
    problems = admission_problems(create(body))
    assert len(problems) == 2
    message = refusal_message(problems)
    assert message.startswith("InferenceService refused by Kiln (2 problems): ")
    assert all(problem in message for problem in problems)
    assert refusal_message(problems[:1]) == (
        f"InferenceService refused by Kiln (1 problem): {problems[0]}"
    )
