"""Generate Kiln's CustomResourceDefinitions from the pydantic models.

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
from kiln_operator.api.v1alpha1.profile import InferencePolicySpec, ProfileDefaults, ProfileSpec

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
        "name": "Canary",
        "type": "string",
        "jsonPath": ".status.rollout.phase",
        "description": "The last canary's phase (spec.rollout.canary).",
    },
    {
        "name": "Step",
        "type": "integer",
        "jsonPath": ".status.rollout.step",
        "description": "The canary's step (0-based).",
        "priority": 1,
    },
    {
        "name": "Share",
        "type": "integer",
        "jsonPath": ".status.rollout.sharePercent",
        "description": "The canary's declared share of traffic in percent.",
        "priority": 1,
    },
    {
        "name": "Verdict",
        "type": "string",
        "jsonPath": ".status.rollout.lastVerdict.reason",
        "description": "The canary's last verdict.",
        "priority": 1,
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


def _drop_inherited_required(node: JsonSchema, defaults: JsonSchema) -> None:
    """A field a profile may provide is not required by the InferenceService's schema: the
    operator requires it of the resolved spec instead (Ready=False, InvalidSpec)."""
    provided = defaults.get("properties") or {}
    required = [key for key in node.get("required") or [] if key not in provided]
    if required:
        node["required"] = required
    else:
        node.pop("required", None)
    for key, schema in provided.items():
        child = (node.get("properties") or {}).get(key)
        if child is not None and child.get("type") == "object":
            _drop_inherited_required(child, schema)


def inference_service_spec_schema() -> JsonSchema:
    """The InferenceService's spec schema: the model's, less what a profile may provide."""
    schema = openapi_schema(InferenceServiceSpec)
    _drop_inherited_required(schema, openapi_schema(ProfileDefaults))
    return schema


def _crd(
    *,
    kind: str,
    plural: str,
    singular: str,
    scope: str,
    description: str,
    schema_properties: JsonSchema,
    printer_columns: list[dict[str, Any]],
    short_names: tuple[str, ...] = (),
    categories: tuple[str, ...] = constants.PLATFORM_CATEGORIES,
    subresources: dict[str, Any] | None = None,
) -> dict[str, Any]:
    names: dict[str, Any] = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": singular,
    }
    if short_names:
        names["shortNames"] = list(short_names)
    names["categories"] = list(categories)
    version: dict[str, Any] = {"name": constants.VERSION, "served": True, "storage": True}
    if subresources is not None:
        version["subresources"] = subresources
    version["additionalPrinterColumns"] = printer_columns
    version["schema"] = {
        "openAPIV3Schema": {
            "type": "object",
            "description": description,
            "required": ["spec"],
            "properties": {
                "apiVersion": {"type": "string", "description": "Versioned schema of this object."},
                "kind": {"type": "string", "description": "REST resource this object represents."},
                "metadata": {"type": "object"},
                **schema_properties,
            },
        }
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{constants.GROUP}",
            "labels": {constants.LABEL_PART_OF: "kiln"},
        },
        "spec": {
            "group": constants.GROUP,
            "scope": scope,
            "names": names,
            "versions": [version],
        },
    }


def build_crd() -> dict[str, Any]:
    """The InferenceService CustomResourceDefinition as a dict."""
    return _crd(
        kind=constants.KIND,
        plural=constants.PLURAL,
        singular=constants.SINGULAR,
        scope="Namespaced",
        description=(
            "A model served on GPUs behind one endpoint (HTTP and gRPC, Open Inference "
            "Protocol), kept within a p99 latency SLO by autoscaling and scheduled pre-warming."
        ),
        schema_properties={
            "spec": inference_service_spec_schema(),
            "status": {
                **openapi_schema(InferenceServiceStatus),
                "default": UNOBSERVED_STATUS,
            },
        },
        printer_columns=PRINTER_COLUMNS,
        short_names=constants.SHORT_NAMES,
        categories=constants.CATEGORIES,
        subresources={
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.autoscaling.minReplicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        },
    )


def _column(name: str, kind: str, path: str, description: str) -> dict[str, Any]:
    return {"name": name, "type": kind, "jsonPath": path, "description": description}


AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
PROFILE_COLUMNS: list[dict[str, Any]] = [
    _column("Image", "string", ".spec.defaults.runtime.image", "Default runtime image."),
    _column("GPUs", "integer", ".spec.defaults.resources.gpuCount", "Default GPUs per pod."),
    _column("P99", "number", ".spec.defaults.slo.p99LatencyMilliseconds", "Default p99 SLO (ms)."),
    _column(
        "Max-Replicas",
        "integer",
        ".spec.defaults.autoscaling.maxReplicas",
        "Default replica ceiling.",
    ),
    _column("Description", "string", ".spec.description", "What the profile is for."),
    AGE_COLUMN,
]
POLICY_COLUMNS: list[dict[str, Any]] = [
    _column("GPUs/Pod", "integer", ".spec.maxGpusPerPod", "Most GPUs per pod."),
    _column("GPUs/Service", "integer", ".spec.maxGpusPerService", "Most GPUs per service."),
    _column("Max-Replicas", "integer", ".spec.maxReplicas", "Most replicas per service."),
    _column("Images", "string", ".spec.allowedImages", "Allowed runtime image prefixes."),
    _column("Sources", "string", ".spec.allowedModelUriSchemes", "Allowed model URI schemes."),
    AGE_COLUMN,
]
PLATFORM_KINDS: dict[str, tuple[str, str, str, str]] = {
    constants.CLUSTER_PROFILE_KIND: (
        constants.CLUSTER_PROFILE_PLURAL,
        "Cluster",
        "profile",
        "The platform's defaults for InferenceServices: the fields a service leaves out take "
        "these values (a namespace's InferenceProfile of the same name comes first).",
    ),
    constants.PROFILE_KIND: (
        constants.PROFILE_PLURAL,
        "Namespaced",
        "profile",
        "A team's defaults for the InferenceServices of its namespace: overrides the "
        "ClusterInferenceProfile of the same name there.",
    ),
    constants.CLUSTER_POLICY_KIND: (
        constants.CLUSTER_POLICY_PLURAL,
        "Cluster",
        "policy",
        "Limits every InferenceService of the cluster must keep (GPUs, replicas, images, model "
        "sources, Prometheus endpoints); a service that breaks one is refused and frozen.",
    ),
    constants.POLICY_KIND: (
        constants.POLICY_PLURAL,
        "Namespaced",
        "policy",
        "Narrower limits for the InferenceServices of one namespace; enforced together with "
        "every ClusterInferencePolicy, so it can never widen one.",
    ),
}


def build_platform_crd(kind: str) -> dict[str, Any]:
    """The CRD of one of the platform's kinds (profiles and policies) as a dict."""
    plural, scope, shape, description = PLATFORM_KINDS[kind]
    profile = shape == "profile"
    return _crd(
        kind=kind,
        plural=plural,
        singular=kind.lower(),
        scope=scope,
        description=description,
        schema_properties={"spec": openapi_schema(ProfileSpec if profile else InferencePolicySpec)},
        printer_columns=PROFILE_COLUMNS if profile else POLICY_COLUMNS,
    )


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


def render_platform_crd(kind: str) -> str:
    """A profile or policy CRD as YAML text."""
    return HEADER + yaml.safe_dump(build_platform_crd(kind), sort_keys=False, width=100)


def platform_crd_file_name(kind: str) -> str:
    """File name of a profile or policy CRD."""
    return f"{constants.GROUP}_{PLATFORM_KINDS[kind][0]}.yaml"


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
        {platform_crd_file_name(kind): render_platform_crd(kind) for kind in PLATFORM_KINDS}
    )
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
