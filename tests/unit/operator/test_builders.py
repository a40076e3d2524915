"""The pure builders: golden manifests for the full sample, and the rules each must keep."""

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kiln_operator import constants
from kiln_operator.builders import (
    Owner,
    build_deployment,
    build_pdb,
    build_runtime_config,
    build_service,
    build_service_monitor,
)
from kiln_operator.builders.deployment import RUNTIME_USER_ID
from kiln_operator.builders.naming import label_selector_string
from kiln_operator.builders.pdb import wants_pdb
from tests.unit.operator.conftest import assert_golden, sample_spec

OWNER = Owner(name="resnet50", namespace="vision", uid="0b6f5a8e-3c1d-4e0f-9a7b-5d2c1e8f4a6b")


def pod_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return spec


def runtime_container(manifest: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod_spec(manifest)["containers"][0]
    return container


def test_golden_children_of_the_full_sample() -> None:
    spec = sample_spec("full")
    assert_golden("deployment-full.yaml", build_deployment(spec, OWNER, initial_replicas=2))
    assert_golden("service.yaml", build_service(OWNER, scrape_annotations=True))
    assert_golden("pdb.yaml", build_pdb(OWNER))
    assert_golden("servicemonitor.yaml", build_service_monitor(OWNER))


def test_golden_deployment_of_the_minimal_sample() -> None:
    owner = Owner(name="mlp", namespace="default", uid="uid-1")
    assert_golden("deployment-minimal.yaml", build_deployment(sample_spec("minimal"), owner))


def test_replicas_are_set_only_when_creating() -> None:
    spec = sample_spec("full")
    assert "replicas" not in build_deployment(spec, OWNER)["spec"]
    assert build_deployment(spec, OWNER, initial_replicas=3)["spec"]["replicas"] == 3


def test_the_same_spec_builds_the_same_manifest() -> None:
    assert build_deployment(sample_spec("full"), OWNER) == build_deployment(
        sample_spec("full"), OWNER
    )


def test_every_child_is_owned_and_labelled() -> None:
    spec = sample_spec("full")
    for manifest in (
        build_deployment(spec, OWNER),
        build_service(OWNER, scrape_annotations=False),
        build_pdb(OWNER),
        build_service_monitor(OWNER),
    ):
        (reference,) = manifest["metadata"]["ownerReferences"]
        assert reference["uid"] == OWNER.uid
        assert reference["controller"] is True
        assert reference["kind"] == "InferenceService"
        labels = manifest["metadata"]["labels"]
        assert labels[constants.LABEL_MANAGED_BY] == constants.MANAGER
        assert labels[constants.LABEL_INFERENCESERVICE] == OWNER.name


def test_gpu_pods_ask_for_gpus_select_the_product_and_tolerate_the_taint() -> None:
    manifest = build_deployment(sample_spec("full"), OWNER)
    container = runtime_container(manifest)
    assert container["resources"]["limits"][constants.GPU_RESOURCE] == "1"
    assert container["resources"]["requests"][constants.GPU_RESOURCE] == "1"
    pod = pod_spec(manifest)
    assert pod["nodeSelector"] == {
        constants.GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB",
        "topology.kubernetes.io/zone": "zone-a",
    }
    assert pod["tolerations"][0] == {
        "key": constants.GPU_RESOURCE,
        "operator": "Exists",
        "effect": "NoSchedule",
    }
    assert pod["tolerations"][1]["key"] == "dedicated"


def test_cpu_pods_neither_ask_for_nor_select_gpus() -> None:
    manifest = build_deployment(sample_spec("cpu-test"), OWNER)
    assert constants.GPU_RESOURCE not in runtime_container(manifest)["resources"]["limits"]
    assert pod_spec(manifest)["nodeSelector"] == {}
    assert pod_spec(manifest)["tolerations"] == []


def test_imitated_gpus_change_only_the_device_and_say_so_on_the_pod() -> None:
    """The platform's KILN_IMITATED_GPUS: a GPU pod keeps its GPU request, product selector and
    toleration; its runtime is told CPU, and its template carries the annotation."""
    spec = sample_spec("full")
    real = build_deployment(spec, OWNER)
    imitated = build_deployment(spec, OWNER, imitated_gpus=True)
    real_config = json.loads(runtime_container(real)["env"][0]["value"])
    imitated_config = json.loads(runtime_container(imitated)["env"][0]["value"])
    assert real_config["optimization"]["device"] == "cuda"
    assert imitated_config["optimization"]["device"] == "cpu"
    assert {**imitated_config, "optimization": real_config["optimization"]} == real_config
    annotations = imitated["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        constants.ANNOTATION_IMITATED_GPUS: "requests 1 nvidia.com/gpu but runs on CPU: the "
        "operator's KILN_IMITATED_GPUS declares this cluster's GPUs imitated"
    }
    assert "annotations" not in real["spec"]["template"]["metadata"]
    # Nothing else differs: placement and resources are the GPU pod's.
    runtime_container(imitated)["env"] = runtime_container(real)["env"]
    del imitated["spec"]["template"]["metadata"]["annotations"]
    assert imitated == real


def test_imitated_gpus_leave_cpu_pods_alone() -> None:
    spec = sample_spec("cpu-test")
    assert build_deployment(spec, OWNER, imitated_gpus=True) == build_deployment(spec, OWNER)


def test_ports_probes_and_the_warm_up_gate() -> None:
    manifest = build_deployment(sample_spec("full"), OWNER)
    container = runtime_container(manifest)
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [
        ("http", 8000),
        ("grpc", 8001),
        ("metrics", 8002),
    ]
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    # startup budget covers warm-up timeout (600 s) plus load time
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    assert pod_spec(manifest)["readinessGates"] == [
        {"conditionType": constants.CONDITION_WARMED_UP}
    ]


def test_no_readiness_gate_when_warm_up_is_disabled() -> None:
    spec = sample_spec("cpu-test")
    spec = spec.model_copy(update={"warmup": spec.warmup.model_copy(update={"requests": 0})})
    assert pod_spec(build_deployment(spec, OWNER))["readinessGates"] == []


def test_restricted_security_profile_and_zero_unavailable_rollouts() -> None:
    manifest = build_deployment(sample_spec("full"), OWNER)
    pod = pod_spec(manifest)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = runtime_container(manifest)["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert manifest["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod["automountServiceAccountToken"] is False


def test_drain_sets_grace_period_and_pre_stop_pause() -> None:
    manifest = build_deployment(sample_spec("full"), OWNER)
    assert pod_spec(manifest)["terminationGracePeriodSeconds"] == 5 + 30 + 5
    assert runtime_container(manifest)["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}


def test_pvc_models_are_mounted_read_only() -> None:
    manifest = build_deployment(sample_spec("full"), OWNER)
    volumes = {v["name"]: v for v in pod_spec(manifest)["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {
        "claimName": "model-store",
        "readOnly": True,
    }
    mounts = {m["name"]: m for m in runtime_container(manifest)["volumeMounts"]}
    assert mounts["model"] == {
        "name": "model",
        "mountPath": "/models/model-store",
        "readOnly": True,
    }
    args = runtime_container(manifest)["args"]
    assert args[args.index("--model-path") + 1] == "/models/model-store/resnet50/model.pt2"


def test_runtime_config_env_follows_the_contract() -> None:
    spec = sample_spec("full")
    env = {e["name"]: e["value"] for e in runtime_container(build_deployment(spec, OWNER))["env"]}
    config = json.loads(env[constants.ENV_RUNTIME_CONFIG])
    assert config == build_runtime_config(spec, OWNER.name)
    assert config["model"] == {
        "name": "resnet50",
        "version": "3",
        "format": "torch_export",
        "inputs": [{"name": "input", "datatype": "FP16", "shape": [3, 224, 224]}],
        "outputs": [{"name": "logits", "datatype": "FP16", "shape": [1000]}],
    }
    assert config["optimization"] == {
        "mode": "compile",
        "precision": "fp16",
        "cudaGraphs": True,
        "device": "cuda",
    }
    assert config["batching"] == {
        "maxBatchSize": 64,
        "maxQueueDelayMicroseconds": 3000,
        "maxQueueSize": 512,
    }
    assert config["warmup"] == {"batchSizes": [1, 8, 32, 64]}
    assert config["drain"] == {"timeoutSeconds": 30}


def test_runtime_warms_up_one_and_the_largest_batch_by_default() -> None:
    config = build_runtime_config(sample_spec("cpu-test"), "mlp-cpu")
    assert config["warmup"] == {"batchSizes": [1, 16]}
    assert config["optimization"]["device"] == "cpu"


def test_service_exposes_http_grpc_and_metrics_and_scrape_annotations_on_request() -> None:
    service = build_service(OWNER, scrape_annotations=True)
    assert [p["port"] for p in service["spec"]["ports"]] == [8000, 8001, 8002]
    assert service["metadata"]["annotations"][constants.ANNOTATION_PROMETHEUS_PORT] == "8002"
    assert "annotations" not in build_service(OWNER, scrape_annotations=False)["metadata"]
    assert (
        service["spec"]["selector"]
        == build_deployment(sample_spec("full"), OWNER)["spec"]["selector"]["matchLabels"]
    )


@pytest.mark.parametrize(("replicas", "wanted"), [(0, False), (1, False), (2, True), (9, True)])
def test_a_pdb_only_with_more_than_one_replica(replicas: int, wanted: bool) -> None:
    assert wants_pdb(replicas) is wanted


def test_status_selector_string_matches_the_pod_selector() -> None:
    assert label_selector_string("mlp") == (
        "app.kubernetes.io/component=predictor,app.kubernetes.io/instance=mlp"
    )


def test_pods_run_as_the_runtime_images_own_user() -> None:
    """The pod's uid and the image's user are one value: a kubelet runs the image as the pod
    says, and files the image owns must stay readable."""
    dockerfile = (Path(__file__).resolve().parents[3] / "runtime_image" / "Dockerfile").read_text()
    created = re.search(r"useradd .*--uid (\d+)", dockerfile)
    user = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE)
    assert created is not None and user is not None
    assert int(created.group(1)) == RUNTIME_USER_ID
    assert (int(user.group(1)), int(user.group(2))) == (RUNTIME_USER_ID, RUNTIME_USER_ID)


def test_the_cache_credentials_come_from_the_secret_by_reference() -> None:
    from kiln_operator.api.validation import parse_spec
    from tests.unit.operator.conftest import load_sample

    document = load_sample("minimal")["spec"]
    document["model"] = {**document["model"], "deterministic": True}
    redis = {"address": "redis:6379", "secretName": "redis-credentials"}
    document["runtime"] = {**document["runtime"], "cache": {"redis": redis}}
    spec = parse_spec(OWNER.name, document)
    env = runtime_container(build_deployment(spec, OWNER))["env"]  # type: ignore[arg-type]
    config = json.loads(env[0]["value"])
    assert config["cache"]["keyPrefix"] == "kiln:vision/resnet50:"
    assert config["cache"]["redis"]["address"] == "redis:6379"
    assert env[1:] == [
        {
            "name": constants.ENV_CACHE_REDIS_USERNAME,
            "valueFrom": {
                "secretKeyRef": {"name": "redis-credentials", "key": "username", "optional": True}
            },
        },
        {
            "name": constants.ENV_CACHE_REDIS_PASSWORD,
            "valueFrom": {"secretKeyRef": {"name": "redis-credentials", "key": "password"}},
        },
    ]
    assert "password" not in env[0]["value"]
    from kiln_runtime.redis_cache import ENV_PASSWORD, ENV_USERNAME  # the contract's other half

    assert (env[1]["name"], env[2]["name"]) == (ENV_USERNAME, ENV_PASSWORD)
