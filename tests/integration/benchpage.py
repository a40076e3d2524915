"""Benchmark pages that several benchmarks write to.

Why it exists: `make bench-operator` writes docs/benchmarks/operator.md whole, and
`make bench-warmup-memory` writes a section of the same page. Each section a benchmark writes
into another's page sits between markers of its own (`<!-- NAME: begin -->` ...
`<!-- NAME: end -->`); a benchmark that writes the whole page keeps those sections, so either
can run without erasing the other's numbers.
"""

import re
from pathlib import Path

SECTION = re.compile(r"<!-- (?P<name>[a-z0-9-]+): begin -->.*?<!-- (?P=name): end -->", re.S)
"""One marked section, markers included."""


def write_section(path: Path, begin: str, end: str, section: str) -> None:
    """Replace the section between `begin` and `end` of the page, or append it; the rest stays
    as it is. `section` carries the markers itself."""
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        before, _, rest = text.partition(begin)
        _, _, after = rest.partition(end)
        text = before + section.rstrip("\n") + after
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def write_page(path: Path, page: str) -> None:
    """Write the whole page, then the marked sections of the page it replaces that `page` does
    not carry itself (other benchmarks' sections), in their order."""
    old = path.read_text() if path.exists() else ""
    kept = [
        match.group(0)
        for match in SECTION.finditer(old)
        if f"<!-- {match.group('name')}: begin -->" not in page
    ]
    path.write_text("\n\n".join([page.rstrip("\n"), *kept]) + "\n")
