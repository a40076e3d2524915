"""Serve an example model with Triton through nvidia-pytriton: the benchmark's reference.

This is what a user would deploy without Kiln: Triton's server, its dynamic batcher with the
same limits as Kiln's, and the model's TorchScript program run by a Python callback; with
``--int8`` the same dynamically quantized INT8 program Kiln's ``precision: int8`` runs.
Runs in the benchmark's own virtualenv (pytriton pins numpy 1.x); needs torch importable.

    python -m bench.pytriton_server --model-dir DIR --name mlp --http-port P --grpc-port P
"""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

from bench import int8

DTYPES = {"FP32": np.float32, "INT64": np.int64}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--int8", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    config = json.loads((args.model_dir / "config.json").read_text())
    module = int8.load(str(args.model_dir / "model.pt"), args.int8)
    input_spec = config["model"]["inputs"][0]
    output_spec = config["model"]["outputs"][0]
    batching = config["batching"]

    @batch  # type: ignore[untyped-decorator]
    def infer(**inputs: np.ndarray) -> dict[str, Any]:
        with torch.inference_mode():
            x = torch.from_numpy(inputs[input_spec["name"]])
            return {output_spec["name"]: module(x).numpy()}

    triton_config = TritonConfig(
        http_address=args.host,
        http_port=args.http_port,
        grpc_address=args.host,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        allow_metrics=False,
    )
    with Triton(config=triton_config) as triton:
        triton.bind(
            model_name=args.name,
            infer_func=infer,
            inputs=[Tensor(name=input_spec["name"], dtype=DTYPES[input_spec["datatype"]],
                           shape=tuple(input_spec["shape"]))],
            outputs=[Tensor(name=output_spec["name"], dtype=DTYPES[output_spec["datatype"]],
                            shape=tuple(output_spec["shape"]))],
            config=ModelConfig(
                max_batch_size=batching["maxBatchSize"],
                batcher=DynamicBatcher(
                    max_queue_delay_microseconds=batching["maxQueueDelayMicroseconds"]
                ),
            ),
            strict=False,
        )  # fmt: skip
        signal.signal(signal.SIGTERM, lambda *_: triton.stop())
        triton.serve()


if __name__ == "__main__":
    main()
