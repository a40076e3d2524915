"""The runtime's own HTTP/2 transport under grpcio's client: tensors of several frames and
several default (64 KiB) windows in both directions, many concurrent calls multiplexed on one
channel. (That the server keeps within the client's windows is shown in the unit tests, with
h2 as the client: grpcio's client announces windows these tensors do not exhaust.)"""

import concurrent.futures
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc

from .runtime_process import running

pytestmark = pytest.mark.integration

WIDTH = 65_536  # FP32 values per row: 256 KiB, four default windows


class Doubled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def write_model(directory: Path) -> Path:
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(Doubled(), (torch.zeros(2, WIDTH),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(directory / "model.pt"))
    config = {
        "model": {
            "format": "torch_export",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [WIDTH]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [WIDTH]}],
        },
        "batching": {"maxBatchSize": 8},
        "warmup": {"batchSizes": [1, 8]},
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_large_tensors_and_concurrent_calls_on_one_channel(tmp_path: Path) -> None:
    model = write_model(tmp_path)
    with running(model, tmp_path, name="doubled") as runtime:
        client = triton_grpc.InferenceServerClient(runtime.grpc_url)  # one channel for all

        def call(seed: int) -> bool:
            rows = 1 + seed % 3
            x = np.random.default_rng(seed).standard_normal((rows, WIDTH)).astype(np.float32)
            tensor = triton_grpc.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            result = client.infer("doubled", [tensor], client_timeout=60)
            return bool(np.array_equal(result.as_numpy("y"), 2 * x))

        assert call(0)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert all(pool.map(call, range(32)))
        assert client.is_server_ready()
