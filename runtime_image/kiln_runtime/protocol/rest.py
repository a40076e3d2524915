"""The REST adapter: Open Inference Protocol v2 over HTTP, JSON and Triton's binary tensors.

Routes a decoded HTTP request to the data plane and renders the answer; it knows nothing of
sockets (``httpserver`` does). Tensors sent with the binary extension
(``Inference-Header-Content-Length``) are viewed in place, never copied or parsed as JSON.
JSON goes through orjson: it parses several times faster than the standard library and writes
numpy arrays itself, so JSON outputs never become Python lists (docs/runtime.md has the
numbers).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import orjson

from kiln_runtime import __version__, errors
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.datatypes import from_json_values, to_json_array
from kiln_runtime.protocol.types import (
    WARMUP_PARAMETER,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
    tensor_from_buffer,
    tensor_from_flat,
)

HEADER_LENGTH = "inference-header-content-length"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics"]
JSON = b"application/json"
# Triton extensions this runtime does not implement, by the path segment naming them: a
# client probing for one gets 404 naming it, not a 405 that reads like a wrong method.
UNSUPPORTED_EXTENSIONS = {
    "repository": "model repository",
    "systemsharedmemory": "system shared memory",
    "cudasharedmemory": "CUDA shared memory",
    "trace": "trace",
    "logging": "logging",
}
UNSUPPORTED_MODEL_EXTENSIONS = {
    "trace": "trace",
    "generate": "generate",
    "generate_stream": "generate",
}


class HttpResponse:
    """An answer's status, body parts and headers. A plain class: mypyc compiles its
    ``__init__`` (a dataclass's would run as interpreted Python; ``protocol.types``)."""

    def __init__(
        self,
        status: int,
        body: list[bytes | memoryview],
        content_type: bytes = JSON,
        extra_headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.extra_headers = extra_headers


def json_response(status: int, document: Any) -> HttpResponse:
    return HttpResponse(status, [orjson.dumps(document)])


def error_response(error: errors.InferError) -> HttpResponse:
    return json_response(error.kind.mapping.http_status, {"error": error.message})


def empty(status: int) -> HttpResponse:
    return HttpResponse(status, [])


class RestAdapter:
    """Answers one HTTP request at a time for the data plane."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.max_body = dataplane.config.max_request_bytes()
        limits = dataplane.config.http
        self.http_limits = limits
        self.max_decompressed = limits.decompressed_limit(self.max_body)
        self.off_loop_bytes = limits.off_loop_decode_bytes

    def refused(self, code: str) -> None:
        """An infer request the HTTP transport refused before it reached here."""
        self.dataplane.refused("http", code)

    async def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> HttpResponse:
        parts = path.split("?", 1)[0].strip("/").split("/")
        quoted = errors.clip(path)  # an error quotes at most a prefix of what the client sent
        if parts[:1] != ["v2"]:
            return json_response(404, {"error": f"no route for {quoted}"})
        rest = parts[1:]
        if method == "POST" and len(rest) >= 3 and rest[0] == "models" and rest[-1] == "infer":
            return await self._infer(rest[1:-1], headers, body)
        if unsupported := _unsupported_extension(rest):
            return json_response(
                404, {"error": f"the {unsupported} extension is not supported ({quoted})"}
            )
        if method != "GET":
            return json_response(
                405, {"error": f"{errors.clip(method)} is not allowed on {quoted}"}
            )
        dp = self.dataplane
        try:
            if rest == []:
                return json_response(
                    200, {"name": "kiln", "version": __version__, "extensions": EXTENSIONS}
                )
            if rest == ["health", "live"]:  # Triton's codes, KServe's bodies
                return json_response(200 if dp.live else 503, {"live": dp.live})
            if rest == ["health", "ready"]:
                return json_response(200 if dp.ready else 503, {"ready": dp.ready})
            if rest == ["models", "stats"]:  # with the limits in force (docs/runtime.md)
                document = {"model_stats": [dp.statistics()], "limits": dp.limits_report}
                return json_response(200, document)
            if len(rest) >= 2 and rest[0] == "models":
                name, version, tail = _model_path(rest[1:])
                if tail == []:
                    return json_response(200, dp.model_metadata(name, version))
                if tail == ["ready"]:
                    ready = dp.model_ready(name, version)
                    return json_response(200 if ready else 503, {"name": name, "ready": ready})
                if tail == ["config"]:
                    return json_response(200, dp.model_config(name, version))
                if tail == ["stats"]:
                    return json_response(200, {"model_stats": [dp.statistics(name, version)]})
        except errors.InferError as error:
            return error_response(error)
        return json_response(404, {"error": f"no route for {quoted}"})

    async def _infer(
        self, model_parts: list[str], headers: dict[str, str], body: bytes
    ) -> HttpResponse:
        name, version, tail = _model_path(model_parts)

        def decode() -> InferRequest:
            if tail:
                raise errors.not_found(
                    f"no route for model path {errors.clip('/'.join(model_parts))}"
                )
            return decode_infer(name, version, headers, body, self.max_decompressed)

        async def decode_elsewhere() -> InferRequest:
            if tail:
                return decode()
            return await self.dataplane.decoding.decode(
                name, version, headers, body, self.max_decompressed
            )

        # Inflating and parsing a large or compressed body holds the GIL long enough to delay
        # every other client (and the health probes): it runs in the decoding process. A binary
        # body's tensors are views of it, not parsed: only its JSON part counts.
        json_bytes = len(body)
        declared = headers.get(HEADER_LENGTH, "")
        if declared.isdigit() and len(declared) <= 18:
            json_bytes = min(json_bytes, int(declared))
        off_loop = json_bytes >= self.off_loop_bytes or "content-encoding" in headers
        try:
            return await self.dataplane.handle(
                "http",
                decode,
                encode_infer,
                decode_off_loop=decode_elsewhere if off_loop else None,
                traceparent=None if self.dataplane.tracer is None else headers.get("traceparent"),
            )
        except errors.InferError as error:
            return error_response(error)


def _unsupported_extension(rest: list[str]) -> str | None:
    if rest and rest[0] in UNSUPPORTED_EXTENSIONS:
        return UNSUPPORTED_EXTENSIONS[rest[0]]
    if len(rest) >= 3 and rest[0] == "models":
        return UNSUPPORTED_MODEL_EXTENSIONS.get(rest[-1]) or (
            UNSUPPORTED_MODEL_EXTENSIONS.get(rest[-2]) if len(rest) >= 4 else None
        )
    return None


def _model_path(parts: list[str]) -> tuple[str, str, list[str]]:
    """``[name, ("versions", v)?, *tail]`` -> name, version ("" if absent), tail."""
    name = parts[0]
    if len(parts) >= 3 and parts[1] == "versions":
        return name, parts[2], parts[3:]
    return name, "", parts[1:]


def decode_infer(
    model_name: str, version: str, headers: dict[str, str], body: bytes, max_body: int
) -> InferRequest:
    """Parse an infer request body (JSON, optionally followed by binary tensor data)."""
    encoding = headers.get("content-encoding")
    if encoding:
        body = _decompress(body, encoding, max_body)
    header_length = headers.get(HEADER_LENGTH)
    json_part: bytes | memoryview
    if header_length is None:
        json_part, binary = body, memoryview(b"")
    else:
        try:
            length = int(header_length)
        except ValueError:
            raise errors.invalid(
                f"{HEADER_LENGTH} is not an integer: {errors.clip(header_length)!r}"
            ) from None
        if not 0 <= length <= len(body):
            raise errors.invalid(f"{HEADER_LENGTH} {length} exceeds the body of {len(body)} bytes")
        view = memoryview(body)
        json_part, binary = view[:length], view[length:]
    try:
        document = orjson.loads(json_part)
    except orjson.JSONDecodeError as error:
        raise _invalid_json(error) from None
    if not isinstance(document, dict):
        raise errors.invalid("request body must be a JSON object")
    try:
        return _request_from_document(model_name, version, document, binary)
    except (KeyError, TypeError, ValueError) as error:
        raise errors.invalid(f"malformed infer request: {error}") from None


def _request_from_document(
    model_name: str, version: str, document: dict[str, Any], binary: memoryview
) -> InferRequest:
    parameters = document.get("parameters") or {}
    raw_inputs = document.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise errors.invalid("'inputs' must be a non-empty list")
    inputs: list[Tensor] = []
    offset = 0
    for raw in raw_inputs:
        name = errors.clip(str(raw["name"]))
        datatype = raw["datatype"]
        shape = raw["shape"]
        size = (raw.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise errors.invalid(
                    f"input '{name}': binary_data_size {size} exceeds the binary data sent"
                )
            inputs.append(tensor_from_buffer(name, datatype, shape, binary[offset : offset + size]))
            offset += size
        else:
            if "data" not in raw:
                raise errors.invalid(f"input '{name}': no 'data' and no binary_data_size")
            try:
                flat = from_json_values(raw["data"], datatype)
            except KeyError:
                raise errors.invalid(
                    f"input '{name}': unsupported datatype {errors.clip(str(datatype))!r}"
                ) from None
            except (ValueError, TypeError, OverflowError) as error:
                raise errors.invalid(f"input '{name}': bad data: {error}") from None
            inputs.append(tensor_from_flat(name, datatype, shape, flat))
    if offset != len(binary):
        raise errors.invalid(
            f"{len(binary) - offset} bytes of binary data are not claimed by any input"
        )
    binary_default = bool(parameters.get("binary_data_output", False))
    outputs = [
        RequestedOutput(
            o["name"], bool((o.get("parameters") or {}).get("binary_data", binary_default))
        )
        for o in document.get("outputs") or []
    ]
    timeout = parameters.get("timeout")
    if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
        raise errors.invalid(f"parameter 'timeout' must be a positive number of us: {timeout!r}")
    warmup = parameters.get(WARMUP_PARAMETER, False)
    if not isinstance(warmup, bool):
        raise errors.invalid(f"parameter '{WARMUP_PARAMETER}' must be a boolean: {warmup!r}")
    return InferRequest(
        model_name=model_name,
        model_version=version,
        id=str(document.get("id", "")),
        inputs=inputs,
        outputs=outputs,
        timeout_seconds=None if timeout is None else timeout / 1e6,
        binary_output=binary_default,
        parameters=parameters,
        warmup=warmup,
    )


def _invalid_json(error: orjson.JSONDecodeError) -> errors.InferError:
    """The 400 for a body orjson refused, worded for the client.

    JSON (RFC 8259) has no NaN or Infinity and orjson refuses them with a bare "unexpected
    character": the message names the constant instead. This is where Kiln differs from
    Triton, whose JSON layer (common ``triton_json.h``) parses with rapidjson's
    ``kParseNanAndInfFlag`` and writes with ``kWriteNanAndInfFlag``; Kiln keeps to strict JSON
    both ways, and such values travel as binary tensor data, bit for bit. orjson also stops at 1024
    levels of nesting, so a deeply nested body is refused before it costs anything.
    """
    if error.msg.startswith("depth limit"):
        return errors.invalid("request body is not valid JSON: nested too deeply")
    rest = error.doc[error.pos : error.pos + 8]
    for constant in ("NaN", "Infinity"):
        if rest.startswith(constant):
            name = f"-{constant}" if error.doc[error.pos - 1 : error.pos] == "-" else constant
            return errors.invalid(f"request body is not valid JSON: {name} is not a JSON number")
    return errors.invalid(f"request body is not valid JSON: {error}")


def _decompress(body: bytes, encoding: str, max_body: int) -> bytes:
    windows = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
    if encoding not in windows:
        raise errors.invalid(
            f"unsupported Content-Encoding {errors.clip(encoding)!r} (gzip or deflate)"
        )
    inflater = zlib.decompressobj(windows[encoding])
    try:
        data = inflater.decompress(body, max_body + 1)
    except zlib.error as error:
        raise errors.invalid(f"body is not valid {encoding}: {error}") from None
    if len(data) > max_body or inflater.unconsumed_tail:
        raise errors.invalid(f"decompressed request exceeds {max_body} bytes")
    return data


def encode_infer(response: InferResponse) -> HttpResponse:
    outputs = []
    buffers: list[bytes | memoryview] = []
    for tensor in response.outputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if response.binary.get(tensor.name, False):
            raw = memoryview(np.ascontiguousarray(tensor.data)).cast("B")  # type: ignore[arg-type]
            entry["parameters"] = {"binary_data_size": raw.nbytes}
            buffers.append(raw)
        else:
            try:
                entry["data"] = to_json_array(tensor.data, tensor.datatype)
            except ValueError:
                raise errors.invalid(
                    "an output holds NaN or Infinity, which JSON cannot carry; "
                    "ask for it as binary data (binary_data_output)"
                ) from None
        outputs.append(entry)
    document: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": outputs,
    }
    if response.id:
        document["id"] = response.id
    header = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    if not buffers:
        return HttpResponse(200, [header])
    return HttpResponse(
        200,
        [header, *buffers],
        content_type=b"application/octet-stream",
        extra_headers=((b"Inference-Header-Content-Length", str(len(header)).encode()),),
    )
