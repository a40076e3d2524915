"""Protocol-neutral request and response: what both adapters translate to and from.

Nothing here knows HTTP or gRPC; tensors are numpy arrays whose dtype carries the declared
protocol datatype (see ``kiln_runtime.datatypes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kiln_runtime import errors
from kiln_runtime.datatypes import SUPPORTED_DATATYPES, numpy_carrier


@dataclass(frozen=True)
class Tensor:
    """A named tensor; ``data`` has the full shape (batch dimension first)."""

    name: str
    datatype: str
    data: npt.NDArray[Any]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool = True


@dataclass
class InferRequest:
    model_name: str
    inputs: list[Tensor]
    model_version: str = ""
    id: str = ""
    outputs: list[RequestedOutput] = field(default_factory=list)
    timeout_seconds: float | None = None
    binary_output: bool = False  # HTTP: the default for outputs that do not say


@dataclass
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: list[Tensor]
    binary: dict[str, bool] = field(default_factory=dict)  # HTTP: output name -> send as binary


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
