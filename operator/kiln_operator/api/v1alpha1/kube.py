"""Kubernetes core/v1 types as pydantic models, built from Kubernetes' own OpenAPI schemas.

Why it exists: spec.pod embeds Affinity, TopologySpreadConstraint, EnvVar and
LocalObjectReference as Kubernetes defines them; the models are made here from the schemas the
pinned Kubernetes release publishes (`api/kubernetes_openapi.json`, see `api/kubeschemas.py`),
never hand-copied: same field names, required fields, types and descriptions (so `kubectl
explain` reads as it does for a Deployment). Unknown fields are refused, as everywhere in Kiln's
API; rules the schema cannot express (an operator's allowed values, a weight's range) are the API
server's own, checked when the Deployment is written (a refusal reaches Ready as ChildRejected,
with the server's message naming the field).
"""

from functools import cache
from typing import Any

from pydantic import Field, create_model
from pydantic.alias_generators import to_snake

from kiln_operator.api.kubeschemas import JsonSchema, load
from kiln_operator.api.v1alpha1.base import ApiModel
from kiln_operator.api.v1alpha1.resources import Quantity


def _annotation(schema: JsonSchema) -> Any:
    if "ref" in schema:
        return _model(schema["ref"])
    kind = schema.get("type")
    if kind == "string":
        return Quantity if schema.get("format") == "quantity" else str
    if kind == "integer":
        return int
    if kind == "boolean":
        return bool
    if kind == "number":
        return float
    if kind == "array":
        return list[_annotation(schema["items"])]  # type: ignore[misc]
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return dict[str, _annotation(schema["additionalProperties"])]  # type: ignore[misc]
    raise ValueError(f"no model for the Kubernetes schema {schema}")


@cache
def _model(name: str) -> Any:
    schema = load()[name]
    if name == "Quantity":
        return Quantity
    required = set(schema.get("required") or ())
    fields: dict[str, Any] = {}
    for wire, prop in (schema.get("properties") or {}).items():
        annotation = _annotation(prop)
        description = prop.get("description")
        if wire in required:
            fields[to_snake(wire)] = (annotation, Field(alias=wire, description=description))
        else:
            fields[to_snake(wire)] = (
                annotation | None,
                Field(default=None, alias=wire, description=description),
            )
    return create_model(name, __base__=ApiModel, __doc__=schema.get("description"), **fields)


def wire(value: object) -> dict[str, Any]:
    """One of these models as Kubernetes reads it: camelCase, fields left out omitted."""
    if not isinstance(value, ApiModel):
        raise TypeError(f"not an API model: {value!r}")
    return value.model_dump(by_alias=True, exclude_none=True, mode="json")


Affinity: type[ApiModel] = _model("Affinity")
TopologySpreadConstraint: type[ApiModel] = _model("TopologySpreadConstraint")
EnvVar: type[ApiModel] = _model("EnvVar")
LocalObjectReference: type[ApiModel] = _model("LocalObjectReference")
