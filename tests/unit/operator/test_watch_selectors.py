"""The operator's watches of kinds it does not own ask the API server for Kiln's objects only:
kopf puts the selector on the watch request, so no other Deployment, Service, PDB or pod of a
served namespace is encoded, sent or parsed. Its own kinds are watched whole."""

import kopf
from kopf._cogs.structs.references import Resource

from kiln_operator import constants
from kiln_operator.handlers.inferenceservice import tune_kopf

KILN_ONLY = [f"{constants.LABEL_MANAGED_BY}={constants.MANAGER}"]


def selectors(resource: Resource) -> list[str]:
    settings = kopf.OperatorSettings()
    tune_kopf(settings)
    return sorted(set(settings.watching.label_selectors.collect(resource)))


def test_children_and_pods_are_watched_by_kilns_label() -> None:
    for resource in (
        Resource("apps", "v1", "deployments", kind="Deployment", namespaced=True),
        Resource("", "v1", "services", kind="Service", namespaced=True),
        Resource("policy", "v1", "poddisruptionbudgets", kind="PodDisruptionBudget",
                 namespaced=True),
        Resource("", "v1", "pods", kind="Pod", namespaced=True),
    ):  # fmt: skip
        assert selectors(resource) == KILN_ONLY, resource


def test_kilns_own_kinds_and_other_groups_kinds_of_the_same_name_are_not_filtered() -> None:
    own = Resource(constants.GROUP, constants.VERSION, constants.PLURAL, namespaced=True)
    assert selectors(own) == []
    knative = Resource("serving.knative.dev", "v1", "services", kind="Service", namespaced=True)
    assert selectors(knative) == []
