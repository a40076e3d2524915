"""gRPC decoding/encoding with tritonclient's own messages."""

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from kiln_runtime import errors
from kiln_runtime.protocol.grpc import decode_infer, encode_infer
from kiln_runtime.protocol.types import InferResponse, Tensor


def test_raw_contents_are_viewed_and_timeout_read() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    message = service_pb2.ModelInferRequest(model_name="m", model_version="1", id="x")
    message.inputs.add(name="A", datatype="FP32", shape=[2, 3])
    message.raw_input_contents.append(a.tobytes())
    message.parameters["timeout"].int64_param = 2500
    message.outputs.add(name="Y")
    request = decode_infer(message, 1 << 20)
    np.testing.assert_array_equal(request.inputs[0].data, a)
    assert request.timeout_seconds == 0.0025
    assert [o.name for o in request.outputs] == ["Y"]
    assert (request.model_name, request.model_version, request.id) == ("m", "1", "x")


def test_the_warm_up_mark_is_a_boolean_parameter() -> None:
    def message() -> service_pb2.ModelInferRequest:
        built = service_pb2.ModelInferRequest(model_name="m")
        built.inputs.add(name="A", datatype="FP32", shape=[1])
        built.raw_input_contents.append(b"\0" * 4)
        return built

    assert decode_infer(message(), 1024).warmup is False
    marked = message()
    marked.parameters["kiln_warmup"].bool_param = True
    assert decode_infer(marked, 1024).warmup is True
    wrong = message()
    wrong.parameters["kiln_warmup"].string_param = "true"
    with pytest.raises(errors.InferError, match="'kiln_warmup' must be a boolean") as failure:
        decode_infer(wrong, 1024)
    assert failure.value.kind is errors.ErrorKind.INVALID


def test_every_input_meets_its_own_raw_contents_in_order() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([[7, 8, 9, 10], [11, 12, 13, 14]], dtype=np.int32)
    message = service_pb2.ModelInferRequest(model_name="m")
    message.inputs.add(name="A", datatype="FP32", shape=[2, 3])
    message.inputs.add(name="B", datatype="INT32", shape=[2, 4])
    message.raw_input_contents.extend([a.tobytes(), b.tobytes()])
    message.outputs.add(name="Y")
    message.outputs.add(name="Z")
    request = decode_infer(message, 1 << 20)
    assert [(t.name, t.datatype, t.shape) for t in request.inputs] == [
        ("A", "FP32", (2, 3)),
        ("B", "INT32", (2, 4)),
    ]
    np.testing.assert_array_equal(request.inputs[0].data, a)
    np.testing.assert_array_equal(request.inputs[1].data, b)
    assert [o.name for o in request.outputs] == ["Y", "Z"]


def test_typed_contents_are_accepted() -> None:
    message = service_pb2.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="B", datatype="INT64", shape=[1, 2])
    tensor.contents.int64_contents.extend([4, 5])
    request = decode_infer(message, 1 << 20)
    assert request.inputs[0].data.dtype == np.int64
    assert request.inputs[0].data.tolist() == [[4, 5]]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda m: (m.inputs.add(name="A", datatype="FP32", shape=[2]),
                    m.raw_input_contents.append(b"\0" * 4)), "expected 8"),
        (lambda m: (m.inputs.add(name="A", datatype="FP32", shape=[1]),
                    m.inputs.add(name="B", datatype="FP32", shape=[1]),
                    m.raw_input_contents.append(b"\0" * 4)), "raw_input_contents for 2"),
        (lambda m: m.inputs.add(name="A", datatype="FP16", shape=[1]), "raw_input_contents"),
        (lambda m: (m.inputs.add(name="A", datatype="FP32", shape=[1]),
                    m.raw_input_contents.append(b"\0" * 4096)), "limit"),
    ],
)  # fmt: skip
def test_malformed_messages_are_invalid(build: object, message: str) -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    build(request)  # type: ignore[operator]
    with pytest.raises(errors.InferError, match=message) as failure:
        decode_infer(request, 1024)
    assert failure.value.kind is errors.ErrorKind.INVALID


def test_outputs_travel_as_raw_contents() -> None:
    y = np.arange(4, dtype=np.float32).reshape(2, 2)
    message = encode_infer(InferResponse("m", "1", "x", [Tensor("Y", "FP32", y)]))
    assert message.outputs[0].name == "Y"
    assert list(message.outputs[0].shape) == [2, 2]
    assert message.raw_output_contents[0] == y.tobytes()
