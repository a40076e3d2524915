"""The operator's boolean settings: `true` turns one on; unset or `false` leaves it off; anything
else stops the start naming the variable, so a typo never silently leaves a setting off."""

import pytest

from kiln_operator import constants
from kiln_operator.handlers.inferenceservice import operator_flag


@pytest.mark.parametrize(
    ("value", "on"), [("true", True), ("TRUE ", True), ("false", False), ("", False)]
)
def test_true_or_false(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    monkeypatch.setenv(constants.ENV_IMITATED_GPUS, value)
    assert operator_flag(constants.ENV_IMITATED_GPUS) is on


def test_unset_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(constants.ENV_IMITATED_GPUS, raising=False)
    assert operator_flag(constants.ENV_IMITATED_GPUS) is False


def test_anything_else_stops_the_start_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(constants.ENV_IMITATED_GPUS, "yes")
    with pytest.raises(ValueError, match="KILN_IMITATED_GPUS must be 'true' or 'false', not 'yes'"):
        operator_flag(constants.ENV_IMITATED_GPUS)
