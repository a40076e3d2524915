"""The validating admission webhook against the real API server and operator processes.

The configuration is the chart's own (`helm template` with webhook.enabled, scoped by
watchNamespaces to the test's namespace, so it never touches another test), with its
clientConfig pointed at the operator on this host (the API server runs as a host process):
`https://127.0.0.1:<port>/validate-inferenceservice` and the CA of a certificate made here.

What it shows: every spec of the invalid corpus that the schema lets through is refused at
`kubectl apply`, naming its field, and nothing is stored; a valid → invalid update is refused
while the running Deployment and pods stay untouched; a label and a delete still work; another
namespace is not judged; a replica that is not the peering leader serves it; and an operator
that hangs or is stopped delays a write by at most the 5 s timeout and never blocks it.
"""

import base64
import copy
import datetime
import ipaddress
import json
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kiln_localcluster.waiting import wait_for
from kiln_operator import constants
from tests.gotools import FIRST_BUILD_TEST_TIMEOUT, go_tool
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    SAMPLES,
    AuditLog,
    OperatorProcess,
    apply,
    get,
    gpu_service,
    on_fake_nodes,
)
from tests.integration.operator.test_peering import peer_priorities
from tests.sessioncluster import REPO
from tests.unit.operator.conftest import corpus, expectation

pytestmark = [pytest.mark.integration, pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)]

CHART = REPO / "manifests" / "charts" / "kiln"
DENIED = 'admission webhook "validate.inferenceservices.serving.kiln.dev" denied the request'
RESUMED = "Resuming operations after the pause"
"""kopf's log line when a peered operator starts acting (it starts paused)."""
TIMEOUT_SECONDS = 5
"""The chart's webhook timeoutSeconds (tests/unit/gitops holds the chart to it)."""


def load(path: Path, name: str | None = None) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(path.read_text())
    if name is not None:
        manifest["metadata"]["name"] = name
    return manifest


def invalid_update(name: str) -> dict[str, Any]:
    """The GPU sample with more minimum than maximum replicas (the corpus' min-above-max)."""
    return gpu_service(name, autoscaling={"minReplicas": 5, "maxReplicas": 2})


MIN_ABOVE_MAX = "spec.autoscaling: minReplicas (5) must not exceed maxReplicas (2)"


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_certificate(directory: Path) -> bytes:
    """A CA and, signed by it, a serving certificate for 127.0.0.1 written as `tls.crt` and
    `tls.key` (a mounted kubernetes.io/tls Secret's names); returns the CA's PEM."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kiln-webhook-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    serving = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(_pem(serving))
    (directory / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return _pem(ca)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def chart_webhook_configuration(namespace: str, tmp_path: Path) -> dict[str, Any]:
    """The chart's ValidatingWebhookConfiguration for a release serving only `namespace`."""
    home = tmp_path / "helm"
    state = [f"HELM_{kind}_HOME={home / kind.lower()}" for kind in ("CACHE", "CONFIG", "DATA")]
    result = subprocess.run(
        [
            "env", *state,
            str(go_tool("helm")), "template", f"kiln-{namespace[-6:]}", str(CHART),
            "--namespace", namespace, "--set", "webhook.enabled=true",
            "--set", f"watchNamespaces={{{namespace}}}",
        ],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    (configuration,) = [
        doc
        for doc in yaml.safe_load_all(result.stdout)
        if doc and doc["kind"] == "ValidatingWebhookConfiguration"
    ]
    found: dict[str, Any] = configuration
    return found


class Webhook:
    """The chart's webhook configuration in the cluster, pointed at one operator's port."""

    def __init__(self, cluster: Cluster, namespace: str, tmp_path: Path) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.certificates = tmp_path / "webhook-tls"
        self.ca = make_certificate(self.certificates)
        self.configuration = chart_webhook_configuration(namespace, tmp_path)
        self.name = self.configuration["metadata"]["name"]

    def environment(self, port: int) -> dict[str, str]:
        """The operator's settings to serve the webhook on `port` with the test's certificate."""
        return {
            constants.ENV_WEBHOOK_PORT: str(port),
            constants.ENV_WEBHOOK_CERT_DIR: str(self.certificates),
        }

    def install(self, port: int) -> None:
        configuration = json.loads(json.dumps(self.configuration))
        (webhook,) = configuration["webhooks"]
        path = webhook["clientConfig"]["service"]["path"]
        webhook["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}{path}",
            "caBundle": base64.b64encode(self.ca).decode(),
        }
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(configuration))

    def uninstall(self) -> None:
        self.cluster.kubectl(
            "delete", "validatingwebhookconfiguration", self.name, "--ignore-not-found"
        )

    def wait_serving(self, timeout: float = 90) -> None:
        """Until a server-side dry run of an invalid spec is refused: before the operator
        listens, failurePolicy Ignore admits it."""
        manifest = invalid_update("probe")

        def refused() -> bool:
            result = self.cluster.kubectl(
                "apply", "--dry-run=server", "-n", self.namespace, "-f", "-",
                input=yaml.safe_dump(manifest), check=False,
            )  # fmt: skip
            return result.returncode != 0 and DENIED in result.stderr

        wait_for(refused, timeout=timeout, interval=1, description="the webhook refusing")


