"""`serve` runs on uvloop's event loop unless told otherwise, or unless grpcio's server (which
runs on asyncio's own loop) serves gRPC. The hardening tests of the integration tier run the
default: uvloop; the unit tier's in-process servers run on asyncio's loop."""

import asyncio

import pytest
import uvloop

from kiln_runtime.__main__ import event_loop_factory


@pytest.mark.parametrize(
    ("choice", "transport", "uv"),
    [("auto", "kiln", True), ("auto", "grpcio", False), ("uvloop", "kiln", True),
     ("uvloop", "grpcio", True), ("asyncio", "kiln", False)],
)  # fmt: skip
def test_the_event_loop_is_uvloops_unless_told_or_grpcio_serves(
    choice: str, transport: str, uv: bool
) -> None:
    factory = event_loop_factory(choice, transport)
    with asyncio.Runner(loop_factory=factory) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, uvloop.Loop) is uv
