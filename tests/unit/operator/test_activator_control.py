"""KILN_ACTIVATOR_CONTROL: one DNS name (the chart's headless Service) or the activator pods one
by one (an operator outside the cluster, where no cluster DNS answers); and the demand long
poll's handling of a pod that fails or answers badly."""

import asyncio
from typing import Any

import pytest

from kiln_operator.k8s.activator import Activators, parse_control


def test_one_name_or_a_comma_separated_list_of_host_port() -> None:
    assert parse_control("kiln-activator-control.kiln-system:9090") == [
        ("kiln-activator-control.kiln-system", 9090)
    ]
    assert parse_control("10.0.0.5:9090, 10.0.0.6:9090") == [
        ("10.0.0.5", 9090),
        ("10.0.0.6", 9090),
    ]
    assert parse_control("[fd00::5]:9090") == [("fd00::5", 9090)]


@pytest.mark.parametrize("bad", ["", "host", "host:", ":9090", "host:http", "a:1,b", "h:70000"])
def test_anything_else_is_refused_at_start(bad: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        parse_control(bad)


def test_each_listed_pod_is_an_address_once() -> None:
    activators = Activators("127.0.0.1:9090,127.0.0.2:9091,127.0.0.1:9090")
    assert asyncio.run(activators.addresses()) == ["127.0.0.1:9090", "127.0.0.2:9091"]


async def test_a_pod_that_keeps_failing_is_asked_ever_less_often_and_bad_answers_wake_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The demand long poll of one activator pod: waits double from 1 s to 10 s while the pod
    fails (a warning each time in the log), a malformed answer counts as a failure, and the
    first good answer wakes only its well-formed entries with requests held."""
    answers: list[Any] = [None, None, True, None, None, None, None]
    answers.append(
        {
            "generation": 4,
            "services": [
                {"namespace": "models", "name": "mlp", "held": 2},
                {"namespace": "models", "name": "idle", "held": 0},
                {"namespace": "models", "name": "odd", "held": "many"},
                "not an entry",
            ],
        }
    )
    answers.append({"generation": 4, "services": "not a list"})
    asked: list[str] = []
    slept: list[float] = []

    async def call(method: str, address: str, path: str, *_: Any, **__: Any) -> Any:
        asked.append(path)
        if not answers:
            raise asyncio.CancelledError
        return answers.pop(0)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    activators = Activators("10.0.0.1:9090")
    monkeypatch.setattr(activators, "_call", call)
    monkeypatch.setattr("kiln_operator.k8s.activator.asyncio.sleep", sleep)
    woken: list[tuple[str, str]] = []
    with pytest.raises(asyncio.CancelledError):
        await activators._long_poll("10.0.0.1:9090", woken.append)
    assert slept[:7] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert woken == [("models", "mlp")]
    assert asked[7] == "/v1/demand" and asked[8] == "/v1/demand?after=4&wait=20"
