"""REST decoding/encoding: JSON and Triton's binary tensors, malformed bodies as INVALID."""

import gzip
import json
import zlib
from typing import Any

import numpy as np
import pytest

from kiln_runtime import errors
from kiln_runtime.protocol.rest import HEADER_LENGTH, decode_infer, encode_infer
from kiln_runtime.protocol.types import InferResponse, Tensor

LIMIT = 1 << 20


def binary_body(document: dict[str, Any], *buffers: bytes) -> tuple[dict[str, str], bytes]:
    header = json.dumps(document).encode()
    return {HEADER_LENGTH: str(len(header))}, header + b"".join(buffers)


def test_json_inputs_become_typed_arrays() -> None:
    body = json.dumps(
        {
            "id": "r1",
            "parameters": {"timeout": 5000},
            "inputs": [
                {"name": "A", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2]},
                {"name": "M", "datatype": "BOOL", "shape": [2], "data": [True, False]},
                {"name": "H", "datatype": "BF16", "shape": [1], "data": [1.0]},
            ],
            "outputs": [{"name": "Y", "parameters": {"binary_data": False}}],
        }
    ).encode()
    request = decode_infer("m", "", {}, body, LIMIT)
    assert request.id == "r1"
    assert request.timeout_seconds == 0.005
    a, m, h = request.inputs
    assert a.data.dtype == np.float32 and a.data.tolist() == [[1.5, 2.0]]
    assert m.data.dtype == np.bool_
    assert h.data.tolist() == [0x3F80]  # bfloat16 bits of 1.0
    assert request.outputs[0].name == "Y" and not request.outputs[0].binary


def test_binary_inputs_are_views_of_the_body() -> None:
    a = np.arange(6, dtype=np.float32)
    b = np.arange(3, dtype=np.int64)
    headers, body = binary_body(
        {
            "inputs": [
                {"name": "A", "datatype": "FP32", "shape": [2, 3],
                 "parameters": {"binary_data_size": a.nbytes}},
                {"name": "B", "datatype": "INT64", "shape": [3],
                 "parameters": {"binary_data_size": b.nbytes}},
            ],
            "parameters": {"binary_data_output": True},
        },
        a.tobytes(), b.tobytes(),
    )  # fmt: skip
    request = decode_infer("m", "1", headers, body, LIMIT)
    np.testing.assert_array_equal(request.inputs[0].data, a.reshape(2, 3))
    np.testing.assert_array_equal(request.inputs[1].data, b)
    assert not request.inputs[0].data.flags.owndata
    assert request.binary_output and request.model_version == "1"


@pytest.mark.parametrize(
    ("headers", "body", "message"),
    [
        ({}, b"{not json", "not valid JSON"),
        ({}, b"[]", "JSON object"),
        ({}, b'{"inputs": []}', "non-empty list"),
        ({}, b'{"inputs": [{"name": "A"}]}', "malformed"),
        ({}, b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [2]}]}', "no 'data'"),
        ({}, b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [3], "data": [1, 2]}]}',
         "2 values for shape"),
        ({}, b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [1.5]}]}',
         "must be integers"),
        ({}, b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": ["x"]}]}',
         "bad data"),
        ({}, b'{"inputs": [{"name": "A", "datatype": "STR", "shape": [1], "data": [1]}]}',
         "unsupported datatype"),
        ({}, b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [-1], "data": [1]}]}',
         "non-negative"),
        ({HEADER_LENGTH: "x"}, b"{}", "not an integer"),
        ({HEADER_LENGTH: "99"}, b"{}", "exceeds the body"),
        ({"content-encoding": "br"}, b"{}", "Content-Encoding"),
        ({}, b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1]}], '
             b'"parameters": {"timeout": -3}}', "timeout"),
    ],
)  # fmt: skip
def test_malformed_requests_are_invalid(headers: dict[str, str], body: bytes, message: str) -> None:
    with pytest.raises(errors.InferError, match=message) as failure:
        decode_infer("m", "", headers, body, LIMIT)
    assert failure.value.kind is errors.ErrorKind.INVALID


def test_the_warm_up_mark_is_a_boolean_parameter() -> None:
    tensor = {"name": "A", "datatype": "FP32", "shape": [1], "data": [1]}

    def decoded(parameters: dict[str, Any]) -> bool:
        body = json.dumps({"inputs": [tensor], "parameters": parameters}).encode()
        return decode_infer("m", "", {}, body, LIMIT).warmup

    assert decoded({"kiln_warmup": True}) is True
    assert decoded({"kiln_warmup": False}) is False
    assert decoded({}) is False
    with pytest.raises(errors.InferError, match="'kiln_warmup' must be a boolean") as failure:
        decoded({"kiln_warmup": "yes"})
    assert failure.value.kind is errors.ErrorKind.INVALID


