"""The operator image caps glibc's malloc arenas: with one arena per allocating thread, the
operator at 1,000 services kept over 100 MB of freed memory resident (issue 18's RSS target;
docs/benchmarks/operator.md)."""

import re

from tests.unit.operator.conftest import REPO


def test_the_operator_image_sets_two_malloc_arenas() -> None:
    dockerfile = (REPO / "operator" / "Dockerfile").read_text()
    final_stage = dockerfile.rsplit("\nFROM ", 1)[1]

    assert re.search(r"^\s*MALLOC_ARENA_MAX=2\s*$", final_stage, re.MULTILINE)
