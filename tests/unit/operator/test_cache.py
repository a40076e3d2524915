"""The watch-fed object cache: newest copy wins, private copies, pods found by their service."""

from types import MappingProxyType
from typing import Any, cast

import kopf

from kiln_operator import constants
from kiln_operator.k8s.cache import ObjectCache


def obj(name: str, version: str, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": version,
            "managedFields": [{"manager": "x"}],
            **extra,
        },
        "spec": {"replicas": int(version)},
    }


def pod(name: str, service: str, version: str = "1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": version,
            "labels": {constants.LABEL_INFERENCESERVICE: service},
        },
        "spec": {"containers": [{"name": "big"}], "readinessGates": [{"conditionType": "x"}]},
        "status": {"podIP": "10.0.0.1"},
    }


def test_an_older_copy_never_replaces_a_newer_one() -> None:
    cache = ObjectCache()
    cache.store("deployments", obj("a", "7"))  # the response to our own write
    cache.observe("deployments", "MODIFIED", obj("a", "6"))  # a late watch event
    held = cache.get("deployments", "ns", "a")
    assert held is not None
    assert held["spec"]["replicas"] == 7
    cache.observe("deployments", "MODIFIED", obj("a", "8"))
    held = cache.get("deployments", "ns", "a")
    assert held is not None
    assert held["spec"]["replicas"] == 8


def test_reads_are_private_copies_without_managed_fields() -> None:
    cache = ObjectCache()
    cache.store("deployments", obj("a", "1"))
    first = cache.get("deployments", "ns", "a")
    assert first is not None
    assert "managedFields" not in first["metadata"]
    first["spec"]["replicas"] = 99
    again = cache.get("deployments", "ns", "a")
    assert again is not None
    assert again["spec"]["replicas"] == 1


def test_deleted_objects_are_forgotten_and_unseen_ones_are_none() -> None:
    cache = ObjectCache()
    cache.store("services", obj("a", "1"))
    cache.observe("services", "DELETED", obj("a", "2"))
    assert cache.get("services", "ns", "a") is None
    assert cache.get("services", "ns", "never") is None
    assert len(cache) == 0


def test_pods_are_found_by_their_service_and_keep_only_what_is_read() -> None:
    cache = ObjectCache()
    cache.observe("pods", "ADDED", pod("p1", "mlp"))
    cache.observe("pods", "ADDED", pod("p2", "mlp"))
    cache.observe("pods", "ADDED", pod("q1", "other"))
    names = [p["metadata"]["name"] for p in cache.pods_of("ns", "mlp")]
    assert names == ["p1", "p2"]
    kept = cache.pods_of("ns", "mlp")[0]
    assert kept["spec"] == {"readinessGates": [{"conditionType": "x"}]}
    assert kept["status"]["podIP"] == "10.0.0.1"
    cache.observe("pods", "DELETED", pod("p1", "mlp", "2"))
    assert [p["metadata"]["name"] for p in cache.pods_of("ns", "mlp")] == ["p2"]
    cache.observe("pods", "DELETED", pod("p2", "mlp", "3"))
    assert cache.pods_of("ns", "mlp") == []


def test_a_watch_event_body_as_kopf_delivers_it_is_stored() -> None:
    """kopf hands handlers read-only mappings, not dicts; the cache keeps their contents."""
    cache = ObjectCache()
    raw = obj("a", "3", labels=MappingProxyType({"app": "mlp"}))
    cache.observe("deployments", "ADDED", kopf.Body(cast(kopf.RawBody, raw)))
    held = cache.get("deployments", "ns", "a")
    assert held == {
        "metadata": {
            "name": "a",
            "namespace": "ns",
            "resourceVersion": "3",
            "labels": {"app": "mlp"},
        },
        "spec": {"replicas": 3},
    }
