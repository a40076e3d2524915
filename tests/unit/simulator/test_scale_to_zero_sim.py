"""The simulator's scale-to-zero comparison: on a sparse day zero saves most replica-hours and
refuses nothing (the hold outlasts the cold start); a pre-warm schedule per session gets the
attainment back; on a busy day zero changes nothing."""

from kiln_operator.simulator.traffic import SPARSE_DAY, Scenario
from kiln_operator.simulator.zero import ZeroRow, render_zero, run_zero_case, with_zero_section


def by_policy(scenario: Scenario) -> dict[str, ZeroRow]:
    return {row.policy: row for row in run_zero_case(scenario, 0, 0)}


def test_a_sparse_day_at_zero_costs_a_fraction_of_always_on_and_loses_nothing() -> None:
    rows = by_policy(SPARSE_DAY)
    always, floor1 = rows["always-on-1"], rows["kiln-min-1"]
    zero, prewarmed = rows["kiln-min-0"], rows["kiln-min-0-prewarm"]
    assert always.replica_hours == floor1.replica_hours == 24.0
    assert zero.replica_hours < 0.25 * always.replica_hours
    assert zero.rejects == 0 and zero.wakes == len(SPARSE_DAY.sessions)
    # the first requests of each session wait for a cold start: the SLO misses are the price
    assert zero.attainment < 0.9
    # a window per known session wakes the service ahead: no miss, still a fraction of the cost
    assert prewarmed.attainment == 1.0 and prewarmed.rejects == 0
    assert prewarmed.replica_hours < 0.25 * always.replica_hours
    table = render_zero(list(rows.values()))
    assert "| sparse | kiln-min-0 |" in table and "0 of 888" in table


def test_a_busy_day_never_goes_to_zero() -> None:
    busy = Scenario("busy", "two busy hours", hours=2.0, mean_rate=3.0)
    rows = by_policy(busy)
    assert "kiln-min-0-prewarm" not in rows
    zero, floor1 = rows["kiln-min-0"], rows["kiln-min-1"]
    assert zero.wakes == 0
    assert zero.replica_hours == floor1.replica_hours
    assert zero.attainment == floor1.attainment


def test_the_section_is_replaced_not_appended_twice() -> None:
    page = with_zero_section("# Scale to zero\n\nmeasured\n", "first")
    again = with_zero_section(page, "second")
    assert "second" in again and "first" not in again and again.count("measured") == 1
