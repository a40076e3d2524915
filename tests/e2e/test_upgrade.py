"""Kiln upgraded and rolled back as a platform team does it, while three InferenceServices serve
under load: the release installed from the chart and operator image of an earlier commit,
`helm upgrade` to this checkout's, then `helm rollback`, each with the README's commands.

Why it exists: a platform team's second day. An upgrade replaces every operator pod; the new
operator lists every InferenceService and reconciles it afresh, its autoscaler starts from
what the old one left on the object. Whatever the new operator reads differently from the old
one would show here as a write to a user's object, a rolled Deployment or a restarted pod, and
a failed request. Measured and asserted: no failed request through the Services' cluster IPs
(HTTP and gRPC, all three services, throughout), every child unchanged byte for byte (its
status aside) and no pod restarted, and, from the API server's audit log, that the operator
pods the upgrade started wrote nothing of a user's namespace but status subresources (this
version keeps its autoscaler's state in status.autoscalerState). The pods of the rollback run
the earlier version, which kept that state in an annotation: theirs may patch the object, and
the test asserts that the annotation is the only field outside status their field manager
owns.

The earlier commit's tree comes from git history (`git archive`; CI clones the whole history);
its operator image is built from that tree by its own `make image-operator`. The chart's CRDs
are applied before the upgrade, as the README says (Helm never upgrades them).
"""

import functools
import json
import subprocess
import tarfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln_localcluster.waiting import wait_for
from kiln_operator.constants import MANAGER
from tests.e2e.conftest import E2ECluster, HostOperator, Model, service_address
from tests.e2e.test_in_cluster import (
    IMAGE,
    INSTALL,
    LOCAL_VALUES,
    OPERATOR,
    RELEASE,
    SERVICE_ACCOUNT,
    SYSTEM,
    Tools,
    acting,
    image_of,
    operator_logs,
    operator_pods,
    operator_state,
    readme_commands,
    ready,
)
from tests.e2e.test_real_node import GRPC, HTTP, inference_service, runtime_pods
from tests.e2e.test_scale_down import Paced, grpc_caller, http_call, paced
from tests.gotools import FIRST_BUILD_TEST_TIMEOUT, go_tool
from tests.sessioncluster import REPO, missing_component

pytestmark = pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)

PREVIOUS = "d60d734"
"""The commit the release is upgraded from: the last landed one when this test was written.
Move it forward to the last release's commit (or tag) when the chart or the operator changes."""
PREVIOUS_IMAGE = "kiln/operator:e2e-previous"
UPGRADE = (
    "kubectl apply --server-side --force-conflicts -f manifests/charts/kiln/crds/",
    f"helm upgrade {RELEASE} manifests/charts/kiln -n {SYSTEM} --reset-then-reuse-values",
)
"""The README's upgrade, word for word (the test adds the new image's tag, as a new chart's
appVersion would)."""
ROLLBACK = f"helm rollback {RELEASE} -n {SYSTEM}"
SERVICES = ("mlp-a", "mlp-b", "mlp-c")
PER_SECOND = 3.0
"""Calls per second per service and protocol (18 a second in all) through the cluster IPs."""
STEADY_SECONDS = 10.0
"""How long the load runs before the upgrade and on after each transition, the new operator
acting: two autoscaler passes of every service (evaluationIntervalSeconds 5) after the
listing's reconcile of each."""
CHILD_KINDS = "deployments,replicasets,pods,services,poddisruptionbudgets"
EVERY_KIND = f"inferenceservices,{CHILD_KINDS}"
EARLIER_STATE_ANNOTATION = "serving.kiln.dev/autoscaler-state"
EARLIER_STATE: dict[str, Any] = {
    "f:metadata": {"f:annotations": {f"f:{EARLIER_STATE_ANNOTATION}": {}}}
}
"""What of an InferenceService outside its status the operator of PREVIOUS writes: its
autoscaler's state annotation (this version keeps the state in status.autoscalerState)."""
STATUS_WRITES = {"inferenceservices/status", "pods/status"}
"""What an operator may write in a user's namespace across an upgrade: the services' status
(conditions, autoscaling, warm-up) and the warm-up gate's pod condition."""


@dataclass(frozen=True)
class Write:
    """One write request of the operator's ServiceAccount, from the API server's audit log."""

    pod: str
    verb: str
    resource: str
    namespace: str
    name: str
    agent: str

    def __str__(self) -> str:
        return f"{self.verb} {self.resource}/{self.name} ({self.pod}, {self.agent})"


