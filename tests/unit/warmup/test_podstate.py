"""The gate's state lives on the pods: which need warming, the patch, and the status summary."""

import datetime
from typing import Any

from kiln_operator.warmup import podstate

GATE = "serving.kiln.dev/warmed-up"


def pod(
    *conditions: tuple[str, str, str], created: str = "2026-01-01T00:00:00Z", **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "uid": "u", "creationTimestamp": created},
        "spec": {"readinessGates": [{"conditionType": GATE}]},
        "status": {
            "phase": "Running",
            "podIP": "10.244.0.5",
            "conditions": [
                {"type": t, "status": s, "reason": r, "lastTransitionTime": "2026-01-01T00:00:30Z"}
                for t, s, r in conditions
            ],
            **status,
        },
    }


READY_CONTAINERS = ("ContainersReady", "True", "")


def test_a_ready_container_without_a_verdict_needs_warming() -> None:
    assert podstate.needs_warmup(pod(READY_CONTAINERS))


def test_an_interrupted_attempt_is_taken_up_again() -> None:
    assert podstate.needs_warmup(pod(READY_CONTAINERS, (GATE, "False", "WarmingUp")))


def test_decided_pods_are_left_alone() -> None:
    assert not podstate.needs_warmup(pod(READY_CONTAINERS, (GATE, "True", "WarmedUp")))
    assert not podstate.needs_warmup(pod(READY_CONTAINERS, (GATE, "False", "P99OverBound")))


def test_pods_not_yet_running_ready_or_gated_are_not_warmed() -> None:
    assert not podstate.needs_warmup(pod(("ContainersReady", "False", "")))
    assert not podstate.needs_warmup(pod(READY_CONTAINERS, phase="Pending"))
    ungated = pod(READY_CONTAINERS)
    ungated["spec"]["readinessGates"] = []
    assert not podstate.needs_warmup(ungated)
    deleting = pod(READY_CONTAINERS)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    assert not podstate.needs_warmup(deleting)


def test_patch_sets_only_the_gate_condition() -> None:
    now = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
    patch = podstate.condition_patch(True, "WarmedUp", "p99 3 ms", now)
    assert patch == {"status": {"conditions": [{
        "type": GATE, "status": "True", "reason": "WarmedUp", "message": "p99 3 ms",
        "lastTransitionTime": "2026-03-01T12:00:00Z",
    }]}}  # fmt: skip


def test_summary_counts_warm_and_failed_pods_and_cold_starts() -> None:
    warm_fast = pod((GATE, "True", "WarmedUp"), created="2026-01-01T00:00:30Z")
    warm_fast["status"]["conditions"][0]["lastTransitionTime"] = "2026-01-01T00:00:40Z"  # 10 s
    warm_slow = pod((GATE, "True", "WarmedUp"), created="2026-01-01T00:00:00Z")  # 30 s
    failed = pod((GATE, "False", "P99OverBound"))
    failed["status"]["conditions"][0]["message"] = "p99 80 ms exceeds 50 ms"
    warming = pod((GATE, "False", "WarmingUp"))
    summary = podstate.summarize([warm_fast, warm_slow, failed, warming])
    assert summary.warm_replicas == 2
    assert summary.failed_replicas == 1
    assert summary.failure_message == "P99OverBound: p99 80 ms exceeds 50 ms"
    assert summary.cold_start_p50_seconds == 10.0
    assert summary.cold_start_p90_seconds == 30.0
    assert summary.last_cold_start_seconds == 10.0  # the pod warmed most recently


def test_summary_of_no_pods_is_empty() -> None:
    summary = podstate.summarize([])
    assert (summary.warm_replicas, summary.failed_replicas) == (0, 0)
    assert summary.cold_start_p50_seconds is None and summary.failure_message is None


def test_status_leaves_out_what_is_not_known() -> None:
    summary = podstate.summarize([pod((GATE, "True", "WarmedUp"))])
    assert podstate.summary_status(summary) == {
        "warmReplicas": 1,
        "failedReplicas": 0,
        "lastColdStartSeconds": 30.0,
        "coldStartP50Seconds": 30.0,
        "coldStartP90Seconds": 30.0,
    }


def runtime_status(restarts: int, **state: Any) -> list[dict[str, Any]]:
    return [{"name": "runtime", "restartCount": restarts, **state}]


def test_a_container_restarted_after_the_verdict_must_warm_up_again() -> None:
    # The gate passed at 00:00:30 (the helper's transition time).
    crashed = pod(
        (GATE, "True", "WarmedUp"),
        containerStatuses=runtime_status(
            1,
            state={"waiting": {"reason": "CrashLoopBackOff"}},
            lastState={"terminated": {"finishedAt": "2026-01-01T00:05:00Z"}},
        ),
    )
    assert podstate.verdict_outlived_its_container(crashed)
    restarted = pod(
        (GATE, "False", "P99OverBound"),
        containerStatuses=runtime_status(
            1, state={"running": {"startedAt": "2026-01-01T00:06:00Z"}}
        ),
    )
    assert podstate.verdict_outlived_its_container(restarted)


def test_the_gate_closes_as_soon_as_the_first_container_exits_before_its_restart() -> None:
    exited = pod(
        (GATE, "True", "WarmedUp"),
        containerStatuses=runtime_status(
            0, state={"terminated": {"exitCode": 137, "finishedAt": "2026-01-01T00:05:00Z"}}
        ),
    )
    assert podstate.verdict_outlived_its_container(exited)
    exited_before_the_verdict = pod(
        (GATE, "True", "WarmedUp"),
        containerStatuses=runtime_status(
            0, state={"terminated": {"exitCode": 1, "finishedAt": "2026-01-01T00:00:20Z"}}
        ),
    )
    assert not podstate.verdict_outlived_its_container(exited_before_the_verdict)


def test_a_verdict_given_to_the_running_container_stands() -> None:
    first_start = pod(
        (GATE, "True", "WarmedUp"),
        containerStatuses=runtime_status(
            0, state={"running": {"startedAt": "2026-01-01T00:00:10Z"}}
        ),
    )
    assert not podstate.verdict_outlived_its_container(first_start)
    # A restart before the verdict (e.g. a slow first load): the verdict is the new container's.
    early_restart = pod(
        (GATE, "True", "WarmedUp"),
        containerStatuses=runtime_status(
            1,
            state={"running": {"startedAt": "2026-01-01T00:00:20Z"}},
            lastState={"terminated": {"finishedAt": "2026-01-01T00:00:15Z"}},
        ),
    )
    assert not podstate.verdict_outlived_its_container(early_restart)


def test_no_verdict_yet_or_a_disabled_gate_is_not_stale() -> None:
    late = runtime_status(2, state={"running": {"startedAt": "2026-01-01T00:09:00Z"}})
    assert not podstate.verdict_outlived_its_container(pod(containerStatuses=late))
    assert not podstate.verdict_outlived_its_container(
        pod((GATE, "False", "WarmingUp"), containerStatuses=late)
    )
    assert not podstate.verdict_outlived_its_container(
        pod((GATE, "True", "GateDisabled"), containerStatuses=late)
    )
