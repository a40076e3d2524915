"""The benchmark matrix and the CLI, on tiny traces (seconds, not minutes)."""

from pathlib import Path

import numpy as np
import pytest

from kiln_operator.simulator.__main__ import main
from kiln_operator.simulator.bench import Case, build_policy, run_case, window_floor
from kiln_operator.simulator.model import ServiceModel
from kiln_operator.simulator.traffic import Scenario, ScheduledPeak, Spike

TINY = Scenario(
    "tiny",
    "tiny",
    hours=0.5,
    mean_rate=2.0,
    spike=Spike(3.0, minutes=5, earliest_hour=0.1, latest_hour=0.2),
)
RUNS = (("kiln", 75.0), ("oracle-cold", 0.75), ("static", 0.75), ("hpa", 0.7))


def test_run_case_is_deterministic_and_scores_every_policy() -> None:
    first = run_case(Case(TINY, 0, seed=3, runs=RUNS))
    again = run_case(Case(TINY, 0, seed=3, runs=RUNS))
    assert [row.policy for row in first] == ["kiln", "oracle-cold", "static", "hpa"]
    assert [row.score for row in first] == [row.score for row in again]
    for row in first:
        assert 0.0 <= row.score.attainment <= 1.0
        assert row.score.replica_hours > 0


def test_window_floor_is_the_expected_peak_at_the_target_utilization() -> None:
    service = ServiceModel()
    peak = Scenario("p", "p", mean_rate=6.0, peak=ScheduledPeak(extra_rate=12.0))
    floor = window_floor(peak, service)
    assert floor * service.capacity_per_replica * 0.75 >= 12.0
    assert window_floor(Scenario("d", "d"), service) == 0


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        build_policy("vpa", 1.0, Case(TINY, 0, 0, ()), np.ones(10))


def test_cli_bench_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        [
            "bench",
            "--seeds", "1",
            "--sweep-seeds", "1",
            "--scenarios", "peak-on-time,spike-3x",
            "--hours", "0.2",
            "--processes", "1",
            "--out", str(tmp_path),
        ]
    )  # fmt: skip
    assert status == 0
    report = (tmp_path / "autoscaling.md").read_text()
    assert "## Targets (issue 7)" in report
    assert "| kiln |" in report
    assert (tmp_path / "autoscaling-tradeoff.png").stat().st_size > 0
    assert "[1/2]" in capsys.readouterr().err


def test_cli_refuses_an_unknown_scenario() -> None:
    with pytest.raises(SystemExit, match="unknown scenario"):
        main(["bench", "--scenarios", "black-friday", "--out", "unused"])
