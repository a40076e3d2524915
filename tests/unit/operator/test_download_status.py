"""A pod that cannot fetch its model: the fetcher's message on Ready, with a Warning event."""

from dataclasses import replace
from typing import Any

from kiln_operator import constants
from kiln_operator.status import compute_status
from kiln_operator.status.download import model_download_failure
from tests.unit.operator.test_status import T0, condition, deployment, observe

DENIED = "model download failed: AccessDenied for s3://models/mlp/model.pt: head: 403 (Forbidden)"


def pod(name: str, fetch_status: dict[str, Any] | None, **meta: Any) -> dict[str, Any]:
    statuses = [] if fetch_status is None else [{"name": constants.FETCH_CONTAINER, **fetch_status}]
    return {"metadata": {"name": name, **meta}, "status": {"initContainerStatuses": statuses}}


def terminated(code: int, message: str = "", reason: str = "Error") -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason, "message": message}}


def test_a_failed_or_crash_looping_fetch_is_reported_with_its_own_message() -> None:
    failed = pod("a", {"state": terminated(4, DENIED + "\n")})
    looping = pod(
        "a",
        {"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": terminated(4, DENIED)},
    )
    assert model_download_failure([failed]) == DENIED
    assert model_download_failure([looping]) == DENIED


def test_no_failure_while_fetching_first_after_success_or_without_a_fetch() -> None:
    fetching = pod("a", {"state": {"running": {}}})
    done = pod(
        "b",
        {
            "state": terminated(0, "model fetched: 10 bytes in 0.1 s from s3://m/x"),
            "lastState": terminated(4, DENIED),  # a retry that succeeded clears the failure
        },
    )
    leaving = pod("c", {"state": terminated(4, DENIED)}, deletionTimestamp="2026-03-01T12:00:00Z")
    assert model_download_failure([fetching, done, leaving, pod("d", None)]) is None


CRASH_LOOP = [
    {"state": terminated(4, DENIED)},
    {"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": terminated(4, DENIED)},
    {
        "state": {"running": {"startedAt": "2026-03-01T12:00:10Z"}},
        "lastState": terminated(4, DENIED),
    },
    {"state": terminated(4, DENIED)},
    {"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": terminated(4, DENIED)},
    {
        "state": {"running": {"startedAt": "2026-03-01T12:00:40Z"}},
        "lastState": terminated(4, DENIED),
    },
]
"""The fetch init container's states through two crash-loop cycles, as the kubelet reports them."""


def test_the_failure_stays_through_the_crash_loop_and_warns_once() -> None:
    status: dict[str, Any] = {}
    events = []
    for fetch_status in CRASH_LOOP:
        pods = (pod("a", fetch_status),)
        assert model_download_failure(list(pods)) == DENIED  # the retry under way, too
        stuck = replace(
            observe(deployment(available=0, ready=0)),
            pods=pods,
            download_failure=model_download_failure(list(pods)),
        )
        update = compute_status(status, stuck, T0)
        status = {**status, **update.applied}
        ready = condition(status, constants.CONDITION_READY)
        assert (ready["reason"], ready["message"]) == (
            constants.REASON_MODEL_DOWNLOAD_FAILED,
            DENIED,
        )
        events += [(e.type, e.reason) for e in update.events]
    assert events == [("Warning", constants.REASON_MODEL_DOWNLOAD_FAILED)]


def test_a_retry_that_succeeds_ends_the_failure() -> None:
    fetched = terminated(0, "model fetched: 10 bytes in 0.1 s from s3://m/x", reason="Completed")
    succeeded = pod("a", {"state": fetched, "lastState": terminated(4, DENIED)})
    stuck = replace(observe(deployment(available=0, ready=0)), download_failure=DENIED)
    first = compute_status({}, stuck, T0)
    after = replace(stuck, download_failure=model_download_failure([succeeded]))
    ready = condition(compute_status(first.applied, after, T0).applied, constants.CONDITION_READY)
    assert ready["reason"] != constants.REASON_MODEL_DOWNLOAD_FAILED


def test_a_fetcher_killed_without_its_message_still_says_why() -> None:
    killed = pod("a", {"state": terminated(137, "", reason="OOMKilled")})
    assert model_download_failure([killed]) == "model download failed: exit code 137 (OOMKilled)"


def test_ready_carries_the_download_failure_and_warns_once_per_message() -> None:
    stuck = replace(observe(deployment(available=0, ready=0)), download_failure=DENIED)
    first = compute_status({}, stuck, T0)
    assert first.patch is not None
    ready = condition(first.patch, constants.CONDITION_READY)
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        constants.REASON_MODEL_DOWNLOAD_FAILED,
        DENIED,
    )
    assert [(e.type, e.reason, e.message) for e in first.events] == [
        ("Warning", constants.REASON_MODEL_DOWNLOAD_FAILED, DENIED)
    ]
    again = compute_status(first.applied, stuck, T0)
    assert again.patch is None and again.events == []


def test_a_failing_new_pod_does_not_unready_a_serving_service() -> None:
    serving = replace(observe(deployment()), download_failure=DENIED)
    ready = condition(compute_status({}, serving, T0).applied, constants.CONDITION_READY)
    assert (ready["status"], ready["reason"]) == ("True", constants.REASON_AVAILABLE)


def test_the_warm_up_summary_reports_the_latest_warm_pods_download() -> None:
    from kiln_operator.warmup import podstate
    from tests.unit.warmup.test_podstate import GATE
    from tests.unit.warmup.test_podstate import pod as gated_pod

    warm = gated_pod((GATE, "True", "WarmedUp"))
    fetched = "model fetched: 268435456 bytes in 3.250 s from s3://models/m/"
    warm["status"]["initContainerStatuses"] = [
        {"name": constants.FETCH_CONTAINER, "state": terminated(0, fetched, reason="Completed")}
    ]
    status = podstate.summary_status(podstate.summarize([warm]))
    assert (status["lastDownloadSeconds"], status["lastDownloadBytes"]) == (3.25, 268435456)
    assert "lastDownloadSeconds" not in podstate.summary_status(
        podstate.summarize([gated_pod((GATE, "True", "WarmedUp"))])
    )
