"""KILN_ACTIVATOR_CONTROL: one DNS name (the chart's headless Service) or the activator pods one
by one (an operator outside the cluster, where no cluster DNS answers)."""

import asyncio

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
