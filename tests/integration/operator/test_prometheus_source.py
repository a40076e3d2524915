"""The autoscaler's Prometheus adapter against a real Prometheus: one query serves every
service and every concurrent evaluation; a hung endpoint delays only its own services.

No cluster: a real Prometheus scrapes the synthetic exporter of many runtime pods; the hung
endpoint is a loopback socket that accepts connections and never answers.
"""

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_localcluster import prometheus as local_prometheus
from kiln_localcluster.processes import stop
from kiln_localcluster.waiting import wait_for
from kiln_operator.autoscaling.prometheus import QUERY_TIMEOUT_SECONDS, PrometheusSource
from tests.integration.operator import bench_operator
from tests.integration.operator.synthetic_runtimes import SyntheticRuntimes
from tests.sessioncluster import missing_component

pytestmark = pytest.mark.integration

SERVICES = [f"svc-{i:03d}" for i in range(200)]


@pytest.fixture
def exporter() -> Iterator[SyntheticRuntimes]:
    runtimes = SyntheticRuntimes("shop", SERVICES).start()
    try:
        yield runtimes
    finally:
        runtimes.stop()


@pytest.fixture
def prometheus_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exporter: SyntheticRuntimes
) -> Iterator[str]:
    if (missing := local_prometheus.available()) is not None:
        missing_component(missing)
    monkeypatch.setattr(bench_operator, "SCRAPE_SECONDS", 1.0)
    process, url = bench_operator.start_prometheus_for(exporter, tmp_path / "prometheus")
    try:
        yield url
    finally:
        stop(process)


@pytest.fixture
def hung_url() -> Iterator[str]:
    """An endpoint that accepts TCP connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def queries_answered(url: str) -> float:
    text = bench_operator.scrape(f"{url}/metrics")
    return bench_operator.metric_sum(
        text, "prometheus_http_requests_total", 'handler="/api/v1/query"'
    )


def test_one_query_serves_every_service_and_every_concurrent_evaluation(
    prometheus_url: str,
) -> None:
    source = PrometheusSource(prometheus_url)

    def every_service_has_a_rate() -> bool:
        snapshot = asyncio.run(source.snapshot(15, max_age_seconds=0))
        return all(
            (s := snapshot.services.get(("shop", name))) is not None
            and (s.requests_per_second or 0) > 0
            for name in SERVICES
        )

    wait_for(every_service_has_a_rate, timeout=60, interval=1, description="rates of all")
    source.close()
    source = PrometheusSource(prometheus_url)  # no snapshot yet
    before = queries_answered(prometheus_url)

    async def evaluations() -> None:
        # 200 services' evaluations at once, twice: one refresh, then the fresh snapshot.
        for _ in range(2):
            snapshots = await asyncio.gather(
                *(source.snapshot(15, max_age_seconds=5.0) for _ in SERVICES)
            )
            assert all(s is snapshots[0] for s in snapshots)
            assert snapshots[0].error is None
            assert len(snapshots[0].services) == len(SERVICES)

    asyncio.run(evaluations())
    assert queries_answered(prometheus_url) - before == 1
    source.close()


def test_a_hung_prometheus_delays_only_its_own_services(prometheus_url: str, hung_url: str) -> None:
    healthy, hung = PrometheusSource(prometheus_url), PrometheusSource(hung_url)
    wait_for(
        lambda: asyncio.run(healthy.snapshot(15, max_age_seconds=0)).services,
        timeout=60, interval=1, description="the first scrapes",
    )  # fmt: skip

    async def both() -> tuple[float, float, str | None]:
        started = time.monotonic()
        stuck = asyncio.ensure_future(hung.snapshot(15, max_age_seconds=0))
        await asyncio.sleep(0.1)
        snapshot = await healthy.snapshot(15, max_age_seconds=0)
        healthy_seconds = time.monotonic() - started
        assert snapshot.error is None and snapshot.services
        failed = await stuck
        return healthy_seconds, time.monotonic() - started, failed.error

    healthy_seconds, hung_seconds, error = asyncio.run(both())
    assert healthy_seconds < 2.0
    # One query's timeout, no retries: the next evaluation is the retry.
    assert QUERY_TIMEOUT_SECONDS - 0.5 <= hung_seconds < QUERY_TIMEOUT_SECONDS + 2
    assert error is not None and hung_url in error
    healthy.close()
    hung.close()


def test_failed_scrapes_do_not_hide_the_gauges(
    prometheus_url: str, exporter: SyntheticRuntimes
) -> None:
    """A failed scrape marks the target's series stale: the instant gauges must still read."""
    source = PrometheusSource(prometheus_url)

    def every_gauge_read() -> bool:
        snapshot = asyncio.run(source.snapshot(15, max_age_seconds=0))
        return all(
            (s := snapshot.services.get(("shop", name))) is not None
            and s.freshest is not None
            and s.queue_depth is not None
            and (s.requests_per_second or 0) >= 18  # series older than the window: a full rate
            for name in SERVICES
        )

    wait_for(every_gauge_read, timeout=90, interval=1, description="every service's gauges")
    exporter.failing.set()
    failed_from = exporter.scrapes
    # Three scrapes' time (1 s apart) with every one failing: the series are stale by now.
    time.sleep(3.5)
    snapshot = asyncio.run(source.snapshot(15, max_age_seconds=0))
    exporter.failing.clear()
    assert exporter.scrapes == failed_from  # no scrape got through meanwhile
    now = time.time()
    for name in SERVICES:
        signals = snapshot.services.get(("shop", name))
        assert signals is not None and signals.freshest is not None, name
        assert signals.queue_depth == 0.0, name
        assert 3.0 <= now - signals.freshest <= 15.0, name  # the last good scrape's age
    # The pod's load: ~20 answered per second (the exporter's rate, +-3 %; read low here, as
    # the window's last 3.5 s hold no sample) plus 1 in flight from its last sample.
    ((pod, load),) = source.load_by_pod("shop", SERVICES[0], 15).items()
    assert pod == f"{SERVICES[0]}-0" and 12.0 <= load <= 22.0, load
    source.close()
