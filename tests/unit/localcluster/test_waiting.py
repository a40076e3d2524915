"""wait_for returns the first truthy value, and a timeout names what it waited for."""

import itertools

import pytest

from kiln_localcluster.waiting import wait_for


def test_returns_first_truthy_value() -> None:
    counter = itertools.count()
    assert (
        wait_for(lambda: next(counter) >= 3 and "done", timeout=5, interval=0, description="x")
        == "done"
    )


def test_timeout_names_the_condition_and_chains_the_last_error() -> None:
    def failing() -> bool:
        raise ValueError("not yet")

    with pytest.raises(TimeoutError, match="the moon") as caught:
        wait_for(failing, timeout=0.05, interval=0.01, description="the moon")
    assert isinstance(caught.value.__cause__, ValueError)
