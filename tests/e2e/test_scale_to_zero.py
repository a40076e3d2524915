"""Scale to zero on the real node: Kiln's activator as the chart deploys it (two restricted pods
of the runtime image), a service at `minReplicas: 0` with the shortest idle window, and clients
that reach it through its Service's cluster IP by its in-cluster name.

- the first request at zero, over HTTP and over gRPC (tritonclient), is held and answered by a
  pod that had passed its warm-up gate;
- a burst of 200 concurrent requests at zero: each answered, or refused with 503 / UNAVAILABLE
  within its deadline; none lost without an answer;
- cycles of 0 -> 1 -> 0 with a trickle client lose no request;
- a pre-warm schedule wakes a second service from zero before the schedule's start;
- the activator holds 1,000 requests within its container's memory limit.

Why it exists: the hold, the EndpointSlice switch and the release to a gated pod are only real
with kube-proxy, a kubelet's readiness and a pod's cold start: none of them run on kwok or on
loopback (`make bench-scale-to-zero` measures the wake latency over 20 cycles).
"""

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from kiln_localcluster.volumes import provision_claim
from kiln_localcluster.waiting import wait_for
from tests.e2e.conftest import STATE_DIR, E2ECluster, HostOperator, Model
from tests.e2e.test_real_node import GRPC, HTTP
from tests.e2e.zero_setup import (
    ACTIVATOR_NAMESPACE,
    HOLD_TIMEOUT_SECONDS,
    ActivatorPod,
    Answer,
    activator_memory,
    control_env,
    deploy_activator,
    gate_passed_at,
    grpc_infer,
    hold_many,
    http_infer,
    memory_limit,
    read_control,
    remove_activator,
    replicas,
    restricted_namespace,
    service_ip,
    wait_at_zero,
    zero_service,
)
from tests.sessioncluster import missing_component, write_example_model

pytestmark = pytest.mark.timeout(900)
"""The first test also waits for the module's set-up: the activator, two services ready."""

NAME = "mlp"
"""The runtime serves the model under its service's name: the model the clients call."""
CYCLES = int(os.environ.get("KILN_E2E_ZERO_CYCLES", "1"))
"""0 -> 1 -> 0 cycles under a trickle in `make test` (each about 75 s); `make
bench-scale-to-zero` runs 20 of them on the real node and counts what is lost."""
BURST = 200
HELD = 1000
HELD_BODY_BYTES = 10 << 10
GRPC_DEADLINE_SECONDS = 40.0
"""Below the hold: a gRPC call's own deadline (grpc-timeout) is the shorter and must be kept."""
HTTP_DEADLINE_SECONDS = HOLD_TIMEOUT_SECONDS + 15.0


class GateWatch:
    """When each pod of a namespace passed its warm-up gate, polled in the background: a pod
    the pre-warm schedule woke may be gone (its window over, idle again) by the time its test
    reads this."""

    def __init__(self, cluster: E2ECluster, namespace: str) -> None:
        self.gates: dict[str, float] = {}
        self.stop = threading.Event()
        self._cluster, self._namespace = cluster, namespace
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(2):
            got = self._cluster.kubectl(
                "get", "pods", "-n", self._namespace, "-o", "json", check=False, timeout=20
            )
            if got.returncode != 0:
                continue
            for pod in json.loads(got.stdout)["items"]:
                gated = gate_passed_at(pod)
                if gated is not None:
                    self.gates.setdefault(pod["metadata"]["name"], gated)


@dataclass(frozen=True)
class Zero:
    """The module's set-up: the service at zero (`namespace`), the pre-warmed one, the
    activator's pods and the pre-warm schedule's start."""

    namespace: str
    prewarmed: str
    activators: list[ActivatorPod]
    prewarm_start: datetime
    prewarm_gates: GateWatch

    @property
    def activator_ips(self) -> set[str]:
        return {pod.ip for pod in self.activators}

    def host(self, namespace: str | None = None) -> str:
        return f"{NAME}.{namespace or self.namespace}"


