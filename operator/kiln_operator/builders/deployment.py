"""build_deployment: the runtime pods of an InferenceService.

Why it exists: everything the model owner asked for that concerns a pod — image, runtime
config, GPUs and their placement, health probes, drain timing, the warm-up readiness gate,
the restricted security profile — is translated here, and only here.

`replicas` is set only when `initial_replicas` is given (creation): on an existing Deployment
the autoscaler owns it and the reconcile loop never writes it.

`imitated_gpus` is the platform's declaration that its GPUs are imitated (the operator's
KILN_IMITATED_GPUS: the local cluster, kind): GPU pods keep their GPU request, node selector and
toleration, their runtime runs on CPU, and the pod template carries ANNOTATION_IMITATED_GPUS so
nobody takes such a pod for a GPU run.
"""

from typing import Any

from kiln_operator import constants
from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.api.v1alpha1.kube import wire
from kiln_operator.api.v1alpha1.model import CACHE_ROOT, FETCH_ROOT, ModelStorage
from kiln_operator.builders.naming import Manifest, Owner, child_labels, selector_labels
from kiln_operator.builders.runtime_config import render_runtime_config

MODEL_VOLUME = "model"
TMP_VOLUME = "tmp"
CACHE_VOLUME = "model-cache"
STORAGE_SECRET_VOLUME = "model-storage-secret"
STORAGE_SECRET_PATH = "/var/run/secrets/kiln/model-storage"
"""Where the fetch init container (only) reads the spec's Secret."""
RUNTIME_USER_ID = 10001
"""A non-root uid for the restricted Pod Security profile: the runtime image's own user
(`runtime_image/Dockerfile` creates it; a test keeps the two equal)."""
STARTUP_PERIOD_SECONDS = 5
PROGRESS_DEADLINE_FLOOR_SECONDS = 600