class AuditLog:
    """The local API server's audit log (one Metadata line per write), read from a mark on."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        return self.path.stat().st_size

    def operator_writes(self, since: int) -> list[Write]:
        with self.path.open("rb") as log:
            log.seek(since)
            lines = log.read().decode(errors="replace").splitlines()
        writes = []
        for line in lines:
            if not line.strip():
                continue
            entry = json.loads(line)
            user = entry.get("user") or {}
            if user.get("username") != SERVICE_ACCOUNT or entry.get("stage") != "ResponseComplete":
                continue
            ref = entry.get("objectRef") or {}
            resource = ref.get("resource", "")
            if ref.get("subresource"):
                resource += f"/{ref['subresource']}"
            pods = (user.get("extra") or {}).get("authentication.kubernetes.io/pod-name") or ["?"]
            writes.append(
                Write(
                    pod=pods[0], verb=entry["verb"], resource=resource,
                    namespace=ref.get("namespace", ""), name=ref.get("name", ""),
                    agent=entry.get("userAgent", "").split(" ")[0],
                )
            )  # fmt: skip
        return writes


def tally(writes: list[Write]) -> dict[str, int]:
    """Writes counted by verb and resource, for the report."""
    return dict(sorted(Counter(f"{w.verb} {w.resource}" for w in writes).items()))


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository as it was at PREVIOUS, from git history."""
    tree = tmp_path_factory.mktemp("previous")
    archive = tree / "tree.tar"
    found = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", f"--output={archive}", PREVIOUS],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if found.returncode != 0:
        pytest.fail(f"commit {PREVIOUS} is not in this clone's history: {found.stderr.strip()}")
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree


@dataclass
class Upgrade:
    tools: Tools
    previous: Path
    audit: AuditLog


@pytest.fixture(scope="module")
def kiln_previous(
    cluster: E2ECluster,
    operator: HostOperator | None,
    previous_tree: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Upgrade]:
    """Kiln installed from PREVIOUS's tree by its README's commands, both operator images (that
    one's and this checkout's) imported into the node; the suite's own operator stopped
    meanwhile; uninstalled and its namespace deleted afterwards."""
    if cluster.local is None or operator is None:
        missing_component("the operator images are imported into the local cluster's node")
        raise AssertionError("unreachable")
    info = cluster.local.recorded_info()
    assert info is not None
    tools = Tools(cluster, go_tool("helm"), tmp_path_factory.mktemp("helm"))
    started = time.monotonic()
    for tree, image in ((previous_tree, PREVIOUS_IMAGE), (REPO, IMAGE)):
        subprocess.run(
            ["make", "image-operator", f"OPERATOR_IMAGE={image}"], cwd=tree, check=True,
            timeout=1200, capture_output=True,
        )  # fmt: skip
        cluster.local.import_image(image)
    print(f"\nboth operator images built and imported: {time.monotonic() - started:.1f} s")
    prometheus = cluster.local.pod_prometheus_url()
    if cluster.kubectl("get", "namespace", SYSTEM, check=False).returncode == 0:
        pytest.fail(f"namespace {SYSTEM} exists already (from another test?): delete it first")
    with operator.paused():
        try:
            started = time.monotonic()
            for command in INSTALL[:-1]:
                tools.run(command, cwd=previous_tree)
            tools.run(
                INSTALL[-1], "-f", LOCAL_VALUES, "--set", f"prometheus.url={prometheus}",
                "--set", f"image.tag={PREVIOUS_IMAGE.split(':')[1]}", cwd=previous_tree,
            )  # fmt: skip
            wait_rolled_out(cluster, PREVIOUS_IMAGE)
            print(
                f"helm install of {PREVIOUS} -> 2 operator pods Ready, one acting:"
                f" {time.monotonic() - started:.1f} s"
            )
            yield Upgrade(tools, previous_tree, AuditLog(Path(info.audit_log)))
        finally:
            tools.run(f"helm uninstall {RELEASE} -n {SYSTEM}", "--wait", check=False)
            cluster.kubectl("delete", "namespace", SYSTEM, "--wait=true", check=False, timeout=120)


def wait_rolled_out(cluster: E2ECluster, image: str) -> set[str]:
    """Wait until exactly two operator pods run, both of `image` and Ready, one of them acting;
    their names."""

    def rolled_out() -> bool:
        every = cluster.get_json("pods", "-n", SYSTEM, "-l", f"app.kubernetes.io/name={OPERATOR}")[
            "items"
        ]
        return len(every) == 2 and all(image_of(p) == image and ready(p) for p in every)

    try:
        wait_for(rolled_out, timeout=180, interval=0.5, description=f"2 operator pods of {image}")
        wait_for(
            lambda: sum(acting(log) for log in operator_logs(cluster).values()) == 1,
            timeout=90, interval=1, description="exactly one peered replica acting",
        )  # fmt: skip
    except TimeoutError as error:
        raise TimeoutError(f"{error}\n{operator_state(cluster)}") from error
    return {p["metadata"]["name"] for p in operator_pods(cluster)}