def _namespace_with_model(cluster: E2ECluster, name: str) -> Model:
    restricted_namespace(cluster, name)
    local = cluster.local
    assert local is not None
    info = local.recorded_info()
    assert info is not None
    provision_claim(info, name, "models", write_example_model(STATE_DIR / "models" / name))
    return Model(uri="pvc://models/mlp/model.pt", claim="models")


def _prewarm_start(now: datetime) -> datetime:
    """The first whole minute at least 150 s away: the pre-warmed service is at zero by then
    (created, ready, idle 30 s past the metrics window) with its cold start measured."""
    return (now + timedelta(seconds=150 + 59)).replace(second=0, microsecond=0)


@pytest.fixture(scope="module")
def zero(cluster: E2ECluster, operator: HostOperator | None) -> Iterator[Zero]:
    if cluster.local is None or operator is None:
        missing_component(
            "the activator is reported to by the operator of this machine: local only"
        )
        raise AssertionError("unreachable")
    info = cluster.local.recorded_info()
    assert info is not None
    suffix = f"{int(time.time()) % 100000:05d}"
    namespace, prewarmed = f"zero-{suffix}", f"zero-prewarm-{suffix}"
    pods = deploy_activator(cluster)
    assert len(pods) == 2, pods
    host = HostOperator(
        cluster, STATE_DIR / "operator-zero.log", info.prometheus, extra_env=control_env(pods)
    )
    with operator.paused():
        host.start()
        try:
            model = _namespace_with_model(cluster, namespace)
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=zero_service(NAME, model))
            start = _prewarm_start(datetime.now(UTC))
            schedule = {
                "schedules": [
                    {"name": "ahead", "cron": f"{start.minute} {start.hour} * * *",
                     "timeZone": "UTC", "durationMinutes": 1, "minReplicas": 1}
                ],
                # the autoscaler's pass (5 s) and a cold start slowed by the other service's
                "leadTimeMarginSeconds": 15,
            }  # fmt: skip
            warm_model = _namespace_with_model(cluster, prewarmed)
            manifest = zero_service(NAME, warm_model, prewarm=schedule)
            cluster.kubectl("apply", "-n", prewarmed, "-f", "-", input=manifest)
            for space in (namespace, prewarmed):
                wait_for(
                    lambda space=space: cluster.kubectl(  # type: ignore[misc]
                        "wait", "-n", space, "--for=condition=Ready",
                        f"inferenceservice/{NAME}", "--timeout=5s", check=False,
                    ).returncode == 0,
                    timeout=240, interval=2, description=f"{space}/{NAME} Ready",
                )  # fmt: skip
            watch = GateWatch(cluster, prewarmed)
            try:
                yield Zero(namespace, prewarmed, pods, start, watch)
            finally:
                watch.stop.set()
                watch.thread.join(timeout=30)
        finally:
            for space in (namespace, prewarmed):
                cluster.kubectl("delete", "namespace", space, "--wait=false", check=False)
            host.stop()
            remove_activator(cluster)


@pytest.fixture
def namespace(zero: Zero) -> str:
    """The service at zero's namespace (what a failed test reports the state of)."""
    return zero.namespace


def _addresses(cluster: E2ECluster, zero: Zero, namespace: str | None = None) -> tuple[str, str]:
    ip = service_ip(cluster, namespace or zero.namespace, NAME)
    return f"{ip}:{HTTP}", f"{ip}:{GRPC}"


def _http(address: str, host: str, timeout: float = HTTP_DEADLINE_SECONDS) -> Answer:
    return http_infer(address, host, timeout)


