"""s3:// and https:// models: the fetch init container, its volume, its Secret, and where the
runtime then loads the model from."""

from typing import Any

from kiln_operator import constants
from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.builders import Owner, build_deployment
from kiln_operator.builders.compare import covers
from tests.unit.operator.conftest import assert_golden, load_sample, sample_spec

OWNER = Owner(name="mlp-s3", namespace="team-a", uid="5a1f0c2e-8d4b-4c3a-9e7f-2b6d1a0c9e8f")


def _spec(**model: Any) -> InferenceServiceSpec:
    document = load_sample("minimal")["spec"]
    document["model"] = {**document["model"], **model}
    return InferenceServiceSpec.model_validate(document)


def _pod(spec: InferenceServiceSpec) -> dict[str, Any]:
    pod: dict[str, Any] = build_deployment(spec, OWNER)["spec"]["template"]["spec"]
    return pod


def test_golden_deployment_of_the_s3_sample() -> None:
    assert_golden("deployment-s3.yaml", build_deployment(sample_spec("s3"), OWNER))


def test_the_init_container_fetches_into_the_volume_the_runtime_reads_read_only() -> None:
    pod = _pod(sample_spec("s3"))
    (fetch,) = pod["initContainers"]
    runtime = pod["containers"][0]
    assert fetch["name"] == constants.FETCH_CONTAINER
    assert fetch["image"] == runtime["image"]
    assert fetch["command"] == ["python", "-m", "kiln_runtime", "fetch"]
    assert fetch["securityContext"] == runtime["securityContext"]
    assert fetch["terminationMessagePolicy"] == "FallbackToLogsOnError"
    args = fetch["args"]
    assert args[args.index("--uri") + 1] == "s3://models/mlp/v3/model.pt"
    assert args[args.index("--endpoint") + 1] == "https://minio.storage.svc:9000"
    assert args[args.index("--max-bytes") + 1] == "2147483648"
    assert "--path-style" in args and "--no-verify-tls" not in args
    fetch_mounts = {m["name"]: m for m in fetch["volumeMounts"]}
    runtime_mounts = {m["name"]: m for m in runtime["volumeMounts"]}
    assert fetch_mounts["model"] == {"name": "model", "mountPath": "/models/fetched"}
    assert runtime_mounts["model"]["readOnly"] is True
    model_path = runtime["args"][runtime["args"].index("--model-path") + 1]
    assert model_path == "/models/fetched/model/model.pt"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model"] == {"name": "model", "emptyDir": {"sizeLimit": str(2 * 2**31)}}


def test_the_secret_reaches_the_fetcher_only() -> None:
    pod = _pod(sample_spec("s3"))
    (fetch,) = pod["initContainers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-storage-secret"]["secret"]["secretName"] == "model-store-credentials"
    assert any(m["name"] == "model-storage-secret" for m in fetch["volumeMounts"])
    assert all(m["name"] != "model-storage-secret" for m in pod["containers"][0]["volumeMounts"])
    assert "env" not in fetch  # no credential ever travels in the pod spec


def test_a_prefix_is_loaded_as_a_directory_and_https_with_its_sha256() -> None:
    prefix = _pod(_spec(uri="s3://models/mlp/v3/"))
    args = prefix["containers"][0]["args"]
    assert args[args.index("--model-path") + 1] == "/models/fetched/model"

    digest = "ab" * 32
    https = _pod(_spec(uri="https://models.example/mlp.pt", sha256=digest))
    fetch_args = https["initContainers"][0]["args"]
    assert fetch_args[fetch_args.index("--sha256") + 1] == digest
    assert "--credentials-dir" not in fetch_args
    runtime_args = https["containers"][0]["args"]
    assert runtime_args[runtime_args.index("--model-path") + 1] == "/models/fetched/model/mlp.pt"


def test_workload_identity_sets_the_service_account_and_no_secret() -> None:
    pod = _pod(_spec(uri="s3://models/m.pt", storage={"serviceAccountName": "model-reader"}))
    assert pod["serviceAccountName"] == "model-reader"
    assert pod["automountServiceAccountToken"] is False
    assert all("secret" not in volume for volume in pod["volumes"])


def test_a_shared_cache_claim_is_mounted_into_the_fetcher_only() -> None:
    cache = {"claimName": "model-cache", "maxBytes": 10**12}
    pod = _pod(_spec(uri="s3://models/m/", storage={"cache": cache}))
    (fetch,) = pod["initContainers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "model-cache"}
    assert {"name": "model-cache", "mountPath": "/models/cache"} in fetch["volumeMounts"]
    assert all(m["name"] != "model-cache" for m in pod["containers"][0]["volumeMounts"])
    args = fetch["args"]
    assert args[args.index("--cache-dir") + 1] == "/models/cache"
    assert args[args.index("--cache-max-bytes") + 1] == str(10**12)


def test_images_and_claims_have_no_init_container() -> None:
    assert _pod(sample_spec("minimal"))["initContainers"] == []
    assert _pod(sample_spec("full"))["initContainers"] == []


def test_a_served_size_limit_in_another_spelling_is_not_drift() -> None:
    desired = {"emptyDir": {"sizeLimit": str(2 * 64 * 2**30)}}
    assert covers({"emptyDir": {"sizeLimit": "128Gi"}}, desired)
    assert not covers({"emptyDir": {"sizeLimit": "64Gi"}}, desired)
