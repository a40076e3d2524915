"""Kubernetes' own schemas of the core/v1 types Kiln embeds, and their extraction.

Why it exists: spec.pod carries Kubernetes types a platform team already knows (Affinity,
TopologySpreadConstraint, EnvVar, LocalObjectReference). Copying their fields by hand would
drift from Kubernetes; instead `kubernetes_openapi.json` beside this module holds the schemas
exactly as the pinned Kubernetes release publishes them (its OpenAPI v3 document
`api/openapi-spec/v3/api__v1_openapi.json`, the one kube-apiserver serves at /openapi/v3/api/v1),
cut down to the types Kiln embeds and those they reference. `make kube-schemas` writes it from
the `k8s.io/kubernetes` Go module of the version the local cluster runs (e2e/cluster/versions.env);
a unit test checks the file still equals that extraction. `api/v1alpha1/kube.py` turns the
schemas into pydantic models, so the CRD, `kubectl explain` and validation follow Kubernetes.

Run: `python -m kiln_operator.api.kubeschemas --openapi <api__v1_openapi.json> --source <text>`.
"""

import argparse
import json
import sys
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

SCHEMAS_FILE = "kubernetes_openapi.json"
ROOTS = (
    "io.k8s.api.core.v1.Affinity",
    "io.k8s.api.core.v1.TopologySpreadConstraint",
    "io.k8s.api.core.v1.EnvVar",
    "io.k8s.api.core.v1.LocalObjectReference",
)
"""The types spec.pod embeds; every type they reference comes along."""
KEPT_KEYS = frozenset(
    {"type", "format", "description", "properties", "items", "additionalProperties", "required"}
)
"""What a model is built from. `default` (Go's zero value, implied by leaving a field out),
`x-kubernetes-*` (merge hints for built-in types) and `allOf` wrappers carry nothing a model
needs; a `$ref` is kept as `ref`, the referenced type's short name."""

JsonSchema = dict[str, Any]


def short_name(ref: str) -> str:
    """`#/components/schemas/io.k8s.api.core.v1.Affinity` -> `Affinity`."""
    return ref.rsplit("/", 1)[-1].rsplit(".", 1)[-1]


def _simplify(node: JsonSchema, wanted: list[str], schemas: dict[str, JsonSchema]) -> JsonSchema:
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
    if "$ref" in node:
        full = node["$ref"].rsplit("/", 1)[-1]
        if full not in wanted:
            wanted.append(full)
        out: JsonSchema = {"ref": short_name(full)}
        if "description" in node:
            out["description"] = node["description"]
        return out
    if "oneOf" in node:  # resource.Quantity: a string or a number; Kiln takes the string form
        return {"type": "string", "format": "quantity", "description": node.get("description")}
    out = {key: value for key, value in node.items() if key in KEPT_KEYS}
    if "properties" in node:
        out["properties"] = {
            name: _simplify(value, wanted, schemas) for name, value in node["properties"].items()
        }
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out[key] = _simplify(node[key], wanted, schemas)
    return out


def extract(openapi: JsonSchema, roots: Iterable[str] = ROOTS) -> dict[str, JsonSchema]:
    """The schemas of `roots` and every type they reference, by short name, simplified."""
    schemas: dict[str, JsonSchema] = openapi["components"]["schemas"]
    wanted = list(roots)
    result: dict[str, JsonSchema] = {}
    index = 0
    while index < len(wanted):
        full = wanted[index]
        index += 1
        name = short_name(full)
        if name in result:
            continue
        result[name] = _simplify(schemas[full], wanted, schemas)
    return dict(sorted(result.items()))


def render(openapi: JsonSchema, source: str) -> str:
    """The vendored file's text: where it came from, and the extracted schemas."""
    body = {"source": source, "schemas": extract(openapi)}
    return json.dumps(body, indent=1, sort_keys=False) + "\n"


def load() -> dict[str, JsonSchema]:
    """The vendored schemas, by short name."""
    text = resources.files("kiln_operator.api").joinpath(SCHEMAS_FILE).read_text("utf-8")
    schemas: dict[str, JsonSchema] = json.loads(text)["schemas"]
    return schemas


def main(argv: list[str] | None = None) -> int:
    """Write the vendored file from a Kubernetes release's OpenAPI v3 core/v1 document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--openapi", type=Path, required=True, help="api__v1_openapi.json")
    parser.add_argument("--source", required=True, help="what the document is, e.g. its module")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name(SCHEMAS_FILE))
    args = parser.parse_args(argv)
    openapi = json.loads(args.openapi.read_text(encoding="utf-8"))
    args.out.write_text(render(openapi, args.source), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