def test_the_activator_holds_1000_requests_within_its_memory_limit(
    cluster: E2ECluster, zero: Zero
) -> None:
    """1,000 requests of 10 KiB held by one activator pod for a service nobody wakes."""
    pod = zero.activators[0]
    limit = memory_limit(cluster)
    rest_rss, rest_cgroup = activator_memory(cluster, pod)
    ghost = f"ghost.{zero.namespace}"

    async def hold_and_measure() -> tuple[int, int, int]:
        writers = await hold_many(pod.ip, ghost, HELD, HELD_BODY_BYTES)
        try:

            def held() -> int:
                demand = read_control(pod.ip, "/v1/demand")["services"]
                return sum(e["held"] for e in demand if e["name"] == "ghost")

            await asyncio.to_thread(
                wait_for, lambda: held() == HELD, timeout=30, description="1,000 held"
            )
            rss, cgroup = await asyncio.to_thread(activator_memory, cluster, pod)
            return held(), rss, cgroup
        finally:
            for writer in writers:
                writer.close()

    count, rss, cgroup = asyncio.run(hold_and_measure())
    assert count == HELD
    assert cgroup < limit, (cgroup, limit)
    status = cluster.get_json("pod", pod.name, "-n", ACTIVATOR_NAMESPACE)["status"]
    assert status["containerStatuses"][0]["restartCount"] == 0, status
    print(
        f"\nactivator: {rest_rss / 2**20:.0f} MiB RSS at rest, {rss / 2**20:.0f} MiB with "
        f"{count} requests of {HELD_BODY_BYTES >> 10} KiB held (cgroup {rest_cgroup / 2**20:.0f}"
        f" -> {cgroup / 2**20:.0f} MiB, limit {limit / 2**20:.0f} MiB)"
    )


def test_first_request_at_zero_over_http_and_grpc_is_answered_by_a_gated_pod(
    cluster: E2ECluster, zero: Zero
) -> None:
    took = wait_at_zero(cluster, zero.namespace, NAME, zero.activator_ips, timeout=240)
    events = cluster.get_json(
        "events", "-n", zero.namespace, "--field-selector", "reason=ScaledToZero"
    )["items"]
    assert events, "no ScaledToZero event"
    ready = cluster.get_json("inferenceservice", NAME, "-n", zero.namespace)["status"]
    by_type = {c["type"]: c for c in ready["conditions"]}
    assert (by_type["Ready"]["status"], by_type["Ready"]["reason"]) == ("True", "ScaledToZero")
    http_address, grpc_address = _addresses(cluster, zero)
    with ThreadPoolExecutor(2) as pool:
        http = pool.submit(_http, http_address, zero.host())
        grpc = pool.submit(grpc_infer, grpc_address, zero.host(), GRPC_DEADLINE_SECONDS)
        answers = {"http": http.result(), "grpc": grpc.result()}
    answered_at = time.time()
    for protocol, answer in answers.items():
        assert answer.answered, (protocol, answer)
    (pod,) = (
        item
        for item in cluster.get_json(
            "pods", "-n", zero.namespace, "-l", f"serving.kiln.dev/inferenceservice={NAME}"
        )["items"]
        if item["metadata"].get("deletionTimestamp") is None
    )
    gated = gate_passed_at(pod)
    assert gated is not None, pod["status"]
    # the held answers came from a pod past its gate: the gate (1 s resolution) was passed
    # before the answers arrived
    first_answer = answered_at - min(a.seconds for a in answers.values())
    assert gated <= answered_at, (gated, answered_at)
    assert min(a.seconds for a in answers.values()) > 2, answers  # held through a cold start
    metrics = read_control(zero.activators[0].ip, "/metrics") + read_control(
        zero.activators[1].ip, "/metrics"
    )
    assert "kiln_activator_wake_seconds_count" in metrics
    print(
        f"\nat zero {took:.0f} s after the module's wait; first requests held and answered: "
        f"HTTP {answers['http'].seconds:.1f} s, gRPC {answers['grpc'].seconds:.1f} s "
        f"(sent {answered_at - first_answer:.1f} s before the last answer)"
    )


def test_a_burst_of_200_at_zero_is_answered_or_refused_within_its_deadline(
    cluster: E2ECluster, zero: Zero
) -> None:
    wait_at_zero(cluster, zero.namespace, NAME, zero.activator_ips, timeout=240)
    http_address, grpc_address = _addresses(cluster, zero)

    def call(index: int) -> tuple[str, float, Answer]:
        if index % 2:
            return (
                "grpc",
                GRPC_DEADLINE_SECONDS,
                grpc_infer(grpc_address, zero.host(), GRPC_DEADLINE_SECONDS),
            )
        return "http", HTTP_DEADLINE_SECONDS, _http(http_address, zero.host())

    with ThreadPoolExecutor(BURST) as pool:
        outcomes = list(pool.map(call, range(BURST)))
    lost = [(p, a) for p, _, a in outcomes if not (a.answered or a.refused)]
    late = [(p, a) for p, deadline, a in outcomes if a.refused and a.seconds > deadline + 1]
    assert not lost, lost[:5]
    assert not late, late[:5]
    answered = sum(a.answered for _, _, a in outcomes)
    refused = sum(a.refused for _, _, a in outcomes)
    slowest = max(a.seconds for _, _, a in outcomes)
    print(
        f"\nburst of {BURST} at zero (100 HTTP, 100 gRPC): {answered} answered, {refused} refused "
        f"as waking, 0 lost; slowest {slowest:.1f} s"
    )


