"""gRPC server reflection (``grpc.reflection.v1`` and ``v1alpha``): what ``grpcurl list``,
``grpcurl describe`` and other tooling ask a server to learn its services without .proto files.

A bidirectional stream: each request (list the services, or the file defining a symbol or
named so) is answered with one response, the stream staying open until the client closes it.
The messages are built from their descriptor (``reflection.proto``, field for field) by
protobuf itself, as in ``health``: ``grpcio-reflection`` requires a protobuf major version
``tritonclient`` does not allow.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping
from typing import Any

from google.protobuf import descriptor, descriptor_pb2, descriptor_pool, message_factory

PACKAGES = ("grpc.reflection.v1", "grpc.reflection.v1alpha")  # grpcurl asks v1, then v1alpha
NOT_FOUND, UNIMPLEMENTED = 5, 12  # gRPC status codes, as reflection's ErrorResponse carries them

_F = descriptor_pb2.FieldDescriptorProto
# message -> fields (name, number, type, type name or "", oneof index or None, repeated)
_MESSAGES: dict[str, list[tuple[str, int, int, str, int | None, bool]]] = {
    "ServerReflectionRequest": [
        ("host", 1, _F.TYPE_STRING, "", None, False),
        ("file_by_filename", 3, _F.TYPE_STRING, "", 0, False),
        ("file_containing_symbol", 4, _F.TYPE_STRING, "", 0, False),
        ("file_containing_extension", 5, _F.TYPE_MESSAGE, "ExtensionRequest", 0, False),
        ("all_extension_numbers_of_type", 6, _F.TYPE_STRING, "", 0, False),
        ("list_services", 7, _F.TYPE_STRING, "", 0, False),
    ],
    "ExtensionRequest": [
        ("containing_type", 1, _F.TYPE_STRING, "", None, False),
        ("extension_number", 2, _F.TYPE_INT32, "", None, False),
    ],
    "ServerReflectionResponse": [
        ("valid_host", 1, _F.TYPE_STRING, "", None, False),
        ("original_request", 2, _F.TYPE_MESSAGE, "ServerReflectionRequest", None, False),
        ("file_descriptor_response", 4, _F.TYPE_MESSAGE, "FileDescriptorResponse", 0, False),
        ("all_extension_numbers_response", 5, _F.TYPE_MESSAGE, "ExtensionNumberResponse", 0,
         False),
        ("list_services_response", 6, _F.TYPE_MESSAGE, "ListServiceResponse", 0, False),
        ("error_response", 7, _F.TYPE_MESSAGE, "ErrorResponse", 0, False),
    ],
    "FileDescriptorResponse": [("file_descriptor_proto", 1, _F.TYPE_BYTES, "", None, True)],
    "ExtensionNumberResponse": [
        ("base_type_name", 1, _F.TYPE_STRING, "", None, False),
        ("extension_number", 2, _F.TYPE_INT32, "", None, True),
    ],
    "ListServiceResponse": [("service", 1, _F.TYPE_MESSAGE, "ServiceResponse", None, True)],
    "ServiceResponse": [("name", 1, _F.TYPE_STRING, "", None, False)],
    "ErrorResponse": [
        ("error_code", 1, _F.TYPE_INT32, "", None, False),
        ("error_message", 2, _F.TYPE_STRING, "", None, False),
    ],
}  # fmt: skip
_ONEOFS = {"ServerReflectionRequest": "message_request",
           "ServerReflectionResponse": "message_response"}  # fmt: skip


def _file(package: str) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"{package.replace('.', '/')}/reflection.proto", package=package, syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        if name in _ONEOFS:
            message.oneof_decl.add(name=_ONEOFS[name])
        for field, number, kind, type_name, oneof, repeated in fields:
            entry = message.field.add(
                name=field, number=number, type=kind,
                label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
            )  # fmt: skip
            if type_name:
                entry.type_name = f".{package}.{type_name}"
            if oneof is not None:
                entry.oneof_index = oneof
    service = proto.service.add(name="ServerReflection")
    service.method.add(
        name="ServerReflectionInfo", input_type=f".{package}.ServerReflectionRequest",
        output_type=f".{package}.ServerReflectionResponse",
        client_streaming=True, server_streaming=True,
    )  # fmt: skip
    return proto


_pool = descriptor_pool.DescriptorPool()
_FILES = {package: _file(package) for package in PACKAGES}
_classes = message_factory.GetMessages(list(_FILES.values()), pool=_pool)
DESCRIPTORS = [_pool.FindFileByName(proto.name) for proto in _FILES.values()]


def request_type(package: str) -> Any:
    return _classes[f"{package}.ServerReflectionRequest"]


def _response_type(package: str) -> Any:
    return _classes[f"{package}.ServerReflectionResponse"]


class Reflection:
    """Answers reflection requests about ``files`` (each with its dependencies).

    ``served`` names, per service, the methods the server answers: a file is described with
    only those (Triton's ``service.proto`` declares methods this runtime answers UNIMPLEMENTED,
    such as ``ModelStreamInfer``, which a client must not be told to call). A service absent
    from ``served`` is described whole.
    """

    def __init__(
        self,
        services: Iterable[str],
        files: Iterable[descriptor.FileDescriptor],
        served: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        self._services = sorted(services)
        self._served = dict(served or {})
        self._files: dict[str, descriptor.FileDescriptor] = {}
        for file in files:
            self._add(file)

    def _add(self, file: descriptor.FileDescriptor) -> None:
        self._files[file.name] = file
        for dependency in file.dependencies:
            self._add(dependency)

    def _containing(self, symbol: str) -> descriptor.FileDescriptor | None:
        for file in self._files.values():
            names = [
                *file.message_types_by_name, *file.enum_types_by_name,
                *file.services_by_name,
            ]  # fmt: skip
            prefix = f"{file.package}." if file.package else ""
            for name in names:
                full = prefix + name
                if symbol == full or symbol.startswith(full + "."):  # nested, or a method
                    return file
        return None

    def _with_dependencies(self, file: descriptor.FileDescriptor) -> list[bytes]:
        ordered: list[descriptor.FileDescriptor] = []

        def visit(current: descriptor.FileDescriptor) -> None:
            if current not in ordered:
                ordered.append(current)
                for dependency in current.dependencies:
                    visit(dependency)

        visit(file)
        return [self._serialized(f) for f in ordered]

    def _serialized(self, file: descriptor.FileDescriptor) -> bytes:
        """The file as sent, its services holding only the methods the server answers."""
        prefix = f"{file.package}." if file.package else ""
        if not any(prefix + name in self._served for name in file.services_by_name):
            return bytes(file.serialized_pb)
        proto = descriptor_pb2.FileDescriptorProto.FromString(file.serialized_pb)
        for service in proto.service:
            served = self._served.get(prefix + service.name)
            if served is not None:
                kept = [m for m in service.method if m.name in served]
                del service.method[:]
                service.method.extend(kept)
        serialized: bytes = proto.SerializeToString()
        return serialized

    def answer(self, package: str, request: Any) -> Any:
        response = _response_type(package)(valid_host=request.host, original_request=request)
        kind = request.WhichOneof("message_request")
        file = None
        if kind == "list_services":
            for name in self._services:
                response.list_services_response.service.add(name=name)
            return response
        if kind == "file_containing_symbol":
            file = self._containing(request.file_containing_symbol)
        elif kind == "file_by_filename":
            file = self._files.get(request.file_by_filename)
        else:
            response.error_response.error_code = UNIMPLEMENTED
            response.error_response.error_message = f"{kind} is not supported"
            return response
        if file is None:
            response.error_response.error_code = NOT_FOUND
            response.error_response.error_message = "not found"
            return response
        response.file_descriptor_response.file_descriptor_proto.extend(
            self._with_dependencies(file)
        )
        return response

    def method(self, package: str) -> Callable[[AsyncIterator[Any], Callable[[Any], bool]], Any]:
        async def info(messages: AsyncIterator[Any], send: Callable[[Any], bool]) -> None:
            async for request in messages:
                if not send(self.answer(package, request)):
                    return

        return info
