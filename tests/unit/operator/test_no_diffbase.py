"""kopf keeps no diff base for the operator's objects (no deep copy of every event's body):
safe only while no handler needs one, i.e. while the operator registers no create, update,
delete, resume or field handler (its handlers are level-based)."""

import kopf

from kiln_operator.handlers import (  # noqa: F401  (importing registers the handlers)
    autoscaler,
    inferenceservice,
    platform,
    warmup_gate,
)
from kiln_operator.handlers.inferenceservice import NoDiffBase


def test_the_operator_registers_no_handler_that_needs_a_diff_base() -> None:
    registry = kopf.get_default_registry()

    # kopf's registry has no public view of its changing handlers
    assert list(registry._changing.get_all_handlers()) == []
    # nor daemons or timers (the operator's own scheduler runs the autoscaler and the resync),
    # so kopf puts no finalizer on any object, and removes the one an earlier version left
    assert list(registry._spawning.get_all_handlers()) == []


def test_every_object_has_the_same_empty_essence() -> None:
    storage = NoDiffBase()
    body = kopf.Body({"metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"replicas": 2}})

    assert storage.build(body=body) == {}
    assert storage.fetch(body=body) == {}
