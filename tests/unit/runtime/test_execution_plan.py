"""How a model runs: GPU-only features are guarded, impossible combinations refused."""

from typing import Any

import pytest

from kiln_runtime.config import ConfigError, RuntimeConfig, parse_config
from kiln_runtime.execution_plan import padded_rows, plan_execution


def config(fmt: str = "torchscript", **optimization: Any) -> RuntimeConfig:
    return parse_config(
        {
            "model": {
                "name": "m", "format": fmt,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
            },
            "optimization": optimization,
            "warmup": {"batchSizes": [1, 8, 32]},
        }
    )  # fmt: skip


def test_auto_picks_cuda_only_when_present() -> None:
    assert plan_execution(config(), cuda_available=False).device == "cpu"
    gpu = plan_execution(config(), cuda_available=True)
    assert gpu.device == "cuda"
    assert gpu.pinned_memory
    assert not plan_execution(config(device="cpu"), cuda_available=True).pinned_memory


def test_cuda_demanded_without_a_gpu_is_refused() -> None:
    with pytest.raises(ConfigError, match="no CUDA device"):
        plan_execution(config(device="cuda"), cuda_available=False)


def test_cuda_graphs_are_off_with_a_note_on_cpu_and_pad_to_warm_sizes_on_gpu() -> None:
    cpu = plan_execution(config(cudaGraphs=True), cuda_available=False)
    assert not cpu.cuda_graphs
    assert cpu.pad_to_buckets == ()
    assert any("CUDA graphs are off" in note for note in cpu.notes)
    gpu = plan_execution(config(cudaGraphs=True), cuda_available=True)
    assert gpu.cuda_graphs
    assert gpu.pad_to_buckets == (1, 8, 32)


def test_precisions() -> None:
    assert plan_execution(config(precision="bf16"), cuda_available=False).compute_dtype == (
        "bfloat16"
    )
    fp16_cpu = plan_execution(config(precision="fp16"), cuda_available=False)
    assert fp16_cpu.compute_dtype == "float16"
    assert fp16_cpu.notes
    assert plan_execution(config(precision="int8"), cuda_available=False).int8_dynamic
    with pytest.raises(ConfigError, match="CPU only"):
        plan_execution(config(precision="int8"), cuda_available=True)
    with pytest.raises(ConfigError, match="torchscript"):
        plan_execution(config("torch_export", precision="int8"), cuda_available=False)


def test_modes_need_their_format() -> None:
    with pytest.raises(ConfigError, match="torch_export"):
        plan_execution(config(mode="compile"), cuda_available=False)
    with pytest.raises(ConfigError, match="torchscript"):
        plan_execution(config("torch_export", mode="script"), cuda_available=False)
    with pytest.raises(ConfigError, match="onnx"):
        plan_execution(config("onnx", mode="script"), cuda_available=False)
    with pytest.raises(ConfigError, match="precision"):
        plan_execution(config("onnx", precision="bf16"), cuda_available=False)
    compiled = plan_execution(config("torch_export", mode="compile"), cuda_available=False)
    assert compiled.pad_to_buckets == (1, 8, 32)


def test_padding_goes_to_the_smallest_warm_size_that_holds_the_batch() -> None:
    assert padded_rows(1, (1, 8, 32)) == 1
    assert padded_rows(5, (1, 8, 32)) == 8
    assert padded_rows(32, (1, 8, 32)) == 32
    assert padded_rows(40, (1, 8, 32)) == 40
    assert padded_rows(5, ()) == 5
