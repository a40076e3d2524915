"""Ready says why: the first cause read from the Deployment and the pods as the watches deliver
them (statuses written the way the scheduler, the ReplicaSet controller, the kubelet and the
warm-up gate write them), a stalled rollout says how many old pods serve, and the replica floor
has its own condition."""

from datetime import UTC, datetime
from typing import Any

from kiln_operator import constants
from kiln_operator.status.causes import failed_warmup, first_cause
from kiln_operator.status.compute import ReconcileObservation, compute_status
from tests.unit import kube_objects
from tests.unit.kube_objects import pod

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


UNSCHEDULABLE_GPUS = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes "
    "are available: 3 No preemption victims found for incoming pod.",
}
READY = {"type": "Ready", "status": "True"}


def runtime(state: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "name": "runtime",
        "image": "kiln/runtime:dev",
        "ready": False,
        "state": state,
        **fields,
    }


def deployment(**fields: Any) -> dict[str, Any]:
    """One pod wanted, none available, no conditions: where each cause is looked for."""
    defaults: dict[str, Any] = {
        "desired": 1,
        "replicas": 1,
        "updated": 1,
        "available": 0,
        "conditions": [],
    }
    return kube_objects.deployment(**{**defaults, **fields})


def test_the_schedulers_reason_is_the_cause_of_an_unschedulable_pod() -> None:
    cause = first_cause(deployment(), [pod("a", UNSCHEDULABLE_GPUS)])
    assert cause is not None and cause.failure
    assert cause.reason == constants.REASON_UNSCHEDULABLE
    assert cause.message.startswith("pod a cannot be scheduled: 0/3 nodes are available: 3 ")
    assert "Insufficient nvidia.com/gpu" in cause.message


def test_a_quota_refusing_pods_comes_first() -> None:
    failure = {
        "type": "ReplicaFailure",
        "status": "True",
        "reason": "FailedCreate",
        "message": 'pods "mlp-5d4f-x" is forbidden: exceeded quota: gpu-quota, requested: '
        "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=3, limited: "
        "requests.nvidia.com/gpu=3",
    }
    cause = first_cause(deployment(conditions=[failure]), [pod("a", UNSCHEDULABLE_GPUS)])
    assert cause is not None and cause.reason == constants.REASON_PODS_REFUSED
    assert "exceeded quota: gpu-quota" in cause.message


