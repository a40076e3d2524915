"""build_pdb: a PodDisruptionBudget so node drains take runtime pods one at a time.

Why it exists: a drain that evicts every replica at once drops the service; with more than one
replica, at most one may be voluntarily disrupted at a time. With one replica a PDB would only
block drains, so none is built.
"""

from kiln_operator.builders.naming import Manifest, Owner, selector_labels


def wants_pdb(replicas: int) -> bool:
    """A PDB is worth having only when more than one replica runs (or is meant to)."""
    return replicas > 1


def build_pdb(owner: Owner) -> Manifest:
    """The desired PodDisruptionBudget."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owner.metadata(),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner.name)},
        },
    }
