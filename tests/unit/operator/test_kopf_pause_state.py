"""`kopf_pause_state` finds kopf's own pause state in a running kopf operator (the pinned kopf):
the ToggleSet kopf's orchestrator makes the peering toggles in (one per peering object, on while
another replica is active) and pauses its watches with. Peering itself turning it on and off is
tested against the real control plane (tests/integration/operator/test_peering.py)."""

import asyncio
from typing import Any

import kopf
from kopf._cogs.aiokits.aiotoggles import ToggleSet

from kiln_operator.k8s.peering import _pause_state_in, kopf_pause_state
from kiln_operator.k8s.scheduler import Pausing


async def test_the_pause_state_is_the_one_kopfs_orchestrator_pauses_with() -> None:
    registry = kopf.OperatorRegistry()
    found: list[Pausing] = []
    orchestrators: list[Pausing | None] = []
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server="https://127.0.0.1:9", insecure=True)

    @kopf.on.startup(registry=registry)
    async def startup(**_: Any) -> None:
        found.append(kopf_pause_state())
        orchestrators.extend(
            _pause_state_in(task.get_coro(), depth=3)
            for task in asyncio.all_tasks()
            if task.get_name() == "multidimensional multitasker"
        )
        stop.set_result(None)

    operator = kopf.operator(
        registry=registry,
        clusterwide=True,
        standalone=False,
        peering_name="kiln-test",
        stop_flag=stop,
    )
    async with asyncio.timeout(30):
        await operator
    assert isinstance(found[0], ToggleSet)
    assert len(orchestrators) == 1 and orchestrators[0] is found[0]
    assert found[0].is_off()  # nothing paused it yet: no peering seen
