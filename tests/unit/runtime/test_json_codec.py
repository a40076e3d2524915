"""JSON tensors on the REST path: every datatype both ways, nesting, and what is refused.

The codec is orjson plus numpy; these pin what clients see: the numbers written (Triton's
double formatting), what comes back from a round trip, and the 400s for data a datatype
cannot hold.
"""

import json
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from kiln_runtime import errors
from kiln_runtime.datatypes import SUPPORTED_DATATYPES, float_from_bf16_bits, numpy_carrier
from kiln_runtime.protocol.rest import decode_infer, encode_infer
from kiln_runtime.protocol.types import InferResponse, Tensor

LIMIT = 1 << 20
RNG = np.random.default_rng(20)


def sample(datatype: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
    """Random values of ``datatype`` spanning its range (finite, for the float types)."""
    if datatype == "BOOL":
        return RNG.integers(0, 2, shape).astype(np.bool_)
    if datatype == "BF16":
        bits = RNG.integers(0, 1 << 16, shape, dtype=np.uint16)
        return np.where(bits & 0x7F80 == 0x7F80, bits & 0x807F, bits).astype(np.uint16)
    dtype = numpy_carrier(datatype)
    if dtype.kind == "f":
        values = RNG.standard_normal(shape) * 10.0 ** RNG.integers(-6, 4, shape)
        return values.astype(dtype)
    limits = np.iinfo(dtype)
    return RNG.integers(limits.min, limits.max, shape, endpoint=True).astype(dtype)


def request_body(datatype: str, shape: list[int], data: Any) -> bytes:
    tensor = {"name": "A", "datatype": datatype, "shape": shape, "data": data}
    return json.dumps({"inputs": [tensor]}).encode()


def decode_one(datatype: str, shape: list[int], data: Any) -> npt.NDArray[Any]:
    return decode_infer("m", "", {}, request_body(datatype, shape, data), LIMIT).inputs[0].data


def encode_one(datatype: str, array: npt.NDArray[Any]) -> dict[str, Any]:
    response = InferResponse("m", "1", "", [Tensor("Y", datatype, array)], binary={"Y": False})
    http = encode_infer(response)
    assert http.extra_headers == () and len(http.body) == 1
    output: dict[str, Any] = json.loads(bytes(http.body[0]))["outputs"][0]
    return output


def refusal(datatype: str, shape: list[int], data: Any) -> str:
    with pytest.raises(errors.InferError) as failure:
        decode_one(datatype, shape, data)
    assert failure.value.kind is errors.ErrorKind.INVALID
    return failure.value.message


@pytest.mark.parametrize("datatype", SUPPORTED_DATATYPES)
def test_every_datatype_round_trips_through_json(datatype: str) -> None:
    array = sample(datatype, (3, 7))
    output = encode_one(datatype, array)
    assert output["shape"] == [3, 7] and output["datatype"] == datatype
    assert len(output["data"]) == 21  # flat, row-major
    back = decode_one(datatype, output["shape"], output["data"])
    assert back.dtype == array.dtype
    np.testing.assert_array_equal(back, array)


@pytest.mark.parametrize("datatype", ["FP32", "INT64", "BOOL"])
def test_empty_tensors_round_trip(datatype: str) -> None:
    array = sample(datatype, (2, 0))
    output = encode_one(datatype, array)
    assert output["data"] == [] and output["shape"] == [2, 0]
    assert decode_one(datatype, [2, 0], []).shape == (2, 0)


def test_float_outputs_are_written_as_their_double_values_like_triton() -> None:
    """Triton writes an FP32 as the shortest text of its double value: 0.1f is
    0.10000000149011612, not 0.1. Clients parsing into float64 see the same number as before."""
    response = InferResponse(
        "m", "1", "", [Tensor("Y", "FP32", np.array([0.1, 1, -0.0, 3e38], np.float32))],
        binary={"Y": False},
    )  # fmt: skip
    header = bytes(encode_infer(response).body[0])
    assert b'"data":[0.10000000149011612,1.0,-0.0,3.0000000054977558e+38]' in header


def test_json_numbers_parse_exactly_as_the_standard_library_does() -> None:
    values = RNG.standard_normal(2000) * 10.0 ** RNG.integers(-30, 30, 2000)
    text = "[" + ",".join(f"{v:.17g}" for v in values) + "]"
    expected = np.array(json.loads(text), dtype=np.float64)
    np.testing.assert_array_equal(decode_one("FP64", [2000], json.loads(text)), expected)
    np.testing.assert_array_equal(
        decode_one("FP32", [2000], json.loads(text)), expected.astype(np.float32)
    )


def test_bf16_inputs_round_to_nearest_even() -> None:
    # bfloat16 steps by 2^-7 near 1: 1 + 2^-8 is a tie between 1.0 (even) and 1 + 2^-7, and
    # 1 + 3 * 2^-8 a tie between 1 + 2^-7 and 1 + 2^-6 (even): each goes to the even one.
    bits = decode_one("BF16", [3], [1.0, 1 + 2**-8, 1 + 3 * 2**-8])
    assert bits.tolist() == [0x3F80, 0x3F80, 0x3F82]
    np.testing.assert_array_equal(float_from_bf16_bits(bits), [1.0, 1.0, 1 + 2**-6])


def test_nested_row_major_data_is_accepted() -> None:
    nested = [[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 10], [11, 12]]]
    array = decode_one("INT32", [2, 3, 2], nested)
    np.testing.assert_array_equal(array, np.arange(1, 13, dtype=np.int32).reshape(2, 3, 2))
    partly = decode_one("FP32", [2, 3, 2], [list(range(6)), list(range(6, 12))])
    np.testing.assert_array_equal(partly.reshape(-1), np.arange(12, dtype=np.float32))


