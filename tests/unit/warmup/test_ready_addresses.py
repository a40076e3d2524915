"""Where the activator may release held requests: only pods past their warm-up gate."""

from typing import Any

from kiln_operator import constants
from kiln_operator.warmup.podstate import ready_addresses
from tests.unit.kube_objects import pod

READY = {"type": "Ready", "status": "True"}
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
        at("10.0.0.2", READY, WARM),
        at("10.0.0.1", READY, WARM),
        at("10.0.0.3", WARMING),  # still warming: never a backend
        at("10.0.0.4", READY, WARMING),  # Ready reported before the gate's verdict: not yet
        at("10.0.0.5", READY, WARM, deletionTimestamp="2026-11-25T12:00:00Z"),
        at("10.0.0.6", READY, gated=False),  # warm-up disabled: Ready is the gate
        at("fd00::7", READY, WARM),
    ]
    http, grpc = ready_addresses(pods)
    assert http == ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.6:8000", "[fd00::7]:8000"]
    assert grpc == ["10.0.0.1:8001", "10.0.0.2:8001", "10.0.0.6:8001", "[fd00::7]:8001"]
    assert ready_addresses([at("10.0.0.3", WARMING)]) == ([], [])
