"""The warm-up's request tensors: of the declared dtypes and shapes, and built without a wider
temporary copy, so what the operator allocates to build them is what the warm-up byte budget
counts (a float64 draw cast down once held 2.5 times that)."""

import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kiln_operator.api.v1alpha1.inferenceservice import InferenceServiceSpec
from kiln_operator.warmup.plan import plan_for
from kiln_operator.warmup.probe import NOISE_CHUNK_ELEMENTS, synthetic_inputs

DATATYPES = ["FP32", "FP16", "BF16", "INT64", "INT32", "INT8", "UINT8", "BOOL"]
SHAPE = [512, 1024]
"""Half a million elements: 0.5 to 4 MiB, so a temporary copy would dwarf any fixed overhead."""
FIXED_OVERHEAD = NOISE_CHUNK_ELEMENTS * 4 + 4096
"""What building may allocate beside the tensor whatever its size: the array object, the
generator, one chunk of float32 noise (FP16)."""


def spec(datatype: str) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {
            "model": {
                "uri": "/opt/models/m.pt",
                "format": "torchscript",
                "inputs": [{"name": "X", "datatype": datatype, "shape": SHAPE}],
                "outputs": [{"name": "Y", "datatype": "FP32", "shape": [2]}],
            },
            "runtime": {"image": "kiln-runtime:dev"},
            "slo": {"p99LatencyMilliseconds": 50},
        }
    )


def peak_allocation(build: Callable[[], Any]) -> tuple[Any, int]:
    """What `build` returns, and the most bytes it had allocated at once (tracemalloc sees
    numpy's array data)."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        built = build()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not tracing:
            tracemalloc.stop()
    return built, peak - before


@pytest.mark.parametrize("datatype", DATATYPES)
def test_building_an_input_allocates_only_the_bytes_the_budget_counts(datatype: str) -> None:
    plan = plan_for(spec(datatype), "m")
    (tensor,), peak = peak_allocation(lambda: synthetic_inputs(plan, seed=0))
    assert tensor.shape == (1, *SHAPE)
    assert tensor.nbytes == plan.input_bytes  # the budget counts the tensor as it is held
    assert peak <= tensor.nbytes + FIXED_OVERHEAD, f"{peak / tensor.nbytes:.2f}x the tensor"


def test_floats_are_normal_noise_and_the_rest_small_integers() -> None:
    by_type = {
        datatype: synthetic_inputs(plan_for(spec(datatype), "m"), seed=0)[0]
        for datatype in DATATYPES
    }
    assert by_type["FP16"].dtype == np.float16 and by_type["BF16"].dtype == np.float32
    for datatype in ("FP32", "FP16", "BF16"):
        noise = by_type[datatype].astype(np.float64)
        assert abs(noise.mean()) < 0.01 and abs(noise.std() - 1) < 0.01, datatype
    assert set(np.unique(by_type["BOOL"]).tolist()) == {False, True}
    for datatype in ("INT64", "INT32", "INT8", "UINT8"):
        assert by_type[datatype].min() >= 0 and by_type[datatype].max() < 16, datatype
