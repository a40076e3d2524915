"""Where the activator may release held requests: only pods past their warm-up gate, from the
gate's verdict on (not at the kubelet's Ready, which follows 1 to 2 s later)."""

from typing import Any

from kiln_operator import constants
from kiln_operator.warmup.podstate import ready_addresses
from tests.unit.kube_objects import pod

READY = {"type": "Ready", "status": "True"}
CONTAINERS = {"type": "ContainersReady", "status": "True"}
NOT_CONTAINERS = {"type": "ContainersReady", "status": "False"}
WARM = {"type": constants.CONDITION_WARMED_UP, "status": "True"}
WARMING = {"type": constants.CONDITION_WARMED_UP, "status": "False", "reason": "WarmingUp"}
GATE = [{"conditionType": constants.CONDITION_WARMED_UP}]


def at(ip: str, *conditions: dict[str, Any], gated: bool = True, **meta: Any) -> dict[str, Any]:
    body = pod(ip, *conditions)
    body["status"]["podIP"] = ip
    body["spec"] = {"readinessGates": GATE if gated else []}
    body["metadata"].update(meta)
    return body


def test_only_ready_pods_past_the_gate_and_not_leaving_are_backends() -> None:
    pods = [
        at("10.0.0.2", READY, CONTAINERS, WARM),
        at("10.0.0.1", CONTAINERS, WARM),  # the verdict, before the kubelet's Ready: a backend
        at("10.0.0.3", CONTAINERS, WARMING),  # still warming: never a backend
        at("10.0.0.4", READY, CONTAINERS, WARMING),  # Ready before the gate's verdict: not yet
        at("10.0.0.5", READY, CONTAINERS, WARM, deletionTimestamp="2026-11-25T12:00:00Z"),
        at("10.0.0.6", READY, gated=False),  # warm-up disabled: Ready is the gate
        at("10.0.0.8", NOT_CONTAINERS, WARM),  # its container stopped being ready: not one
        at("10.0.0.9", CONTAINERS, gated=False),  # no gate and not Ready: not one
        at("fd00::7", READY, CONTAINERS, WARM),
    ]
    http, grpc = ready_addresses(pods)
    assert http == ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.6:8000", "[fd00::7]:8000"]
    assert grpc == ["10.0.0.1:8001", "10.0.0.2:8001", "10.0.0.6:8001", "[fd00::7]:8001"]
    assert ready_addresses([at("10.0.0.3", WARMING)]) == ([], [])


def test_a_verdict_given_to_a_container_since_restarted_admits_nothing() -> None:
    decided = {**WARM, "lastTransitionTime": "2026-11-25T11:01:00Z", "reason": "WarmedUp"}
    restarted = at("10.0.0.2", CONTAINERS, decided)
    restarted["status"]["containerStatuses"] = [
        {
            "name": constants.RUNTIME_CONTAINER,
            "restartCount": 1,
            "state": {"running": {"startedAt": "2026-11-25T11:05:00Z"}},
        }
    ]
    assert ready_addresses([restarted]) == ([], [])
