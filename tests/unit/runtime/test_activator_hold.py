"""The activator's hold: released to the first ready pod, bounded in requests, bytes and
services, each request with a deadline, and the demand it reports."""

import asyncio
import time

import pytest

from kiln_runtime.activator.control import _backends, _long_poll
from kiln_runtime.activator.fronts import refuse_by, service_of
from kiln_runtime.activator.hold import HoldLimits, Holds, Refused

MLP = ("models", "mlp")


async def held(holds: Holds, count: int) -> None:
    """Until `count` requests of MLP are held (each waiter registers on its first step)."""
    for _ in range(200):
        if holds.demand().get(MLP, 0) >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{holds.demand()} never held {count}")


async def test_held_requests_are_released_to_the_first_ready_pod_and_the_wake_is_timed() -> None:
    holds = Holds(HoldLimits(timeout_seconds=5))
    waiters = [asyncio.create_task(holds.wait(MLP, 10, grpc=False, deadline=None)) for _ in "abc"]
    await held(holds, 3)
    assert holds.demand() == {MLP: 3}
    await asyncio.sleep(0.05)
    holds.set_backends(MLP, ("10.0.0.1:8000", "10.0.0.2:8000"), ("10.0.0.1:8001",))
    releases = await asyncio.gather(*waiters)
    assert sorted(r.address for r in releases) == [
        "10.0.0.1:8000", "10.0.0.1:8000", "10.0.0.2:8000",
    ]  # fmt: skip
    assert all(r.held_seconds >= 0.05 for r in releases)
    assert holds.demand() == {}
    assert len(holds.wakes) == 1 and holds.wakes[0] >= 0.05
    # with pods ready, a request goes straight on, gRPC to the gRPC port
    now = await holds.wait(MLP, 10, grpc=True, deadline=None)
    assert (now.address, now.held_seconds) == ("10.0.0.1:8001", 0.0)


async def test_beyond_the_count_the_request_is_refused_at_once_saying_the_service_wakes() -> None:
    holds = Holds(HoldLimits(max_requests=2, timeout_seconds=5))
    waiters = [asyncio.create_task(holds.wait(MLP, 1, grpc=False, deadline=None)) for _ in "ab"]
    await held(holds, 2)
    started = time.monotonic()
    with pytest.raises(Refused, match="models/mlp is waking and 2 requests wait") as refused:
        await holds.wait(MLP, 1, grpc=False, deadline=None)
    assert time.monotonic() - started < 0.1
    assert refused.value.reason == "requests" and refused.value.retry_after >= 1
    # another service's hold is its own
    other = asyncio.create_task(holds.wait(("models", "other"), 1, grpc=False, deadline=None))
    await asyncio.sleep(0.01)
    assert holds.demand()[("models", "other")] == 1
    holds.set_backends(MLP, ("10.0.0.1:8000",))
    holds.set_backends(("models", "other"), ("10.0.0.3:8000",))
    await asyncio.gather(*waiters, other)


async def test_beyond_the_bytes_the_request_is_refused() -> None:
    holds = Holds(HoldLimits(max_bytes=100, timeout_seconds=5))
    first = asyncio.create_task(holds.wait(MLP, 60, grpc=False, deadline=None))
    await held(holds, 1)
    with pytest.raises(Refused, match="hold 60 bytes") as refused:
        await holds.wait(MLP, 41, grpc=False, deadline=None)
    assert refused.value.reason == "bytes"
    fits = asyncio.create_task(holds.wait(MLP, 40, grpc=False, deadline=None))
    await held(holds, 2)
    holds.set_backends(MLP, ("10.0.0.1:8000",))
    await asyncio.gather(first, fits)


async def test_a_request_waits_at_most_the_hold_timeout_or_its_own_deadline() -> None:
    holds = Holds(HoldLimits(timeout_seconds=0.2))
    started = time.monotonic()
    with pytest.raises(Refused, match="no pod passed its warm-up gate") as refused:
        await holds.wait(MLP, 1, grpc=False, deadline=None)
    assert 0.2 <= time.monotonic() - started < 0.5
    assert refused.value.reason == "deadline"
    started = time.monotonic()
    with pytest.raises(Refused):
        await holds.wait(MLP, 1, grpc=True, deadline=time.monotonic() + 0.05)
    assert time.monotonic() - started < 0.15
    assert holds.demand() == {}  # nothing is left counted


async def test_pods_of_one_protocol_do_not_release_the_other_protocols_requests() -> None:
    holds = Holds(HoldLimits(timeout_seconds=5))
    grpc_call = asyncio.create_task(holds.wait(MLP, 1, grpc=True, deadline=None))
    await held(holds, 1)
    holds.set_backends(MLP, ("10.0.0.1:8000",), ())
    await asyncio.sleep(0.02)
    assert not grpc_call.done()
    holds.set_backends(MLP, ("10.0.0.1:8000",), ("10.0.0.1:8001",))
    assert (await grpc_call).address == "10.0.0.1:8001"


