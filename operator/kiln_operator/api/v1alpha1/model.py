"""spec.model: what to serve — where the weights are, in which format, with which tensors.

Why it exists: the runtime refuses a request whose tensors do not match the declared ones, and
the warm-up gate synthesises requests from them, so the declaration lives in the API.
"""

from typing import Annotated, Literal

from pydantic import Field, field_validator

from kiln_operator.api.v1alpha1.base import ApiModel

Datatype = Literal["FP32", "FP16", "BF16", "INT64", "INT32", "INT8", "UINT8", "BOOL"]
"""Tensor element types, named as the Open Inference Protocol (KServe v2) names them."""

ModelFormat = Literal["torchscript", "torch_export", "onnx"]

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MODEL_URI_PATTERN = (
    r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/[^\s]+|file:///[^\s]*[^\s/]|/[^\s]*[^\s/])$"
)
"""`pvc://<claim>/<path>` (claim mounted read-only); `file:///<path>` or `/<path>` (image)."""


class TensorSpec(ApiModel):
    """One named input or output tensor of the model."""

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:\-]+$")]
    """Tensor name as clients send it, e.g. INPUT__0."""
    datatype: Datatype
    """Element type in the protocol's naming: FP32, FP16, BF16, INT64, INT32, INT8, UINT8, BOOL."""
    shape: Annotated[list[Annotated[int, Field(ge=-1, le=1_000_000)]], Field(max_length=8)]
    """Dimensions without the batch dimension; -1 marks a variable dimension. [] is a scalar."""

    @field_validator("shape")
    @classmethod
    def _no_zero_dimension(cls, shape: list[int]) -> list[int]:
        if 0 in shape:
            raise ValueError("a dimension is 0; use a positive size or -1 for variable")
        return shape


class ModelSpec(ApiModel):
    """The model to serve."""

    uri: Annotated[str, Field(max_length=1024, pattern=MODEL_URI_PATTERN)]
    """Where the model file is. `pvc://<claim>/<path>` mounts the PersistentVolumeClaim <claim>
    read-only at /models/<claim> and loads /models/<claim>/<path>; `file:///<path>` or `/<path>` is
    a file already inside the runtime image."""
    format: ModelFormat
    """Serialisation of the model file: torchscript (torch.jit.save), torch_export
    (torch.export.save) or onnx."""
    name: Annotated[str | None, Field(max_length=63, pattern=DNS_LABEL)] = None
    """Model name in the inference protocol's URLs (/v2/models/<name>); defaults to the
    InferenceService's name."""
    version: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9_.\-]+$")] = "1"
    """Model version reported by the protocol's model metadata."""
    inputs: Annotated[list[TensorSpec], Field(min_length=1, max_length=64)]
    """Input tensors, in the order the model's forward() takes them."""
    outputs: Annotated[list[TensorSpec], Field(min_length=1, max_length=64)]
    """Output tensors, in the order the model returns them."""

    @field_validator("inputs", "outputs")
    @classmethod
    def _unique_names(cls, tensors: list[TensorSpec]) -> list[TensorSpec]:
        names = [tensor.name for tensor in tensors]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"tensor names must be unique; repeated: {', '.join(duplicates)}")
        return tensors

    @property
    def pvc_claim(self) -> str | None:
        """The claim name of a `pvc://` URI, else None."""
        if not self.uri.startswith("pvc://"):
            return None
        return self.uri.removeprefix("pvc://").split("/", 1)[0]

    def path_in_container(self, mount_root: str) -> str:
        """The model file's path inside the runtime container."""
        if self.uri.startswith("pvc://"):
            return f"{mount_root}/{self.uri.removeprefix('pvc://')}"
        return self.uri.removeprefix("file://")
