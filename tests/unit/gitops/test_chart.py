"""Kiln's Helm chart: lint-clean, its schema refuses bad values with the key's path, and for
default values it renders the same objects as the kustomize base (`kubectl kustomize manifests/`),
apart from the Namespace (Helm's `--create-namespace`) and Helm's own bookkeeping labels."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from kiln_operator import constants
from kiln_operator.builders.naming import Manifest
from tests.gotools import FIRST_BUILD_TEST_TIMEOUT, kubectl
from tests.sessioncluster import REPO
from tools import dashboards

CHART = REPO / "manifests" / "charts" / "kiln"
NAMESPACE = "kiln-system"
HELM_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart")
"""The labels Helm charts conventionally add and kustomize's base has no counterpart of."""


def run(command: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{command[-6:]} failed:\n{result.stderr}")
    return result


def documents(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def template(helm: list[str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(
        [*helm, "template", "kiln", str(CHART), "--namespace", NAMESPACE, "--include-crds", *args],
        check=check,
    )


def keyed(objects: list[Manifest]) -> dict[tuple[str, str], Manifest]:
    return {(obj["kind"], obj["metadata"]["name"]): obj for obj in objects}


def without_helm_labels(obj: Manifest) -> Manifest:
    labels = obj["metadata"].get("labels", {})
    for key in HELM_LABELS:
        labels.pop(key, None)
    return obj


def deployment(objects: list[Manifest]) -> Manifest:
    (found,) = [obj for obj in objects if obj["kind"] == "Deployment"]
    return found


pytestmark = pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)


def test_default_values_render_the_kustomize_base(helm: list[str]) -> None:
    chart = keyed([without_helm_labels(obj) for obj in documents(template(helm).stdout)])
    base = keyed(documents(run([str(kubectl()), "kustomize", str(REPO / "manifests")]).stdout))
    assert set(base) - set(chart) == {("Namespace", NAMESPACE)}
    assert set(chart) - set(base) == set()
    for key, obj in chart.items():
        assert obj == base[key], f"{key} differs between the chart and the kustomize base"
    assert {kind for kind, _ in chart} == {
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
    }


def test_every_object_carries_helms_labels(helm: list[str]) -> None:
    for obj in documents(template(helm).stdout):
        if obj["kind"] == "CustomResourceDefinition":
            continue  # crds/ is installed as is, never templated
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/instance"] == "kiln"
        assert labels["app.kubernetes.io/part-of"] == "kiln"


def test_the_chart_crds_are_the_generated_ones() -> None:
    generated = sorted(p.name for p in (REPO / "crds").glob("*.yaml") if p.stem != "kustomization")
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == generated
    for name in generated:
        assert (CHART / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes()


def test_helm_lint_is_clean(helm: list[str]) -> None:
    result = run([*helm, "lint", "--strict", str(CHART)])
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout
    # The one [INFO] is that an icon is recommended; Kiln has no published icon to point at.
    assert [line for line in result.stdout.splitlines() if line.startswith("[INFO]")] == [
        "[INFO] Chart.yaml: icon is recommended"
    ]


def test_values_set_the_operator(helm: list[str], tmp_path: Path) -> None:
    values = {
        "image": {"repository": "registry.example/kiln/operator", "tag": "0.1.0"},
        "replicas": 1,
        "peering": {"enabled": False},
        "logLevel": "debug",
        "watchNamespaces": ["models", "canary"],
        "prometheus": {
            "url": "http://prometheus.observability:9090",
            "allowedUrls": ["http://prometheus.team-a:9090", "http://thanos.observability"],
        },
        "resources": {"requests": {"cpu": "200m", "memory": "300Mi"}},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    }
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    objects = documents(template(helm, "-f", str(tmp_path / "values.yaml")).stdout)
    spec = deployment(objects)["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    assert spec["replicas"] == 1
    assert container["image"] == "registry.example/kiln/operator:0.1.0"
    assert container["args"] == [
        "run",
        "--liveness=http://0.0.0.0:8080/healthz",
        "--standalone",
        "--verbose",
        "--namespace=models",
        "--namespace=canary",
    ]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["KILN_PROMETHEUS_URL"] == "http://prometheus.observability:9090"
    assert env["KILN_ALLOWED_PROMETHEUS_URLS"] == (
        "http://prometheus.team-a:9090,http://thanos.observability"
    )
    # Helm merges maps with the defaults: the default memory limit stays
    assert container["resources"] == {
        "requests": {"cpu": "200m", "memory": "300Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert spec["template"]["spec"]["tolerations"] == values["tolerations"]


def test_the_service_monitor_is_optional_and_selects_the_operators_metrics(
    helm: list[str],
) -> None:
    assert not [o for o in documents(template(helm).stdout) if o["kind"] == "ServiceMonitor"]
    objects = documents(
        template(
            helm,
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.serviceMonitor.labels.release=prometheus",
            "--set",
            "metrics.port=9100",
        ).stdout
    )
    by_kind = {obj["kind"]: obj for obj in objects}
    service, monitor = by_kind["Service"], by_kind["ServiceMonitor"]
    pod_labels = deployment(objects)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9100, "targetPort": "metrics"}]
    (container,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9100} in container["ports"]


@pytest.mark.parametrize(
    ("values", "refusal"),
    [
        ({"replicas": "two"}, "at '/replicas': got string, want integer"),
        ({"replica": 2}, "at '': additional properties 'replica' not allowed"),
        ({"image": {"tagg": "v1"}}, "at '/image': additional properties 'tagg' not allowed"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy'"),
        ({"logLevel": "trace"}, "at '/logLevel'"),
        ({"metrics": {"port": 8080}}, "at '/metrics/port'"),
        (
            {"metrics": {"serviceMonitor": {"interval": "often"}}},
            "at '/metrics/serviceMonitor/interval'",
        ),
        ({"prometheus": {"url": "prometheus:9090"}}, "at '/prometheus/url'"),
        ({"watchNamespaces": ["Models"]}, "at '/watchNamespaces/0'"),
        ({"resources": {"requests": {"cpu": "lots"}}}, "at '/resources/requests/cpu'"),
        # two unpeered replicas would both act
        ({"peering": {"enabled": False}}, "at '/replicas': value must be 1"),
    ],
)
def test_the_schema_refuses_bad_values_with_the_keys_path(
    helm: list[str], tmp_path: Path, values: Manifest, refusal: str
) -> None:
    (tmp_path / "values.yaml").write_text(json.dumps(values))
    result = template(helm, "-f", str(tmp_path / "values.yaml"), check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert refusal in result.stderr


def test_imitated_gpus_are_off_by_default_and_render_the_kustomize_component(
    helm: list[str], tmp_path: Path
) -> None:
    """`imitatedGpus: true` sets the operator's KILN_IMITATED_GPUS, exactly as `manifests/` with
    the component `manifests/components/imitated-gpus` does; by default it is not set at all."""

    def operator_env(objects: list[Manifest]) -> dict[str, str]:
        (container,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
        return {item["name"]: item["value"] for item in container["env"]}

    assert constants.ENV_IMITATED_GPUS not in operator_env(documents(template(helm).stdout))
    component = REPO / "manifests" / "components" / "imitated-gpus"
    (tmp_path / "kustomization.yaml").write_text(
        "resources:\n"
        f"  - {os.path.relpath(REPO / 'manifests', tmp_path)}\n"
        "components:\n"
        f"  - {os.path.relpath(component, tmp_path)}\n"
    )
    base = keyed(documents(run([str(kubectl()), "kustomize", str(tmp_path)]).stdout))
    chart = keyed(
        [
            without_helm_labels(obj)
            for obj in documents(template(helm, "--set", "imitatedGpus=true").stdout)
        ]
    )
    assert operator_env(list(chart.values()))[constants.ENV_IMITATED_GPUS] == "true"
    assert set(base) - set(chart) == {("Namespace", NAMESPACE)}
    for key, obj in chart.items():
        assert obj == base[key], f"{key} differs between the chart and the kustomize component"
    refused = template(helm, "--set", "imitatedGpus=yes", check=False)
    assert "at '/imitatedGpus': got string, want boolean" in refused.stderr


def test_dashboards_and_alerts_are_off_by_default(helm: list[str]) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in documents(template(helm).stdout)}
    assert not {k for k in kinds if k[0] in ("PrometheusRule",) or k[1].endswith("-dashboards")}


def test_the_dashboards_configmap_carries_the_generated_dashboards_for_grafanas_sidecar(
    helm: list[str],
) -> None:
    objects = documents(
        template(helm, "--set", "dashboards.enabled=true", "--set-string",
                 "dashboards.annotations.grafana_folder=Kiln").stdout
    )  # fmt: skip
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Kiln"}
    assert configmap["data"] == {
        name: text.rstrip("\n") for name, text in dashboards.rendered_files().items()
    }
    assert {json.loads(text)["uid"] for text in configmap["data"].values()} == {
        "kiln-service",
        "kiln-operator",
    }


def test_the_committed_dashboards_are_the_generated_ones() -> None:
    for name, text in dashboards.rendered_files().items():
        assert (dashboards.CHART_DASHBOARDS / name).read_text() == text, (
            f"{name} differs from tools/dashboards.py: run `python tools/dashboards.py`"
        )


def test_the_prometheus_rule_holds_the_plain_rules_file(helm: list[str]) -> None:
    objects = documents(
        template(helm, "--set", "alerts.prometheusRule.enabled=true", "--set",
                 "alerts.prometheusRule.labels.release=prometheus").stdout
    )  # fmt: skip
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    rules_file = REPO / "manifests/charts/kiln/files/kiln-alerts.rules.yaml"
    assert rule["spec"] == yaml.safe_load(rules_file.read_text())


def test_the_activator_ships_restricted_with_its_control_port_for_the_operator_only(
    helm: list[str],
) -> None:
    objects = keyed(documents(template(helm, "--set", "activator.enabled=true").stdout))
    activator = objects[("Deployment", "kiln-activator")]
    spec = activator["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert activator["spec"]["replicas"] == 2
    assert container["command"] == ["python", "-m", "kiln_runtime.activator"]
    assert "--max-held-requests=1000" in container["args"]
    assert "--hold-timeout-seconds=120" in container["args"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["automountServiceAccountToken"] is False
    control = objects[("Service", "kiln-activator-control")]
    assert control["spec"]["clusterIP"] == "None"
    policy = objects[("NetworkPolicy", "kiln-activator")]
    guarded = [rule for rule in policy["spec"]["ingress"] if "from" in rule]
    assert guarded == [
        {
            "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "kiln-operator"}}}],
            "ports": [{"port": "control"}],
        }
    ]
    operator_pods = objects[("Deployment", "kiln-operator")]["spec"]["template"]["spec"]
    (operator,) = operator_pods["containers"]
    env = {item["name"]: item.get("value") for item in operator["env"]}
    assert env["KILN_ACTIVATOR_CONTROL"] == "kiln-activator-control.kiln-system.svc:9090"
    # off by default: nothing of it, and the operator is not told of one
    default = keyed(documents(template(helm).stdout))
    assert ("Deployment", "kiln-activator") not in default
    refused = template(helm, "--set", "activator.hold.maxRequests=0", check=False)
    assert refused.returncode != 0 and "maxRequests" in refused.stderr


def test_the_activators_args_are_what_its_own_flags_parse(helm: list[str]) -> None:
    # Helm renders a large number from values as a float: the chart once gave the activator
    # `--max-held-bytes=2.68435456e+08`, and its pods crash-looped on the real node.
    from kiln_runtime.activator.__main__ import parse

    for extra in ([], ["--set", "activator.hold.maxBytes=1073741824"]):
        objects = keyed(documents(template(helm, "--set", "activator.enabled=true", *extra).stdout))
        (container,) = objects[("Deployment", "kiln-activator")]["spec"]["template"]["spec"][
            "containers"
        ]
        _, _, settings = parse(container["args"])
        assert settings.hold.max_bytes == (1 << 30 if extra else 256 << 20)
        assert settings.hold.max_requests == 1000
        assert settings.max_in_flight_per_pod == 64
