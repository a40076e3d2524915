"""A watch-fed cache of the objects the operator reads, as controller-runtime's informers.

Why it exists: with many InferenceServices, a GET on every reconcile, autoscaler pass and
warm-up summary costs the API server (and the operator's JSON decoding) more than the work
itself, and listing pods by label makes the API server scan every pod of the namespace per
call. kopf already watches InferenceServices, their children and Kiln's pods; its events feed
this cache (through the handlers), so do the responses to the operator's own writes, and readers
take the newest copy from memory.

Objects are kept as compact JSON without managedFields (a parsed Deployment takes about ten
times its JSON in memory); each read parses a private copy, so no reader can change the cache.
The JSON is orjson's: with 1,000 new services the standard library's encoding and parsing here
took a twentieth of the operator's CPU (py-spy), several times orjson's.
A newer copy never gives way to an older one: watch events can arrive after the response to
the write that caused them.

Absent from the cache means "not seen", not "does not exist": readers that must know fall back
to the API server.
"""

from collections.abc import Mapping
from typing import Any

import orjson

from kiln_operator import constants
from kiln_operator.builders.naming import Manifest

Key = tuple[str, str, str]
"""(plural, namespace, name)."""

POD_FIELDS_KEPT = ("readinessGates",)
"""Of a pod's spec, only what the warm-up summary reads (the rest is large and unused)."""


def _version(body: Mapping[str, Any]) -> int | None:
    text = (body.get("metadata") or {}).get("resourceVersion")
    return int(text) if isinstance(text, str) and text.isdigit() else None


def _slim(plural: str, body: Mapping[str, Any]) -> Manifest:
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    slim = {**body, "metadata": meta}
    if plural == "pods":
        spec = body.get("spec") or {}
        slim["spec"] = {k: spec[k] for k in POD_FIELDS_KEPT if k in spec}
    return slim


def _plain(value: Any) -> Any:
    """What orjson cannot encode itself: kopf's read-only mappings of a watch event's body."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


class ObjectCache:
    """The newest copy of each object seen, by plural, namespace and name; pods also by the
    InferenceService they serve."""

    def __init__(self) -> None:
        self._objects: dict[Key, tuple[int | None, bytes]] = {}
        self._pods_by_service: dict[tuple[str, str], set[str]] = {}
        self._service_of_pod: dict[tuple[str, str], str] = {}

    def __len__(self) -> int:
        return len(self._objects)

    def store(self, plural: str, body: Mapping[str, Any]) -> None:
        """Keep `body` unless the cache holds a newer copy of it."""
        meta = body.get("metadata") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name")
        if not name:
            return
        key = (plural, namespace, name)
        version = _version(body)
        held = self._objects.get(key)
        if held is not None and held[0] is not None and version is not None and version < held[0]:
            return
        encoded = orjson.dumps(_slim(plural, body), default=_plain)
        self._objects[key] = (version, encoded)
        if plural == "pods":
            service = (meta.get("labels") or {}).get(constants.LABEL_INFERENCESERVICE)
            if service:
                self._pods_by_service.setdefault((namespace, service), set()).add(name)
                self._service_of_pod[(namespace, name)] = service

    def forget(self, plural: str, namespace: str, name: str) -> None:
        """The object was deleted."""
        self._objects.pop((plural, namespace, name), None)
        service = self._service_of_pod.pop((namespace, name), None) if plural == "pods" else None
        if service is not None:
            names = self._pods_by_service.get((namespace, service), set())
            names.discard(name)
            if not names:
                self._pods_by_service.pop((namespace, service), None)

    def observe(self, plural: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A watch event: DELETED forgets the object, anything else stores it."""
        meta = body.get("metadata") or {}
        if event_type == "DELETED":
            self.forget(plural, meta.get("namespace", ""), meta.get("name", ""))
        else:
            self.store(plural, body)

    def get(self, plural: str, namespace: str, name: str) -> Manifest | None:
        """A private copy of the newest object seen, or None if none was."""
        held = self._objects.get((plural, namespace, name))
        if held is None:
            return None
        parsed: Manifest = orjson.loads(held[1])
        return parsed

    def names(self, plural: str, namespace: str | None = None) -> list[tuple[str, str]]:
        """(namespace, name) of every object of `plural` seen, of `namespace` only if given."""
        return [
            (ns, name)
            for kind, ns, name in self._objects
            if kind == plural and (namespace is None or ns == namespace)
        ]

    def pods_of(self, namespace: str, service: str) -> list[Manifest]:
        """Private copies of the pods seen with the InferenceService's label."""
        names = sorted(self._pods_by_service.get((namespace, service), ()))
        return [pod for name in names if (pod := self.get("pods", namespace, name)) is not None]
