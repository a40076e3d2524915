"""A real Prometheus (Debian's package) scraping the local cluster's Kiln pods.

Why it exists: the autoscaler reads p99 and queue depth from Prometheus, so its tests and the
demo need a real one. Debian builds Prometheus without Kubernetes service discovery, so the pod
runner publishes the pods it runs as file-based discovery targets carrying the labels Kubernetes
pod discovery plus the relabelling in docs/autoscaling.md would give (`namespace`, `pod`,
`inferenceservice`). Prometheus reaches the pod IPs through the pod network's bridge.
"""

import json
import shutil
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kiln_localcluster.processes import Started, free_ports, spawn, wait_started
from kiln_localcluster.waiting import http_ok


def scrape_config(targets_file: Path, interval_seconds: float) -> dict[str, Any]:
    """Prometheus configuration: the real node's Kiln pods (``targets``), scraped every
    ``interval_seconds``."""
    interval = f"{round(interval_seconds * 1000)}ms"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [{
            "job_name": "kiln-runtime",
            "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
        }],
    }  # fmt: skip


@dataclass(frozen=True)
class LocalPrometheus:
    """A running Prometheus: its process and its URL."""

    process: Started
    url: str

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as response:
            result: list[dict[str, Any]] = json.load(response)["data"]["result"]
            return result


def available() -> str | None:
    """None when Debian's prometheus is installed, else what is missing."""
    return None if shutil.which("prometheus") else "the `prometheus` binary is not installed"


def start_prometheus(
    targets_file: Path, directory: Path, interval_seconds: float = 1.0
) -> LocalPrometheus:
    """Start Prometheus on a free loopback port and wait until it is ready."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(targets_file, interval_seconds)))
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    process = spawn("prometheus", [
        "prometheus", f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=2h",
        "--log.level=warn",
    ], directory / "prometheus.log")  # fmt: skip

    wait_started(process, lambda: http_ok(f"{url}/-/ready"), timeout=30)
    return LocalPrometheus(process=process, url=url)
