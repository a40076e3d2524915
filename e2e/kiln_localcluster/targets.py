"""Prometheus scrape targets for Kiln's pods, as file-based discovery.

Why it exists: Debian's Prometheus is built without Kubernetes service discovery, so the local
cluster publishes the pods' metrics endpoints itself, labelled as Kubernetes pod discovery would
label them: a small loop publishes the Kiln pods the real node's kubelet runs (the fake GPU
nodes run no container, so they have nothing to scrape).
"""

import json
import signal
import ssl
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Protocol

POLL_SECONDS = 1.0
INFERENCESERVICE_LABEL = "serving.kiln.dev/inferenceservice"
TRACK_LABEL = "serving.kiln.dev/track"
"""A canary's pods carry it (spec.rollout.canary); it becomes the series label `kiln_track`."""

Pod = dict[str, Any]


class Api(Protocol):
    def get(self, path: str, **query: str) -> Any: ...


class ApiReader:
    """Read-only GETs against the local API server with the admin identity."""

    def __init__(self, server: str, context: ssl.SSLContext) -> None:
        self.server = server
        self.context = context

    def get(self, path: str, **query: str) -> Any:
        url = f"{self.server}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, context=self.context, timeout=10) as response:
            return json.load(response)


def targets_file(state: Path) -> Path:
    """Where a cluster's scrape targets are published, for its state directory."""
    return state / "prometheus-targets.json"


def scrape_target(pod: Pod) -> dict[str, Any] | None:
    """A file_sd entry for the pod's `metrics` container port, or None if it has none."""
    container = pod["spec"]["containers"][0]
    port = next(
        (p["containerPort"] for p in container.get("ports", []) if p.get("name") == "metrics"),
        None,
    )
    if port is None:
        return None
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    series_labels = {
        "namespace": meta["namespace"],
        "pod": meta["name"],
        "inferenceservice": labels.get(INFERENCESERVICE_LABEL, ""),
    }
    if labels.get(TRACK_LABEL):
        series_labels["kiln_track"] = labels[TRACK_LABEL]
    return {"targets": [f"{pod['status']['podIP']}:{port}"], "labels": series_labels}


def write_targets(path: Path, targets: list[dict[str, Any]]) -> None:
    """Replace the targets file in one rename, and only when its content changed."""
    text = json.dumps(targets, indent=1, sort_keys=True)
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def node_targets(api: Api, node: str) -> list[dict[str, Any]]:
    """The targets of the running Kiln pods the kubelet of ``node`` runs."""
    pods = api.get(
        "/api/v1/pods",
        fieldSelector=f"spec.nodeName={node},status.phase=Running",
        labelSelector=INFERENCESERVICE_LABEL,
    )["items"]
    live = sorted(
        (
            p
            for p in pods
            if p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")
        ),
        key=lambda p: str(p["metadata"]["uid"]),
    )
    return [target for pod in live if (target := scrape_target(pod)) is not None]


def publish_forever(api: Api, node: str, path: Path) -> None:
    """Publish ``node``'s Kiln pods as targets until SIGTERM or SIGINT."""
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    while not stopping.is_set():
        try:
            write_targets(path, node_targets(api, node))
        except OSError as error:  # API server briefly unavailable: try again next pass
            print(f"[targets] {error}", file=sys.stderr, flush=True)
        stopping.wait(POLL_SECONDS)
