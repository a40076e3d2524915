"""`make bench-operator` and `make bench-warmup-memory` write the same page: neither erases the
other's numbers, whichever runs last."""

from pathlib import Path

from tests.integration.benchpage import write_page, write_section
from tests.unit.operator.conftest import REPO

BEGIN = "<!-- bench-warmup-memory: begin -->"
END = "<!-- bench-warmup-memory: end -->"


def warmup_section(peak: str) -> str:
    return f"{BEGIN}\n## Warm-up memory\n\npeak {peak}\n{END}\n"


def test_the_operator_page_keeps_the_warmup_section(tmp_path: Path) -> None:
    page = tmp_path / "operator.md"
    write_page(page, "# Operator benchmark\n\nold numbers\n")
    write_section(page, BEGIN, END, warmup_section("194 MiB"))

    write_page(page, "# Operator benchmark\n\nnew numbers\n")

    text = page.read_text()
    assert "new numbers" in text and "old numbers" not in text
    assert text.endswith(warmup_section("194 MiB"))
    assert text.count(BEGIN) == 1


def test_the_warmup_section_replaces_only_itself(tmp_path: Path) -> None:
    page = tmp_path / "operator.md"
    write_page(page, "# Operator benchmark\n\nnumbers\n")
    write_section(page, BEGIN, END, warmup_section("194 MiB"))

    write_section(page, BEGIN, END, warmup_section("180 MiB"))

    text = page.read_text()
    assert text.startswith("# Operator benchmark\n\nnumbers\n")
    assert "180 MiB" in text and "194 MiB" not in text
    assert text.count(BEGIN) == 1


def test_the_committed_page_has_a_section_the_operator_bench_keeps(tmp_path: Path) -> None:
    committed = REPO / "docs" / "benchmarks" / "operator.md"
    page = tmp_path / "operator.md"
    page.write_text(committed.read_text())
    write_page(page, "# Operator benchmark\n")
    assert BEGIN in page.read_text() and END in page.read_text()
