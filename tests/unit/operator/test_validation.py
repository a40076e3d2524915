"""The checks that run before a child is written: Kubernetes' quantity grammar, label keys and
values, tolerations, model paths that stay inside their source, pre-warm floors within
maxReplicas, and one warm-up request within the operator's byte budget."""

from decimal import Decimal

import pytest

from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.api.validation import (
    SpecError,
    check_label_key,
    check_label_value,
    check_model_path,
    parse_quantity,
    parse_spec,
    warmup_request_bytes,
)
from tests.unit.operator.conftest import load_sample


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Decimal(2)),
        ("500m", Decimal("0.5")),
        ("8Gi", Decimal(8 * 2**30)),
        ("1.5", Decimal("1.5")),
        (".5", Decimal("0.5")),
        ("5.", Decimal(5)),
        ("+3k", Decimal(3000)),
        ("1e3", Decimal(1000)),
        ("12E-1", Decimal("1.2")),
        ("2E", Decimal(2 * 10**18)),
        ("-1", Decimal(-1)),
        ("0", Decimal(0)),
    ],
)
def test_quantities_of_the_kubernetes_grammar_parse(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["1.2.3", "", "m", "1x", "2GB", "1 Gi", "--1", "1e", "1Ki5", ".", "1.5.Mi", "0x10"]
)
def test_what_is_no_quantity_is_refused(text: str) -> None:
    assert parse_quantity(text) is None


@pytest.mark.parametrize(
    "key",
    ["zone", "topology.kubernetes.io/zone", "nvidia.com/gpu.product", "a_b.c-d", "x" * 63],
)
def test_label_keys_kubernetes_accepts(key: str) -> None:
    assert check_label_key("f", key) is None


@pytest.mark.parametrize(
    "key",
    ["bad key!", "", "-zone", "zone-", "Example.com/zone", "/zone", "a/b/c", "x" * 64,
     f"{'p' * 254}/zone"],
)  # fmt: skip
def test_label_keys_kubernetes_refuses(key: str) -> None:
    problem = check_label_key("spec.resources.nodeSelector", key)
    assert problem is not None and problem.startswith("spec.resources.nodeSelector: ")


def test_label_values() -> None:
    assert check_label_value("f", "") is None
    assert check_label_value("f", "A100_80gb.v2") is None
    assert check_label_value("f", "a" * 64) is not None
    assert check_label_value("f", "has space") is not None
    assert check_label_value("f", "-x") is not None


@pytest.mark.parametrize(
    "uri",
    ["pvc://models/../../etc/shadow", "pvc://models/a/../../b", "/opt/../etc/shadow",
     "file:///models/../etc/passwd", "pvc://models/.."],
)  # fmt: skip
def test_model_paths_leaving_their_source_are_refused_naming_model_uri(uri: str) -> None:
    problem = check_model_path(uri)
    assert problem is not None and problem.startswith("spec.model.uri: ")


@pytest.mark.parametrize(
    "uri", ["pvc://models/resnet/model.pt", "pvc://models/a..b/m.pt", "/opt/models/mlp.pt"]
)
def test_model_paths_inside_their_source_pass(uri: str) -> None:
    assert check_model_path(uri) is None


def spec_with(**changes: object) -> dict[str, object]:
    spec: dict[str, object] = load_sample("cpu-test")["spec"]
    for path, value in changes.items():
        node: dict[str, object] = spec
        *parents, leaf = path.split("__")
        for part in parents:
            node = node.setdefault(part, {})  # type: ignore[assignment]
        node[leaf] = value
    return spec


def refusal(spec: dict[str, object], **kwargs: int) -> str:
    result = parse_spec("svc", spec, **kwargs)
    assert isinstance(result, SpecError), "the spec was accepted"
    return result.message


def test_a_valid_sample_passes_every_check() -> None:
    assert isinstance(parse_spec("svc", spec_with()), InferenceServiceSpec)