def _gpu_placement(spec: InferenceServiceSpec) -> tuple[dict[str, str], list[Manifest]]:
    """Node selector and tolerations: GPU product and GPU taint first, then the user's own."""
    resources = spec.resources
    node_selector: dict[str, str] = {}
    tolerations: list[Manifest] = []
    if resources.gpu_count > 0:
        tolerations.append(
            {"key": constants.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
        )
        if resources.gpu_product is not None:
            node_selector[constants.GPU_PRODUCT_LABEL] = resources.gpu_product
    node_selector.update(resources.node_selector)
    tolerations.extend(
        toleration.model_dump(by_alias=True, exclude_none=True)
        for toleration in resources.tolerations
    )
    return node_selector, tolerations


def _extra_env(spec: InferenceServiceSpec) -> list[Manifest]:
    """spec.pod.env, after Kiln's own variables (validation refuses KILN_ names)."""
    return [wire(variable) for variable in spec.pod.env]


OPTIONAL_POD_FIELDS = (
    "serviceAccountName",
    "priorityClassName",
    "runtimeClassName",
    "imagePullSecrets",
    "affinity",
    "topologySpreadConstraints",
)
"""Pod spec fields present only when the spec sets them (so a Deployment built before they
existed is unchanged): one left live after the spec dropped it is drift (builders/compare.py)."""


def _spread(spec: InferenceServiceSpec, owner: Owner) -> list[Manifest]:
    """spec.pod.topologySpreadConstraints; one without a labelSelector counts this service's
    own pods, so a profile can spread every service without naming one."""
    constraints = []
    for constraint in spec.pod.topology_spread_constraints:
        rendered = wire(constraint)
        rendered.setdefault("labelSelector", {"matchLabels": selector_labels(owner.name)})
        constraints.append(rendered)
    return constraints


def _pod_settings(spec: InferenceServiceSpec, owner: Owner) -> Manifest:
    """The OPTIONAL_POD_FIELDS the spec sets."""
    pod = spec.pod
    fields: Manifest = {
        "serviceAccountName": spec.service_account_name(),
        "priorityClassName": pod.priority_class_name,
        "runtimeClassName": pod.runtime_class_name,
        "imagePullSecrets": [wire(secret) for secret in pod.image_pull_secrets],
        "affinity": wire(pod.affinity) if pod.affinity is not None else None,
        "topologySpreadConstraints": _spread(spec, owner),
    }
    return {key: value for key, value in fields.items() if value}


def _resources(spec: InferenceServiceSpec) -> Manifest:
    amounts: dict[str, Any] = {"cpu": spec.resources.cpu, "memory": spec.resources.memory}
    if spec.resources.gpu_count > 0:
        amounts[constants.GPU_RESOURCE] = str(spec.resources.gpu_count)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _probes(spec: InferenceServiceSpec) -> Manifest:
    """Startup allows model load plus the runtime's own warm-up; liveness and readiness then
    watch the runtime's health endpoints.

    Not (yet) the kubelet's native gRPC probe, though the runtime serves one for liveness
    (grpc.health.v1.Health/Check of service ``liveness``; ``""`` is readiness, as
    ``/v2/health/ready``): the real-node test of a killed runtime
    (``tests/e2e/test_real_node.py``) failed on the branch that added it, with gRPC probes and
    then with these HTTP ones too, so the switch waits until that is understood
    (docs/runtime.md)."""
    startup_budget = spec.warmup.timeout_seconds + 300
    return {
        "startupProbe": {
            "httpGet": {"path": constants.HEALTH_LIVE_PATH, "port": constants.PORT_NAME_HTTP},
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "failureThreshold": -(-startup_budget // STARTUP_PERIOD_SECONDS),
        },
        "livenessProbe": {
            "httpGet": {"path": constants.HEALTH_LIVE_PATH, "port": constants.PORT_NAME_HTTP},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": constants.HEALTH_READY_PATH, "port": constants.PORT_NAME_HTTP},
            "periodSeconds": 2,
            "failureThreshold": 2,
        },
    }


def _restricted_security() -> Manifest:
    """The Pod Security `restricted` profile, for the runtime and the fetch init container
    alike (a fresh copy each: manifests share no nested objects)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _fetch_container(spec: InferenceServiceSpec) -> Manifest:
    """`kiln_runtime fetch` in the runtime image: the model into the model volume, verified;
    a failure ends in a termination message the reconcile loop carries to Ready."""
    model = spec.model
    storage = model.storage or ModelStorage()
    args = ["--uri", model.uri, "--dest", FETCH_ROOT, "--max-bytes", str(storage.max_bytes)]
    if model.sha256 is not None:
        args += ["--sha256", model.sha256]
    if storage.endpoint is not None:
        args += ["--endpoint", storage.endpoint]
    if storage.region is not None:
        args += ["--region", storage.region]
    if storage.path_style:
        args.append("--path-style")
    if not storage.tls_verify:
        args.append("--no-verify-tls")
    mounts: list[Manifest] = [
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
        {"name": MODEL_VOLUME, "mountPath": FETCH_ROOT},
    ]
    if storage.cache is not None:
        args += ["--cache-dir", CACHE_ROOT, "--cache-max-bytes", str(storage.cache.max_bytes)]
        mounts.append({"name": CACHE_VOLUME, "mountPath": CACHE_ROOT})
    if storage.secret_name is not None:
        args += ["--credentials-dir", STORAGE_SECRET_PATH]
        mounts.append(
            {"name": STORAGE_SECRET_VOLUME, "mountPath": STORAGE_SECRET_PATH, "readOnly": True}
        )
    return {
        "name": constants.FETCH_CONTAINER,
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": ["python", "-m", "kiln_runtime", "fetch"],
        "args": args,
        **({"env": _extra_env(spec)} if spec.pod.env else {}),
        # The runtime's own CPU and memory: the pod's request stays what the runtime asks.
        "resources": {
            "requests": {"cpu": spec.resources.cpu, "memory": spec.resources.memory},
            "limits": {"cpu": spec.resources.cpu, "memory": spec.resources.memory},
        },
        "securityContext": _restricted_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }


def _cache_credentials(spec: InferenceServiceSpec) -> list[Manifest]:
    """The response cache's Redis credentials, from the user's Secret by reference: their
    values never enter the pod template (the kubelet resolves them; a missing Secret keeps the
    container from starting, which Ready reports)."""
    cache = spec.runtime.cache
    if cache is None or cache.redis is None or cache.redis.secret_name is None:
        return []
    secret = cache.redis.secret_name
    return [
        {
            "name": constants.ENV_CACHE_REDIS_USERNAME,
            "valueFrom": {"secretKeyRef": {"name": secret, "key": "username", "optional": True}},
        },
        {
            "name": constants.ENV_CACHE_REDIS_PASSWORD,
            "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}},
        },
    ]


def _container(spec: InferenceServiceSpec, owner: Owner, imitated_gpus: bool) -> Manifest:
    model_path = spec.model.path_in_container(constants.MODEL_MOUNT_ROOT)
    mounts: list[Manifest] = [{"name": TMP_VOLUME, "mountPath": "/tmp"}]
    claim = spec.model.pvc_claim
    if spec.model.is_fetched:
        mounts.append({"name": MODEL_VOLUME, "mountPath": FETCH_ROOT, "readOnly": True})
    if claim is not None:
        mounts.append(
            {
                "name": MODEL_VOLUME,
                "mountPath": f"{constants.MODEL_MOUNT_ROOT}/{claim}",
                "readOnly": True,
            }
        )
    container: Manifest = {
        "name": constants.RUNTIME_CONTAINER,
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": ["python", "-m", "kiln_runtime", "serve"],
        "args": [
            "--model-path",
            model_path,
            "--model-name",
            spec.model_name(owner.name),
            "--http-port",
            str(constants.HTTP_PORT),
            "--grpc-port",
            str(constants.GRPC_PORT),
            "--metrics-port",
            str(constants.METRICS_PORT),
        ],
        "env": [
            {
                "name": constants.ENV_RUNTIME_CONFIG,
                "value": render_runtime_config(
                    spec, owner.name, imitated_gpus=imitated_gpus, namespace=owner.namespace
                ),
            },
            *_cache_credentials(spec),
            *_extra_env(spec),
        ],
        "ports": [
            {
                "name": constants.PORT_NAME_HTTP,
                "containerPort": constants.HTTP_PORT,
                "protocol": "TCP",
            },
            {
                "name": constants.PORT_NAME_GRPC,
                "containerPort": constants.GRPC_PORT,
                "protocol": "TCP",
            },
            {
                "name": constants.PORT_NAME_METRICS,
                "containerPort": constants.METRICS_PORT,
                "protocol": "TCP",
            },
        ],
        "resources": _resources(spec),
        **_probes(spec),
        "securityContext": _restricted_security(),
        # The runtime writes why it exits at start-up (the model does not load, the config is
        # refused) to the termination log, and the reconcile loop carries it to Ready; anything
        # else that kills it leaves its last log lines there instead.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }
    # Empty when there is no pause: an empty desired value makes a stale live one drift.
    container["lifecycle"] = (
        {"preStop": {"sleep": {"seconds": spec.drain.pre_stop_delay_seconds}}}
        if spec.drain.pre_stop_delay_seconds > 0
        else {}
    )
    return container


def _volumes(spec: InferenceServiceSpec) -> list[Manifest]:
    volumes: list[Manifest] = [{"name": TMP_VOLUME, "emptyDir": {}}]
    storage = spec.model.storage or ModelStorage()
    if spec.model.is_fetched:
        # Twice the model: the fetcher stages beside the published copy on a re-fetch.
        volumes.append(
            {"name": MODEL_VOLUME, "emptyDir": {"sizeLimit": str(2 * storage.max_bytes)}}
        )
    if spec.model.is_fetched and storage.cache is not None:
        volumes.append(
            {
                "name": CACHE_VOLUME,
                "persistentVolumeClaim": {"claimName": storage.cache.claim_name},
            }
        )
    if spec.model.is_fetched and storage.secret_name is not None:
        volumes.append(
            {
                "name": STORAGE_SECRET_VOLUME,
                "secret": {"secretName": storage.secret_name, "defaultMode": 0o400},
            }
        )
    claim = spec.model.pvc_claim
    if claim is not None:
        volumes.append(
            {
                "name": MODEL_VOLUME,
                "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
            }
        )
    return volumes


def build_pod_spec(
    spec: InferenceServiceSpec, owner: Owner, *, imitated_gpus: bool = False
) -> Manifest:
    """The runtime pod's spec."""
    node_selector, tolerations = _gpu_placement(spec)
    pod: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": spec.drain.termination_grace_period_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_USER_ID,
            "runAsGroup": RUNTIME_USER_ID,
            "fsGroup": RUNTIME_USER_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(spec, owner, imitated_gpus)],
        "volumes": _volumes(spec),
    }
    pod["initContainers"] = [_fetch_container(spec)] if spec.model.is_fetched else []
    pod.update(_pod_settings(spec, owner))
    # Optional parts are always present, empty when unused, so that removing them from the
    # spec removes them from the live Deployment (an empty desired value must be empty live).
    pod["readinessGates"] = (
        [{"conditionType": constants.CONDITION_WARMED_UP}] if spec.warmup.requests > 0 else []
    )
    pod["nodeSelector"] = node_selector
    pod["tolerations"] = tolerations
    return pod