@pytest.mark.parametrize(
    ("shape", "data", "message"),
    [
        ([2, 3], [1, 2, 3, 4, 5], "5 values for shape [2, 3] (expected 6)"),
        ([2, 3], [[1, 2, 3], [4, 5, 6], [7, 8, 9]], "9 values for shape [2, 3] (expected 6)"),
        ([2, 2], [[1, 2], [3]], "bad data"),  # ragged: not a tensor
        ([2], [[1, [2]]], "bad data"),
        ([1], 5, None),  # a bare number is one value
    ],
)
def test_element_counts_must_match_the_shape(
    shape: list[int], data: Any, message: str | None
) -> None:
    if message is None:
        assert decode_one("FP32", shape, data).tolist() == [5.0]
    else:
        assert message in refusal("FP32", shape, data)


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("INT32", [1.5], "must be integers"),
        ("INT64", [1e3], "must be integers"),  # 1e3 is a JSON float
        ("BOOL", [1, 0], "true/false"),
        ("INT8", [127, 128], "beyond the range of INT8 [-128, 127]"),
        ("UINT8", [-1], "beyond the range of UINT8"),
        ("INT16", [40000], "beyond the range of INT16"),
        ("INT32", [2**31], "beyond the range of INT32"),
        ("INT64", [2**63], "beyond the range of INT64"),
        ("INT64", [2**64 - 1], "beyond the range of INT64"),
        ("INT64", [2**70], "must be integers"),  # past 64 bits JSON parsers read a double
        ("FP16", [70000], "beyond the range of FP16"),
        ("FP32", [1e39], "beyond the range of FP32"),
        ("BF16", [3.4e38], "beyond the range of BF16"),
        ("FP32", ["1.5"], "must be numbers"),
        ("BF16", ["1.5"], "must be numbers"),
        ("FP32", [None], "must be numbers"),
        ("FP32", [{"x": 1}], "must be numbers"),
    ],
)
def test_values_a_datatype_cannot_hold_are_refused(datatype: str, data: Any, message: str) -> None:
    assert message in refusal(datatype, [len(data)], data)


def test_the_largest_values_of_each_type_are_accepted() -> None:
    assert decode_one("INT64", [2], [2**63 - 1, -(2**63)]).tolist() == [2**63 - 1, -(2**63)]
    assert decode_one("FP16", [1], [65504]).tolist() == [65504.0]
    assert decode_one("FP32", [1], [3.4028234663852886e38]).tolist() == [3.4028234663852886e38]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"1e400", "not valid JSON"),  # a double's infinity: refused by the parser
        (b"[1, -Infinity]", "-Infinity is not a JSON number"),
        (b"[1, Infinity]", "Infinity is not a JSON number"),
        (b"[NaN, 1]", "NaN is not a JSON number"),
        (b"[1, nan]", "not valid JSON"),
        (b"[1,]", "not valid JSON"),
        (b"[" * 2000 + b"]" * 2000, "nested too deeply"),
    ],
)
def test_data_that_is_not_json_is_refused(text: bytes, message: str) -> None:
    body = b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": %s}]}' % text
    with pytest.raises(errors.InferError, match=message) as failure:
        decode_infer("m", "", {}, body, LIMIT)
    assert failure.value.kind is errors.ErrorKind.INVALID


def test_json_is_parsed_from_a_view_of_the_body_with_binary_tensors() -> None:
    header = json.dumps(
        {"inputs": [
            {"name": "A", "datatype": "FP32", "shape": [2], "data": [1, 2]},
            {"name": "B", "datatype": "INT8", "shape": [3], "parameters": {"binary_data_size": 3}},
        ]}
    ).encode()  # fmt: skip
    request = decode_infer(
        "m", "", {"inference-header-content-length": str(len(header))}, header + b"\1\2\3", LIMIT
    )
    assert request.inputs[0].data.tolist() == [1.0, 2.0]
    assert request.inputs[1].data.tolist() == [1, 2, 3]


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64", "BF16"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_outputs_are_refused_as_json(datatype: str, value: float) -> None:
    carrier = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
    if datatype == "BF16":
        array = np.array([0x3F80, {np.inf: 0x7F80, -np.inf: 0xFF80}.get(value, 0x7FC0)], np.uint16)
    else:
        array = np.array([1.0, value], dtype=carrier[datatype])
    response = InferResponse("m", "1", "", [Tensor("Y", datatype, array)], binary={"Y": False})
    with pytest.raises(errors.InferError, match="NaN or Infinity") as failure:
        encode_infer(response)
    assert failure.value.kind is errors.ErrorKind.INVALID


def test_non_contiguous_outputs_are_written_in_row_major_order() -> None:
    array = np.arange(12, dtype=np.int32).reshape(3, 4).T
    output = encode_one("INT32", array)
    assert output["shape"] == [4, 3]
    assert output["data"] == array.reshape(-1).tolist()
