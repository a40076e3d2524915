"""The canary Deployment and the revision that tells versions apart.

Why it exists: with spec.rollout.canary a new pod template first runs in a second Deployment
beside the stable one. Its pods carry the stable pods' selector labels (the one Service sends
them their share of traffic) plus the track label (its own selector, and the `kiln_track` series
label that separates the two versions' metrics); the revision annotation says which template it
runs, so the autoscaler's pass judges the right one.
"""

import hashlib
import json

from kiln_operator import constants
from kiln_operator.builders.naming import Manifest, Owner

CANARY_LABELS = {constants.LABEL_TRACK: constants.TRACK_CANARY}


def canary_name(service_name: str) -> str:
    """The canary Deployment's name."""
    return f"{service_name}{constants.CANARY_SUFFIX}"


def revision_of(deployment: Manifest) -> str:
    """A short hash of a desired Deployment's pod template: the same spec gives the same
    revision in every operator replica and after a restart."""
    template = json.dumps(deployment["spec"]["template"], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(template.encode()).hexdigest()[:12]


def build_canary_deployment(
    stable: Manifest, owner: Owner, initial_replicas: int | None = None
) -> Manifest:
    """The canary Deployment from the desired (new) stable Deployment. Pass `initial_replicas`
    only to create it: afterwards the autoscaler owns its replicas."""
    revision = revision_of(stable)
    spec: Manifest = {key: value for key, value in stable["spec"].items() if key != "replicas"}
    template = spec["template"]
    spec["selector"] = {"matchLabels": {**spec["selector"]["matchLabels"], **CANARY_LABELS}}
    spec["template"] = {
        **template,
        "metadata": {
            **template["metadata"],
            "labels": {**template["metadata"]["labels"], **CANARY_LABELS},
        },
    }
    if initial_replicas is not None:
        spec = {"replicas": initial_replicas, **spec}
    metadata = owner.metadata(CANARY_LABELS)
    metadata["name"] = canary_name(owner.name)
    metadata["annotations"] = {constants.ANNOTATION_REVISION: revision}
    return {**stable, "metadata": metadata, "spec": spec}