async def test_the_services_held_for_are_bounded() -> None:
    holds = Holds(HoldLimits(max_services=1, timeout_seconds=5))
    first = asyncio.create_task(holds.wait(MLP, 1, grpc=False, deadline=None))
    await held(holds, 1)
    with pytest.raises(Refused) as refused:
        await holds.wait(("models", "other"), 1, grpc=False, deadline=None)
    assert refused.value.reason == "services"
    holds.set_backends(MLP, ("10.0.0.1:8000",))
    await first
    holds.set_backends(MLP, ())  # back at zero, nothing held: forgotten
    assert holds.grpc_addresses() == set()
    other = asyncio.create_task(holds.wait(("models", "other"), 1, grpc=False, deadline=None))
    await asyncio.sleep(0.01)
    assert not other.done()
    other.cancel()


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("mlp.models", ("models", "mlp")),
        ("mlp.models:8000", ("models", "mlp")),
        ("mlp.models.svc", ("models", "mlp")),
        ("MLP.Models.svc.cluster.local:8001", ("models", "mlp")),
        ("mlp", None),
        ("mlp:8000", None),
        ("127.0.0.1:8000", None),
        ("example.com", ("com", "example")),  # two labels read as NAME.NAMESPACE
        ("mlp.models.example.com", None),
        ("", None),
    ],
)
def test_the_service_is_named_by_host(host: str, key: tuple[str, str] | None) -> None:
    assert service_of(host) == key


def test_backends_are_validated() -> None:
    assert _backends({"http": ["10.0.0.1:8000"], "grpc": []}) == (("10.0.0.1:8000",), ())
    bad_bodies: list[object] = [
        [],
        {"http": "10.0.0.1:8000"},
        {"http": ["10.0.0.1"]},
        {"grpc": [1]},
    ]
    for bad in bad_bodies:
        with pytest.raises(ValueError):
            _backends(bad)


def test_a_held_grpc_call_is_refused_before_its_own_deadline_so_the_refusal_arrives() -> None:
    # on the real node a call with a 1 s deadline held at zero ended DEADLINE_EXCEEDED on the
    # client, the activator's UNAVAILABLE ("waking") arriving at the same instant: too late
    assert refuse_by(100.0, None) is None
    assert refuse_by(100.0, 40.0) == pytest.approx(139.5)
    assert refuse_by(100.0, 1.0) == pytest.approx(100.9)
    assert refuse_by(100.0, 0.01) == pytest.approx(100.009)


async def test_a_services_first_held_request_is_news_at_once_and_later_ones_are_not() -> None:
    holds = Holds(HoldLimits(timeout_seconds=5))
    start = holds.generation
    assert await holds.next_demand(start, 0.01) == start  # nothing new: the wait ends empty
    news = asyncio.create_task(holds.next_demand(start, 5.0))
    await asyncio.sleep(0.01)
    assert not news.done()
    first = asyncio.create_task(holds.wait(MLP, 1, grpc=False, deadline=None))
    assert await asyncio.wait_for(news, 1.0) == start + 1
    second = asyncio.create_task(holds.wait(MLP, 1, grpc=False, deadline=None))
    await held(holds, 2)
    assert holds.generation == start + 1  # the same wait: no news
    assert await holds.next_demand(start, 5.0) == start + 1  # behind already: answered at once
    holds.set_backends(MLP, ("10.0.0.1:8000",))
    await asyncio.gather(first, second)
    holds.set_backends(MLP, ())  # back at zero: the next request begins a new wait
    third = asyncio.create_task(holds.wait(MLP, 1, grpc=False, deadline=None))
    assert await asyncio.wait_for(holds.next_demand(start + 1, 5.0), 1.0) == start + 2
    holds.set_backends(MLP, ("10.0.0.1:8000",))
    await third


@pytest.mark.parametrize(
    ("query", "expected"),
    [("", (None, 0.0)), ("after=3&wait=20", (3, 20.0)), ("after=0", (0, 0.0))],
)
def test_the_demand_long_poll_query(query: str, expected: tuple[int | None, float]) -> None:
    assert _long_poll(query) == expected


@pytest.mark.parametrize(
    "query", ["after=x", "wait=31", "wait=-1", "wait=nan", "a=1&b=2&c=3&d=4&e=5", "after=1" * 40]
)
def test_a_demand_query_out_of_bounds_is_refused(query: str) -> None:
    with pytest.raises(ValueError, match=r"after=INT&wait=SECONDS|wait is 0 to 30 seconds"):
        _long_poll(query)
