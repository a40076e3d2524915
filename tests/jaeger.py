"""A real trace backend for the tests: Jaeger's all-in-one (built from its Go module by
e2e/gotools), and what the trace tests check of a trace it holds. Shared by the runtime process
test on loopback and the real node's test, where the pods export to the node's bridge address."""

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kiln_localcluster.processes import free_ports
from kiln_localcluster.waiting import http_ok, wait_for
from tests.gotools import go_tool

STAGES = ("decode", "queue", "compute", "encode")
UNACCOUNTED_BOUND_SECONDS = 0.002
"""What the stage spans may leave uncovered of a request's span: the hand-back of the batch's
result from the model's thread to the event loop (measured well under 1 ms on an idle host)."""


@contextmanager
def running_jaeger(host: str, log_dir: Path) -> Iterator[tuple[str, str]]:
    """Jaeger all-in-one listening on ``host``, traces in memory: (OTLP/HTTP traces URL, query
    URL)."""
    binary = go_tool("jaeger")
    otlp_http, otlp_grpc, query_http, query_grpc, admin, c_http, c_grpc, a_http, *udp = free_ports(
        11
    )
    flags = {
        "collector.otlp.http.host-port": otlp_http, "collector.otlp.grpc.host-port": otlp_grpc,
        "query.http-server.host-port": query_http, "query.grpc-server.host-port": query_grpc,
        "admin.http.host-port": admin, "collector.http-server.host-port": c_http,
        "collector.grpc-server.host-port": c_grpc, "http-server.host-port": a_http,
        "reporter.grpc.host-port": c_grpc,
        "processor.jaeger-compact.server-host-port": udp[0],
        "processor.jaeger-binary.server-host-port": udp[1],
        "processor.zipkin-compact.server-host-port": udp[2],
    }  # fmt: skip
    args = [str(binary), *(f"--{name}={host}:{port}" for name, port in flags.items())]
    with (log_dir / "jaeger.log").open("wb") as log:
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env={"SPAN_STORAGE_TYPE": "memory"}
        )
    try:
        query = f"http://{host}:{query_http}"
        wait_for(lambda: http_ok(f"{query}/api/services"), timeout=30, description="Jaeger")
        yield f"http://{host}:{otlp_http}/v1/traces", query
    finally:
        # Its spans are in memory: nothing to flush. On SIGTERM Jaeger waits for its own
        # self-tracing exporter, which dials OTLP's default port where nothing listens: 10 s on
        # an idle host, over 30 s once on a loaded one. So it is killed.
        process.kill()
        process.wait(10)


def traceparent(trace_id: str, parent: str) -> str:
    return f"00-{trace_id}-{parent}-01"


def jaeger_trace(query: str, trace_id: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{query}/api/traces/{trace_id}", timeout=5) as answer:
            data: list[dict[str, Any]] = json.load(answer)["data"]
    except OSError:
        return None
    return data[0] if data and len(data[0]["spans"]) >= 1 + len(STAGES) else None


def check_trace(trace: dict[str, Any], parent: str) -> float:
    """The trace holds kiln.infer under `parent` and its stages; returns what the stages leave
    uncovered of the request's span (seconds)."""
    spans = {span["operationName"]: span for span in trace["spans"]}
    root = spans["kiln.infer"]
    assert [(r["refType"], r["spanID"]) for r in root["references"]] == [("CHILD_OF", parent)]
    assert {"key": "span.kind", "type": "string", "value": "server"} in root["tags"]
    covered = 0
    for stage in STAGES:
        span = spans[stage]
        assert {
            "refType": "CHILD_OF",
            "traceID": trace["traceID"],
            "spanID": root["spanID"],
        } in span["references"]
        # Jaeger keeps microseconds, each time rounded on its own: 1 µs of slack
        assert root["startTime"] <= span["startTime"] + 1
        assert span["startTime"] + span["duration"] <= root["startTime"] + root["duration"] + 1
        covered += span["duration"]
    links = [r for r in spans["compute"]["references"] if r["traceID"] != trace["traceID"]]
    assert len(links) == 1  # the batch's span, in a trace of its own
    return float(root["duration"] - covered) / 1e6


def describe(trace: dict[str, Any]) -> str:
    """The trace as a tree of names and durations (what docs/observability.md shows)."""
    spans = {span["operationName"]: span for span in trace["spans"]}
    root = spans["kiln.infer"]
    lines = [f"kiln.infer {root['duration']} µs (trace {trace['traceID']})"]
    for stage in STAGES:
        span = spans[stage]
        offset = span["startTime"] - root["startTime"]
        lines.append(f"  {stage:<8} +{offset:>5} µs  {span['duration']:>5} µs")
    return "\n".join(lines)


def uncovered_by_stages(query: str, sent: list[tuple[str, str]], timeout: float) -> list[float]:
    """Wait for each sent (trace id, parent) in Jaeger, check it (`check_trace`) and print it;
    what the stages leave uncovered of each request's span (seconds)."""
    gaps = []
    for trace_id, parent in sent:
        trace = wait_for(
            lambda trace_id=trace_id: jaeger_trace(query, trace_id),  # type: ignore[misc]
            timeout=timeout,
            description=f"trace {trace_id} in Jaeger",
        )
        gaps.append(check_trace(trace, parent))
        print(describe(trace))
    print(f"uncovered by the stage spans (ms): {[round(g * 1000, 3) for g in gaps]}")
    return gaps
