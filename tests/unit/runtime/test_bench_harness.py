"""The runtime benchmark's pure parts: CPU accounting from /proc and the JSON poster's body.

The load itself needs servers and compiled clients (`make bench-runtime`); what is pinned here
is what turns its numbers into the report's verdicts.
"""

import os
import time

import numpy as np

from bench import loadgen, proc
from kiln_runtime.protocol.rest import decode_infer

STAT = "4242 (a (weird) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 {u} {s} 0 0 20 0 3 0"


def test_stat_fields_are_counted_from_the_last_parenthesis() -> None:
    assert proc.parse_stat(STAT.format(u=150, s=25)) == (17, 175)


def test_a_tree_is_the_root_and_every_descendant() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 30: 99}

    assert sorted(proc.tree(10, parents)) == [10, 11, 12, 13]
    assert proc.tree(13, parents) == [13]


def test_this_process_cpu_time_grows_with_work() -> None:
    before = proc.tree_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass

    assert proc.tree_cpu_seconds(os.getpid()) > before


def test_the_plain_json_body_is_what_the_runtime_parses() -> None:
    x = np.random.default_rng(20).standard_normal((2, 3)).astype(np.float32)

    request = decode_infer("mlp", "", {}, loadgen.json_body("INPUT__0", "FP32", x), 1 << 20)

    np.testing.assert_array_equal(request.inputs[0].data, x)
    assert request.inputs[0].datatype == "FP32"


def test_server_cost_per_request_survives_a_run_without_answers() -> None:
    result = loadgen.LoadResult(0, 5, 1.0, 0.0, 0.0, 0.1, server_cpu_seconds=0.002)

    assert result.server_us_per_request == 2000
