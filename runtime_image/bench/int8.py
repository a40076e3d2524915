"""Dynamic INT8 quantization of a TorchScript program, exactly as kiln_runtime applies it.

The benchmark's raw forward pass and its Triton (pytriton) server import this, so Kiln's INT8
is compared with Triton serving the same INT8 program, not with Triton's FP32. Needs only
torch: it runs in the benchmark's Triton virtualenv too.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch


def quantize_dynamic(module: Any) -> Any:
    """``module`` with its Linear layers dynamically quantized to INT8 (CPU)."""
    from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic_jit

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic_jit(  # type: ignore[no-untyped-call]
            module, {"": default_dynamic_qconfig}
        )


def load(path: str, int8: bool) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = torch.jit.load(path).eval()  # type: ignore[no-untyped-call]
    return quantize_dynamic(module) if int8 else module
