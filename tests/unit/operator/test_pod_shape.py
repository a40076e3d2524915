"""spec.pod and spec.route, pure: Kubernetes' own types, the fields reaching the pod template,
drift when one is dropped, Kiln's own names refused, profiles merging them, the policies'
guardrails, and the routes rendered for Gateway API or Ingress."""

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kiln_operator import constants
from kiln_operator.api import kubeschemas
from kiln_operator.api.crdgen import build_crd, build_platform_crd
from kiln_operator.api.v1alpha1 import InferenceServiceSpec
from kiln_operator.api.validation import SpecError, parse_spec
from kiln_operator.builders.compare import build_update, needs_update
from kiln_operator.builders.deployment import build_deployment
from kiln_operator.builders.naming import Manifest, Owner, selector_labels
from kiln_operator.builders.route import build_grpc_route, build_http_route, build_ingress
from kiln_operator.k8s.resources import CRDS, HTTP_ROUTES, INFERENCE_SERVICES, INGRESSES
from kiln_operator.profiles.effective import PlatformState, effective_spec
from tests.sessioncluster import missing_component
from tests.unit.operator.conftest import REPO, load_sample
from tests.unit.operator.test_reconciler import NAMESPACE, FakeKube, add_service, live, reconciler

OWNER = Owner(name="mlp", namespace="vision", uid="uid-1")
GATEWAY = {"name": "models", "namespace": "gateways", "sectionName": "https"}
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["inference"]}]}
            ]
        }
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "mlp"}},
                },
            }
        ]
    },
}
POD = {
    "labels": {"cost-center": "ml-42", "team": "vision"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "env": [
        {"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tokens", "key": "hub"}}},
    ],
    "affinity": AFFINITY,
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
        }
    ],
    "priorityClassName": "inference-high",
    "runtimeClassName": "nvidia",
    "imagePullSecrets": [{"name": "registry-creds"}],
    "serviceAccountName": "model-reader",
}


def spec_with(**parts: Any) -> dict[str, Any]:
    spec: dict[str, Any] = copy.deepcopy(load_sample("minimal")["spec"])
    spec.update(copy.deepcopy(parts))
    return spec


def parsed(spec: dict[str, Any]) -> InferenceServiceSpec:
    result = parse_spec("mlp", spec)
    assert not isinstance(result, SpecError), result
    return result


def problems(spec: dict[str, Any]) -> str:
    result = parse_spec("mlp", spec)
    assert isinstance(result, SpecError), "the spec was accepted"
    return result.message


def pod_template(spec: dict[str, Any]) -> Manifest:
    template: Manifest = build_deployment(parsed(spec), OWNER)["spec"]["template"]
    return template


# --- Kubernetes' own types --------------------------------------------------------------------


