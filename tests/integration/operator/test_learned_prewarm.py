"""The learned pre-warm on the real control plane against a real Prometheus holding two weeks of
backfilled history: the operator reads it, forecasts the daily peak and raises the replicas
before the peak comes, with no cron in the spec.

The history is written as OpenMetrics and turned into TSDB blocks by `promtool tsdb
create-blocks-from openmetrics` (Debian's prometheus package): 8 days of the service's
`kiln_requests_total`, 20 req/s with a daily hour at 5,000 req/s starting a few minutes after
the test's start. Prometheus then serves those blocks and scrapes the synthetic exporter's live
metrics for the same service (the batch metrics the capacity estimate needs). The service's
pods run on kwok's fake nodes (placed, so nothing holds a scale-up).
"""

import asyncio
import math
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from kiln_localcluster import prometheus as local_prometheus
from kiln_localcluster.processes import free_ports, spawn, stop, wait_started
from kiln_localcluster.waiting import http_ok, wait_for
from kiln_operator.api.v1alpha1.autoscaling import LearnedPrewarmSpec
from kiln_operator.autoscaling.history import HistoryCache
from kiln_operator.autoscaling.learned import LearnedFit
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import apply, gpu_service
from tests.integration.operator.synthetic_runtimes import SyntheticRuntimes
from tests.sessioncluster import missing_component

pytestmark = pytest.mark.integration

SERVICE = "learner"
BASE_RPS = 20.0
PEAK_RPS = 5000.0
HISTORY_DAYS = 8  # historyDays 7 is read (the least allowed): a short backfill, a quick start
SAMPLE_MINUTES = 2  # rate() over 5 minutes sees two or three samples
MARGIN_SECONDS = 60  # leadTimeMarginSeconds; the lead adds assumedColdStartSeconds (none measured)
SETUP_SECONDS = 60
"""From the test's start to the floor's raise: the operator's first passes, its history read and
its status come first. The assumed cold start is set so the raise comes then, whatever the
peak's 5-minute alignment left: the test waits about a minute, not up to six."""
MAX_REPLICAS = 4


def peak_start(now: datetime) -> datetime:
    """The daily peak's start: the first 5-minute boundary at least 4 minutes ahead, so the
    operator's first passes come before the floor's raise (the peak less the lead)."""
    ahead = now + timedelta(minutes=4)
    seconds = math.ceil(ahead.timestamp() / 300) * 300
    return datetime.fromtimestamp(seconds, UTC)


def openmetrics_history(namespace: str, peak: datetime, end: datetime) -> str:
    """The counter, a sample every SAMPLE_MINUTES from HISTORY_DAYS days before `end` on."""
    labels = f'namespace="{namespace}",inferenceservice="{SERVICE}",pod="history",code="ok"'
    lines = ["# TYPE kiln_requests counter"]
    at = end - timedelta(days=HISTORY_DAYS)
    total = 0.0
    peak_minute = peak.hour * 60 + peak.minute
    while at < end:
        minute = at.hour * 60 + at.minute
        in_peak = 0 <= (minute - peak_minute) % 1440 < 60
        total += SAMPLE_MINUTES * 60 * (PEAK_RPS if in_peak else BASE_RPS)
        lines.append(f"kiln_requests_total{{{labels}}} {total:.0f} {int(at.timestamp())}")
        at += timedelta(minutes=SAMPLE_MINUTES)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@contextmanager
def prometheus_with_history(
    directory: Path, namespace: str
) -> Iterator[tuple[str, datetime, SyntheticRuntimes]]:
    """Prometheus over the backfilled blocks, scraping the live exporter every second; its URL,
    the forecast peak's start and the exporter."""
    if (missing := local_prometheus.available()) is not None:
        missing_component(missing)
    if shutil.which("promtool") is None:
        missing_component("promtool (Debian's prometheus package) is not installed")
    now = datetime.now(UTC)
    peak = peak_start(now)
    data = directory / "data"
    source = directory / "history.om"
    source.write_text(openmetrics_history(namespace, peak, now - timedelta(minutes=2)))
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    exporter = SyntheticRuntimes(namespace, [SERVICE], rate=BASE_RPS).start()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{
            "job_name": "kiln-runtime", "honor_labels": True, "scrape_timeout": "1s",
            "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
        }],
    }  # fmt: skip
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    process = spawn("prometheus", [
        "prometheus", f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=30d", "--log.level=warn",
    ], directory / "prometheus.log")  # fmt: skip
    try:
        wait_started(process, lambda: http_ok(f"{url}/-/ready"), timeout=60)
        yield url, peak, exporter
    finally:
        stop(process)
        exporter.stop()


@pytest.fixture
def history_prometheus(
    tmp_path: Path, namespace: str
) -> Iterator[tuple[str, datetime, SyntheticRuntimes]]:
    with prometheus_with_history(tmp_path, namespace) as started:
        yield started


