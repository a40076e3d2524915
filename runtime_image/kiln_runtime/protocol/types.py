"""Protocol-neutral request and response: what both adapters translate to and from.

Nothing here knows HTTP or gRPC; tensors are numpy arrays whose dtype carries the declared
protocol datatype (see ``kiln_runtime.datatypes``).
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from kiln_runtime import errors
from kiln_runtime.datatypes import SUPPORTED_DATATYPES, numpy_carrier

# Plain classes with their own ``__init__``, not dataclasses: mypyc compiles an ``__init__``
# written out to C, while a dataclass's is generated at import and runs as interpreted Python
# (about 0.6 µs each; a call made eight of these objects). ``Final``: set once, as frozen was.


class Tensor:
    """A named tensor; ``data`` has the full shape (batch dimension first)."""

    def __init__(self, name: str, datatype: str, data: npt.NDArray[Any]) -> None:
        self.name: Final = name
        self.datatype: Final = datatype
        self.data: Final = data

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)


class RequestedOutput:
    def __init__(self, name: str, binary: bool = True) -> None:
        self.name: Final = name
        self.binary: Final = binary


WARMUP_PARAMETER: Final = "kiln_warmup"
"""The request parameter (a boolean) with which the operator's warm-up gate marks its requests:
a contract with the operator (docs/metrics.md says what the runtime does with it)."""


class InferRequest:
    def __init__(
        self,
        model_name: str,
        inputs: list[Tensor],
        *,
        model_version: str = "",
        id: str = "",
        outputs: list[RequestedOutput] | None = None,
        timeout_seconds: float | None = None,
        binary_output: bool = False,
        parameters: Any = None,
        warmup: bool = False,
    ) -> None:
        self.model_name = model_name
        self.inputs = inputs
        self.model_version = model_version
        self.id = id
        self.outputs: list[RequestedOutput] = [] if outputs is None else outputs
        self.timeout_seconds = timeout_seconds
        self.binary_output = binary_output  # HTTP: the default for outputs that do not say
        # The request's parameters as decoded (HTTP: the JSON object; gRPC: the message's map of
        # InferParameter), unread but by the response cache, whose key covers them.
        self.parameters = parameters
        self.warmup = warmup  # marked as the warm-up gate's (``WARMUP_PARAMETER``)


class InferResponse:
    def __init__(
        self,
        model_name: str,
        model_version: str,
        id: str,
        outputs: list[Tensor],
        binary: dict[str, bool] | None = None,
    ) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.outputs = outputs
        # HTTP: output name -> send as binary
        self.binary: dict[str, bool] = {} if binary is None else binary


def tensor_from_buffer(
    name: str, datatype: str, shape: list[int], raw: bytes | memoryview
) -> Tensor:
    """A tensor viewing ``raw`` (no copy) after checking its size against shape and datatype."""
    dtype = _dtype(name, datatype)
    dims = _dims(name, shape)
    expected = math.prod(dims) * dtype.itemsize  # exact (np.prod costs more than the view)
    if len(raw) != expected:
        raise errors.invalid(
            f"input '{name}': {len(raw)} bytes of data for shape {dims} of {datatype} "
            f"(expected {expected})"
        )
    return Tensor(name, datatype, np.frombuffer(raw, dtype=dtype).reshape(dims))


def tensor_from_flat(name: str, datatype: str, shape: list[int], flat: npt.NDArray[Any]) -> Tensor:
    dims = _dims(name, shape)
    _dtype(name, datatype)
    count = math.prod(dims)
    if flat.size != count:
        raise errors.invalid(
            f"input '{name}': {flat.size} values for shape {dims} (expected {count})"
        )
    return Tensor(name, datatype, flat.reshape(dims))


def _dtype(name: str, datatype: str) -> np.dtype[Any]:
    if datatype not in SUPPORTED_DATATYPES:
        raise errors.invalid(
            f"input '{name}': unsupported datatype {datatype!r}; supported: "
            f"{list(SUPPORTED_DATATYPES)}"
        )
    return numpy_carrier(datatype)


def _dims(name: str, shape: Any) -> list[int]:
    if type(shape) is list or type(shape) is tuple:
        for d in shape:  # the common case, plain ints (not bool, whose type is bool)
            if type(d) is not int or d < 0:
                break
        else:
            return list(shape)
    if not isinstance(shape, list | tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise errors.invalid(f"input '{name}': shape must be a list of non-negative integers")
    return [int(d) for d in shape]
