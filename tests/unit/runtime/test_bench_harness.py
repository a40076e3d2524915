"""The runtime benchmark's pure parts: CPU accounting from /proc.

The load itself needs servers and compiled clients (`make bench-runtime`); what is pinned here
is what turns its numbers into the report's verdicts.
"""

import os
import time

from bench import proc

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
