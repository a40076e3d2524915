"""Decide how a model will execute from its config and the hardware found. Pure.

Which device, which precision, whether INT8, CUDA graphs or pinned host buffers apply, and to
which batch sizes a batch is padded. Impossible combinations are a ``ConfigError`` at start-up;
GPU-only features asked for on a CPU-only host are switched off with a note (the logs and
``docs/runtime.md`` say so), because the same spec may be scheduled on either kind of node.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln_runtime.config import ConfigError, RuntimeConfig


@dataclass(frozen=True)
class ExecutionPlan:
    device: str  # "cpu" or "cuda"
    compute_dtype: str | None  # "float16" / "bfloat16": cast the model and floating inputs
    int8_dynamic: bool
    cuda_graphs: bool
    pinned_memory: bool
    pad_to_buckets: tuple[int, ...]  # padded batch sizes; empty means run every size as is
    notes: tuple[str, ...]


def plan_execution(config: RuntimeConfig, *, cuda_available: bool) -> ExecutionPlan:
    opt = config.optimization
    fmt = config.model.format
    notes: list[str] = []

    if opt.device == "cuda" and not cuda_available:
        raise ConfigError("optimization.device: 'cuda' requested but no CUDA device is visible")
    device = "cuda" if opt.device == "cuda" or (opt.device == "auto" and cuda_available) else "cpu"

    if fmt == "onnx":
        if opt.mode != "eager":
            raise ConfigError(
                f"optimization.mode: {opt.mode!r} applies to PyTorch formats; onnx runs as "
                "exported (use 'eager'; onnxruntime optimizes the graph itself)"
            )
        if opt.precision != "fp32":
            raise ConfigError(
                "optimization.precision: onnx models run in the precision they were exported in "
                "(use 'fp32' and export the model in the precision you want)"
            )
    if opt.mode == "compile" and fmt == "torchscript":
        raise ConfigError(
            "optimization.mode: 'compile' needs format 'torch_export' (torch.compile cannot "
            "compile TorchScript programs); use mode 'script' for TorchScript"
        )
    if opt.mode == "script" and fmt != "torchscript":
        raise ConfigError("optimization.mode: 'script' (freeze + optimize) needs 'torchscript'")

    compute_dtype: str | None = None
    int8 = False
    if opt.precision == "int8":
        if device != "cpu":
            raise ConfigError("optimization.precision: 'int8' (dynamic quantization) is CPU only")
        if fmt != "torchscript":
            raise ConfigError(
                "optimization.precision: 'int8' dynamic quantization needs format 'torchscript'"
            )
        int8 = True
    elif opt.precision in ("fp16", "bf16"):
        compute_dtype = "float16" if opt.precision == "fp16" else "bfloat16"
        if device == "cpu" and opt.precision == "fp16":
            notes.append("fp16 on CPU is emulated and usually slower than fp32; prefer bf16")

    cuda_graphs = opt.cuda_graphs and device == "cuda"
    if opt.cuda_graphs and not cuda_graphs:
        notes.append("cudaGraphs requested but the model runs on CPU: CUDA graphs are off")
    if cuda_graphs and fmt == "onnx":
        raise ConfigError("optimization.cudaGraphs: not available for onnx models")

    pad = cuda_graphs or opt.mode == "compile"
    return ExecutionPlan(
        device=device,
        compute_dtype=compute_dtype,
        int8_dynamic=int8,
        cuda_graphs=cuda_graphs,
        pinned_memory=device == "cuda",
        pad_to_buckets=config.warmup_batch_sizes() if pad else (),
        notes=tuple(notes),
    )


def padded_rows(rows: int, buckets: tuple[int, ...]) -> int:
    """The batch size ``rows`` runs at: the smallest bucket that holds it, else ``rows``.

    Compiled programs and captured CUDA graphs exist per batch size; padding to a warmed size
    keeps a real request from triggering a compilation or running without its graph.
    """
    for bucket in sorted(buckets):
        if bucket >= rows:
            return bucket
    return rows
