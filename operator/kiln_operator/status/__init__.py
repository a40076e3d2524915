"""Pure status logic: conditions, the aggregate Ready, what changed and which events to emit.

Nothing here reads the clock (`now` is a parameter) or talks to the API server.
"""

from kiln_operator.status.compute import Event, StatusUpdate, compute_status
from kiln_operator.status.conditions import find_condition, set_condition
from kiln_operator.status.deployment import RolloutState, rollout_state

__all__ = [
    "Event",
    "RolloutState",
    "StatusUpdate",
    "compute_status",
    "find_condition",
    "rollout_state",
    "set_condition",
]
