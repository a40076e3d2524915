"""Every tier's wall time at the end of a run, so the README's figures can be checked; and the
session's one local cluster, which the e2e and integration tiers share (`sessioncluster`).

Why it exists: `make test` runs all tiers (unit, integration, docker, e2e) in one pytest session;
this adds up each test's set-up, call and tear-down time per tier (the first directory under
tests/) and prints the totals after pytest's own summary.
"""

import os
from collections import defaultdict
from collections.abc import Iterator

import pytest

from tests import sessioncluster
from tests.sessioncluster import SessionCluster

_seconds: defaultdict[str, float] = defaultdict(float)
_counts: defaultdict[str, int] = defaultdict(int)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[SessionCluster]:
    """The local cluster of this checkout (`.kiln`), started once per session for every tier
    that needs it; stopped at the end unless it was running before (`KILN_KEEP_CLUSTER=1`
    keeps it)."""
    cluster, started_here = sessioncluster.start()
    yield cluster
    if started_here and not os.environ.get("KILN_KEEP_CLUSTER"):
        cluster.local.down()


@pytest.fixture(scope="session")
def real_node(local_cluster: SessionCluster) -> SessionCluster:
    """The session's cluster with its real node running Kiln's current runtime image (skipped
    without root or the node's packages; a failure with CI=true)."""
    sessioncluster.provide_runtime_image(local_cluster)
    return local_cluster


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
