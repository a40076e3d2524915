"""The chart's validating admission webhook (`webhook.enabled`): off by default; when on, a
configuration that can never block a write (failurePolicy Ignore, 5 s, no DELETE, no status),
whose path names the operator's handler and whose Service reaches the port every replica serves
on with the mounted certificate; the generated certificate is signed by the CA in the bundle
and names the Service; with cert-manager, the same objects as the kustomize component."""

import base64
import datetime
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from kiln_operator import constants
from kiln_operator.builders.naming import Manifest
from tests.gotools import FIRST_BUILD_TEST_TIMEOUT, kubectl
from tests.sessioncluster import REPO
from tests.unit.gitops.test_chart import (
    NAMESPACE,
    deployment,
    documents,
    keyed,
    run,
    template,
    without_helm_labels,
)

pytestmark = pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)

COMPONENT = REPO / "manifests" / "components" / "webhook"
ON = ("--set", "webhook.enabled=true")
WEBHOOK_KINDS = {"ValidatingWebhookConfiguration", "Secret", "Issuer", "Certificate"}


def rendered(helm: list[str], *args: str) -> list[Manifest]:
    return documents(template(helm, *args).stdout)


def of_kind(objects: list[Manifest], kind: str) -> Manifest:
    (found,) = [obj for obj in objects if obj["kind"] == kind]
    return found