class Trickle:
    """One HTTP request every `period` seconds through the Service until stopped."""

    def __init__(self, address: str, host: str, period: float) -> None:
        self.address, self.host, self.period = address, host, period
        self.answers: list[Answer] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def first_answered(self) -> bool:
        return len(self.answers) >= 1

    def _run(self) -> None:
        while not self.stop.is_set():
            self.answers.append(_http(self.address, self.host))
            self.stop.wait(self.period)


def test_cycles_from_zero_to_one_and_back_with_a_trickle_client_lose_no_request(
    cluster: E2ECluster, zero: Zero
) -> None:
    """Each cycle: at zero, a trickle of requests (one every 2 s for 10 s) wakes the service and
    is answered, the first through the activator (its Via header), the last straight from the
    pod; then silence until it is at zero again."""
    http_address, _ = _addresses(cluster, zero)
    wakes: list[float] = []
    answers: list[Answer] = []
    for _ in range(CYCLES):
        wait_at_zero(cluster, zero.namespace, NAME, zero.activator_ips, timeout=240)
        trickle = Trickle(http_address, zero.host(), period=2.0)
        trickle.thread.start()
        wait_for(
            trickle.first_answered, timeout=HTTP_DEADLINE_SECONDS + 10,
            interval=0.2, description="the waking request answered",
        )  # fmt: skip
        time.sleep(10)
        trickle.stop.set()
        trickle.thread.join(timeout=HTTP_DEADLINE_SECONDS + 10)
        wakes.append(trickle.answers[0].seconds)
        answers += trickle.answers
        assert replicas(cluster, zero.namespace, NAME) == 1
        # held by the activator while at zero; out of the data path once the service is awake
        assert trickle.answers[0].via_activator, trickle.answers[0]
        assert not trickle.answers[-1].via_activator, trickle.answers
    lost = [a for a in answers if not a.answered]
    assert not lost, lost[:5]
    print(
        f"\n{CYCLES} cycles 0 -> 1 -> 0: {len(answers)} requests, 0 lost; waking request "
        f"answered after {', '.join(f'{s:.1f}' for s in wakes)} s"
    )


def test_a_prewarm_schedule_wakes_the_service_from_zero_before_its_start(
    cluster: E2ECluster, zero: Zero
) -> None:
    events = cluster.get_json(
        "events", "-n", zero.prewarmed, "--field-selector", "reason=ScaledToZero"
    )["items"]
    assert events, "the pre-warmed service never went to zero"
    zeroed = min(_event_time(e) for e in events)
    start = zero.prewarm_start.timestamp()
    assert zeroed < start, (zeroed, start)

    def gated_pod() -> float | None:
        times = [t for t in zero.prewarm_gates.gates.values() if t > zeroed]
        return min(times) if times else None

    gated = wait_for(
        gated_pod, timeout=max(10.0, start - time.time() + 60), interval=1,
        description="the pre-warmed service's pod past its gate",
    )  # fmt: skip
    assert gated <= start, f"gated {gated - start:.0f} s after the schedule's start"
    print(
        f"\npre-warm: at zero {start - zeroed:.0f} s before the schedule's start, a pod past "
        f"its gate {start - gated:.0f} s before it"
    )


def _event_time(event: dict[str, object]) -> float:
    stamp = event.get("firstTimestamp") or event.get("eventTime") or event.get("lastTimestamp")
    assert isinstance(stamp, str), event
    stamp = stamp.split(".")[0].rstrip("Z")
    return datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp()
