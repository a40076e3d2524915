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
from tests.integration.conftest import missing_component
from tests.integration.operator import bench_operator
from tests.integration.operator.synthetic_runtimes import SyntheticRuntimes

pytestmark = pytest.mark.integration

SERVICES = [f"svc-{i:03d}" for i in range(200)]


@pytest.fixture
def prometheus_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if (missing := local_prometheus.available()) is not None:
        missing_component(missing)
    monkeypatch.setattr(bench_operator, "SCRAPE_SECONDS", 1.0)
    exporter = SyntheticRuntimes("shop", SERVICES).start()
    process, url = bench_operator.start_prometheus_for(exporter, tmp_path / "prometheus")
    try:
        yield url
    finally:
        stop(process)
        exporter.stop()


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
