"""Process lifecycle: ready only after warm-up, drain on SIGTERM, refusal under overload."""

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from kiln_runtime.protocol import health

from .conftest import ModelFactory
from .runtime_process import running, start

pytestmark = pytest.mark.integration

TOKENS = np.random.default_rng(0).integers(0, 1000, (8, 64)).astype(np.int64)


def transformer_infer(url: str, rows: int = 8) -> str:
    """One request of ``rows`` sequences; returns 'ok' or the error status."""
    client = triton_http.InferenceServerClient(url, network_timeout=120)
    tensor = triton_http.InferInput("INPUT__0", [rows, 64], "INT64")
    tensor.set_data_from_numpy(TOKENS[:rows])
    try:
        result = client.infer("transformer", [tensor])
    except InferenceServerException as error:
        return str(error.status())
    assert result.as_numpy("OUTPUT__0").shape == (rows, 10)
    return "ok"


def test_sigterm_turns_ready_off_at_once_and_finishes_accepted_work(
    example_model: ModelFactory, tmp_path: Path
) -> None:
    model = example_model("transformer")
    runtime = start(model / "model.pt", tmp_path, config=model / "config.json", name="transformer")
    try:
        runtime.wait_for("/v2/health/ready", 200, seconds=60)
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(transformer_infer, runtime.http_url) for _ in range(12)]
            deadline = time.monotonic() + 30
            while 'kiln_inflight_requests{model="transformer"} 0.0' in runtime.metrics():
                assert time.monotonic() < deadline, "requests never arrived"
                time.sleep(0.01)
            runtime.process.send_signal(signal.SIGTERM)
            runtime.wait_for("/v2/health/ready", 503, seconds=2)
            assert runtime.status("/v2/health/live") == 200
            # gRPC health agrees: not ready (the readiness it reports), live (the probe's)
            assert runtime.grpc_health("") == health.NOT_SERVING
            assert runtime.grpc_health(health.LIVENESS) == health.SERVING
            outcomes = [f.result(timeout=120) for f in futures]
        assert outcomes == ["ok"] * 12
        assert runtime.process.wait(60) == 0
        assert "draining" in runtime.output()
    finally:
        if runtime.process.poll() is None:
            runtime.process.kill()
            runtime.process.wait(10)


def test_a_full_queue_refuses_with_429_and_resource_exhausted_then_recovers(
    example_model: ModelFactory, tmp_path: Path
) -> None:
    model = example_model("transformer", batching={"maxQueueSize": 2, "maxBatchSize": 8})
    with running(model, tmp_path, name="transformer") as runtime:
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            outcomes = list(pool.map(lambda _: transformer_infer(runtime.http_url), range(24)))
        assert "429" in outcomes and "ok" in outcomes
        assert set(outcomes) <= {"ok", "429"}

        client = triton_grpc.InferenceServerClient(runtime.grpc_url)

        def grpc_one(_: int) -> str:
            tensor = triton_grpc.InferInput("INPUT__0", [8, 64], "INT64")
            tensor.set_data_from_numpy(TOKENS)
            try:
                client.infer("transformer", [tensor])
            except InferenceServerException as error:
                return str(error.status())
            return "ok"

        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            outcomes = list(pool.map(grpc_one, range(24)))
        assert "StatusCode.RESOURCE_EXHAUSTED" in outcomes and "ok" in outcomes
        assert transformer_infer(runtime.http_url) == "ok"
        assert 'code="overloaded"' in runtime.metrics()


