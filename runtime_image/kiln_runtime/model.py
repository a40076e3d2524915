"""Load a model program from a local path and run batches on it.

The only module that touches torch or onnxruntime. ``ModelRunner.forward`` takes one numpy
array per declared input (batch dimension first) and returns one per declared output; it is
called from the model's single worker thread. Inputs and outputs are checked against the
config when the model loads, so a mismatch stops start-up instead of failing requests.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch

from kiln_runtime.config import ConfigError, RuntimeConfig, TensorSpec
from kiln_runtime.datatypes import numpy_carrier
from kiln_runtime.execution_plan import ExecutionPlan, padded_rows, plan_execution
from kiln_runtime.staging import StagingPool

log = logging.getLogger(__name__)

# Requests arrive as read-only views of the received bytes and torch warns on wrapping them;
# models must not write to their inputs, and the runtime never reuses those buffers.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "INT8": torch.int8,
    "INT16": torch.int16,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "FP16": torch.float16,
    "BF16": torch.bfloat16,
    "FP32": torch.float32,
    "FP64": torch.float64,
}

Arrays = list[npt.NDArray[Any]]


class ModelLoadError(RuntimeError):
    """The model file cannot be loaded or does not match its declared inputs and outputs."""


def example_batch(specs: Sequence[TensorSpec], rows: int) -> Arrays:
    """Zero-filled inputs of ``rows`` rows (variable dimensions take size 1)."""
    arrays = []
    for spec in specs:
        dims = [rows, *(1 if d == -1 else d for d in spec.shape)]
        arrays.append(np.zeros(dims, dtype=numpy_carrier(spec.datatype)))
    return arrays


class ModelRunner:
    """A loaded, optimized model that runs batches of numpy arrays."""

    def __init__(self, config: RuntimeConfig, model_path: Path) -> None:
        self.config = config
        self.plan = plan_execution(config, cuda_available=torch.cuda.is_available())
        for note in self.plan.notes:
            log.warning("%s", note)
        self._device = torch.device(self.plan.device)
        self._on_cpu = self._device.type == "cpu"  # numpy-backed tensors need no move
        self._compute_dtype = (
            getattr(torch, self.plan.compute_dtype) if self.plan.compute_dtype else None
        )
        self._call: Callable[[Arrays], Arrays]
        path = Path(model_path)
        if not path.exists():
            raise ModelLoadError(f"model path {str(path)!r} does not exist")
        fmt = config.model.format
        if fmt == "onnx":
            self._call = _load_onnx(path, config, self.plan)
        else:
            module = self._load_torch(path)
            self._module = module
            self._call = self._torch_call
        self._staging: StagingPool[torch.Tensor] = StagingPool(_pinned_buffer)
        self._graphs: _CudaGraphs | None = None
        if self.plan.cuda_graphs:
            self._graphs = _CudaGraphs(self._module, config.model.inputs, self._device)
        self.check_io()

    # ---------------------------------------------------------------- loading

    def _load_torch(self, path: Path) -> Callable[..., Any]:
        opt = self.config.optimization
        with warnings.catch_warnings():
            # torch marks TorchScript deprecated; it remains the format most models ship in.
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                if self.config.model.format == "torchscript":
                    module: Any = torch.jit.load(  # type: ignore[no-untyped-call]
                        str(path), map_location=self._device
                    )
                else:
                    module = torch.export.load(str(path)).module().to(self._device)
            except Exception as error:
                raise ModelLoadError(
                    f"cannot load {self.config.model.format} program from {str(path)!r}: {error}"
                ) from error
            if self.config.model.format == "torchscript":
                module.eval()  # exported programs are already in inference form
            if self._compute_dtype is not None:
                module = module.to(self._compute_dtype)
            if self.plan.int8_dynamic:
                from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic_jit

                module = quantize_dynamic_jit(  # type: ignore[no-untyped-call]
                    module, {"": default_dynamic_qconfig}
                )
            if opt.mode == "script":
                module = torch.jit.optimize_for_inference(torch.jit.freeze(module))
            elif opt.mode == "compile":
                module = torch.compile(module, dynamic=False)
        return module  # type: ignore[no-any-return]

    @property
    def computes_on_cpu(self) -> bool:
        """Whether batches compute on the server's own CPUs (not on a GPU)."""
        return self.plan.device == "cpu"

    def check_io(self) -> None:
        """Run one row and compare what comes out with the declared outputs."""
        try:
            outputs = self.forward(example_batch(self.config.model.inputs, 1))
        except (ConfigError, ModelLoadError):
            raise
        except Exception as error:
            raise ModelLoadError(
                f"model failed on a batch shaped as the declared inputs "
                f"{[(s.name, s.datatype, [-1, *s.shape]) for s in self.config.model.inputs]}: "
                f"{error}"
            ) from error
        for spec, array in zip(self.config.model.outputs, outputs, strict=True):
            declared = (1, *spec.shape)
            if len(array.shape) != len(declared) or any(
                d not in (-1, a) for d, a in zip(declared, array.shape, strict=True)
            ):
                raise ModelLoadError(
                    f"output '{spec.name}': the model produced shape {list(array.shape[1:])} "
                    f"per row, the config declares {list(spec.shape)}"
                )

    # ---------------------------------------------------------------- running

    def forward(self, inputs: Arrays) -> Arrays:
        """Run one batch; every array's first dimension is the batch."""
        return self._call(inputs)

    def warm_up(self, batch_sizes: Sequence[int], repeats: int = 2) -> float:
        """Run every warm-up size ``repeats`` times, compiling or capturing on first use.

        Returns the seconds spent. Blocks: call it from the model's worker thread.
        """
        started = time.perf_counter()
        for rows in batch_sizes:
            if self._graphs is not None:
                self._graphs.capture(rows, self._compute_dtype)
            batch = example_batch(self.config.model.inputs, rows)
            for _ in range(repeats):
                self.forward(batch)
        return time.perf_counter() - started

    def _torch_call(self, inputs: Arrays) -> Arrays:
        rows = inputs[0].shape[0]
        run_rows = padded_rows(rows, self.plan.pad_to_buckets) if self.plan.pad_to_buckets else rows
        with torch.inference_mode():
            tensors = [
                self._to_device(array, spec, run_rows)
                for array, spec in zip(inputs, self.config.model.inputs, strict=True)
            ]
            if self._graphs is not None and run_rows in self._graphs.sizes:
                raw = self._graphs.replay(tensors)
            else:
                raw = self._module(*tensors)
            return self._to_numpy(raw, rows)

    def _to_device(self, array: npt.NDArray[Any], spec: TensorSpec, run_rows: int) -> torch.Tensor:
        if spec.datatype == "BF16":
            tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
        rows = tensor.shape[0]
        if run_rows > rows:
            padding = tensor.new_zeros((run_rows - rows, *tensor.shape[1:]))
            tensor = torch.cat((tensor, padding))
        if self.plan.pinned_memory:
            tensor = self._upload_pinned(tensor)
        elif not self._on_cpu:  # from numpy: on the CPU
            tensor = tensor.to(self._device, non_blocking=True)
        if self._compute_dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(self._compute_dtype)
        return tensor

    def _upload_pinned(self, tensor: torch.Tensor) -> torch.Tensor:
        """Upload through a page-locked buffer (asynchronous DMA); the buffer goes back to the
        pool with the copy's event, so no later batch overwrites it while the copy reads it."""
        slot = self._staging.acquire((tensor.dtype, tensor.numel()))
        staged = slot.buffer.view(tensor.shape)
        staged.copy_(tensor)
        uploaded = staged.to(self._device, non_blocking=True)
        copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
        copied.record()
        self._staging.release(slot, copied)
        return uploaded

    def _to_numpy(self, raw: Any, rows: int) -> Arrays:
        specs = self.config.model.outputs
        if isinstance(raw, torch.Tensor):
            produced = [raw]
        elif isinstance(raw, dict):
            missing = [s.name for s in specs if s.name not in raw]
            if missing:
                raise ModelLoadError(f"model output dict lacks {missing}")
            produced = [raw[s.name] for s in specs]
        elif isinstance(raw, list | tuple):
            produced = list(raw)
        else:
            raise ModelLoadError(f"model returned {type(raw).__name__}, expected tensors")
        if len(produced) != len(specs):
            raise ModelLoadError(
                f"model returned {len(produced)} outputs, the config declares {len(specs)}"
            )
        arrays = []
        for spec, tensor in zip(specs, produced, strict=True):
            # rows beyond the request's are padding (a warmed batch size); slicing costs
            # more than it looks, so only when there are some
            kept = tensor if tensor.shape[0] == rows else tensor[:rows]
            arrays.append(_tensor_to_numpy(kept, spec))
        return arrays


