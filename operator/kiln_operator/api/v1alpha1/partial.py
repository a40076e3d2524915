"""Partial copies of spec models: every field optional, nothing defaulted, no cross-field checks.

Why it exists: a profile's defaults are the InferenceService's own spec parts, each field left
out unless the platform team sets it. Deriving them from the spec models keeps one source of
truth: a field's type, bounds, pattern and description (hence `kubectl explain`) are those of the
InferenceService field it fills. Checks that span fields (min <= max, batch <= queue) run on the
resolved spec, where every value is known.
"""

from typing import Any

from pydantic import BaseModel, create_model
from pydantic.fields import FieldInfo

from kiln_operator.api.v1alpha1.base import ApiModel


def _optional(info: FieldInfo) -> tuple[Any, FieldInfo]:
    annotation: Any = info.annotation
    if isinstance(annotation, type) and issubclass(annotation, ApiModel):
        annotation = partial_model(annotation)
    optional: Any = annotation | None
    partial = FieldInfo.merge_field_infos(info, default=None)
    partial.default_factory = None
    partial.annotation = optional
    return optional, partial


def partial_model(model: type[ApiModel], exclude: frozenset[str] = frozenset()) -> type[ApiModel]:
    """`model` with every field optional (None: not set here), nested spec models partial too,
    fields in `exclude` left out; the class docstring is kept as its description."""
    fields = {
        name: _optional(info) for name, info in model.model_fields.items() if name not in exclude
    }
    partial: type[ApiModel] = create_model(  # type: ignore[call-overload]
        f"Partial{model.__name__}",
        __base__=ApiModel,
        __doc__=model.__doc__,
        **fields,
    )
    return partial


def set_fields(model: BaseModel) -> dict[str, Any]:
    """The fields set in a partial model, as the InferenceService's wire form (camelCase), with
    every unset (None) field left out at any depth."""
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")
