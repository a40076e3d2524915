"""The messages of ``grpc.health.v1.Health``, the standard gRPC health service.

Kubernetes' native gRPC probe, grpc-health-probe, load balancers and most gRPC tooling ask it
whether a server is serving. Its package (``grpcio-health-checking``) requires a protobuf
major version newer than the one ``tritonclient`` allows, so the two messages are built here
from their descriptor (the service's ``health.proto``, field for field) by protobuf itself.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SERVICE = "grpc.health.v1.Health"
# The service name whose status is the process's liveness (``/v2/health/live``), not readiness:
# what the pods' gRPC liveness probe asks (``grpc: {port: 8001, service: liveness}``).
LIVENESS = "liveness"
UNKNOWN, SERVING, NOT_SERVING, SERVICE_UNKNOWN = 0, 1, 2, 3


def _file() -> descriptor_pb2.FileDescriptorProto:
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="grpc/health/v1/health.proto", package="grpc.health.v1", syntax="proto3"
    )
    request = proto.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    response = proto.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for name, number in (
        ("UNKNOWN", UNKNOWN), ("SERVING", SERVING), ("NOT_SERVING", NOT_SERVING),
        ("SERVICE_UNKNOWN", SERVICE_UNKNOWN),
    ):  # fmt: skip
        status.value.add(name=name, number=number)
    response.field.add(
        name="status", number=1, type=field.TYPE_ENUM, label=field.LABEL_OPTIONAL,
        type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
    )  # fmt: skip
    service = proto.service.add(name="Health")
    for method, streaming in (("Check", False), ("Watch", True)):
        service.method.add(
            name=method, input_type=".grpc.health.v1.HealthCheckRequest",
            output_type=".grpc.health.v1.HealthCheckResponse", server_streaming=streaming,
        )  # fmt: skip
    return proto


FILE = _file()
_pool = descriptor_pool.DescriptorPool()
_classes = message_factory.GetMessages([FILE], pool=_pool)
DESCRIPTOR = _pool.FindFileByName(FILE.name)  # what server reflection describes
HealthCheckRequest: Any = _classes["grpc.health.v1.HealthCheckRequest"]
HealthCheckResponse: Any = _classes["grpc.health.v1.HealthCheckResponse"]
