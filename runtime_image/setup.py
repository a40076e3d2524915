"""Builds kiln-runtime; with ``KILN_RUNTIME_COMPILE=1`` its request path is compiled by mypyc.

Why: on one core, what a call costs the server beyond the model's forward is this package's own
Python (the HTTP/2 transport, HPACK, gRPC and REST framing, the data plane, the batcher,
metrics); mypyc, the compiler mypy and black ship with, turns these type-annotated modules into
C extensions that run the same code several times faster (docs/runtime.md, "The compiled
request path", for the measurements). The image is built compiled (Dockerfile); ``make native``
compiles the working tree in place, and ``make test`` runs every tier on the compiled build,
with the runtime's unit tests also on the pure source (``make test-runtime-pure``). Without the
variable the package is pure Python, as the editable development install is.

What mypyc asks of the source, kept in these modules and checked by the tests on the compiled
build: no async generators (an async iterator class instead); no generic dataclasses; in one
function, one name per exception type in ``except ... as name`` (mypyc types the name by its
first binding, so a second clause with another type raises TypeError).

    KILN_RUNTIME_COMPILE=1 python setup.py build_ext --inplace   # make native
    KILN_RUNTIME_COMPILE=1 pip install --no-build-isolation .    # the image
"""

from __future__ import annotations

import os

from setuptools import setup

# The modules a request runs through; the rest (config, model loading, fetch) runs at start-up.
COMPILED = [
    "kiln_runtime/batch_policy.py",
    "kiln_runtime/batcher.py",
    "kiln_runtime/dataplane.py",
    "kiln_runtime/datatypes.py",
    "kiln_runtime/errors.py",
    "kiln_runtime/metrics.py",
    "kiln_runtime/protocol/grpc.py",
    "kiln_runtime/protocol/grpcserver.py",
    "kiln_runtime/protocol/hpack.py",
    "kiln_runtime/protocol/httpserver.py",
    "kiln_runtime/protocol/rest.py",
    "kiln_runtime/protocol/types.py",
    "kiln_runtime/response_cache.py",
    "kiln_runtime/protocol/http2/answering.py",
    "kiln_runtime/protocol/http2/budgets.py",
    "kiln_runtime/protocol/http2/connection.py",
    "kiln_runtime/protocol/http2/messages.py",
    "kiln_runtime/protocol/http2/receiving.py",
    "kiln_runtime/protocol/http2/settings.py",
    "kiln_runtime/protocol/http2/state.py",
    "kiln_runtime/protocol/http2/wire.py",
]
# The compiled modules share one library, ``kiln_runtime/_compiled__mypyc*.so``.
GROUP = "kiln_runtime._compiled"
# No config file, so a build in the image and one in the working tree type the same way
# (the project's strict mypy run checks these modules on every test run); modules without
# type information (tritonclient, protobuf's generated code) are typed as Any.
MYPY_FLAGS = ["--config-file=", "--python-version=3.11", "--ignore-missing-imports"]


def extensions() -> list[object]:
    if os.environ.get("KILN_RUNTIME_COMPILE") != "1":
        return []
    from mypyc.build import mypycify

    return list(mypycify([*MYPY_FLAGS, *COMPILED], opt_level="3", group_name=GROUP))


if __name__ == "__main__":  # as setuptools runs it; the tests import COMPILED
    setup(ext_modules=extensions())
