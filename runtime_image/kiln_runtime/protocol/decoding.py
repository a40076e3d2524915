"""Large and compressed request bodies are decoded in a process of their own, off the event loop.

Why a process and not a thread: orjson's parser, numpy's conversion of a list of numbers and
the objects they create hold the GIL for the whole body (a 38 MB JSON body: 0.33 s in
``orjson.loads`` and 0.15 s in ``np.asarray``, during which a thread beside them got no turn),
so a worker thread stalls the event loop, and every other client and the kubelet's probes with
it, as long as decoding on the loop does. A process has its own GIL.

Why not ``concurrent.futures.ProcessPoolExecutor``: it pickles the body and unpickles the
tensors while holding the GIL, copies of tens of MB that stalled the loop for 100-300 ms on a
loaded host. Here the body goes over a Unix socket as it is and the tensors come back as raw
bytes received straight into their arrays: every copy happens inside a send or receive call,
which releases the GIL, a socket buffer at a time, between which the loop serves others. Only
a few hundred bytes of description (names, shapes, dtypes) are pickled.

The process (``python -m kiln_runtime.protocol.decoding_child FD``: numpy and orjson, no torch) is
started on the first body that needs it and kept for the next; it decodes one body at a time,
the others waiting their turn off the loop. If it dies (killed for memory), or a request is
cancelled in mid-exchange, it is stopped; that request fails with UNAVAILABLE and the next one
starts a new process. It exits when the runtime's end of its socket closes.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import subprocess
import sys
from typing import Any

import numpy as np

from kiln_runtime import errors
from kiln_runtime.protocol.types import InferRequest, RequestedOutput, Tensor

LENGTH = 8  # bytes of the big-endian length before each pickled description
CHILD = "kiln_runtime.protocol.decoding_child"  # the decoding process's module


class DecodingProcess:
    """The runtime's side: one decoding process, started when first needed."""

    def __init__(self) -> None:
        self._child: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._turn: asyncio.Lock | None = None

    async def decode(
        self, model_name: str, version: str, headers: dict[str, str], body: bytes, max_body: int
    ) -> InferRequest:
        if self._turn is None:
            self._turn = asyncio.Lock()
        async with self._turn:
            sock = self._started()
            try:
                return await _exchange(sock, (model_name, version, headers, max_body), body)
            except errors.InferError:
                raise
            except OSError:
                self.close()  # the next body starts a new process
                raise errors.InferError(
                    errors.ErrorKind.UNAVAILABLE,
                    "the process decoding large request bodies ended (out of memory?); retry",
                ) from None
            except BaseException:  # cancelled in mid-exchange: the stream is out of step
                self.close()
                raise

    def _started(self) -> socket.socket:
        if self._socket is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            command = [sys.executable, "-m", CHILD, str(theirs.fileno())]
            # the modules the runtime runs (a test's or a tool's path included), not others
            path = os.pathsep.join(entry for entry in sys.path if entry)
            self._child = subprocess.Popen(
                command, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": path},
            )  # fmt: skip
            theirs.close()
            ours.setblocking(False)
            self._socket = ours
        return self._socket

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._child is not None:
            self._child.kill()
            self._child.wait(timeout=5)
            self._child = None


async def _exchange(sock: socket.socket, description: tuple[Any, ...], body: bytes) -> InferRequest:
    loop = asyncio.get_running_loop()
    head = pickle.dumps((*description, len(body)))
    await loop.sock_sendall(sock, len(head).to_bytes(LENGTH, "big") + head)
    await loop.sock_sendall(sock, memoryview(body))
    size = int.from_bytes(await _received(sock, bytearray(LENGTH)), "big")
    answer = pickle.loads(await _received(sock, bytearray(size)))
    if answer[0] == "error":
        raise errors.InferError(errors.ErrorKind[answer[1]], answer[2])
    (_, name, version, request_id, inputs, outputs, timeout, binary_output, parameters, warmup) = (
        answer
    )
    tensors = []
    for tensor_name, datatype, dtype, shape, nbytes in inputs:
        raw = np.empty(nbytes, dtype=np.uint8)
        await _received(sock, memoryview(raw))  # type: ignore[arg-type]
        tensors.append(Tensor(tensor_name, datatype, raw.view(np.dtype(dtype)).reshape(shape)))
    return InferRequest(
        name,
        tensors,
        model_version=version,
        id=request_id,
        outputs=[RequestedOutput(n, binary) for n, binary in outputs],
        timeout_seconds=timeout,
        binary_output=binary_output,
        parameters=parameters,
        warmup=warmup,
    )


async def _received(sock: socket.socket, into: bytearray | memoryview) -> bytearray | memoryview:
    loop = asyncio.get_running_loop()
    view, done = memoryview(into), 0
    while done < len(view):
        got = await loop.sock_recv_into(sock, view[done:])
        if not got:
            raise ConnectionResetError("the decoding process closed its socket")
        done += got
    return into
