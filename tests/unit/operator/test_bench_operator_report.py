"""The operator benchmark's page judges issue 18's convergence target by either of its rules:
1,000 services written within 60 s, or within 1.1x of a bare client making the same requests
in the same run (where the API server's creates are the bound)."""

from datetime import UTC, datetime
from typing import Any

import pytest

from tests.integration.operator.bench_operator import Placement, own_cpus, report, rotated


def bare_run(written: float) -> dict[str, Any]:
    return {
        "written_seconds": written,
        "client_seconds": written - 1,
        "create_p50_seconds": {"deployments": 0.03, "services": 4.8},
        "load_average": [0.4, 2.9],
        "writes_until_written": {"kiln-operator/kiln create services": 1000},
    }


def converge_run(
    written: float, bare_written: float, watching_written: float | None = None
) -> dict[str, Any]:
    run = {
        "count": 1000,
        "operator": "whole operator",
        "apply_seconds": 6.0,
        "written_seconds": written,
        "converge_seconds": written,
        "peak_rss_mb": 250.0,
        "create_p50_seconds": {"deployments": 0.04, "services": 5.0},
        "operator_cpu_seconds": 30.0,
        "load_average": [0.5, 3.0],
        "writes_per_resync": 0,
        "all_operator_writes_during_resync": 0,
        "writes_until_written": {"kiln-operator/reconcile create services": 1000},
        "bare": bare_run(bare_written),
    }
    if watching_written is not None:
        run["bare_watching"] = bare_run(watching_written)
    return run


def test_within_the_bare_clients_bound_is_met_though_over_60_s() -> None:
    page = report([converge_run(written=90.0, bare_written=85.0)])

    assert "| 1000 | 85.0 | 84.0 | 0.03 / 4.8 | 0.4, 2.9 | - | 90.0 | 1.06 | - |" in page
    assert (
        "1000 written in 90.0 s: over 60 s; 1.06x the bare client's 85.0 s, within 1.1x; "
        "the target (60 s, or 1.1x the bare client): met"
    ) in page


def test_each_bound_is_judged_on_its_own() -> None:
    page = report([converge_run(written=99.0, bare_written=80.0, watching_written=92.0)])

    assert "| 1000 | 80.0 | 79.0 | 0.03 / 4.8 | 0.4, 2.9 | 92.0 | 99.0 | 1.24 | 1.08 |" in page
    assert (
        "1000 written in 99.0 s: over 60 s; 1.24x the bare client's 80.0 s, over 1.1x; "
        "1.08x the watching bare client's 92.0 s, within 1.1x; "
        "the target (60 s, or 1.1x the bare client): **missed**"
    ) in page


def test_over_the_bare_clients_bound_is_missed() -> None:
    page = report([converge_run(written=120.0, bare_written=85.0)])

    assert (
        "1.41x the bare client's 85.0 s, over 1.1x; the target (60 s, or 1.1x the bare client): "
        "**missed**"
    ) in page
    assert "kiln-operator/reconcile create services: 1000" in page


def test_a_page_rendered_again_from_a_runs_numbers_says_when_they_were_measured() -> None:
    measured = datetime(2026, 11, 26, 5, 6, tzinfo=UTC)
    page = report([converge_run(written=62.6, bare_written=47.2)], when=measured)

    assert "- When: 2026-11-26 05:06 UTC" in page


def rounds_run(rounds: list[tuple[float, float, float]]) -> dict[str, Any]:
    """A result of several rounds of (bare, watching bare, operator) written times."""
    bare, watching, operator = rounds[-1]
    run = converge_run(written=operator, bare_written=bare, watching_written=watching)
    run["rounds"] = [
        {"bare": b, "bare_watching": w, "operator": o, "operator_cpu_seconds": 15.0}
        for b, w, o in rounds
    ]
    run["median_written_seconds"] = {
        "bare": sorted(b for b, _, _ in rounds)[len(rounds) // 2],
        "bare_watching": sorted(w for _, w, _ in rounds)[len(rounds) // 2],
        "operator": sorted(o for _, _, o in rounds)[len(rounds) // 2],
    }
    run["shared_cpus"] = {
        "written_seconds": 70.0,
        "operator_cpu_seconds": 18.0,
        "create_p50_seconds": {"deployments": 0.03, "services": 4.0},
        "load_average": [3.0, 4.0],
        "bare": {"written_seconds": 56.0},
    }
    return run


def test_the_targets_judge_the_medians_of_the_rounds_not_one_round() -> None:
    # the last round alone (66.0 over 55.0: 1.2x) would miss; the medians (60.0 over 56.0) meet
    page = report([rounds_run([(56.0, 57.0, 58.0), (57.0, 58.0, 60.0), (55.0, 56.0, 66.0)])])

    assert "| 1000 | 3 | 55.0 | 56.0 | 66.0 | 15.0 | 1.2 | 1.18 |" in page
    assert "| 1000 | **median** | 56.0 | 57.0 | 60.0 | - | 1.07 | 1.05 |" in page
    assert (
        "1000 written in 60.0 s (median of the rounds): within 60 s; 1.07x the bare client's "
        "56.0 s, within 1.1x; 1.05x the watching bare client's 57.0 s, within 1.1x; the target "
        "(60 s, or 1.1x the bare client): met"
    ) in page
    assert "moved from 55.0 to 57.0 s between rounds" in page
    assert "stayed within 1.04 to 1.2." in page


def test_the_runs_sharing_every_cpu_are_reported_beside_the_rounds_against_each_other() -> None:
    page = report([rounds_run([(50.0, 51.0, 52.0)])])

    assert "not judged): the bare client written in 56.0 s, the operator in 70.0 s, 1.25x" in page


def test_each_run_takes_every_place_once_over_as_many_rounds() -> None:
    runs = ["bare", "bare_watching", "operator"]
    orders = [rotated(runs, by) for by in range(3)]

    assert orders[1] == ["bare_watching", "operator", "bare"]
    for place in range(3):
        assert sorted(order[place] for order in orders) == sorted(runs)
    assert rotated(runs, 3) == runs


def test_a_rounds_row_says_in_which_order_its_runs_ran() -> None:
    run = rounds_run([(56.0, 57.0, 58.0)])
    run["rounds"][0]["order"] = ["operator", "bare", "bare_watching"]

    assert "| 1000 | 1 (operator, bare, watching) | 56.0 | 57.0 | 58.0 |" in report([run])


def test_the_control_plane_and_the_clients_get_halves_of_the_cpus_apart() -> None:
    assert own_cpus({0, 1}) == Placement(frozenset({0}), frozenset({1}))
    assert own_cpus({5, 2, 3, 4}) == Placement(frozenset({2, 3}), frozenset({4, 5}))
    with pytest.raises(ValueError, match="needs 2 CPUs"):
        own_cpus({0})