def test_image_pull_and_crash_loop_carry_the_kubelets_words() -> None:
    pulling = runtime(
        {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x:1"'}}
    )
    cause = first_cause(deployment(), [pod("a", containers=[pulling])])
    assert cause is not None and cause.reason == constants.REASON_IMAGE_PULL_FAILED
    assert "ImagePullBackOff" in cause.message and "Back-off pulling image" in cause.message

    crashing = runtime(
        {"waiting": {"reason": "CrashLoopBackOff"}},
        restartCount=4,
        lastState={
            "terminated": {
                "exitCode": 2,
                "reason": "Error",
                "message": "model file /models/x/model.pt not found",
            }
        },
    )
    cause = first_cause(deployment(), [pod("a", containers=[crashing])])
    assert cause is not None and cause.reason == constants.REASON_CRASH_LOOP
    assert "4 restarts; last exit code 2, Error" in cause.message
    assert cause.message.endswith("model file /models/x/model.pt not found")


def test_a_failed_warm_up_is_a_failure_and_warming_up_is_progress() -> None:
    failed = {
        "type": constants.CONDITION_WARMED_UP,
        "status": "False",
        "reason": "RequestErrors",
        "message": "92 of 200 warm-up requests failed: connection refused",
    }
    cause = first_cause(deployment(), [pod("a", failed)])
    assert cause is not None and cause.failure
    assert cause.reason == constants.REASON_WARMUP_FAILED
    assert "(RequestErrors): 92 of 200 warm-up requests failed: connection refused" in cause.message

    warming = {**failed, "reason": "WarmingUp", "message": "attempt 1/3"}
    running = {"name": "runtime", "ready": True, "state": {"running": {}}}
    cause = first_cause(deployment(), [pod("a", warming, containers=[running])])
    assert cause is not None and not cause.failure
    assert cause.reason == constants.REASON_WARMING_UP


def test_failed_warmup_names_a_pod_the_gate_failed_whatever_else_the_pods_show() -> None:
    """What rolls a canary back at once: a final verdict of the gate, even while another pod
    crashes (first_cause would name the crash), never a gate still warming up nor a pod on its
    way out."""
    failed = {
        "type": constants.CONDITION_WARMED_UP,
        "status": "False",
        "reason": "P99OverBound",
        "message": "warm-up p99 1900.00 ms (p50 800.00 ms) over 25 requests exceeds 1000 ms",
    }
    warming = {**failed, "reason": "WarmingUp", "message": "attempt 1/3"}
    passed = {**failed, "status": "True", "reason": "WarmedUp"}
    crashing = runtime({"waiting": {"reason": "CrashLoopBackOff"}}, lastState={
        "terminated": {"exitCode": 1, "reason": "Error"}
    })  # fmt: skip
    leaving = pod("c", failed)
    leaving["metadata"]["deletionTimestamp"] = "2026-11-25T12:00:00Z"
    assert failed_warmup([pod("a", warming), pod("b", passed), leaving]) is None
    said = failed_warmup([pod("a", containers=[crashing]), pod("b", failed), pod("d", failed)])
    assert said == (
        "warm-up of pod b failed (P99OverBound): warm-up p99 1900.00 ms (p50 800.00 ms) over 25 "
        "requests exceeds 1000 ms"
    )


def test_a_runtime_that_runs_but_is_not_ready_is_named() -> None:
    cause = first_cause(deployment(), [pod("a", containers=[runtime({"running": {}})])])
    assert cause is not None and cause.reason == constants.REASON_RUNTIME_NOT_READY


def test_ready_pods_have_no_cause_and_failures_beat_progress() -> None:
    assert first_cause(deployment(), [pod("a", READY)]) is None
    assert first_cause(None, []) is None
    starting = pod("new", created="2026-11-25T11:59:00Z", containers=[runtime({"running": {}})])
    stuck = pod("old", UNSCHEDULABLE_GPUS)
    cause = first_cause(deployment(), [starting, stuck])
    assert cause is not None and cause.reason == constants.REASON_UNSCHEDULABLE


def observe(body: dict[str, Any], pods: list[dict[str, Any]], min_replicas: int = 1) -> Any:
    observation = ReconcileObservation(
        generation=2,
        spec_error=None,
        deployment=body,
        selector="s",
        url="u",
        grpc_address="g",
        pods=tuple(pods),
        min_replicas=min_replicas,
    )
    conditions = compute_status({}, observation, NOW).applied["conditions"]
    return {c["type"]: c for c in conditions}


def test_ready_names_the_cause_when_no_pod_serves() -> None:
    conditions = observe(deployment(), [pod("a", UNSCHEDULABLE_GPUS)])
    ready = conditions["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "Unschedulable")
    assert ready["message"].startswith("0 of 1 updated pods are available: pod a cannot be ")
    assert "Insufficient nvidia.com/gpu" in ready["message"]


def test_a_rollout_stalled_behind_an_unschedulable_pod_says_so_and_who_serves() -> None:
    rolling = deployment(desired=1, replicas=2, updated=1, available=1)
    new = pod("new", UNSCHEDULABLE_GPUS, created="2026-11-25T11:59:00Z")
    old = pod("old", READY)
    ready = observe(rolling, [new, old])["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "RolloutStalled")
    assert ready["message"].startswith("the rollout is stalled: pod new cannot be scheduled")
    assert ready["message"].endswith("; 1 pods of the previous spec keep serving")
    assert "terminating" not in observe(rolling, [new, old])["Progressing"]["message"]


def test_the_replica_floor_has_its_own_condition_and_ready_stays_true_while_serving() -> None:
    failure = {
        "type": "ReplicaFailure",
        "status": "True",
        "reason": "FailedCreate",
        "message": "exceeded quota: pods, limited: pods=3",
    }
    serving = deployment(desired=5000, replicas=3, updated=3, available=3, conditions=[failure])
    conditions = observe(serving, [pod(f"p{i}", READY) for i in range(3)], 5000)
    assert conditions["Ready"]["status"] == "True"
    floor = conditions["ReplicaFloorMet"]
    assert (floor["status"], floor["reason"]) == ("False", "FloorNotMet")
    assert floor["message"].startswith("3 of minReplicas 5000 pods available: pods cannot be")
    assert "exceeded quota: pods" in floor["message"]
    met = observe(deployment(available=1), [pod("a", READY)])["ReplicaFloorMet"]
    assert (met["status"], met["reason"]) == ("True", "FloorMet")


MISSING_MODEL = {
    "exitCode": 1,
    "reason": "Error",
    "message": "model 'mlp' failed to start: model path '/models/mlp/v9/model.pt' does not exist",
}
"""What the runtime writes to its termination log when its model path does not exist."""


def crash_cycle() -> dict[str, list[dict[str, Any]]]:
    """The runtime container of a pod whose model does not load, at each step of its crash
    loop as the kubelet reports it."""
    return {
        "just exited": [runtime({"terminated": MISSING_MODEL}, restartCount=0)],
        "backing off": [
            runtime(
                {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
                restartCount=1,
                lastState={"terminated": MISSING_MODEL},
            )
        ],
        "running its retry": [
            runtime(
                {"running": {"startedAt": "2026-11-25T11:59:30Z"}},
                restartCount=1,
                lastState={"terminated": MISSING_MODEL},
            )
        ],
    }


def test_a_runtime_that_exits_at_start_is_a_crash_loop_through_its_whole_cycle() -> None:
    # was: CrashLoop "no termination message" while backing off, RuntimeNotReady ("loading the
    # model") while running the retry
    for step, containers in crash_cycle().items():
        cause = first_cause(deployment(), [pod("a", containers=containers)])
        assert cause is not None and cause.failure, step
        assert cause.reason == constants.REASON_CRASH_LOOP, step
        assert "last exit code 1, Error" in cause.message, step
        assert cause.message.endswith("model path '/models/mlp/v9/model.pt' does not exist")


def test_a_rollout_to_a_model_that_does_not_load_is_stalled_with_the_runtimes_reason() -> None:
    rolling = deployment(desired=1, replicas=2, updated=1, available=1)
    old = pod("old", READY)
    for step, containers in crash_cycle().items():
        new = pod("new", created="2026-11-25T11:59:00Z", containers=containers)
        conditions = observe(rolling, [new, old])
        ready, stalled = conditions["Ready"], conditions["Stalled"]
        assert (ready["status"], ready["reason"]) == ("False", "RolloutStalled"), step
        assert "does not exist" in ready["message"], step
        assert (stalled["status"], stalled["reason"]) == ("True", "RolloutStalled"), step
        assert "model 'mlp' failed to start" in stalled["message"], step


def test_a_restart_that_serves_again_is_no_crash_and_a_first_start_is_progress() -> None:
    oom = {"exitCode": 137, "reason": "OOMKilled"}
    served_again = runtime(
        {"running": {}}, ready=True, restartCount=1, lastState={"terminated": oom}
    )
    assert first_cause(deployment(), [pod("a", containers=[served_again])]) is None
    loading = runtime({"running": {}}, restartCount=0)
    cause = first_cause(deployment(), [pod("a", containers=[loading])])
    assert cause is not None and cause.reason == constants.REASON_RUNTIME_NOT_READY
    stopped = runtime({"terminated": {"exitCode": 0, "reason": "Completed"}})
    assert first_cause(deployment(), [pod("a", containers=[stopped])]) is None
