"""The decoding process (``protocol/decoding.py`` starts it): one request body in, its tensors
or its error out, until the runtime closes its end of the socket.

Apart from ``decoding`` so that the runtime's side of the exchange, which the data plane uses,
does not import the REST adapter (the adapters stay independent of each other).
"""

from __future__ import annotations

import pickle
import socket
import sys
import traceback
from typing import Any

import numpy as np

from kiln_runtime import errors
from kiln_runtime.protocol import rest
from kiln_runtime.protocol.decoding import LENGTH


def _read(sock: socket.socket, size: int) -> bytearray | None:
    buffer, done = bytearray(size), 0
    view = memoryview(buffer)
    while done < size:
        got = sock.recv_into(view[done:])
        if not got:
            return None
        done += got
    return buffer


def serve_decoding(sock: socket.socket) -> None:
    """The decoding process's loop: one body in, its tensors (or its error) out, until EOF."""
    while True:
        size = _read(sock, LENGTH)
        if size is None:
            return
        head = _read(sock, int.from_bytes(size, "big"))
        if head is None:
            return
        model_name, version, headers, max_body, length = pickle.loads(head)
        body = _read(sock, length)
        if body is None:
            return
        arrays: list[Any] = []
        try:
            request = rest.decode_infer(model_name, version, headers, bytes(body), max_body)
        except errors.InferError as error:
            answer: tuple[Any, ...] = ("error", error.kind.name, error.message)
        except Exception:  # a bug: logged here, answered INTERNAL as on the loop
            traceback.print_exc()
            answer = ("error", "INTERNAL", "internal error; see server log")
        else:
            arrays = [np.ascontiguousarray(t.data) for t in request.inputs]
            answer = (
                "ok", request.model_name, request.model_version, request.id,
                [(t.name, t.datatype, a.dtype.str, a.shape, a.nbytes)
                 for t, a in zip(request.inputs, arrays, strict=True)],
                [(o.name, o.binary) for o in request.outputs],
                request.timeout_seconds, request.binary_output, request.parameters, request.warmup,
            )  # fmt: skip
        del body
        encoded = pickle.dumps(answer)
        sock.sendall(len(encoded).to_bytes(LENGTH, "big") + encoded)
        for array in arrays:
            sock.sendall(memoryview(array).cast("B"))


if __name__ == "__main__":
    serve_decoding(socket.socket(fileno=int(sys.argv[1])))