@pytest.fixture
def webhook(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Webhook]:
    installed = Webhook(cluster, namespace, tmp_path)
    yield installed
    installed.uninstall()


@pytest.fixture
def serving(webhook: Webhook, start_operator: Any, namespace: str) -> OperatorProcess:
    """A standalone operator for the namespace serving the webhook, and the configuration."""
    port = free_port()
    process: OperatorProcess = start_operator([namespace], env=webhook.environment(port))
    webhook.install(port)
    webhook.wait_serving()
    return process


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"webhook-other-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def timed_apply(
    cluster: Cluster, namespace: str, manifest: dict[str, Any]
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """`kubectl apply` of the manifest, and how long it took."""
    started = time.monotonic()
    result = apply(cluster, namespace, manifest, check=False)
    return time.monotonic() - started, result


def test_every_invalid_spec_is_refused_at_apply_naming_the_field(
    cluster: Cluster, namespace: str, other_namespace: str, serving: OperatorProcess
) -> None:
    cases = corpus("semantic")
    assert len(cases) >= 20
    for index, path in enumerate(cases):
        keep_name = "name-not-a-dns-label" in path.name
        result = apply(
            cluster, namespace, load(path, None if keep_name else f"case-{index}"), check=False
        )
        assert result.returncode != 0, f"{path.name} was accepted"
        assert DENIED in result.stderr, f"{path.name}: {result.stderr}"
        assert expectation(path) in result.stderr, f"{path.name}: {result.stderr}"
    assert cluster.get_json("inferenceservices", "-n", namespace)["items"] == []

    # every problem at once, in one message
    both = gpu_service("both")
    both["spec"]["resources"] = {"gpuCount": 1, "cpu": "1.2.3", "memory": "1.2.3"}
    result = apply(cluster, namespace, both, check=False)
    assert f"{DENIED}: InvalidSpec: spec.resources.cpu: '1.2.3' is not a Kubernetes quantity" in (
        result.stderr
    )
    assert "; spec.resources.memory: '1.2.3' is not a Kubernetes quantity" in result.stderr

    # a valid spec is admitted; a namespace the operator does not serve is not judged
    apply(cluster, namespace, on_fake_nodes(load(SAMPLES / "cpu-test.yaml")))
    apply(cluster, other_namespace, invalid_update("elsewhere"))
    assert get(cluster, other_namespace, "inferenceservice", "elsewhere") is not None


def test_an_invalid_update_is_refused_and_what_runs_is_untouched(
    cluster: Cluster, namespace: str, serving: OperatorProcess, audit: AuditLog
) -> None:
    apply(cluster, namespace, gpu_service("svc"))

    def available() -> bool:
        found = get(cluster, namespace, "deployment", "svc") or {"spec": {}, "status": {}}
        wanted = found["spec"].get("replicas")
        return bool(wanted) and (found.get("status") or {}).get("availableReplicas") == wanted

    wait_for(available, timeout=120, description="the Deployment's pods available")
    audit.wait_quiet(namespace, seconds=5, timeout=90)
    before_service = get(cluster, namespace, "inferenceservice", "svc")
    before_deployment = get(cluster, namespace, "deployment", "svc")
    before_pods = pods(cluster, namespace)
    assert before_service is not None and before_deployment is not None and before_pods
    mark = audit.mark()

    result = apply(cluster, namespace, invalid_update("svc"), check=False)
    assert result.returncode != 0
    assert DENIED in result.stderr and MIN_ABOVE_MAX in result.stderr

    time.sleep(5)  # anything the refused write could have caused would happen by now
    after_service = get(cluster, namespace, "inferenceservice", "svc")
    after_deployment = get(cluster, namespace, "deployment", "svc")
    assert after_service is not None and after_deployment is not None
    assert after_service["spec"] == before_service["spec"]
    for key in ("generation", "resourceVersion"):
        assert after_service["metadata"][key] == before_service["metadata"][key]
        assert after_deployment["metadata"][key] == before_deployment["metadata"][key]
    assert pods(cluster, namespace) == before_pods
    assert audit.operator_writes(mark, namespace) == []

    # only a change of the spec is judged; labels and deleting are never refused
    cluster.kubectl("label", "inferenceservice", "svc", "-n", namespace, "team=search")
    cluster.kubectl("delete", "inferenceservice", "svc", "-n", namespace, "--wait=false")