def objects(cluster: E2ECluster, namespace: str, kinds: str) -> dict[str, Any]:
    """The objects as the API server holds them, status aside: metadata (but its
    resourceVersion, which status writes move, and the status subresource's managed fields),
    spec, and each pod's containers' restart counts. Of an InferenceService, not the state
    annotation of PREVIOUS's autoscaler either (nor its field manager's entry): the old pods may
    still write it while the new ones start; the audit log tells whose writes those are."""
    found: dict[str, Any] = {}
    for item in cluster.get_json(kinds, "-n", namespace)["items"]:
        meta = dict(item["metadata"])
        meta.pop("resourceVersion", None)
        meta["managedFields"] = [
            f for f in meta.get("managedFields") or [] if f.get("subresource") != "status"
        ]
        if item["kind"] == "InferenceService":
            annotations = dict(meta.get("annotations") or {})
            annotations.pop(EARLIER_STATE_ANNOTATION, None)
            meta["annotations"] = annotations
            meta["managedFields"] = [f for f in meta["managedFields"] if f["manager"] != MANAGER]
        kept: dict[str, Any] = {"metadata": meta, "spec": item.get("spec")}
        if item["kind"] == "Pod":
            statuses = (item.get("status") or {}).get("containerStatuses") or []
            kept["restarts"] = {s["name"]: s["restartCount"] for s in statuses}
        found[f"{item['kind']}/{meta['name']}"] = kept
    return found


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What changed between two `objects` snapshots, one line per object."""
    lines = [f"gone: {key}" for key in sorted(set(before) - set(after))]
    lines += [f"new: {key}" for key in sorted(set(after) - set(before))]
    for key in sorted(set(before) & set(after)):
        if before[key] != after[key]:
            lines.append(f"changed: {key}: {json.dumps(before[key])} -> {json.dumps(after[key])}")
    return lines


def operator_fields_outside_status(cluster: E2ECluster, namespace: str) -> dict[str, Any]:
    """Per InferenceService, the fields outside its status that the operator's field manager
    owns (None: none): what its writes of the object itself have set."""
    owned: dict[str, Any] = {}
    for item in cluster.get_json("inferenceservices", "-n", namespace)["items"]:
        owned[item["metadata"]["name"]] = next(
            (
                entry.get("fieldsV1")
                for entry in item["metadata"].get("managedFields") or []
                if entry["manager"] == MANAGER and entry.get("subresource") != "status"
            ),
            None,
        )
    return owned


def answers(address: str) -> bool:
    try:
        http_call(address)
    except Exception:  # not yet: kube-proxy does not route to its endpoints yet
        return False
    return True


def service_manifest(name: str, model: Model) -> str:
    spec = yaml.safe_load(inference_service(name, model))
    spec["spec"]["model"]["name"] = "mlp"  # the name the clients ask for
    spec["spec"]["resources"] = {"gpuCount": 0, "cpu": "300m", "memory": "1Gi"}
    spec["spec"]["slo"] = {"p99LatencyMilliseconds": 250}
    # One replica each: a scale-up under this machine's load would be the autoscaler's doing, not
    # the upgrade's; the autoscaler still evaluates every 5 s and writes what it decides.
    spec["spec"]["autoscaling"] = {
        "minReplicas": 1, "maxReplicas": 1,
        "evaluationIntervalSeconds": 5, "metricsWindowSeconds": 15,
    }  # fmt: skip
    return yaml.safe_dump(spec)


@dataclass
class Transition:
    """One `helm upgrade` or `helm rollback` under load."""

    name: str
    seconds: float
    """From the command to both new operator pods Ready and one of them acting."""
    pods: set[str]
    writes: list[Write]
    """Every write of the operator's ServiceAccount from the command to the end of the steady
    window after it."""


def transition(
    cluster: E2ECluster, upgrade: Upgrade, name: str, image: str, *commands: tuple[str, ...]
) -> Transition:
    mark = upgrade.audit.mark()
    started = time.monotonic()
    for command, *extra in commands:
        print(f"\n$ {command}\n{upgrade.tools.run(command, *extra).stdout}", end="")
    pods = wait_rolled_out(cluster, image)
    seconds = time.monotonic() - started
    time.sleep(STEADY_SECONDS)
    return Transition(name, seconds, pods, upgrade.audit.operator_writes(mark))


def test_upgrade_and_rollback_under_load_fail_no_request_and_touch_no_users_object(
    cluster: E2ECluster, kiln_previous: Upgrade, namespace: str, model: Model
) -> None:
    old_pods = {p["metadata"]["name"] for p in operator_pods(cluster)}
    for name in SERVICES:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=service_manifest(name, model))
    for name in SERVICES:
        cluster.kubectl(
            "wait", "-n", namespace, "--for=condition=Ready", f"inferenceservice/{name}",
            "--timeout=300s", timeout=310,
        )  # fmt: skip
    wait_for(
        lambda: len(pods := runtime_pods(cluster, namespace)) == 3 and all(map(ready, pods)),
        timeout=120, interval=1, description="3 runtime pods Ready",
    )  # fmt: skip

    stop = threading.Event()
    loads: list[tuple[Paced, threading.Thread]] = []
    closes = []
    with (
        service_address(cluster, namespace, SERVICES[0]) as first,
        service_address(cluster, namespace, SERVICES[1]) as second,
        service_address(cluster, namespace, SERVICES[2]) as third,
    ):
        addresses = dict(zip(SERVICES, (first, second, third), strict=True))
        for address in addresses.values():
            # kube-proxy follows a new Service's endpoints a moment after they are ready (a run
            # saw connections refused for the first calls): the load starts once each answers.
            wait_for(
                functools.partial(answers, address[HTTP]), timeout=60, interval=0.5,
                description="each Service answering through its cluster IP",
            )  # fmt: skip
        try:
            for name, address in addresses.items():
                call, close = grpc_caller(address[GRPC])
                closes.append(close)
                loads.append(paced(f"{name}, gRPC", call, PER_SECOND, stop))
                loads.append(
                    paced(
                        f"{name}, HTTP",
                        functools.partial(http_call, address[HTTP]),
                        PER_SECOND,
                        stop,
                    )
                )
            time.sleep(STEADY_SECONDS)  # the old operator's autoscaler has seen the load
            before = objects(cluster, namespace, EVERY_KIND)
            upgraded = transition(
                cluster, kiln_previous, "upgrade", IMAGE,
                (UPGRADE[0],), (UPGRADE[1], "--set", f"image.tag={IMAGE.split(':')[1]}"),
            )  # fmt: skip
            after_upgrade = objects(cluster, namespace, EVERY_KIND)
            rolled_back = transition(
                cluster, kiln_previous, "rollback", PREVIOUS_IMAGE, (ROLLBACK,)
            )
            after_rollback = objects(cluster, namespace, CHILD_KINDS)
            outside_status = operator_fields_outside_status(cluster, namespace)
        finally:
            stop.set()
            for _, thread in loads:
                thread.join(timeout=30)
            for close in closes:
                close()

    answered = sum(outcome.answered for outcome, _ in loads)
    failures = [f"{o.name}: {f}" for o, _ in loads for f in o.failures]
    report = [
        f"\n{answered} calls through the 3 Services' cluster IPs, {len(failures)} failed",
    ]
    for step in (upgraded, rolled_back):
        mine = [w for w in step.writes if w.pod in step.pods]
        others = [w for w in step.writes if w.pod not in step.pods]
        report.append(
            f"helm {step.name}: 2 new operator pods Ready, one acting, in {step.seconds:.1f} s;"
            f" writes of the new pods: {tally(mine)}; of the pods they replaced: {tally(others)}"
        )
        report.extend(f"  {w}" for w in mine if w.namespace == namespace)
    print("\n".join(report))
    assert failures == [], failures[:10]
    assert old_pods.isdisjoint(upgraded.pods) and upgraded.pods.isdisjoint(rolled_back.pods)
    assert differences(before, after_upgrade) == []
    children_after_upgrade = {k: v for k, v in after_upgrade.items() if k in after_rollback}
    assert differences(children_after_upgrade, after_rollback) == []
    for step in (upgraded, rolled_back):
        unknown = [w for w in step.writes if w.pod == "?"]
        assert unknown == [], [str(w) for w in unknown]  # every write is a pod's
    # The new operator writes nothing of a user's namespace but status.
    users = [
        w for w in upgraded.writes
        if w.pod in upgraded.pods and w.namespace == namespace
        and w.resource not in STATUS_WRITES
    ]  # fmt: skip
    assert users == [], [str(w) for w in users]
    # The operator rolled back to writes what that version writes: status, and its autoscaler's
    # state annotation (the only field outside status its field manager owns), nothing else.
    earlier = [
        w for w in rolled_back.writes
        if w.pod in rolled_back.pods and w.namespace == namespace
        and w.resource not in STATUS_WRITES
    ]  # fmt: skip
    assert {(w.verb, w.resource) for w in earlier} <= {("patch", "inferenceservices")}, earlier
    assert all(fields in (None, EARLIER_STATE) for fields in outside_status.values()), (
        outside_status
    )


def test_the_readme_shows_the_upgrade_and_rollback() -> None:
    section = readme_commands()
    for command in (*UPGRADE, ROLLBACK):
        assert f"\n{command}" in section, command
