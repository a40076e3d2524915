"""Every dashboard panel's PromQL returns data from a real Prometheus holding Kiln's real
metrics: a runtime process on loopback under load, and the operator's metric definitions served
by `operator_metrics_process`, both scraped every second with the labels Kubernetes pod
discovery gives (`namespace`, `inferenceservice`). The same Prometheus draws the service
dashboard's main panels with matplotlib (docs/observability.md shows them: set
KILN_RENDER_DASHBOARD=1 to write docs/observability/service-dashboard.png after a longer run)."""

import http.client
import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln_localcluster import prometheus
from kiln_localcluster.processes import free_ports, stop
from kiln_localcluster.waiting import wait_for
from kiln_runtime.examples import write_example
from tests.integration.runtime.runtime_process import HOST, Runtime, running
from tests.sessioncluster import REPO
from tools import dashboards

pytestmark = pytest.mark.integration

NAMESPACE, SERVICE = "models", "svc"
RENDER = os.environ.get("KILN_RENDER_DASHBOARD") == "1"
LOAD_SECONDS = 60.0 if RENDER else 8.0
"""How long the load runs (rate windows need a few scrapes; the docs' picture a longer run)."""
PICTURE = REPO / "docs" / "observability" / "service-dashboard.png"


def concrete(expr: str, window: str) -> str:
    """The panel's query as Grafana would send it for this service."""
    return (
        expr.replace("$namespace", NAMESPACE)
        .replace("$inferenceservice", SERVICE)
        .replace("$__rate_interval", window)
    )


def infer_body(value: float) -> bytes:
    tensor = {"name": "INPUT__0", "datatype": "FP32", "shape": [1, 512], "data": [value] * 512}
    return json.dumps({"inputs": [tensor]}).encode()


def load(runtime: Runtime, seconds: float, stop: threading.Event) -> int:
    """Paced requests from 4 threads for `seconds` (at most 60,000): 50 a second each, 150 in
    the run's middle third, so the picture shows load rise and fall; the count answered."""
    answered = [0]
    body = infer_body(0.5)
    started = time.monotonic()

    def client() -> None:
        connection = http.client.HTTPConnection(HOST, runtime.http_port, timeout=10)
        sent, due = 0, time.monotonic()
        while not stop.is_set() and time.monotonic() - started < seconds and sent < 15_000:
            share = (time.monotonic() - started) / seconds
            due += 1 / (150 if 1 / 3 < share < 2 / 3 else 50)
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            connection.request("POST", "/v2/models/mlp/infer", body=body)
            response = connection.getresponse()
            response.read()
            sent += 1
            answered[0] += response.status == 200
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answered[0]


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[tuple[Runtime, Any]]:
    """A runtime and the operator's metrics, scraped by a real Prometheus."""
    if (missing := prometheus.available()) is not None:
        pytest.fail(f"{missing}: run `make system-deps`")
    (operator_port,) = free_ports(1)
    operator = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.observability.operator_metrics_process",
         str(operator_port), NAMESPACE, SERVICE],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=(tmp_path / "operator.log").open("wb"),
    )  # fmt: skip
    try:
        model = tmp_path / "mlp"
        write_example("mlp", model)
        with running(model, tmp_path) as runtime:
            targets = tmp_path / "targets.json"
            pod = {"namespace": NAMESPACE, "inferenceservice": SERVICE, "pod": "svc-abc"}
            targets.write_text(
                json.dumps(
                    [
                        {"targets": [f"{HOST}:{runtime.metrics_port}"], "labels": pod},
                        {"targets": [f"{HOST}:{operator_port}"], "labels": {"job": "operator"}},
                    ]
                )
            )
            server = prometheus.start_prometheus(targets, tmp_path / "prometheus")
            try:
                yield runtime, server
            finally:
                stop(server.process)
    finally:
        operator.terminate()
        operator.wait(30)


def test_every_dashboard_panel_returns_data_for_a_service_under_load(
    scraped: tuple[Runtime, Any], tmp_path: Path
) -> None:
    runtime, server = scraped
    stop = threading.Event()
    started = time.time()
    answered = load(runtime, LOAD_SECONDS, stop)
    assert answered > 50
    wait_for(
        lambda: server.query('kiln_operator_workqueue_depth{job="operator"}'),
        timeout=30,
        description="the operator's metrics scraped",
    )
    empty = []
    for dashboard in dashboards.DASHBOARDS:
        for panel in dashboard.panels:
            for legend, expr in panel.queries:
                result = server.query(concrete(expr, "10s"))
                values = [float(item["value"][1]) for item in result]
                if not [v for v in values if not math.isnan(v)]:
                    empty.append(f"{dashboard.uid} / {panel.title} / {legend}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
    picture = PICTURE if RENDER else tmp_path / "service-dashboard.png"
    render(server.url, started, time.time(), picture)
    assert picture.stat().st_size > 10_000


def query_range(url: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 1})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{query}", timeout=10) as answer:
        result: list[dict[str, Any]] = json.load(answer)["data"]["result"]
        return result


def render(url: str, start: float, end: float, out: Path) -> None:
    """The service dashboard's first four panels, drawn from the same queries."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboards.SERVICE_DASHBOARD.panels[:4]
    figure, axes = plt.subplots(2, 2, figsize=(12, 6.5), constrained_layout=True)
    for axis, panel in zip(axes.flat, panels, strict=True):
        for legend, expr in panel.queries:
            window = "10s"
            for series in query_range(url, concrete(expr, window), start, end):
                times = [float(t) - start for t, _ in series["values"]]
                values = [float(v) for _, v in series["values"]]
                if panel.unit == "s":
                    values = [v * 1000 for v in values]
                label = legend.replace("{{code}}", series["metric"].get("code", ""))
                axis.plot(times, values, label=label, linestyle="--" if "SLO" in legend else "-")
        axis.set_title(panel.title + (" (ms)" if panel.unit == "s" else ""))
        axis.set_xlabel("seconds")
        axis.legend(loc="upper right", fontsize="small")
        axis.grid(alpha=0.3)
    figure.suptitle(f"{dashboards.SERVICE_DASHBOARD.title}: {NAMESPACE}/{SERVICE}")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)
    plt.close(figure)
