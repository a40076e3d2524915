"""Pure builders: an InferenceService in, the Kubernetes manifests of its children out.

Nothing here reads the clock, the network or the API server; the same input always gives the
same dicts, which is what lets the reconcile loop compare and write nothing when converged.
"""

from kiln_operator.builders.deployment import build_deployment
from kiln_operator.builders.naming import Owner
from kiln_operator.builders.pdb import build_pdb
from kiln_operator.builders.runtime_config import build_runtime_config
from kiln_operator.builders.service import build_service
from kiln_operator.builders.service_monitor import build_service_monitor

__all__ = [
    "Owner",
    "build_deployment",
    "build_pdb",
    "build_runtime_config",
    "build_service",
    "build_service_monitor",
]
