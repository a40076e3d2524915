"""The REST JSON path's codec alone: microseconds to decode an infer body and encode an answer.

Exists to choose (and re-check) the JSON library of ``kiln_runtime.protocol.rest`` on numbers
rather than reputation. Each variant turns the same request body into numpy tensors and the
same output tensor into response bytes; variants run interleaved, repetition by repetition, so
load from other processes on a shared machine disturbs them alike. Reported: the median (and
the spread) of the per-call time over the repetitions.

Shapes: the example MLP (FP32 [N, 512] in, FP32 [N, 10] out, N = 1 and 8) and a
transformer-like INT64 [1, 128] input. Bodies are written as ``tritonclient.http`` writes them
(``binary_data=False``): flat lists, each FP32 as the shortest text of its double value.

Variants:
- ``stdlib``: the standard library's ``json`` with values through Python lists (the codec
  before orjson), kept here as the baseline;
- ``kiln``: the runtime's ``decode_infer`` / ``encode_infer`` (orjson; the whole request
  decode, envelope and checks included, so it is charged for more than the others);
- ``orjson-f32`` (encode): orjson writing float32 directly, shorter text than Triton's
  (0.1 rather than 0.10000000149011612): what keeping Triton's formatting costs;
- ``msgspec-raw`` (decode, when ``msgspec`` is importable; not a runtime dependency): the
  envelope into typed Structs with ``data`` as ``msgspec.Raw``, the numbers parsed by numpy's
  text reader in C, no Python float per element.

    cd runtime_image && python -m bench.json_codec [--repeat 9] [--seconds 0.05]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from kiln_runtime.datatypes import numpy_carrier
from kiln_runtime.protocol.rest import decode_infer, encode_infer
from kiln_runtime.protocol.types import InferResponse, Tensor

LIMIT = 64 << 20
SHAPES: list[tuple[str, str, tuple[int, ...], tuple[int, ...] | None]] = [
    # label, input datatype, input shape, FP32 output shape (None: decode only)
    ("MLP N=1", "FP32", (1, 512), (1, 10)),
    ("MLP N=8", "FP32", (8, 512), (8, 10)),
    ("transformer INT64 [1,128]", "INT64", (1, 128), None),
]


def stdlib_decode(body: bytes) -> list[npt.NDArray[Any]]:
    """The codec before orjson: ``json.loads``, then numpy from the Python lists."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    document = json.loads(body, parse_constant=refuse)
    tensors = []
    for raw in document["inputs"]:
        flat = np.asarray(raw["data"]).reshape(-1)
        if flat.dtype.kind not in "biuf":
            raise ValueError("data must be numbers")
        tensors.append(flat.astype(numpy_carrier(raw["datatype"])).reshape(raw["shape"]))
    return tensors


def stdlib_encode(response: InferResponse) -> bytes:
    """The codec before orjson: ``tolist()`` and ``json.dumps``."""
    outputs = [
        {
            "name": t.name,
            "datatype": t.datatype,
            "shape": list(t.shape),
            "data": t.data.reshape(-1).tolist(),
        }
        for t in response.outputs
    ]
    document = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": outputs,
    }
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


def kiln_decode(body: bytes) -> list[npt.NDArray[Any]]:
    return [t.data for t in decode_infer("mlp", "", {}, body, LIMIT).inputs]


def kiln_encode(response: InferResponse) -> bytes:
    return bytes(encode_infer(response).body[0])


def orjson_f32_encode(response: InferResponse) -> bytes:
    outputs = []
    for t in response.outputs:
        flat = np.ascontiguousarray(t.data.reshape(-1))
        if not np.isfinite(flat).all():
            raise ValueError("NaN or Infinity")
        outputs.append(
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape), "data": flat}
        )
    document = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": outputs,
    }
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)