def pods(cluster: Cluster, namespace: str) -> dict[str, tuple[str, str]]:
    """Each pod's uid and resourceVersion, by name."""
    items = cluster.get_json("pods", "-n", namespace)["items"]
    return {
        pod["metadata"]["name"]: (pod["metadata"]["uid"], pod["metadata"]["resourceVersion"])
        for pod in items
    }


def test_services_are_judged_with_their_namespaces_profiles_and_policies(
    cluster: Cluster, namespace: str, serving: OperatorProcess
) -> None:
    """Namespaced profile and policy only: cluster-scoped ones would reach other tests."""
    profile = {
        "apiVersion": f"{constants.GROUP}/{constants.VERSION}",
        "kind": constants.PROFILE_KIND,
        "metadata": {"name": "team"},
        "spec": {
            "defaults": {
                "runtime": {"image": "kiln/runtime:dev"},
                "slo": {"p99LatencyMilliseconds": 50},
                "autoscaling": {"maxReplicas": 4},
            }
        },
    }
    limits = {
        "apiVersion": f"{constants.GROUP}/{constants.VERSION}",
        "kind": constants.POLICY_KIND,
        "metadata": {"name": "team-limits"},
        "spec": {"maxReplicas": 3},
    }
    apply(cluster, namespace, profile)
    five_lines = gpu_service("five-lines")
    five_lines["spec"] = {"profile": "team", "model": five_lines["spec"]["model"]}
    five_lines["spec"]["autoscaling"] = {"maxReplicas": 2}
    apply(cluster, namespace, five_lines)  # image and SLO from the profile

    apply(cluster, namespace, limits)
    del five_lines["spec"]["autoscaling"]  # the profile's 4 is above the policy's 3
    result = apply(cluster, namespace, five_lines, check=False)
    assert result.returncode != 0
    assert f"{DENIED}: PolicyViolation: InferencePolicy team-limits: " in result.stderr
    assert "(spec resolved with InferenceProfile team)" in result.stderr

    later = copy.deepcopy(five_lines)
    later["metadata"]["name"] = "later"
    later["spec"]["profile"] = "not-yet"
    later["spec"]["autoscaling"] = {"maxReplicas": 2}
    result = apply(cluster, namespace, later)
    assert "Warning: ProfileNotFound: spec.profile: " in result.stderr
    assert get(cluster, namespace, "inferenceservice", "later") is not None


def test_a_replica_that_is_not_the_leader_serves_the_webhook(
    cluster: Cluster, namespace: str, webhook: Webhook, start_operator: Any
) -> None:
    leader_port = free_port()
    leader: OperatorProcess = start_operator(
        [namespace], standalone=False, priority=20, env=webhook.environment(leader_port)
    )
    # kopf starts a peered operator paused and logs its resumption once it is the highest
    wait_for(lambda: RESUMED in leader.output(), timeout=60, description="the leader acting")
    follower_port = free_port()
    assert follower_port != leader_port
    follower: OperatorProcess = start_operator(
        [namespace], standalone=False, priority=10, env=webhook.environment(follower_port)
    )
    wait_for(
        lambda: peer_priorities(cluster, namespace) == [10, 20],
        timeout=60,
        description="both operators registered as peers",
    )
    webhook.install(follower_port)  # only the follower is asked
    webhook.wait_serving()
    result = apply(cluster, namespace, invalid_update("refused-by-follower"), check=False)
    assert DENIED in result.stderr and MIN_ABOVE_MAX in result.stderr
    assert RESUMED not in follower.output(), "the follower acted"


def test_a_hung_or_stopped_operator_delays_writes_by_at_most_the_timeout_and_never_blocks(
    cluster: Cluster, namespace: str, serving: OperatorProcess
) -> None:
    apply(cluster, namespace, gpu_service("existing"))

    # hung: the socket accepts, nothing answers; the API server gives up after the timeout
    serving.process.send_signal(signal.SIGSTOP)
    try:
        seconds, result = timed_apply(cluster, namespace, invalid_update("while-hung"))
    finally:
        serving.process.send_signal(signal.SIGCONT)
    assert result.returncode == 0, result.stderr
    assert TIMEOUT_SECONDS <= seconds < TIMEOUT_SECONDS + 10, seconds

    serving.stop()  # stopped: nothing listens
    for manifest in (invalid_update("while-down"), invalid_update("existing")):
        seconds, result = timed_apply(cluster, namespace, manifest)
        assert result.returncode == 0, result.stderr
        assert seconds < TIMEOUT_SECONDS + 5, seconds
    stored = get(cluster, namespace, "inferenceservice", "existing")
    assert stored is not None and stored["spec"]["autoscaling"]["minReplicas"] == 5
