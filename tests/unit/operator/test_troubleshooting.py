"""docs/troubleshooting.md cannot drift from the code: every reason constant that reports a
problem on an InferenceService condition has exactly one row, and every row names such a
constant."""

import re

from kiln_operator import constants
from tests.unit.operator.conftest import REPO

HEALTHY = {
    constants.REASON_VALID,
    constants.REASON_AVAILABLE,
    constants.REASON_ROLLOUT_COMPLETE,
    constants.REASON_METRICS_READ,
    constants.REASON_FLOOR_MET,
    constants.REASON_ALL_PODS_PLACED,
    constants.REASON_NOT_STALLED,
    constants.REASON_CONVERGED,
}
"""Reasons of conditions that hold: nothing to troubleshoot."""
ROW = re.compile(r"^\| `([A-Za-z]+)` \|(.+)\|(.+)\|$", re.M)


def problem_reasons() -> set[str]:
    return {
        value
        for name, value in vars(constants).items()
        if name.startswith("REASON_") and isinstance(value, str)
    } - HEALTHY


def test_every_problem_reason_has_one_row_and_every_row_is_a_reason() -> None:
    rows = ROW.findall((REPO / "docs" / "troubleshooting.md").read_text())
    named = [reason for reason, _, _ in rows]
    assert len(named) == len(set(named)), "a reason has two rows"
    assert set(named) == problem_reasons()


def test_every_row_says_what_is_shown_and_what_to_do() -> None:
    for reason, shown, todo in ROW.findall((REPO / "docs" / "troubleshooting.md").read_text()):
        assert len(shown.strip()) > 20 and len(todo.strip()) > 10, reason
