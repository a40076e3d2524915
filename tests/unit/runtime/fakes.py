"""A numpy model and config for data-plane tests that need no torch."""

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kiln_runtime.config import RuntimeConfig, parse_config


def config(**batching: Any) -> RuntimeConfig:
    return parse_config(
        {
            "model": {
                "name": "adder", "version": "1",
                "inputs": [
                    {"name": "A", "datatype": "FP32", "shape": [4]},
                    {"name": "B", "datatype": "INT64", "shape": [4]},
                ],
                "outputs": [
                    {"name": "SUM", "datatype": "FP32", "shape": [4]},
                    {"name": "COUNT", "datatype": "INT32", "shape": [1]},
                ],
            },
            "batching": {"maxBatchSize": 8, **batching},
        }
    )  # fmt: skip


class Adder:
    """SUM = A + B per row; COUNT = rows in the batch the row was computed in."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.warmed: Sequence[int] = ()

    def forward(self, inputs: list[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        a, b = inputs
        rows = a.shape[0]
        self.batches.append(rows)
        return [a + b.astype(np.float32), np.full((rows, 1), rows, dtype=np.int32)]

    def warm_up(self, batch_sizes: Sequence[int], repeats: int = 2) -> float:
        self.warmed = batch_sizes
        return 0.25

    @property
    def computes_on_cpu(self) -> bool:
        return True