def _template_metadata(spec: InferenceServiceSpec, owner: Owner, imitated_gpus: bool) -> Manifest:
    # Kiln's labels last: validation refuses spec.pod.labels that would replace one.
    metadata: Manifest = {"labels": {**spec.pod.labels, **child_labels(owner.name)}}
    annotations: dict[str, str] = dict(spec.pod.annotations)
    if annotations:
        # Which live annotations are the spec's: one dropped from the spec changes this value,
        # and Kiln's own template annotations are compared exactly (builders/compare.py).
        annotations[constants.ANNOTATION_POD_ANNOTATIONS] = ",".join(sorted(annotations))
    if imitated_gpus and spec.resources.gpu_count > 0:
        # Only when set: an empty desired map would demand that the live one be empty, and
        # `kubectl rollout restart` writes its own annotation there. Turning the setting off
        # changes the runtime config too, so that update replaces the template, annotation and all.
        annotations |= {
            constants.ANNOTATION_IMITATED_GPUS: (
                f"requests {spec.resources.gpu_count} {constants.GPU_RESOURCE} but runs on CPU: "
                f"the operator's {constants.ENV_IMITATED_GPUS} declares this cluster's GPUs "
                "imitated"
            )
        }
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def build_deployment(
    spec: InferenceServiceSpec,
    owner: Owner,
    initial_replicas: int | None = None,
    *,
    imitated_gpus: bool = False,
) -> Manifest:
    """The desired Deployment. Pass `initial_replicas` only to create it."""
    attempts = spec.warmup.retries + 1
    deployment_spec: Manifest = {
        "selector": {"matchLabels": selector_labels(owner.name)},
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
        },
        "revisionHistoryLimit": 5,
        "progressDeadlineSeconds": max(
            PROGRESS_DEADLINE_FLOOR_SECONDS, spec.warmup.timeout_seconds * attempts + 300
        ),
        "template": {
            "metadata": _template_metadata(spec, owner, imitated_gpus),
            "spec": build_pod_spec(spec, owner, imitated_gpus=imitated_gpus),
        },
    }
    if initial_replicas is not None:
        deployment_spec = {"replicas": initial_replicas, **deployment_spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owner.metadata(),
        "spec": deployment_spec,
    }
