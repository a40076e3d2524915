"""Two operator processes for the same namespace: exactly one acts; when it dies, the other
takes over once the dead one's peering entry expires."""

from typing import Any

import pytest

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