def container(objects: list[Manifest]) -> Manifest:
    found: Manifest
    (found,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    return found


def env(objects: list[Manifest]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container(objects)["env"]}


def test_the_webhook_is_off_by_default(helm: list[str]) -> None:
    objects = rendered(helm)
    assert not [obj for obj in objects if obj["kind"] in WEBHOOK_KINDS]
    assert not [obj for obj in objects if "webhook" in obj["metadata"]["name"]]
    assert constants.ENV_WEBHOOK_PORT not in env(objects)


def test_the_configuration_never_blocks_and_reaches_the_handler(helm: list[str]) -> None:
    objects = rendered(helm, *ON)
    (webhook,) = of_kind(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["timeoutSeconds"] == 5
    assert webhook["sideEffects"] == "None"
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["rules"] == [
        {
            "apiGroups": [constants.GROUP],
            "apiVersions": [constants.VERSION],
            "resources": [constants.PLURAL],  # not inferenceservices/status
            "operations": ["CREATE", "UPDATE"],  # never DELETE
            "scope": "Namespaced",
        }
    ]
    assert "namespaceSelector" not in webhook  # every namespace, as the operator serves
    service_ref = webhook["clientConfig"]["service"]
    assert service_ref["path"] == f"/{constants.WEBHOOK_HANDLER_ID}"
    service = of_kind(objects, "Service")
    assert (service_ref["name"], service_ref["namespace"]) == (
        service["metadata"]["name"],
        NAMESPACE,
    )
    (port,) = service["spec"]["ports"]
    assert port["port"] == service_ref["port"]
    pod = deployment(objects)["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ports = {item["name"]: item["containerPort"] for item in container(objects)["ports"]}
    assert ports[port["targetPort"]] == int(env(objects)[constants.ENV_WEBHOOK_PORT]) == 9443
    mounts = {item["name"]: item for item in container(objects)["volumeMounts"]}
    volumes = {item["name"]: item for item in pod["spec"]["volumes"]}
    (name,) = [
        n for n, m in mounts.items() if m["mountPath"] == env(objects)["KILN_WEBHOOK_CERT_DIR"]
    ]
    assert mounts[name]["readOnly"] is True
    assert volumes[name]["secret"]["secretName"] == of_kind(objects, "Secret")["metadata"]["name"]


def test_the_generated_certificate_names_the_service_and_its_ca_is_the_bundle(
    helm: list[str],
) -> None:
    objects = rendered(helm, *ON)
    secret = of_kind(objects, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    (webhook,) = of_kind(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert webhook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    serving = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    serving.verify_directly_issued_by(ca)
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    service = of_kind(objects, "Service")["metadata"]["name"]
    assert f"{service}.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    in_nine_years = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=9 * 365)
    assert serving.not_valid_after_utc > in_nine_years
    assert base64.b64decode(secret["data"]["tls.key"]).startswith(b"-----BEGIN")


def test_watched_namespaces_scope_the_webhook(helm: list[str]) -> None:
    objects = rendered(helm, *ON, "--set", "watchNamespaces={models,canary}")
    (webhook,) = of_kind(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert webhook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["models", "canary"]}
        ]
    }


def test_cert_manager_issues_the_certificate_and_injects_the_ca(helm: list[str]) -> None:
    objects = rendered(helm, *ON, "--set", "webhook.certManager.enabled=true")
    assert not [obj for obj in objects if obj["kind"] == "Secret"]
    configuration = of_kind(objects, "ValidatingWebhookConfiguration")
    certificate = of_kind(objects, "Certificate")
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{certificate['metadata']['name']}"
    }
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]
    assert certificate["spec"]["issuerRef"] == {
        "kind": "Issuer",
        "name": of_kind(objects, "Issuer")["metadata"]["name"],
    }
    pod = deployment(objects)["spec"]["template"]["spec"]
    assert {"name": "webhook-tls", "secret": {"secretName": certificate["spec"]["secretName"]}} in (
        pod["volumes"]
    )

    platform = rendered(
        helm, *ON, "--set", "webhook.certManager.enabled=true",
        "--set", "webhook.certManager.issuerRef.kind=ClusterIssuer",
        "--set", "webhook.certManager.issuerRef.name=platform-ca",
    )  # fmt: skip
    assert not [obj for obj in platform if obj["kind"] == "Issuer"]
    assert of_kind(platform, "Certificate")["spec"]["issuerRef"] == {
        "kind": "ClusterIssuer",
        "name": "platform-ca",
    }


def _by_name(items: list[Manifest]) -> list[Manifest]:
    return sorted(items, key=lambda item: str(item.get("name")))


def normalised(obj: Manifest) -> Manifest:
    """The Deployment's named lists in name order: kustomize's patch puts the component's env,
    ports and mounts first, the chart's template after the base's; the order means nothing."""
    if obj["kind"] != "Deployment":
        return obj
    pod: dict[str, Any] = obj["spec"]["template"]["spec"]
    pod["volumes"] = _by_name(pod["volumes"])
    for item in pod["containers"]:
        for key in ("env", "ports", "volumeMounts"):
            item[key] = _by_name(item[key])
    return obj


def test_with_cert_manager_the_chart_renders_the_kustomize_component(
    helm: list[str], tmp_path: Path
) -> None:
    """`webhook.enabled` and `webhook.certManager.enabled` against `manifests/` with the
    component `manifests/components/webhook`, as the README tells kustomize users to write it."""
    (tmp_path / "kustomization.yaml").write_text(
        "resources:\n"
        f"  - {os.path.relpath(REPO / 'manifests', tmp_path)}\n"
        "components:\n"
        f"  - {os.path.relpath(COMPONENT, tmp_path)}\n"
    )
    base = keyed(
        [
            normalised(obj)
            for obj in documents(run([str(kubectl()), "kustomize", str(tmp_path)]).stdout)
        ]
    )
    chart = keyed(
        [
            normalised(without_helm_labels(obj))
            for obj in rendered(helm, *ON, "--set", "webhook.certManager.enabled=true")
        ]
    )
    assert set(base) - set(chart) == {("Namespace", NAMESPACE)}
    assert set(chart) - set(base) == set()
    for key, obj in chart.items():
        assert obj == base[key], f"{key} differs between the chart and the kustomize component"


@pytest.mark.parametrize(
    ("values", "refusal"),
    [
        (("webhook.enabled=yes",), "at '/webhook/enabled': got string, want boolean"),
        (("webhook.port=8080",), "at '/webhook/port'"),
        (("webhook.timeoutSeconds=31",), "at '/webhook/timeoutSeconds'"),
        (("webhook.certManager.issuerRef.kind=Vault",), "at '/webhook/certManager/issuerRef/kind'"),
        (("webhook.certmanager.enabled=true",), "additional properties 'certmanager' not allowed"),
    ],
)
def test_the_schema_refuses_bad_webhook_values(
    helm: list[str], values: tuple[str, ...], refusal: str
) -> None:
    args = [arg for value in values for arg in ("--set", value)]
    result = template(helm, *args, check=False)
    assert result.returncode != 0
    assert refusal in result.stderr, result.stderr


def test_helm_lint_is_clean_with_the_webhook(helm: list[str]) -> None:
    for extra in ([], ["--set", "webhook.certManager.enabled=true"]):
        result = run([*helm, "lint", "--strict", str(REPO / "manifests/charts/kiln"), *ON, *extra])
        assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout
