"""A port's saturation in metrics and readiness (``kiln_runtime/ports.py``, issue 39 item 3)."""

from prometheus_client import CollectorRegistry, generate_latest

from kiln_runtime import ports
from kiln_runtime.dataplane import DataPlane
from kiln_runtime.metrics import RuntimeMetrics

from .fakes import Adder, config


def status(refused_at: float) -> ports.PortStatus:
    return lambda: (7, 2, 1 if refused_at else 0, refused_at)


def test_a_port_that_refused_lately_is_saturated() -> None:
    quiet = {"http": status(0.0), "grpc": status(0.0)}
    assert ports.saturated(quiet, now=100.0) == ""
    assert ports.saturated({**quiet, "grpc": status(95.0)}, now=100.0) == "grpc"
    assert ports.saturated({**quiet, "grpc": status(80.0)}, now=100.0) == ""  # long ago
    assert ports.saturated({**quiet, "metrics": status(99.0)}, now=100.0) == ""  # not serving


def test_the_ports_counters_are_exported() -> None:
    registry = CollectorRegistry()
    registry.register(ports.PortsCollector("mlp", {"grpc": status(5.0)}))
    text = generate_latest(registry).decode()
    assert 'kiln_connections{model="mlp",port="grpc"} 7.0' in text
    assert 'kiln_connections_evicted_total{model="mlp",port="grpc"} 2.0' in text
    assert 'kiln_connections_refused_total{model="mlp",port="grpc"} 1.0' in text


async def test_a_saturated_port_turns_readiness_off() -> None:
    dp = DataPlane(config(), RuntimeMetrics("adder"), executor=None)
    await dp.start(Adder)
    assert dp.ready
    dp.saturated = lambda: True
    assert not dp.ready
    assert dp.live
    await dp.stop()
