"""The protocol's tensor datatypes and their numpy carriers.

The data plane carries tensors as numpy arrays. BF16 has no numpy type: its carrier is
``uint16`` holding the raw bits (what the binary wire format carries), converted only where a
number is needed (JSON, the model).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

_NUMPY_CARRIERS: dict[str, npt.DTypeLike] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "BF16": np.uint16,
    "FP32": np.float32,
    "FP64": np.float64,
}

SUPPORTED_DATATYPES: tuple[str, ...] = tuple(_NUMPY_CARRIERS)


def numpy_carrier(datatype: str) -> np.dtype[Any]:
    """The numpy dtype that carries ``datatype`` (raises ``KeyError`` if unsupported)."""
    return np.dtype(_NUMPY_CARRIERS[datatype])


def element_size(datatype: str) -> int:
    return numpy_carrier(datatype).itemsize


def bf16_bits_from_float(values: npt.NDArray[Any]) -> npt.NDArray[np.uint16]:
    """Round float values to bfloat16 (round to nearest even) and return the raw bits."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return ((bits + rounding) >> np.uint32(16)).astype(np.uint16)


def float_from_bf16_bits(bits: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def from_json_values(values: Any, datatype: str) -> npt.NDArray[Any]:
    """A flat array of ``datatype`` from JSON ``data`` (raises ``ValueError`` on bad values)."""
    if datatype == "BF16":
        return bf16_bits_from_float(np.asarray(values, dtype=np.float32).reshape(-1))
    flat = np.asarray(values).reshape(-1)
    if flat.dtype.kind not in "biuf":
        raise ValueError(f"data of a {datatype} tensor must be numbers")
    if datatype == "BOOL" and flat.dtype.kind != "b":
        raise ValueError("data of a BOOL tensor must be true/false")
    if flat.dtype.kind == "f" and numpy_carrier(datatype).kind in "iu":
        raise ValueError(f"data of a {datatype} tensor must be integers")
    return flat.astype(numpy_carrier(datatype), copy=False)


def to_json_values(array: npt.NDArray[Any], datatype: str) -> list[Any]:
    """The flat list that represents ``array`` in JSON."""
    if datatype == "BF16":
        return float_from_bf16_bits(array.reshape(-1)).tolist()  # type: ignore[no-any-return]
    values: list[Any] = array.reshape(-1).tolist()
    return values
