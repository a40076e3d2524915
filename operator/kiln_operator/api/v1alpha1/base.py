"""The base of every Kiln API model.

Why it exists: the wire format of a Kubernetes object is camelCase and the generated CRD must
reject nothing that Kubernetes itself accepts while Python code reads snake_case. One base
class keeps that convention in one place.
"""

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """A part of the InferenceService API: camelCase aliases, unknown fields refused, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )
