"""Models built in code, for demos, tests and the benchmark (there is no model hub here).

``write_example`` saves a model and the runtime config that serves it, so
``python -m kiln_runtime serve --model-path DIR/model.pt --config DIR/config.json`` works.
Weights come from a fixed seed: the same kind always yields the same model.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kiln_runtime.config import parse_config, to_document

KINDS = ("mlp", "transformer")
SEQUENCE_LENGTH = 64
VOCABULARY = 1000


class TransformerClassifier(nn.Module):
    """A small encoder: token and position embeddings, 4 layers of d=256, mean-pooled head."""

    def __init__(self, d_model: int = 256, layers: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCABULARY, d_model)
        self.positions = nn.Parameter(torch.randn(1, SEQUENCE_LENGTH, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=4 * d_model, batch_first=True, dropout=0.0
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 10)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.tokens(token_ids) + self.positions)
        return self.head(hidden.mean(dim=1))  # type: ignore[no-any-return]


def build(kind: str) -> tuple[nn.Module, dict[str, Any]]:
    """The eager module of ``kind`` and its ``model`` config section (without name)."""
    torch.manual_seed(0)
    if kind == "mlp":
        module: nn.Module = nn.Sequential(
            nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
        )
        inputs = [{"name": "INPUT__0", "datatype": "FP32", "shape": [512]}]
    elif kind == "transformer":
        module = TransformerClassifier()
        inputs = [{"name": "INPUT__0", "datatype": "INT64", "shape": [SEQUENCE_LENGTH]}]
    else:
        raise ValueError(f"unknown example kind {kind!r}; choose one of {list(KINDS)}")
    outputs = [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [10]}]
    return module.eval(), {"inputs": inputs, "outputs": outputs}


def example_input(kind: str, rows: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rows)
    if kind == "mlp":
        return torch.randn(rows, 512, generator=generator)
    return torch.randint(0, VOCABULARY, (rows, SEQUENCE_LENGTH), generator=generator)


def write_example(
    kind: str, out: Path, *, name: str | None = None, fmt: str = "torchscript"
) -> Path:
    """Write ``model.pt`` (TorchScript) or ``model.pt2`` (torch.export) and ``config.json``.

    Returns the model file's path.
    """
    module, model_section = build(kind)
    out.mkdir(parents=True, exist_ok=True)
    example = example_input(kind, 2)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notice
        if fmt == "torchscript":
            path = out / "model.pt"
            torch.jit.save(torch.jit.trace(module, (example,)), str(path))  # type: ignore[no-untyped-call]
        elif fmt == "torch_export":
            path = out / "model.pt2"
            batch = torch.export.Dim("batch", min=1, max=1024)
            program = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
            torch.export.save(program, str(path))
        else:
            raise ValueError(f"examples are written as torchscript or torch_export, not {fmt}")
    document = {
        "model": {"name": name or kind, "version": "1", "format": fmt, **model_section},
        "batching": {"maxBatchSize": 32, "maxQueueDelayMicroseconds": 2000, "maxQueueSize": 256},
        "warmup": {"batchSizes": [1, 8, 32]},
    }
    config = parse_config(document)  # the written config must be one the runtime accepts
    (out / "config.json").write_text(json.dumps(to_document(config), indent=2) + "\n")
    return path
