"""Decide whether a live child differs from its desired manifest, and build the update.

Why it exists: a converged object must cause zero writes. The API server adds defaults,
status, managedFields and normalises quantities, so "differs" means: some field *we set* has
another value live. Fields we never set (defaults, clusterIP, replicas) are not ours to judge.
"""

import copy
from typing import Any

from kiln_operator import constants
from kiln_operator.api.validation import parse_quantity
from kiln_operator.builders.deployment import OPTIONAL_POD_FIELDS
from kiln_operator.builders.naming import Manifest

OWNED_ANNOTATION_PREFIXES = ("prometheus.io/", f"{constants.GROUP}/")
"""Annotation keys Kiln sets on children; one it set earlier and no longer wants is drift."""

EXACT_MAPS = frozenset({"requests", "limits", "nodeSelector", "matchLabels"})
"""Maps the API server never adds keys to: an extra live key is drift, not a default."""


SLICE_FIELDS = ("addressType", "endpoints", "ports")
"""An EndpointSlice's fields Kiln sets, compared and written whole."""


def _empty(value: Any) -> bool:
    return value is None or value in ({}, [])


def covers(actual: Any, desired: Any, *, in_resources: bool = False) -> bool:
    """True when every field set in `desired` has the same value in `actual`.

    Keys the server never adds to are compared exactly (EXACT_MAPS: a GPU limit or a node
    selector left over from an older spec is drift), and an empty desired map or list means
    "must be empty" (so a field removed from the spec is removed from the child). Elsewhere,
    keys only the live object has are server defaults and are not judged.
    """
    if isinstance(desired, dict):
        if not isinstance(actual, dict) or not desired:
            return _empty(desired) and _empty(actual)
        return all(
            _covers_field(actual, key, value, in_resources=in_resources)
            for key, value in desired.items()
        )
    if isinstance(desired, list):
        if not isinstance(actual, list):
            return _empty(desired) and _empty(actual)
        return len(actual) == len(desired) and all(
            covers(a, d, in_resources=in_resources) for a, d in zip(actual, desired, strict=True)
        )
    if in_resources and actual != desired:
        left, right = parse_quantity(str(actual)), parse_quantity(str(desired))
        return left is not None and left == right
    return bool(actual == desired)


def _covers_field(actual: dict[str, Any], key: str, desired: Any, *, in_resources: bool) -> bool:
    if key not in actual:
        return _empty(desired)
    live = actual[key]
    exact = key in EXACT_MAPS and isinstance(desired, dict) and isinstance(live, dict)
    if exact and set(live) != set(desired):
        return False
    quantities = in_resources or key in ("requests", "limits", "sizeLimit")
    return covers(live, desired, in_resources=quantities)


def _owned_annotations(annotations: dict[str, str]) -> dict[str, str]:
    return {
        key: value
        for key, value in annotations.items()
        if key.startswith(OWNED_ANNOTATION_PREFIXES)
    }


def _has_owner(actual_meta: Manifest, desired_meta: Manifest) -> bool:
    live = {ref.get("uid"): ref for ref in actual_meta.get("ownerReferences") or []}
    return all(
        ref["uid"] in live and covers(live[ref["uid"]], ref)
        for ref in desired_meta.get("ownerReferences", [])
    )


def _pod_template_drift(actual_spec: Any, desired_spec: Any) -> bool:
    """What `covers` cannot see in a pod template: a label, an annotation of Kiln's or an
    optional pod field (OPTIONAL_POD_FIELDS) that the live template still has after the spec
    dropped it. Template labels are compared exactly (only the writer of a template sets them);
    other tools' template annotations (`kubectl rollout restart`) are not judged."""
    if not isinstance(actual_spec, dict) or not isinstance(desired_spec, dict):
        return False
    actual_template = actual_spec.get("template") or {}
    desired_template = desired_spec.get("template")
    if not isinstance(desired_template, dict):
        return False
    live_meta = actual_template.get("metadata") or {}
    wanted_meta = desired_template.get("metadata") or {}
    if (live_meta.get("labels") or {}) != (wanted_meta.get("labels") or {}):
        return True
    live_annotations = _owned_annotations(live_meta.get("annotations") or {})
    if live_annotations != _owned_annotations(wanted_meta.get("annotations") or {}):
        return True
    live_pod = actual_template.get("spec") or {}
    wanted_pod = desired_template.get("spec") or {}
    return any(
        not _empty(live_pod.get(key)) and key not in wanted_pod for key in OPTIONAL_POD_FIELDS
    )


def needs_update(actual: Manifest, desired: Manifest) -> bool:
    """Whether the live object must be written to match the desired one."""
    actual_meta, desired_meta = actual.get("metadata", {}), desired.get("metadata", {})
    if _pod_template_drift(actual.get("spec"), desired.get("spec")):
        return True
    if not covers(actual_meta.get("labels") or {}, desired_meta.get("labels", {})):
        return True
    live_annotations = _owned_annotations(actual_meta.get("annotations") or {})
    if live_annotations != _owned_annotations(desired_meta.get("annotations", {})):
        return True
    if not _has_owner(actual_meta, desired_meta):
        return True
    if desired.get("kind") == "EndpointSlice":  # its content is top-level, not under spec
        return not all(covers(actual.get(key), desired[key]) for key in SLICE_FIELDS)
    return not covers(actual.get("spec"), desired.get("spec"))


def build_update(actual: Manifest, desired: Manifest, *, keep_live_spec: bool) -> Manifest:
    """The full object to PUT: the live object with our labels, annotations, owner reference and
    spec. `keep_live_spec`: keep live spec fields we do not set (a Service's clusterIP); else
    our spec replaces the live one, except `replicas`, which the autoscaler owns."""
    body = copy.deepcopy(actual)
    body.pop("status", None)
    meta = body.setdefault("metadata", {})
    desired_meta = desired["metadata"]
    meta["labels"] = {**(meta.get("labels") or {}), **desired_meta.get("labels", {})}
    foreign = {
        key: value
        for key, value in (meta.get("annotations") or {}).items()
        if not key.startswith(OWNED_ANNOTATION_PREFIXES)
    }
    annotations = {**foreign, **desired_meta.get("annotations", {})}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    ours = {ref["uid"] for ref in desired_meta.get("ownerReferences", [])}
    meta["ownerReferences"] = [
        ref for ref in meta.get("ownerReferences") or [] if ref.get("uid") not in ours
    ] + desired_meta.get("ownerReferences", [])
    if desired.get("kind") == "EndpointSlice":
        body.update({key: copy.deepcopy(desired[key]) for key in SLICE_FIELDS})
        return body
    live_spec = body.get("spec") or {}
    if keep_live_spec:
        body["spec"] = {**live_spec, **copy.deepcopy(desired["spec"])}
    else:
        body["spec"] = copy.deepcopy(desired["spec"])
        if "replicas" in live_spec:
            body["spec"]["replicas"] = live_spec["replicas"]
    return body