def test_the_embedded_types_are_kubernetes_own_with_their_descriptions() -> None:
    schemas = kubeschemas.load()
    crd_pod = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["pod"]["properties"]
    spread = crd_pod["topologySpreadConstraints"]["items"]
    assert set(spread["required"]) == {"maxSkew", "topologyKey", "whenUnsatisfiable"}
    assert (
        spread["properties"]["whenUnsatisfiable"]["description"]
        == schemas["TopologySpreadConstraint"]["properties"]["whenUnsatisfiable"]["description"]
    )
    node_affinity = crd_pod["affinity"]["properties"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in node_affinity["properties"]
    assert crd_pod["env"]["items"]["required"] == ["name"]
    # a profile offers the same types
    profile = build_platform_crd("ClusterInferenceProfile")["spec"]["versions"][0]["schema"]
    defaults = profile["openAPIV3Schema"]["properties"]["spec"]["properties"]["defaults"]
    offered = defaults["properties"]["pod"]["properties"]["affinity"]
    assert offered["description"] == crd_pod["affinity"]["description"]
    assert set(offered["properties"]) == {"nodeAffinity", "podAffinity", "podAntiAffinity"}


def test_the_embedded_types_refuse_what_kubernetes_refuses_structurally() -> None:
    assert "spec.pod.env.0.name" in problems(spec_with(pod={"env": [{"value": "x"}]})).replace(
        "[0]", ".0"
    )
    assert "maxSkew" in problems(
        spec_with(pod={"topologySpreadConstraints": [{"topologyKey": "zone"}]})
    )
    assert "nodeAfinity" in problems(spec_with(pod={"affinity": {"nodeAfinity": {}}}))


def test_the_vendored_schemas_are_the_pinned_kubernetes_releases() -> None:
    """kubernetes_openapi.json is what `make kube-schemas` extracts from the k8s.io/kubernetes
    module of the version the local cluster runs."""
    versions = (REPO / "e2e" / "cluster" / "versions.env").read_text()
    version = next(
        line.split("=", 1)[1].strip()
        for line in versions.splitlines()
        if line.startswith("KUBERNETES_VERSION=")
    )
    try:
        found = subprocess.run(
            ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env={**os.environ, "GOFLAGS": "-mod=mod"},
        )
    except FileNotFoundError:
        missing_component("go, to read the pinned Kubernetes module's OpenAPI document")
        return
    if found.returncode != 0:
        missing_component(f"k8s.io/kubernetes@{version}: {found.stderr.strip()[-500:]}")
    document = Path(json.loads(found.stdout)["Dir"]) / "api/openapi-spec/v3/api__v1_openapi.json"
    vendored = json.loads(
        (REPO / "operator/kiln_operator/api" / kubeschemas.SCHEMAS_FILE).read_text()
    )
    assert version in vendored["source"]
    assert vendored["schemas"] == kubeschemas.extract(json.loads(document.read_text()))


# --- rendering into the Deployment ------------------------------------------------------------


def test_every_pod_field_reaches_the_pod_template() -> None:
    template = pod_template(spec_with(pod=POD))
    pod = template["spec"]
    assert pod["affinity"] == AFFINITY
    assert pod["priorityClassName"] == "inference-high"
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert pod["serviceAccountName"] == "model-reader"
    assert pod["automountServiceAccountToken"] is False
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["labelSelector"] == {"matchLabels": selector_labels("mlp")}
    (runtime,) = pod["containers"]
    names = [variable["name"] for variable in runtime["env"]]
    assert names == [constants.ENV_RUNTIME_CONFIG, "HTTPS_PROXY", "TOKEN"]
    assert runtime["env"][2]["valueFrom"] == {"secretKeyRef": {"name": "tokens", "key": "hub"}}
    labels = template["metadata"]["labels"]
    assert labels["cost-center"] == "ml-42"
    assert labels[constants.LABEL_INSTANCE] == "mlp"
    annotations = template["metadata"]["annotations"]
    assert annotations["sidecar.istio.io/inject"] == "false"
    assert annotations[constants.ANNOTATION_POD_ANNOTATIONS] == "sidecar.istio.io/inject"


def test_a_spread_constraint_with_its_own_selector_keeps_it() -> None:
    own = {"matchLabels": {"tier": "gpu"}}
    constraint = {**POD["topologySpreadConstraints"][0], "labelSelector": own}  # type: ignore[index]
    template = pod_template(spec_with(pod={"topologySpreadConstraints": [constraint]}))
    assert template["spec"]["topologySpreadConstraints"][0]["labelSelector"] == own


def test_the_fetch_container_gets_the_extra_env_too() -> None:
    spec = load_sample("s3")["spec"]
    spec["pod"] = {"env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]}
    (fetch,) = pod_template(spec)["spec"]["initContainers"]
    assert fetch["env"] == [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]


def test_a_spec_without_pod_settings_renders_the_deployment_as_before() -> None:
    template = pod_template(spec_with())
    assert not set(template["spec"]) & {
        "affinity",
        "topologySpreadConstraints",
        "priorityClassName",
        "runtimeClassName",
        "imagePullSecrets",
        "serviceAccountName",
    }
    assert "annotations" not in template["metadata"]


def test_the_storage_service_account_still_names_the_pods_one() -> None:
    spec = load_sample("s3")["spec"]
    spec["model"]["storage"] = {**spec["model"].get("storage", {}), "serviceAccountName": "reader"}
    assert pod_template(spec)["spec"]["serviceAccountName"] == "reader"
    spec["pod"] = {"serviceAccountName": "other"}
    assert "name different ServiceAccounts" in problems(spec)
    spec["pod"] = {"serviceAccountName": "reader"}
    assert pod_template(spec)["spec"]["serviceAccountName"] == "reader"


# --- drift: a change rolls the pods, a dropped field is removed, a converged one is left -----


def live_copy(desired: Manifest) -> Manifest:
    """The Deployment as the API server stores it: what Kiln wrote, plus server additions."""
    stored = copy.deepcopy(desired)
    stored["metadata"]["resourceVersion"] = "7"
    template = stored["spec"]["template"]
    template["metadata"].setdefault("annotations", {})["kubectl.kubernetes.io/restartedAt"] = "t"
    template["spec"]["schedulerName"] = "default-scheduler"
    if "serviceAccountName" in template["spec"]:
        template["spec"]["serviceAccount"] = template["spec"]["serviceAccountName"]
    return stored


@pytest.mark.parametrize(
    "change",
    [
        "priorityClassName",
        "runtimeClassName",
        "imagePullSecrets",
        "serviceAccountName",
        "affinity",
        "topologySpreadConstraints",
        "labels",
        "annotations",
        "env",
    ],
)
def test_dropping_a_pod_field_is_drift_and_the_update_removes_it(change: str) -> None:
    before = build_deployment(parsed(spec_with(pod=POD)), OWNER)
    live = live_copy(before)
    assert not needs_update(live, before)
    after = build_deployment(
        parsed(spec_with(pod={k: v for k, v in POD.items() if k != change})), OWNER
    )
    assert needs_update(live, after)
    updated = build_update(live, after, keep_live_spec=False)
    assert not needs_update(live_copy(updated), after)
    template = updated["spec"]["template"]
    rendered = json.dumps(template)
    gone = {
        "labels": "cost-center",
        "annotations": "sidecar.istio.io/inject",
        "env": "HTTPS_PROXY",
    }.get(change, change)
    assert gone not in rendered


def test_a_changed_pod_field_changes_the_template_so_pods_roll_through_the_gate() -> None:
    before = build_deployment(parsed(spec_with(pod=POD)), OWNER)
    after = build_deployment(parsed(spec_with(pod={**POD, "priorityClassName": "batch"})), OWNER)
    assert needs_update(live_copy(before), after)
    assert before["spec"]["template"] != after["spec"]["template"]
    assert after["spec"]["template"]["spec"]["readinessGates"] == [
        {"conditionType": constants.CONDITION_WARMED_UP}
    ]


# --- Kiln's own names refused ------------------------------------------------------------------


def test_kilns_own_environment_variables_cannot_be_overridden() -> None:
    message = problems(spec_with(pod={"env": [{"name": "KILN_RUNTIME_CONFIG", "value": "{}"}]}))
    assert "spec.pod.env" in message
    assert "['KILN_RUNTIME_CONFIG'] cannot be set" in message
    assert "Kiln's own" in message
    assert "appear more than once" in problems(
        spec_with(pod={"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]})
    )


def test_kilns_own_labels_and_annotations_are_refused() -> None:
    message = problems(spec_with(pod={"labels": {constants.LABEL_INSTANCE: "other"}}))
    assert "spec.pod.labels" in message and constants.LABEL_INSTANCE in message
    message = problems(spec_with(pod={"annotations": {"serving.kiln.dev/imitated-gpus": "x"}}))
    assert "spec.pod.annotations" in message
    assert "not a label key" in problems(spec_with(pod={"labels": {"-bad": "x"}}))
    assert "not a label value" in problems(spec_with(pod={"labels": {"ok": "bad value"}}))


# --- profiles merge as other fields do -----------------------------------------------------------


def profile(defaults: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu", "generation": 1},
        "spec": {"default": True, "defaults": defaults},
    }


def test_profile_pod_defaults_merge_with_the_services() -> None:
    platform = PlatformState(
        cluster_profiles=[
            profile(
                {
                    "pod": {
                        "labels": {"cost-center": "shared", "tier": "gpu"},
                        "priorityClassName": "inference-high",
                        "topologySpreadConstraints": POD["topologySpreadConstraints"],
                        "env": [{"name": "FROM_PROFILE", "value": "1"}],
                        "imagePullSecrets": [{"name": "registry-creds"}],
                    }
                }
            )
        ]
    )
    own = spec_with(
        pod={"labels": {"cost-center": "ml-42"}, "env": [{"name": "MINE", "value": "2"}]}
    )
    effective = effective_spec("mlp", own, platform)
    assert effective.spec is not None, effective.message
    pod = effective.spec.pod
    assert pod.labels == {"cost-center": "ml-42", "tier": "gpu"}
    assert pod.priority_class_name == "inference-high"
    assert [variable.name for variable in pod.env] == ["MINE"]  # type: ignore[attr-defined]
    template = build_deployment(effective.spec, OWNER)["spec"]["template"]
    assert template["spec"]["topologySpreadConstraints"][0]["labelSelector"] == {
        "matchLabels": selector_labels("mlp")
    }
    assert template["spec"]["imagePullSecrets"] == [{"name": "registry-creds"}]


def test_a_profile_names_the_gateway_and_a_model_owner_only_opts_in() -> None:
    platform = PlatformState(
        cluster_profiles=[
            profile(
                {
                    "route": {
                        "gateway": GATEWAY,
                        "hostnameTemplate": "{name}.{namespace}.models.example.com",
                        "grpcHostnameTemplate": "{name}-grpc.{namespace}.models.example.com",
                    }
                }
            )
        ]
    )
    off = effective_spec("mlp", spec_with(), platform)
    assert off.spec is not None and build_http_route(off.spec, OWNER) is None
    on = effective_spec("mlp", spec_with(route={"enabled": True}), platform)
    assert on.spec is not None, on.message
    route = build_http_route(on.spec, OWNER)
    assert route is not None
    assert route["spec"]["hostnames"] == ["mlp.vision.models.example.com"]
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", **GATEWAY}
    ]


# --- guardrails --------------------------------------------------------------------------------


def policy(**limits: Any) -> dict[str, Any]:
    return {"metadata": {"name": "prod"}, "spec": limits}


@pytest.mark.parametrize(
    ("limits", "pod", "expected"),
    [
        (
            {"allowedPriorityClasses": ["inference-high"]},
            {"priorityClassName": "system-cluster-critical"},
            "spec.pod.priorityClassName 'system-cluster-critical' is not one of "
            "allowedPriorityClasses ['inference-high']",
        ),
        (
            {"allowedRuntimeClasses": ["nvidia"]},
            {"runtimeClassName": "kata"},
            "spec.pod.runtimeClassName 'kata' is not one of allowedRuntimeClasses ['nvidia']",
        ),
        (
            {"requiredPodLabels": ["cost-center", "team"]},
            {"labels": {"team": "vision"}},
            "spec.pod.labels lacks ['cost-center'], which requiredPodLabels",
        ),
        (
            {"forbiddenServiceAccounts": ["admin"]},
            {"serviceAccountName": "admin"},
            "the pods would run as ServiceAccount 'admin' (spec.pod.serviceAccountName), which "
            "forbiddenServiceAccounts ['admin'] forbids",
        ),
        (
            {"forbiddenServiceAccounts": ["default"]},
            {},
            "the pods would run as ServiceAccount 'default' (no serviceAccountName)",
        ),
    ],
)
def test_each_pod_guardrail_is_a_policy_violation_naming_its_rule(
    limits: dict[str, Any], pod: dict[str, Any], expected: str
) -> None:
    platform = PlatformState(cluster_policies=[policy(**limits)])
    refused = effective_spec("mlp", spec_with(pod=pod), platform)
    assert refused.reason == constants.REASON_POLICY_VIOLATION
    assert refused.message is not None
    assert refused.message.startswith("ClusterInferencePolicy prod: ")
    assert expected in refused.message


def test_a_spec_keeping_the_pod_guardrails_passes_them() -> None:
    platform = PlatformState(
        cluster_policies=[
            policy(
                allowedPriorityClasses=["inference-high"],
                allowedRuntimeClasses=["nvidia"],
                requiredPodLabels=["cost-center"],
                forbiddenServiceAccounts=["default", "admin"],
            )
        ]
    )
    kept = effective_spec("mlp", spec_with(pod=POD), platform)
    assert kept.spec is not None, kept.message
    # unset classes leave the cluster's defaults, which no list forbids
    unset = {k: v for k, v in POD.items() if k not in ("priorityClassName", "runtimeClassName")}
    assert effective_spec("mlp", spec_with(pod=unset), platform).spec is not None


# --- routes ------------------------------------------------------------------------------------

ROUTE = {
    "enabled": True,
    "gateway": GATEWAY,
    "hostnameTemplate": "{name}.{namespace}.models.example.com",
    "grpcHostnameTemplate": "{name}-grpc.{namespace}.models.example.com",
    "ingressClassName": "nginx",
    "ingressTlsSecretName": "models-tls",
}


def test_routes_send_http_and_grpc_to_the_services_ports() -> None:
    spec = parsed(spec_with(route=ROUTE))
    http = build_http_route(spec, OWNER)
    grpc = build_grpc_route(spec, OWNER)
    assert http is not None and grpc is not None
    assert http["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert http["metadata"]["labels"][constants.LABEL_MANAGED_BY] == constants.MANAGER
    assert http["spec"]["rules"][0]["backendRefs"][0]["port"] == constants.HTTP_PORT
    assert grpc["spec"]["hostnames"] == ["mlp-grpc.vision.models.example.com"]
    assert grpc["spec"]["rules"][0]["backendRefs"][0]["port"] == constants.GRPC_PORT
    ingress = build_ingress(spec, OWNER)
    assert ingress is not None
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [
        {"hosts": ["mlp.vision.models.example.com"], "secretName": "models-tls"}
    ]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "mlp", "port": {"number": constants.HTTP_PORT}}
    no_grpc = parsed(spec_with(route={**ROUTE, "grpcHostnameTemplate": None}))
    assert build_grpc_route(no_grpc, OWNER) is None


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ({"enabled": True, "gateway": GATEWAY}, "route.hostnameTemplate is required"),
        ({"enabled": True, "hostnameTemplate": "{name}.x.io"}, "route.gateway is required"),
        ({"hostnameTemplate": "{model}.x.io"}, "may contain only the placeholders"),
        ({"hostnameTemplate": "{name}..x.io"}, "does not make a hostname"),
        (
            {"hostnameTemplate": "{name}.x.io", "grpcHostnameTemplate": "{name}.x.io"},
            "cannot share a hostname",
        ),
    ],
)
def test_an_incomplete_route_is_refused_naming_the_field(
    route: dict[str, Any], expected: str
) -> None:
    assert expected in problems(spec_with(route=route))


def test_an_ingress_only_route_needs_no_gateway() -> None:
    spec = parsed(
        spec_with(route={"enabled": True, "api": "Ingress", "hostnameTemplate": "{name}.x.io"})
    )
    assert build_ingress(spec, OWNER) is not None


# --- routes as children of the reconcile loop -------------------------------------------------


def cluster_with_gateway_api(kube: Any) -> None:
    for plural in ("httproutes", "grpcroutes"):
        name = f"{plural}.gateway.networking.k8s.io"
        kube.objects[(CRDS.plural, None, name)] = {"metadata": {"name": name}}


async def test_routes_are_created_converge_and_go_when_the_service_opts_out() -> None:
    kube = FakeKube()
    cluster_with_gateway_api(kube)
    add_service(kube, spec_with(route=ROUTE))
    outcome = await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert outcome.child_problems == []
    assert ("create", "httproutes") in kube.writes and ("create", "grpcroutes") in kube.writes
    assert ("create", "ingresses") not in kube.writes
    http = live(kube, HTTP_ROUTES)
    assert http["spec"]["hostnames"] == ["mlp.vision.models.example.com"]
    kube.writes.clear()
    loop = reconciler(kube)
    await loop.reconcile(NAMESPACE, "mlp", fresh=True)
    await loop.reconcile(NAMESPACE, "mlp")
    assert kube.writes == []
    live(kube, INFERENCE_SERVICES)["spec"]["route"] = {**ROUTE, "enabled": False}
    await loop.reconcile(NAMESPACE, "mlp", fresh=True)
    assert sorted(w for w in kube.writes if w[0] == "delete") == [
        ("delete", "grpcroutes"),
        ("delete", "httproutes"),
    ]


async def test_a_route_kiln_did_not_create_is_never_written() -> None:
    kube = FakeKube()
    cluster_with_gateway_api(kube)
    foreign = {"metadata": {"name": "mlp", "namespace": NAMESPACE, "uid": "other"}, "spec": {}}
    kube.objects[(HTTP_ROUTES.plural, NAMESPACE, "mlp")] = copy.deepcopy(foreign)
    add_service(kube, spec_with(route=ROUTE))
    outcome = await reconciler(kube).reconcile(NAMESPACE, "mlp", fresh=True)
    assert [p.reason for p in outcome.child_problems] == [constants.REASON_CHILD_CONFLICT]
    assert "HTTPRoute vision/mlp already exists" in outcome.child_problems[0].message
    assert live(kube, HTTP_ROUTES) == foreign
    assert not [w for w in kube.writes if w[1] == "httproutes"]
    # opting out deletes nothing that is not Kiln's
    live(kube, INFERENCE_SERVICES)["spec"]["route"] = {**ROUTE, "enabled": False}
    await reconciler(kube).reconcile(NAMESPACE, "mlp", fresh=True)
    assert live(kube, HTTP_ROUTES) == foreign


async def test_without_the_gateway_api_the_route_is_an_ingress() -> None:
    kube = FakeKube()
    add_service(kube, spec_with(route=ROUTE))
    outcome = await reconciler(kube).reconcile(NAMESPACE, "mlp")
    assert outcome.child_problems == []
    assert ("create", "ingresses") in kube.writes
    assert not [w for w in kube.writes if w[1] in ("httproutes", "grpcroutes")]
    assert live(kube, INGRESSES)["spec"]["rules"][0]["host"] == "mlp.vision.models.example.com"


async def test_gateway_api_asked_for_on_a_cluster_without_it_is_reported() -> None:
    kube = FakeKube()
    add_service(kube, spec_with(route={**ROUTE, "api": "GatewayAPI"}))
    outcome = await reconciler(kube).reconcile(NAMESPACE, "mlp")
    (problem,) = outcome.child_problems
    assert problem.reason == constants.REASON_CHILD_REJECTED
    assert "does not serve httproutes.gateway.networking.k8s.io" in problem.message
    assert not [w for w in kube.writes if w[1] in ("httproutes", "grpcroutes", "ingresses")]