def test_binary_sizes_must_match_the_data_sent() -> None:
    tensor = {"name": "A", "datatype": "FP32", "shape": [2]}
    headers, body = binary_body(
        {"inputs": [{**tensor, "parameters": {"binary_data_size": 8}}]}, b"\0" * 4
    )
    with pytest.raises(errors.InferError, match="exceeds the binary data"):
        decode_infer("m", "", headers, body, LIMIT)
    headers, body = binary_body(
        {"inputs": [{**tensor, "parameters": {"binary_data_size": 8}}]}, b"\0" * 12
    )
    with pytest.raises(errors.InferError, match="not claimed"):
        decode_infer("m", "", headers, body, LIMIT)
    headers, body = binary_body(
        {"inputs": [{**tensor, "parameters": {"binary_data_size": 4}}]}, b"\0" * 4
    )
    with pytest.raises(errors.InferError, match="expected 8"):
        decode_infer("m", "", headers, body, LIMIT)


def test_compressed_bodies_are_inflated_within_the_limit() -> None:
    body = json.dumps(
        {"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [3]}]}
    ).encode()
    request = decode_infer("m", "", {"content-encoding": "gzip"}, gzip.compress(body), LIMIT)
    assert request.inputs[0].data.tolist() == [3.0]
    bomb = gzip.compress(b" " * (LIMIT * 4))
    with pytest.raises(errors.InferError, match="exceeds"):
        decode_infer("m", "", {"content-encoding": "gzip"}, bomb, LIMIT)


def test_encode_binary_and_json_outputs() -> None:
    y = np.arange(4, dtype=np.float32).reshape(2, 2)
    z = np.array([[1], [2]], dtype=np.int64)
    response = InferResponse(
        "m", "1", "r1", [Tensor("Y", "FP32", y), Tensor("Z", "INT64", z)],
        binary={"Y": True, "Z": False},
    )  # fmt: skip
    http = encode_infer(response)
    header_length = dict(http.extra_headers)[b"Inference-Header-Content-Length"]
    header = json.loads(bytes(http.body[0]))
    assert int(header_length) == len(http.body[0])
    assert header["id"] == "r1"
    assert header["outputs"][0] == {
        "name": "Y", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 16}
    }  # fmt: skip
    assert header["outputs"][1]["data"] == [1, 2]
    assert bytes(http.body[1]) == y.tobytes()
    assert http.content_type == b"application/octet-stream"


def test_encode_all_json_has_no_binary_header() -> None:
    response = InferResponse(
        "m", "1", "", [Tensor("Y", "BF16", np.array([0x3F80], np.uint16))], binary={"Y": False}
    )
    http = encode_infer(response)
    assert http.extra_headers == ()
    assert json.loads(bytes(http.body[0]))["outputs"][0]["data"] == [1.0]


def test_nesting_too_deep_is_invalid_not_a_crash() -> None:
    deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(errors.InferError, match="nested too deeply") as failure:
        decode_infer("m", "", {}, deep, LIMIT * 1000)
    assert failure.value.kind is errors.ErrorKind.INVALID


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_inputs_are_not_json(constant: bytes) -> None:
    body = b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [%s]}]}' % (
        constant
    )
    with pytest.raises(errors.InferError, match="not a JSON number"):
        decode_infer("m", "", {}, body, LIMIT)


def test_nan_outputs_are_refused_as_json_and_sent_as_binary() -> None:
    y = np.array([[np.nan, np.inf]], dtype=np.float32)
    as_json = InferResponse("m", "1", "", [Tensor("Y", "FP32", y)], binary={"Y": False})
    with pytest.raises(errors.InferError, match="binary"):
        encode_infer(as_json)
    as_binary = InferResponse("m", "1", "", [Tensor("Y", "FP32", y)], binary={"Y": True})
    http = encode_infer(as_binary)
    assert bytes(http.body[1]) == y.tobytes()


def test_a_deflate_bomb_is_refused_at_the_limit() -> None:
    bomb = zlib.compress(b"\0" * (LIMIT * 100))
    with pytest.raises(errors.InferError, match=f"exceeds {LIMIT} bytes"):
        decode_infer("m", "", {"content-encoding": "deflate"}, bomb, LIMIT)
