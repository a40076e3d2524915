"""Two operator processes for the same namespace: exactly one acts; when it dies, the other
takes over once the dead one's peering entry expires; a replica paused for another stops its
autoscaler passes and resyncs until it resumes."""

import time
import urllib.request
from typing import Any

import pytest

from kiln_localcluster.processes import free_ports
from kiln_localcluster.waiting import wait_for
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import OperatorProcess, apply, get, gpu_service

pytestmark = pytest.mark.integration


def peer_priorities(cluster: Cluster, namespace: str) -> list[int]:
    """Priorities of the live peers in the namespace's peering object."""
    peering = get(cluster, namespace, "kopfpeering", "kiln-operator") or {}
    return sorted(int(peer["priority"]) for peer in (peering.get("status") or {}).values())


def test_only_the_highest_priority_operator_acts_and_the_other_takes_over(
    cluster: Cluster, namespace: str, start_operator: Any
) -> None:
    leader: OperatorProcess = start_operator([namespace], standalone=False, priority=20)
    wait_for(
        lambda: get(cluster, namespace, "kopfpeering", "kiln-operator"),
        timeout=60,
        description="the peering object created by the first operator",
    )
    follower: OperatorProcess = start_operator([namespace], standalone=False, priority=10)
    wait_for(
        lambda: peer_priorities(cluster, namespace) == [10, 20],
        timeout=60,
        description="both operators registered as peers",
    )

    apply(cluster, namespace, gpu_service("first"))
    wait_for(
        lambda: get(cluster, namespace, "deployment", "first"),
        timeout=60,
        description="the first service's Deployment",
    )
    # the Deployment exists before the reconcile that wrote it has logged its writes
    wait_for(
        lambda: f"created Deployment {namespace}/first" in leader.output(),
        timeout=60,
        description="the leader's log of its writes",
    )
    assert f"{namespace}/first" not in follower.output()
    assert "Pausing operations in favour of" not in leader.output()

    leader.kill()
    apply(cluster, namespace, gpu_service("second"))
    wait_for(
        lambda: get(cluster, namespace, "deployment", "second"),
        timeout=90,
        description="the follower to take over after the leader's lifetime",
    )
    wait_for(
        lambda: f"created Deployment {namespace}/second" in follower.output(),
        timeout=60,
        description="the follower's log of its writes",
    )


def evaluations(port: int) -> float:
    """kiln_operator_autoscaler_evaluations_total on the operator's /metrics, all outcomes."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kiln_operator_autoscaler_evaluations_total{")
    )


def test_a_replica_paused_for_a_higher_priority_one_stops_its_passes_and_resumes_after_it(
    cluster: Cluster, namespace: str, start_operator: Any
) -> None:
    """The autoscaler's passes and the resyncs are no kopf daemons or timers: the operator's own
    scheduler must stop them when kopf pauses the operator, and take them up after it resumes."""
    (port,) = free_ports(1)
    low: OperatorProcess = start_operator(
        [namespace], standalone=False, priority=10,
        env={"KILN_OPERATOR_METRICS_PORT": str(port)},
    )  # fmt: skip
    apply(cluster, namespace, gpu_service("first"))
    wait_for(
        lambda: f"resynced {namespace}/first" in low.output() and evaluations(port) >= 1,
        timeout=90,
        description="the only replica's resyncs and autoscaler passes",
    )

    active_log = len(low.output())  # every replica starts paused until it has seen the peers
    high: OperatorProcess = start_operator([namespace], standalone=False, priority=20)
    wait_for(
        lambda: (
            "Pausing operations in favour of" in low.output()[active_log:]
            and "paused: no autoscaler pass or resync" in low.output()[active_log:]
        ),
        timeout=60,
        description="the low replica paused, and its scheduler with it",
    )
    paused_log = len(low.output())
    paused_evaluations = evaluations(port)
    wait_for(
        lambda: f"resynced {namespace}/first" in high.output(),
        timeout=60,
        description="the high replica's resyncs",
    )
    time.sleep(20)  # the service's autoscaler interval (15 s), resyncs every 3 s
    assert f"resynced {namespace}/first" not in low.output()[paused_log:]
    assert evaluations(port) == paused_evaluations

    high.kill()
    wait_for(
        lambda: (
            f"resynced {namespace}/first" in low.output()[paused_log:]
            and evaluations(port) > paused_evaluations
        ),
        timeout=90,
        description="the low replica resumed after the high one's peering entry expired",
    )