def test_the_history_cache_reads_and_fits_the_backfilled_weeks(tmp_path: Path) -> None:
    """No cluster: the operator's history adapter against the real Prometheus, one range
    query for the service, its fit forecasting the daily peak where the history has it."""
    with prometheus_with_history(tmp_path, "shop") as (url, peak, _):
        cache = HistoryCache(url)
        spec = LearnedPrewarmSpec(history_days=7)

        async def read() -> LearnedFit | None:
            first = cache.fit_for(("shop", SERVICE), spec, datetime.now(UTC))
            assert first is None  # never waits for Prometheus: the read has only begun
            for _ in range(300):
                await asyncio.sleep(0.1)
                if fitted := cache.fit_for(("shop", SERVICE), spec, datetime.now(UTC)):
                    return fitted
            return None

        try:
            fitted = asyncio.run(read())
        finally:
            cache.close()
    assert fitted is not None and fitted.profile is not None, fitted
    assert fitted.profile.rate_at(peak + timedelta(minutes=10)) == pytest.approx(PEAK_RPS, rel=0.05)
    assert fitted.profile.rate_at(peak - timedelta(minutes=30)) == pytest.approx(BASE_RPS, rel=0.1)
    assert fitted.profile.error < 0.05


def learned_service(prometheus_url: str, lead_seconds: int) -> dict[str, Any]:
    return gpu_service(
        SERVICE,
        slo={"p99LatencyMilliseconds": 1000},
        autoscaling={
            "minReplicas": 1, "maxReplicas": MAX_REPLICAS, "prometheusUrl": prometheus_url,
            "evaluationIntervalSeconds": 5, "metricsWindowSeconds": 15, "staleAfterSeconds": 30,
        },
        prewarm={
            "assumedColdStartSeconds": lead_seconds - MARGIN_SECONDS,
            "leadTimeMarginSeconds": MARGIN_SECONDS,
            "learned": {"historyDays": 7},
        },
    )  # fmt: skip


def learned_status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    body = cluster.get_json("inferenceservice", SERVICE, "-n", namespace)
    found: dict[str, Any] = ((body.get("status") or {}).get("autoscaling") or {}).get(
        "learned"
    ) or {}
    return found


def replicas(cluster: Cluster, namespace: str) -> int:
    return int(cluster.get_json("deployment", SERVICE, "-n", namespace)["spec"]["replicas"])


def test_the_floor_is_raised_before_the_forecast_peak(
    cluster: Cluster,
    namespace: str,
    operator: Any,
    history_prometheus: tuple[str, datetime, SyntheticRuntimes],
) -> None:
    url, peak, _ = history_prometheus
    lead = int((peak - datetime.now(UTC)).total_seconds()) - SETUP_SECONDS
    assert lead > MARGIN_SECONDS, f"the peak at {peak} is too close"
    apply(cluster, namespace, learned_service(url, lead))

    # The history is read and fitted; the next rise is the daily peak, the floor not raised yet.
    first = wait_for(
        lambda: (s := learned_status(cluster, namespace)).get("active") and s, timeout=90,
        description=f"an active learned forecast (last: {learned_status(cluster, namespace)})",
    )  # fmt: skip
    seen_at = datetime.now(UTC)
    assert datetime.fromisoformat(first["nextRiseAt"]) == peak, first
    raise_from = datetime.fromisoformat(first["raiseFrom"])
    # The lead is the assumed cold start plus the margin, or the measured one plus the margin
    # once kwok's pods have a cold start to measure.
    assert timedelta(seconds=MARGIN_SECONDS) <= peak - raise_from <= timedelta(seconds=lead)
    assert first["nextRiseRequestsPerSecond"] == pytest.approx(PEAK_RPS, rel=0.05)
    assert re.search(
        r"^learned: \w+days \d\d:\d\d UTC rise to \d+ req/s; floor \d+ from", first["message"]
    )
    assert seen_at < raise_from, "set up too slowly to see the floor before its raise"
    assert first["floorReplicas"] == 0 and replicas(cluster, namespace) == 1

    # Ahead of the peak, the floor (capped at maxReplicas) raises the Deployment's replicas.
    wait_for(
        lambda: replicas(cluster, namespace) == MAX_REPLICAS,
        timeout=max(30.0, (peak - datetime.now(UTC)).total_seconds()),
        description="replicas raised to the learned floor before the peak",
    )
    raised_at = datetime.now(UTC)
    assert raised_at < peak
    assert raised_at >= raise_from - timedelta(seconds=30)  # not much earlier than said
    body = cluster.get_json("inferenceservice", SERVICE, "-n", namespace)
    autoscaling = body["status"]["autoscaling"]
    assert autoscaling["reason"] == "PrewarmLearned", autoscaling
    assert autoscaling["learned"]["floorReplicas"] == MAX_REPLICAS
    events = wait_for(
        lambda: cluster.get_json(
            "events", "-n", namespace, "--field-selector",
            f"involvedObject.name={SERVICE},reason=LearnedFloorChanged",
        )["items"],
        timeout=30, description="a LearnedFloorChanged event",
    )  # fmt: skip
    assert any(f"-> {MAX_REPLICAS}" in event["message"] for event in events)