def test_every_problem_is_reported_at_once() -> None:
    message = refusal(
        spec_with(
            resources__cpu="-1", resources__memory="1.2.3", resources__nodeSelector={"a b": "c"}
        )
    )
    assert "spec.resources.cpu: '-1' must be greater than zero" in message
    assert "spec.resources.memory: '1.2.3' is not a Kubernetes quantity" in message
    assert "spec.resources.nodeSelector: key 'a b'" in message


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"operator": "Equal", "value": "x"}, "tolerations[0].operator: must be Exists"),
        ({"key": "k", "operator": "Exists", "value": "v"}, "tolerations[0].value: must be empty"),
        ({"key": "k", "value": "not valid!"}, "tolerations[0].value: value 'not valid!'"),
        (
            {"key": "k", "value": "v", "effect": "NoSchedule", "tolerationSeconds": 5},
            "tolerations[0].tolerationSeconds: only allowed with effect NoExecute",
        ),
    ],
)
def test_tolerations_the_api_server_would_refuse(
    toleration: dict[str, object], expected: str
) -> None:
    assert expected in refusal(spec_with(resources__tolerations=[toleration]))


def test_valid_tolerations_pass() -> None:
    tolerations = [
        {"operator": "Exists"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 30},
    ]  # fmt: skip
    assert isinstance(parse_spec("svc", spec_with(resources__tolerations=tolerations)),
                      InferenceServiceSpec)  # fmt: skip


def test_a_prewarm_floor_above_max_replicas_is_refused_not_capped() -> None:
    schedule = {"name": "morning", "cron": "0 9 * * *", "durationMinutes": 30, "minReplicas": 5}
    spec = spec_with(autoscaling__minReplicas=1, autoscaling__maxReplicas=5)
    spec["prewarm"] = {"schedules": [schedule]}
    assert isinstance(parse_spec("svc", spec), InferenceServiceSpec)
    spec["prewarm"] = {"schedules": [{**schedule, "minReplicas": 6}]}
    assert "spec.prewarm.schedules[0].minReplicas (6) exceeds spec.autoscaling.maxReplicas (5)" in (
        refusal(spec)
    )


def test_warm_up_request_bytes_count_prepared_inputs_then_request_and_response_twice() -> None:
    spec = spec_with()
    spec["model"]["inputs"] = [  # type: ignore[index]
        {"name": "a", "datatype": "FP32", "shape": [-1, 100]},
        {"name": "b", "datatype": "INT64", "shape": [10]},
    ]
    spec["model"]["outputs"] = [{"name": "o", "datatype": "FP16", "shape": [7]}]  # type: ignore[index]
    spec["warmup"] = {"batchSizes": [8], "requests": 10, "concurrency": 2}
    parsed = parse_spec("svc", spec)
    assert isinstance(parsed, InferenceServiceSpec)
    inputs, outputs = 100 * 4 + 10 * 8, 7 * 2
    assert warmup_request_bytes(parsed) == inputs + 2 * (inputs + outputs)


def test_a_warm_up_request_over_the_budget_is_refused_naming_the_budget() -> None:
    spec = spec_with()
    spec["model"]["inputs"] = [{"name": "x", "datatype": "FP32", "shape": [1024]}]  # type: ignore[index]
    size = 4096 + 2 * (4096 + 4 * 10)  # the cpu-test sample's output is 10 FP32
    parsed = parse_spec("svc", spec, warmup_budget_bytes=size)
    assert isinstance(parsed, InferenceServiceSpec)
    message = refusal(spec, warmup_budget_bytes=size - 1)
    assert message.startswith(f"spec.model.inputs: one warm-up request needs {size} bytes")
    assert f"warm-up budget of {size - 1} bytes" in message
    assert "spec.warmup.batchSizes" in message
    spec["warmup"] = {"requests": 0}
    assert isinstance(parse_spec("svc", spec, warmup_budget_bytes=1), InferenceServiceSpec)
