"""Model volumes for the local cluster: a directory of this machine offered as a bound claim.

Why it exists: Kiln mounts models from PersistentVolumeClaims, and the scheduler keeps a pod
whose claim is missing or unbound Pending. A pre-bound hostPath PersistentVolume makes the claim
real for the scheduler, and the real node's kubelet mounts that directory into the pod.
"""

from pathlib import Path
from typing import Any

import yaml

from kiln_localcluster.cluster import ClusterInfo, kubectl


def build_claim_volume(
    namespace: str, claim: str, host_dir: Path, access_mode: str = "ReadOnlyMany"
) -> list[dict[str, Any]]:
    """A hostPath PersistentVolume pre-bound to ``namespace/claim``, and that claim
    (``ReadWriteMany`` for a shared model cache)."""
    volume_name = f"kiln-local-{namespace}-{claim}"[:253]
    access = {"accessModes": [access_mode], "storageClassName": ""}
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume_name},
            "spec": {
                **access,
                "capacity": {"storage": "1Gi"},
                "hostPath": {"path": str(host_dir), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": claim},
                "persistentVolumeReclaimPolicy": "Retain",
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                **access,
                "resources": {"requests": {"storage": "1Gi"}},
                "volumeName": volume_name,
            },
        },
    ]


def provision_claim(
    info: ClusterInfo,
    namespace: str,
    claim: str,
    host_dir: Path,
    access_mode: str = "ReadOnlyMany",
) -> None:
    """Create the claim and its volume, and wait until the claim is Bound."""
    volume = build_claim_volume(namespace, claim, host_dir.resolve(), access_mode)
    kubectl(info, "apply", "-f", "-", input=yaml.safe_dump_all(volume))
    kubectl(
        info,
        "wait",
        "-n",
        namespace,
        f"pvc/{claim}",
        "--for=jsonpath={.status.phase}=Bound",
        "--timeout=60s",
    )
