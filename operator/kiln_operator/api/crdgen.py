"""Generate the InferenceService CustomResourceDefinition from the pydantic models.

Why it exists: the models are the single source of truth; this turns their JSON Schema into a
*structural* OpenAPI v3 schema the API server accepts (no $ref, no titles, no
`additionalProperties: false`, OpenAPI 3.0 exclusive bounds, `nullable` for optional fields),
so `kubectl apply` rejects type, range, enum and pattern errors and `kubectl explain` shows
every field's description. `make crds` writes the result; `make check` fails when it is stale.

Run: `python -m kiln_operator.api.crdgen --out crds/`.
"""

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from kiln_operator import constants
from kiln_operator.api.v1alpha1 import InferenceServiceSpec, InferenceServiceStatus

JsonSchema = dict[str, Any]

CRD_FILE_NAME = f"{constants.GROUP}_{constants.PLURAL}.yaml"
PEERING_KINDS = {"Cluster": "ClusterKopfPeering", "Namespaced": "KopfPeering"}
"""kopf's peering kinds: cluster-wide operators use the first, namespace-bound ones the second."""

# List fields whose items are keyed: the API server rejects duplicate keys and merges by key.
LIST_MAP_KEYS: dict[str, list[str]] = {
    "conditions": ["type"],
    "inputs": ["name"],
    "outputs": ["name"],
}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": "Whether the service is valid, rolled out and serving.",
    },
    {
        "name": "Replicas",
        "type": "integer",
        "jsonPath": ".status.readyReplicas",
        "description": "Ready runtime pods.",
    },
    {
        "name": "Warm",
        "type": "integer",
        "jsonPath": ".status.warmup.warmReplicas",
        "description": "Runtime pods that passed the warm-up gate.",
    },
    {
        "name": "P99",
        "type": "number",
        "jsonPath": ".status.autoscaling.observed.p99LatencyMilliseconds",
        "description": "Observed p99 request latency in milliseconds.",
    },
    {
        "name": "Queue",
        "type": "number",
        "jsonPath": ".status.autoscaling.observed.queueDepthPerReplica",
        "description": "Observed requests waiting per replica.",
    },
    {
        "name": "URL",
        "type": "string",
        "jsonPath": ".status.url",
        "description": "In-cluster URL of the HTTP endpoint.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

UNOBSERVED_STATUS: dict[str, Any] = {"observedGeneration": 0}
"""The status of an InferenceService the operator has not yet written one for. The API server
drops status on create, yet applies schema defaults to every object it reads from storage
(kubernetes/kubernetes#129451), so this appears on a new object at once. observedGeneration 0 is
behind metadata.generation (1 and up): kstatus (Flux, `kubectl wait`) and Argo CD's check read
the object as in progress until the operator has judged it, even while no operator runs; an
object without status would read as Current."""


def _resolve(node: Any, definitions: dict[str, JsonSchema]) -> Any:
    """Inline every $ref; a field's own description wins over its class docstring."""
    if isinstance(node, list):
        return [_resolve(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(definitions[node["$ref"].rsplit("/", 1)[-1]])
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        return _resolve({**target, **siblings}, definitions)
    if "allOf" in node and len(node["allOf"]) == 1:
        siblings = {key: value for key, value in node.items() if key != "allOf"}
        return _resolve({**node["allOf"][0], **siblings}, definitions)
    return {key: _resolve(value, definitions) for key, value in node.items()}


def _structural(node: JsonSchema, name: str = "") -> JsonSchema:
    """Rewrite one resolved JSON Schema node into a structural OpenAPI v3.0 schema node."""
    node = dict(node)
    node.pop("title", None)
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        non_null = [option for option in any_of if option.get("type") != "null"]
        if len(non_null) != 1:
            raise ValueError(f"field {name!r}: only `X | None` unions map onto a CRD schema")
        node = {**non_null[0], **node}
        node["nullable"] = True
        node.pop("title", None)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node[bound], bool):
            node[plain] = node[bound]
            node[bound] = True
    if "default" in node and (node["default"] is None or isinstance(node["default"], dict | list)):
        del node["default"]
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    if node.get("type") == "object" and "properties" in node:
        node["properties"] = {
            key: _structural(value, key) for key, value in node["properties"].items()
        }
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _structural(node["additionalProperties"], name)
    if node.get("type") == "array":
        node["items"] = _structural(node["items"], name)
        if name in LIST_MAP_KEYS:
            node["x-kubernetes-list-type"] = "map"
            node["x-kubernetes-list-map-keys"] = LIST_MAP_KEYS[name]
    return node


def openapi_schema(model: type[BaseModel]) -> JsonSchema:
    """The structural OpenAPI v3 schema of one API model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions = raw.pop("$defs", {})
    return _structural(_resolve(raw, definitions))


def build_crd() -> dict[str, Any]:
    """The InferenceService CustomResourceDefinition as a dict."""
    spec_schema = openapi_schema(InferenceServiceSpec)
    status_schema = openapi_schema(InferenceServiceStatus)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{constants.PLURAL}.{constants.GROUP}",
            "labels": {constants.LABEL_PART_OF: "kiln"},
        },
        "spec": {
            "group": constants.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": constants.KIND,
                "listKind": f"{constants.KIND}List",
                "plural": constants.PLURAL,
                "singular": constants.SINGULAR,
                "shortNames": list(constants.SHORT_NAMES),
                "categories": list(constants.CATEGORIES),
            },
            "versions": [
                {
                    "name": constants.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.autoscaling.minReplicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (
                                "A model served on GPUs behind one endpoint (HTTP and gRPC, "
                                "Open Inference Protocol), kept within a p99 latency SLO by "
                                "autoscaling and scheduled pre-warming."
                            ),
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {
                                    "type": "string",
                                    "description": "Versioned schema of this object.",
                                },
                                "kind": {
                                    "type": "string",
                                    "description": "REST resource this object represents.",
                                },
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": {**status_schema, "default": UNOBSERVED_STATUS},
                            },
                        }
                    },
                }
            ],
        },
    }


def peering_crd_file_name(scope: str) -> str:
    """File name of kopf's peering CRD of that scope."""
    return f"kopf.dev_{PEERING_KINDS[scope].lower()}s.yaml"


def build_peering_crd(scope: str) -> dict[str, Any]:
    """kopf's peering CRD: operator replicas elect the one that acts through its objects."""
    kind = PEERING_KINDS[scope]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{kind.lower()}s.kopf.dev",
            "labels": {constants.LABEL_PART_OF: "kiln"},
        },
        "spec": {
            "scope": scope,
            "group": "kopf.dev",
            "names": {
                "kind": kind,
                "plural": f"{kind.lower()}s",
                "singular": kind.lower(),
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "Liveness and priority of each operator replica.",
                            "properties": {
                                "status": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


KUSTOMIZATION = "kustomization.yaml"
"""crds/ is a kustomize base too, so manifests/base includes the CRDs without copying them."""


def render_kustomization(file_names: list[str]) -> str:
    """The kustomization listing the generated CRD files."""
    body = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": file_names,
    }
    return HEADER + yaml.safe_dump(body, sort_keys=False)


HEADER = "# Generated by `make crds` (kiln_operator.api.crdgen). Do not edit.\n"


def render_crd() -> str:
    """The CRD as YAML text, stable across runs (the golden test and `make check` compare it)."""
    return HEADER + yaml.safe_dump(build_crd(), sort_keys=False, width=100)


def render_peering_crd(scope: str) -> str:
    """A peering CRD as YAML text."""
    return HEADER + yaml.safe_dump(build_peering_crd(scope), sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    """Write the CRDs and their kustomization into the directory given by --out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="directory to write the CRD to")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    files = {CRD_FILE_NAME: render_crd()}
    files.update(
        {peering_crd_file_name(scope): render_peering_crd(scope) for scope in PEERING_KINDS}
    )
    files[KUSTOMIZATION] = render_kustomization(sorted(files))
    for file_name, text in files.items():
        target = args.out / file_name
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
