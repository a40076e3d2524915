"""Every tier's wall time at the end of a run, so the README's figures can be checked.

Why it exists: `make test` runs all tiers (unit, integration, docker, e2e) in one pytest session;
this adds up each test's set-up, call and tear-down time per tier (the first directory under
tests/) and prints the totals after pytest's own summary.
"""

from collections import defaultdict

import pytest

_seconds: defaultdict[str, float] = defaultdict(float)
_counts: defaultdict[str, int] = defaultdict(int)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    parts = report.nodeid.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    _seconds[tier] += report.duration
    if report.when == "call":
        _counts[tier] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _seconds:
        return
    terminalreporter.section("time per tier")
    for tier, seconds in sorted(_seconds.items(), key=lambda item: -item[1]):
        minutes, rest = divmod(round(seconds), 60)
        terminalreporter.write_line(
            f"{tier:12} {_counts[tier]:4} tests  {minutes:3d} min {rest:02d} s"
        )