def _tensor_to_numpy(tensor: torch.Tensor, spec: TensorSpec) -> npt.NDArray[Any]:
    want = _TORCH_DTYPES[spec.datatype]
    if tensor.dtype != want:
        if not (tensor.is_floating_point() and want.is_floating_point):
            raise ModelLoadError(
                f"output '{spec.name}': the model produced {tensor.dtype}, the config declares "
                f"{spec.datatype}"
            )
        tensor = tensor.to(want)
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if spec.datatype == "BF16":
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def _pinned_buffer(key: Hashable) -> torch.Tensor:
    dtype, numel = cast(tuple[torch.dtype, int], key)
    return torch.empty(numel, dtype=dtype, pin_memory=True)


class _CudaGraphs:
    """Captured CUDA graphs, one per warmed batch size, replayed on static device buffers.

    GPU only: constructed when the plan enables CUDA graphs, which needs a CUDA device. Not
    exercised on CPU hosts (see docs/runtime.md, "unverified on this hardware").
    """

    def __init__(
        self, module: Callable[..., Any], inputs: Sequence[TensorSpec], device: torch.device
    ) -> None:
        self._module = module
        self._specs = inputs
        self._device = device
        self._graphs: dict[int, tuple[Any, list[torch.Tensor], Any]] = {}

    @property
    def sizes(self) -> set[int]:
        return set(self._graphs)

    def capture(self, rows: int, dtype: torch.dtype | None) -> None:
        static = []
        for spec in self._specs:
            dims = [rows, *(1 if d == -1 else d for d in spec.shape)]
            want = _TORCH_DTYPES[spec.datatype]
            if dtype is not None and want.is_floating_point:
                want = dtype
            static.append(torch.zeros(dims, dtype=want, device=self._device))
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(3):  # settle lazy initialization before capture
                self._module(*static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.inference_mode():
            output = self._module(*static)
        self._graphs[rows] = (graph, static, output)

    def replay(self, tensors: list[torch.Tensor]) -> Any:
        graph, static, output = self._graphs[tensors[0].shape[0]]
        for buffer, tensor in zip(static, tensors, strict=True):
            buffer.copy_(tensor, non_blocking=True)
        graph.replay()
        return output


CUDA_PROVIDER = "CUDAExecutionProvider"


def check_onnx_providers(device: str, where: str, providers: Sequence[str]) -> None:
    """Refuse to serve a GPU service's ONNX model on the CPU: the service asked for (and holds)
    a GPU, so a model quietly computing on the CPU would be slow and unnoticed. ``where`` says
    whose list ``providers`` is ("offers": the installed onnxruntime's, "session has": the ones
    the session loaded)."""
    if device == "cuda" and CUDA_PROVIDER not in providers:
        raise ModelLoadError(
            f"the GPU service's onnx model would run on the CPU: onnxruntime {where} "
            f"{list(providers)}, without {CUDA_PROVIDER} (use a runtime image with "
            "onnxruntime-gpu and the CUDA libraries it needs, or set resources.gpuCount to 0)"
        )


def _load_onnx(
    path: Path, config: RuntimeConfig, plan: ExecutionPlan
) -> Callable[[Arrays], Arrays]:
    try:
        import onnxruntime as ort
    except ImportError as error:
        raise ModelLoadError("format 'onnx' needs the onnxruntime package installed") from error
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    check_onnx_providers(plan.device, "offers", ort.get_available_providers())
    providers = [CUDA_PROVIDER] if plan.device == "cuda" else []
    providers.append("CPUExecutionProvider")
    try:
        session = ort.InferenceSession(str(path), options, providers=providers)
    except Exception as error:
        raise ModelLoadError(f"cannot load onnx model from {str(path)!r}: {error}") from error
    # onnxruntime falls back to the CPU, with only a warning, when the CUDA provider is offered
    # but does not load (a CUDA or cuDNN library missing or of the wrong version)
    check_onnx_providers(plan.device, "session has", session.get_providers())
    declared_in = [s.name for s in config.model.inputs]
    declared_out = [s.name for s in config.model.outputs]
    found_in = [i.name for i in session.get_inputs()]
    found_out = [o.name for o in session.get_outputs()]
    if sorted(found_in) != sorted(declared_in) or not set(declared_out) <= set(found_out):
        raise ModelLoadError(
            f"onnx model has inputs {found_in} and outputs {found_out}; the config declares "
            f"inputs {declared_in} and outputs {declared_out}"
        )

    def call(inputs: Arrays) -> Arrays:
        feed = dict(zip(declared_in, inputs, strict=True))
        produced = session.run(declared_out, feed)
        return [
            np.asarray(array).astype(numpy_carrier(spec.datatype), copy=False)
            for spec, array in zip(config.model.outputs, produced, strict=True)
        ]

    return call