def msgspec_raw_decoder() -> Callable[[bytes], list[npt.NDArray[Any]]]:
    import msgspec

    # defstruct: this module's postponed annotations cannot name classes local to a function
    fields = [("name", str), ("datatype", str), ("shape", list[int]), ("data", msgspec.Raw)]
    request = msgspec.defstruct("Request", [("inputs", list[msgspec.defstruct("Input", fields)])])
    decoder = msgspec.json.Decoder(request)
    number_text = b"0123456789-+.eE \t\r\n,"

    def decode(body: bytes) -> list[npt.NDArray[Any]]:
        tensors = []
        for raw in decoder.decode(body).inputs:
            text = bytes(raw.data).translate(None, b"[]")
            if text.translate(None, number_text):
                raise ValueError("data must be JSON numbers")  # NaN, Infinity, true, strings
            carrier = numpy_carrier(raw.datatype)
            parsed = np.fromstring(text, dtype=np.float64, sep=",")  # exact for these INT64s
            tensors.append(parsed.astype(carrier).reshape(raw.shape))
        return tensors

    return decode


def request_body(datatype: str, shape: tuple[int, ...], rng: np.random.Generator) -> bytes:
    if datatype == "FP32":
        values: npt.NDArray[Any] = rng.standard_normal(shape).astype(np.float32)
    else:
        values = rng.integers(0, 32000, shape, dtype=np.int64)
    tensor = {"name": "x", "datatype": datatype, "shape": list(shape)}
    document = {"inputs": [{**tensor, "data": values.reshape(-1).tolist()}]}
    return json.dumps(document, separators=(",", ":")).encode()


def time_interleaved(
    variants: dict[str, Callable[[], object]], repeat: int, seconds: float
) -> dict[str, list[float]]:
    """Per-call microseconds of each variant, ``repeat`` rounds, variants alternating."""
    loops = {}
    for name, call in variants.items():
        call()
        started, count = time.perf_counter(), 0
        while time.perf_counter() - started < seconds:
            call()
            count += 1
        loops[name] = max(count, 1)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeat):
        for name, call in variants.items():
            started = time.perf_counter()
            for _ in range(loops[name]):
                call()
            samples[name].append((time.perf_counter() - started) / loops[name] * 1e6)
    return samples


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.0f}-{max(values):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=9, help="rounds of every variant")
    parser.add_argument("--seconds", type=float, default=0.05, help="time per variant and round")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    decoders: dict[str, Callable[[bytes], list[npt.NDArray[Any]]]] = {
        "stdlib": stdlib_decode,
        "kiln": kiln_decode,
    }
    if importlib.util.find_spec("msgspec") is not None:
        decoders["msgspec-raw"] = msgspec_raw_decoder()
    encoders: dict[str, Callable[[InferResponse], bytes]] = {
        "stdlib": stdlib_encode,
        "kiln": kiln_encode,
        "orjson-f32": orjson_f32_encode,
    }
    decode_rows, encode_rows = [], []
    for label, datatype, shape, out_shape in SHAPES:
        body = request_body(datatype, shape, rng)
        expected = stdlib_decode(body)[0]
        for decode in decoders.values():
            np.testing.assert_array_equal(decode(body)[0], expected)
        times = time_interleaved(
            {name: (lambda d=decode, b=body: d(b)) for name, decode in decoders.items()},
            args.repeat,
            args.seconds,
        )
        decode_rows.append(row(f"{label} ({len(body)} B)", times, list(decoders)))
        if out_shape is None:
            continue
        output = rng.standard_normal(out_shape).astype(np.float32)
        response = InferResponse("mlp", "1", "", [Tensor("y", "FP32", output)], {"y": False})
        assert json.loads(kiln_encode(response)) == json.loads(stdlib_encode(response))
        times = time_interleaved(
            {name: (lambda e=encode, r=response: e(r)) for name, encode in encoders.items()},
            args.repeat,
            args.seconds,
        )
        output_label = f"FP32 {list(out_shape)} ({len(kiln_encode(response))} B)"
        encode_rows.append(row(output_label, times, list(encoders)))
    for step, names, rows in (("decode", decoders, decode_rows), ("encode", encoders, encode_rows)):
        print(f"\n{step}, µs per call: median (min-max) of {args.repeat} rounds\n")
        print("| shape | " + " | ".join(names) + " | stdlib / kiln |")
        print("|---|" + "---|" * (len(names) + 1))
        print("\n".join(rows))


def row(label: str, times: dict[str, list[float]], names: list[str]) -> str:
    speedup = statistics.median(times["stdlib"]) / statistics.median(times["kiln"])
    cells = " | ".join(cell(times[name]) for name in names)
    return f"| {label} | {cells} | {speedup:.1f}x |"


if __name__ == "__main__":
    main()