def test_ready_stays_false_until_warm_up_is_done(tmp_path: Path) -> None:
    module = torch.nn.Linear(16, 4).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(module, (torch.zeros(2, 16),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "model.pt2"))
    config = {
        "model": {
            "format": "torch_export",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [16]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [4]}],
        },
        "optimization": {"mode": "compile"},
        "warmup": {"batchSizes": [1, 2, 4, 8]},  # one compilation each: seconds of warm-up
    }
    runtime = start(
        tmp_path / "model.pt2", tmp_path, name="tiny",
        env={"KILN_RUNTIME_CONFIG": json.dumps(config)},
    )  # fmt: skip
    try:
        runtime.wait_for("/v2/health/live", 200, seconds=60)
        assert runtime.status("/v2/health/ready") == 503
        assert runtime.grpc_health("") == health.NOT_SERVING  # gRPC health agrees
        assert runtime.grpc_health("inference.GRPCInferenceService") == health.NOT_SERVING
        assert runtime.grpc_health(health.LIVENESS) == health.SERVING
        runtime.wait_for("/v2/health/ready", 200, seconds=240)
        assert runtime.grpc_health("") == health.SERVING
        warmup = [
            line for line in runtime.metrics().splitlines()
            if line.startswith("kiln_warmup_duration_seconds{")
        ]  # fmt: skip
        assert float(warmup[0].split()[-1]) > 0
        client = triton_http.InferenceServerClient(runtime.http_url)
        tensor = triton_http.InferInput("x", [3, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((3, 16), np.float32))
        assert client.infer("tiny", [tensor]).as_numpy("y").shape == (3, 4)
        assert runtime.terminate() == 0
    finally:
        if runtime.process.poll() is None:
            runtime.process.kill()
            runtime.process.wait(10)


def serve_and_wait(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    completed = subprocess.run(
        [sys.executable, "-m", "kiln_runtime", "serve", "--host", "127.0.0.1",
         "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *args],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip
    return completed.returncode, completed.stdout + completed.stderr


def test_a_bad_config_stops_start_up_with_the_field_named(
    example_model: ModelFactory, tmp_path: Path
) -> None:
    model = example_model("mlp")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": {"inputs": [], "outputs": []}}))
    code, output = serve_and_wait(
        ["--model-path", str(model / "model.pt"), "--model-name", "m", "--config", str(bad)],
        env={"KILN_RUNTIME_CONFIG": (model / "config.json").read_text()},  # --config wins
    )
    assert code == 2
    assert "model.inputs" in output
    code, output = serve_and_wait(["--model-path", str(model / "model.pt"), "--model-name", "m"])
    assert code == 2 and "KILN_RUNTIME_CONFIG" in output


def test_a_model_that_contradicts_its_config_exits_with_the_reason(
    example_model: ModelFactory, tmp_path: Path
) -> None:
    model = example_model("mlp")
    document = json.loads((model / "config.json").read_text())
    document["model"]["outputs"][0]["shape"] = [11]
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(document))
    code, output = serve_and_wait(
        ["--model-path", str(model), "--model-name", "m", "--config", str(wrong)]
    )
    assert code == 1
    assert "produced shape [10]" in output


def test_each_start_up_failure_leaves_its_cause_in_the_termination_log(
    example_model: ModelFactory, tmp_path: Path
) -> None:
    """What the kubelet copies into the container's terminated state, where the operator reads
    it for Ready: the runtime's own reason, one process per cause (three starts of torch)."""
    model = example_model("mlp")
    config = json.loads((model / "config.json").read_text())
    not_torchscript = tmp_path / "notes.pt"
    not_torchscript.write_text("this is not a TorchScript archive\n")
    as_onnx = {**config, "model": {**config["model"], "format": "onnx"}}
    cases = [
        (tmp_path / "missing" / "model.pt", config, "does not exist"),
        (not_torchscript, config, "cannot load torchscript program"),
        (model / "model.pt", as_onnx, "cannot load onnx model"),
    ]
    for number, (path, document, cause) in enumerate(cases):
        log = tmp_path / f"termination-{number}"
        code, output = serve_and_wait(
            ["--model-path", str(path), "--model-name", "m", "--termination-log", str(log)],
            env={"KILN_RUNTIME_CONFIG": json.dumps(document)},
        )
        assert code == 1, output
        message = log.read_text()
        assert message.startswith("model 'm' failed to start: ") and cause in message, message
        assert str(path) in message
    # a config the runtime refuses is written there too
    log = tmp_path / "termination-config"
    code, _ = serve_and_wait(
        ["--model-path", str(model), "--model-name", "m", "--termination-log", str(log)],
        env={"KILN_RUNTIME_CONFIG": json.dumps({"model": {"inputs": [], "outputs": []}})},
    )
    assert code == 2 and log.read_text().startswith("invalid runtime config: model.inputs")
