"""Server reflection's answers (``protocol/reflection.py``), decoded as a client would."""

import pytest
from google.protobuf import descriptor_pb2
from tritonclient.grpc import service_pb2

from kiln_runtime.protocol import health, reflection

PACKAGE = "grpc.reflection.v1"
Request = reflection.request_type(PACKAGE)


def reflecting() -> reflection.Reflection:
    names = ["inference.GRPCInferenceService", health.SERVICE]
    return reflection.Reflection(names, [service_pb2.DESCRIPTOR, health.DESCRIPTOR])


def files(response: object) -> list[str]:
    protos = response.file_descriptor_response.file_descriptor_proto  # type: ignore[attr-defined]
    return [descriptor_pb2.FileDescriptorProto.FromString(p).name for p in protos]


def test_services_are_listed() -> None:
    response = reflecting().answer(PACKAGE, Request(host="h", list_services=""))
    names = [s.name for s in response.list_services_response.service]
    assert names == [health.SERVICE, "inference.GRPCInferenceService"]
    assert response.valid_host == "h"
    assert response.original_request.WhichOneof("message_request") == "list_services"


@pytest.mark.parametrize(
    "symbol",
    ["inference.GRPCInferenceService", "inference.GRPCInferenceService.ModelInfer",
     "inference.ModelInferRequest.InferInputTensor"],
)  # fmt: skip
def test_a_symbol_comes_with_its_file_and_dependencies(symbol: str) -> None:
    response = reflecting().answer(PACKAGE, Request(file_containing_symbol=symbol))
    assert files(response) == ["grpc_service.proto", "model_config.proto"]


def test_files_by_name_and_unknown_symbols() -> None:
    by_name = reflecting().answer(PACKAGE, Request(file_by_filename=health.FILE.name))
    assert files(by_name) == [health.FILE.name]
    missing = reflecting().answer(PACKAGE, Request(file_containing_symbol="no.Such"))
    assert missing.error_response.error_code == reflection.NOT_FOUND
    extensions = reflecting().answer(PACKAGE, Request(all_extension_numbers_of_type="x.Y"))
    assert extensions.error_response.error_code == reflection.UNIMPLEMENTED


def test_a_file_is_described_with_only_the_methods_served() -> None:
    names = ["inference.GRPCInferenceService"]
    served = {"inference.GRPCInferenceService": ["ModelInfer", "ServerLive"]}
    pruned = reflection.Reflection(names, [service_pb2.DESCRIPTOR], served=served)
    response = pruned.answer(PACKAGE, Request(file_containing_symbol=names[0]))
    first = response.file_descriptor_response.file_descriptor_proto[0]
    proto = descriptor_pb2.FileDescriptorProto.FromString(first)
    methods = {m.name for s in proto.service for m in s.method}
    assert methods == {"ModelInfer", "ServerLive"}  # ModelStreamInfer is answered UNIMPLEMENTED
    assert [m.name for m in proto.message_type] == [
        m.name
        for m in descriptor_pb2.FileDescriptorProto.FromString(
            service_pb2.DESCRIPTOR.serialized_pb
        ).message_type
    ]  # the messages stay: only the service's methods are cut
