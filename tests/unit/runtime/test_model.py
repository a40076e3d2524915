"""Loading and running real programs: formats, optimization modes, I/O checked at load."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kiln_runtime.config import RuntimeConfig, parse_config
from kiln_runtime.examples import build, example_input, write_example
from kiln_runtime.model import ModelLoadError, ModelRunner


@pytest.fixture(scope="module")
def mlp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mlp")
    write_example("mlp", out, fmt="torch_export")
    write_example("mlp", out)  # last, so config.json says torchscript
    return out


def mlp_config(directory: Path, fmt: str = "torchscript", **optimization: Any) -> RuntimeConfig:
    document = json.loads((directory / "config.json").read_text())
    document["model"]["format"] = fmt
    document["optimization"] = {**document["optimization"], **optimization}
    return parse_config(document)


def reference(rows: int) -> tuple[np.ndarray, np.ndarray]:
    module, _ = build("mlp")
    x = example_input("mlp", rows)
    with torch.no_grad():
        return x.numpy(), module(x).numpy()


@pytest.mark.parametrize(
    ("fmt", "file", "optimization", "tolerance"),
    [
        ("torchscript", "model.pt", {}, 1e-5),
        ("torchscript", "model.pt", {"mode": "script"}, 1e-4),
        ("torchscript", "model.pt", {"precision": "int8"}, 0.05),
        ("torchscript", "model.pt", {"precision": "bf16"}, 0.05),
        ("torch_export", "model.pt2", {}, 1e-5),
    ],
)
def test_modes_compute_the_same_function(
    mlp_dir: Path, fmt: str, file: str, optimization: dict[str, Any], tolerance: float
) -> None:
    runner = ModelRunner(mlp_config(mlp_dir, fmt, **optimization), mlp_dir / file)
    x, expected = reference(5)
    (y,) = runner.forward([x])
    assert y.dtype == np.float32 and y.shape == (5, 10)
    np.testing.assert_allclose(y, expected, atol=tolerance, rtol=tolerance)


def test_int8_really_quantizes(mlp_dir: Path) -> None:
    fp32 = ModelRunner(mlp_config(mlp_dir), mlp_dir / "model.pt")
    int8 = ModelRunner(mlp_config(mlp_dir, precision="int8"), mlp_dir / "model.pt")
    x, _ = reference(4)
    assert not np.array_equal(fp32.forward([x])[0], int8.forward([x])[0])
    assert int8.plan.int8_dynamic


def test_warm_up_runs_each_size(mlp_dir: Path) -> None:
    runner = ModelRunner(mlp_config(mlp_dir), mlp_dir / "model.pt")
    seen: list[int] = []
    forward = runner.forward

    def counting(inputs: list[np.ndarray]) -> list[np.ndarray]:
        seen.append(inputs[0].shape[0])
        return forward(inputs)

    runner.forward = counting  # type: ignore[method-assign]
    assert runner.warm_up((1, 8), repeats=2) >= 0
    assert seen == [1, 1, 8, 8]


def test_compile_pads_to_a_warm_size_and_slices_back(tmp_path: Path) -> None:
    module = torch.nn.Linear(4, 2).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(module, (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "model.pt2"))
    config = parse_config(
        {
            "model": {
                "name": "tiny", "format": "torch_export",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
            },
            "optimization": {"mode": "compile"},
            "warmup": {"batchSizes": [4]},
        }
    )  # fmt: skip
    runner = ModelRunner(config, tmp_path / "model.pt2")
    assert runner.plan.pad_to_buckets == (4,)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    (y,) = runner.forward([x])
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, expected, atol=1e-5)


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example MLP exported to ONNX (model.onnx), once for the module."""
    out = tmp_path_factory.mktemp("onnx")
    module, _ = build("mlp")
    x = example_input("mlp", 2)
    torch.onnx.export(
        module, (x,), str(out / "model.onnx"), input_names=["INPUT__0"],
        output_names=["OUTPUT__0"], dynamic_axes={"INPUT__0": {0: "b"}, "OUTPUT__0": {0: "b"}},
        dynamo=False,
    )  # fmt: skip
    return out


def test_onnx_models_run_through_onnxruntime(onnx_dir: Path, mlp_dir: Path) -> None:
    tmp_path = onnx_dir
    runner = ModelRunner(mlp_config(mlp_dir, "onnx"), tmp_path / "model.onnx")
    xs, expected = reference(3)
    np.testing.assert_allclose(runner.forward([xs])[0], expected, atol=1e-4)
    bad = json.loads((mlp_dir / "config.json").read_text())
    bad["model"]["format"] = "onnx"
    bad["model"]["inputs"][0]["name"] = "WRONG"
    with pytest.raises(ModelLoadError, match="WRONG"):
        ModelRunner(parse_config(bad), tmp_path / "model.onnx")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["model"]["outputs"][0].update(shape=[11]), r"produced shape \[10\]"),
        (lambda d: d["model"]["outputs"][0].update(datatype="INT64"), "produced torch.float32"),
        (lambda d: d["model"]["inputs"][0].update(shape=[7]), "failed on a batch"),
        (lambda d: d["model"]["outputs"].append(
            {"name": "EXTRA", "datatype": "FP32", "shape": [1]}), "returned 1 outputs"),
    ],
)  # fmt: skip
def test_a_model_that_does_not_match_its_config_fails_at_load(
    mlp_dir: Path, change: Any, message: str
) -> None:
    document = json.loads((mlp_dir / "config.json").read_text())
    change(document)
    with pytest.raises(ModelLoadError, match=message):
        ModelRunner(parse_config(document), mlp_dir / "model.pt")


def test_missing_or_corrupt_files_fail_at_load(mlp_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        ModelRunner(mlp_config(mlp_dir), tmp_path / "absent.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match="cannot load torchscript"):
        ModelRunner(mlp_config(mlp_dir), corrupt)


def test_a_gpu_services_onnx_model_never_runs_on_the_cpu(onnx_dir: Path, mlp_dir: Path) -> None:
    """The image's onnxruntime is CPU-only: a plan for the GPU (what the operator asks of a
    GPU service) stops the load, naming the providers, instead of computing on the CPU."""
    from kiln_runtime.execution_plan import plan_execution
    from kiln_runtime.model import _load_onnx, check_onnx_providers

    tmp_path = onnx_dir
    config = mlp_config(mlp_dir, "onnx", device="cuda")
    plan = plan_execution(config, cuda_available=True)  # as on a node with a GPU
    with pytest.raises(ModelLoadError, match="GPU service's onnx model would run on the CPU"):
        _load_onnx(tmp_path / "model.onnx", config, plan)
    # the session's own list is judged too (a CUDA provider offered that does not load)
    with pytest.raises(ModelLoadError, match=r"session has \['CPUExecutionProvider'\]"):
        check_onnx_providers("cuda", "session has", ["CPUExecutionProvider"])
    check_onnx_providers("cuda", "session has", ["CUDAExecutionProvider", "CPUExecutionProvider"])
    check_onnx_providers("cpu", "session has", ["CPUExecutionProvider"])
