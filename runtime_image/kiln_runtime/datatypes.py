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


def bf16_bits_from_float(values: npt.NDArray[Any]) -> npt.NDArray[np.uint16]:
    """Round float values to bfloat16 (round to nearest even) and return the raw bits."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return ((bits + rounding) >> np.uint32(16)).astype(np.uint16)


def float_from_bf16_bits(bits: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def from_json_values(values: Any, datatype: str) -> npt.NDArray[Any]:
    """A flat array of ``datatype`` from decoded JSON ``data`` (flat or nested row-major lists).

    Raises ``KeyError`` for an unsupported datatype and ``ValueError`` for values the datatype
    cannot hold: non-numbers, non-integers for integer types, anything but true/false for BOOL,
    and numbers beyond the type's range (refused rather than wrapped or turned into infinity,
    which the model would then compute with).
    """
    carrier = numpy_carrier(datatype)
    flat = np.asarray(values).reshape(-1)
    if not flat.size:  # numpy reads an empty list as float64: no values, nothing to check
        return flat.astype(carrier)
    kind = flat.dtype.kind
    if kind not in "biuf":
        if kind == "O" and all(type(v) is int for v in flat):
            raise ValueError(f"a value is beyond the range of {datatype}")
        raise ValueError(f"data of a {datatype} tensor must be numbers")
    if datatype == "BOOL":
        if kind != "b":
            raise ValueError("data of a BOOL tensor must be true/false")
        return flat
    if carrier.kind in "iu" and datatype != "BF16":  # BF16's carrier holds bits, not numbers
        if kind == "f":
            raise ValueError(f"data of a {datatype} tensor must be integers")
        if kind != "b" and flat.dtype != carrier:
            low, high = np.iinfo(carrier).min, np.iinfo(carrier).max
            if flat.min() < low or flat.max() > high:
                raise ValueError(f"a value is beyond the range of {datatype} [{low}, {high}]")
        return flat.astype(carrier, copy=False)
    with np.errstate(over="ignore"):  # overflow is detected below, as infinity
        floats = flat.astype(np.float32 if datatype == "BF16" else carrier, copy=False)
    if datatype == "BF16":
        bits = bf16_bits_from_float(floats)
        finite = not np.any(bits & np.uint16(0x7F80) == np.uint16(0x7F80))
    else:
        bits, finite = floats, bool(np.isfinite(floats).all())
    if not finite:
        raise ValueError(f"a value is beyond the range of {datatype}")
    return bits


def to_json_array(array: npt.NDArray[Any], datatype: str) -> npt.NDArray[Any]:
    """The flat, contiguous array that a JSON encoder writes as ``array``'s ``data``.

    Floating-point outputs are widened to float64 so each number is written as the shortest
    text of its double value, as Triton writes them (and as this runtime always has); BF16 bits
    become their float values. JSON has no NaN or Infinity, so those raise ``ValueError``
    (encoders would otherwise write ``null`` or invalid JSON).
    """
    if datatype == "BF16":
        array = float_from_bf16_bits(array.reshape(-1))
    if array.dtype.kind != "f":
        return np.ascontiguousarray(array.reshape(-1))
    wide = array.reshape(-1).astype(np.float64)
    if not np.isfinite(wide).all():
        raise ValueError(f"a {datatype} output holds NaN or Infinity")
    return wide
