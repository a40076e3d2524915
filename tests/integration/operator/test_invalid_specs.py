"""The invalid corpus against the real API server and operator: schema errors are refused by
`kubectl apply` with a message naming the field; semantic errors are accepted, conditioned
Ready=False/InvalidSpec with a message naming the field and a Warning event, and the last valid
spec keeps serving untouched."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    SAMPLES,
    OperatorProcess,
    apply,
    get,
    getter,
    on_fake_nodes,
    wait_condition,
)
from tests.unit.operator.conftest import corpus, expectation

pytestmark = pytest.mark.integration


def load(path: Path, name: str | None = None) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(path.read_text())
    if name is not None:
        manifest["metadata"]["name"] = name
    return manifest


def test_schema_errors_are_refused_at_apply_naming_the_field(
    kiln_crds: Cluster, namespace: str
) -> None:
    for path in corpus("schema"):
        result = apply(kiln_crds, namespace, load(path), check=False)
        assert result.returncode != 0, f"{path.name} was accepted"
        assert expectation(path) in result.stderr, f"{path.name}: {result.stderr}"
    assert kiln_crds.get_json("inferenceservices", "-n", namespace)["items"] == []


def test_semantic_errors_condition_the_service_and_keep_the_last_valid_spec_serving(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    valid = on_fake_nodes(load(SAMPLES / "cpu-test.yaml"))
    cases = [
        (path, f"case-{index}")
        for index, path in enumerate(corpus("semantic"))
        if "name-not-a-dns-label" not in path.name
    ]
    for _, name in cases:
        apply(cluster, namespace, {**valid, "metadata": {"name": name}})
    before: dict[str, dict[str, Any]] = {}
    for _, name in cases:
        deployment = wait_for(
            getter(cluster, namespace, "deployment", name),
            timeout=120,
            description=f"the Deployment of {name}",
        )
        before[name] = deployment

    for path, name in cases:
        apply(cluster, namespace, load(path, name))
    for path, name in cases:
        ready = wait_condition(
            cluster,
            namespace,
            name=name,
            kind="Ready",
            status="False",
            reason="InvalidSpec",
            timeout=120,
        )
        assert expectation(path) in ready["message"], f"{path.name}: {ready['message']}"
        spec_valid = wait_condition(cluster, namespace, name=name, kind="SpecValid", status="False")
        assert spec_valid["message"] == ready["message"]
        after = get(cluster, namespace, "deployment", name)
        assert after is not None, f"{path.name}: the Deployment was deleted"
        assert after["metadata"]["generation"] == before[name]["metadata"]["generation"]
        assert after["spec"]["template"] == before[name]["spec"]["template"]
        assert get(cluster, namespace, "service", name) is not None
    events = kiln_crds_events(cluster, namespace)
    for path, name in cases:
        assert any(
            e["involvedObject"]["name"] == name and expectation(path) in e["message"]
            for e in events
        ), f"no Warning event for {path.name}"


def kiln_crds_events(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = cluster.get_json(
        "events", "-n", namespace, "--field-selector", "type=Warning,reason=InvalidSpec"
    )["items"]
    return events


def test_an_invalid_service_never_gets_children_and_recovers_when_fixed(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    (path,) = [p for p in corpus("semantic") if "min-above-max" in p.name]
    apply(cluster, namespace, load(path, "fresh"))
    wait_condition(
        cluster, namespace, name="fresh", kind="Ready", status="False", reason="InvalidSpec"
    )
    assert get(cluster, namespace, "deployment", "fresh") is None
    fixed = load(path, "fresh")
    fixed["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2}
    apply(cluster, namespace, fixed)
    wait_condition(cluster, namespace, name="fresh", kind="SpecValid", status="True")
    wait_for(
        lambda: get(cluster, namespace, "deployment", "fresh"),
        timeout=120,
        description="the Deployment once the spec is fixed",
    )


def test_a_name_that_cannot_name_a_service_is_reported(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    (path,) = [p for p in corpus("semantic") if "name-not-a-dns-label" in p.name]
    manifest = load(path)
    apply(cluster, namespace, manifest)
    name = manifest["metadata"]["name"]
    ready = wait_condition(
        cluster, namespace, name=name, kind="Ready", status="False", reason="InvalidSpec"
    )
    assert expectation(path) in ready["message"]
    assert get(cluster, namespace, "deployment", name) is None
