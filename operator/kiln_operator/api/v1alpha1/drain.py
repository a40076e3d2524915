"""spec.drain: how a pod leaves without losing a request.

Why it exists: on scale-down or rollout the pod must stop receiving traffic, finish what it
accepted, then exit. terminationGracePeriodSeconds is derived from these numbers so the kubelet
never kills a pod that is still answering.
"""

from typing import Annotated

from pydantic import Field

from kiln_operator.api.v1alpha1.base import ApiModel


class DrainSpec(ApiModel):
    """Graceful shutdown."""

    max_request_seconds: Annotated[int, Field(ge=1, le=3600)] = 30
    """Longest one request may take; the runtime waits this long for in-flight requests after
    SIGTERM (its drain timeout)."""
    pre_stop_delay_seconds: Annotated[int, Field(ge=0, le=300)] = 5
    """Pause before SIGTERM so load balancers and endpoints stop routing to the pod first."""

    @property
    def termination_grace_period_seconds(self) -> int:
        """preStop pause + longest request + 5 s for the process to exit."""
        return self.pre_stop_delay_seconds + self.max_request_seconds + 5
