"""The runtime's histograms expose exactly what prometheus_client's own would."""

import gc

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from kiln_runtime.errors import METRIC_CODES
from kiln_runtime.metrics import LATENCY_BUCKETS, RuntimeMetrics
from kiln_runtime.server import freeze_startup_objects


def _lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name) and "_created" not in line]


def test_histograms_match_prometheus_client_sample_for_sample() -> None:
    values = [0.00005, 0.00003, 0.0007, 0.001, 0.0011, 0.3, 12.0, 0.0]  # bounds included
    metrics = RuntimeMetrics("m")
    reference_registry = CollectorRegistry()
    reference = Histogram(
        "kiln_request_duration_seconds",
        "End-to-end request latency inside the runtime, from the first byte decoded to "
        "the last byte encoded, by outcome (the same codes as kiln_requests_total).",
        ["model", "protocol", "code"],
        buckets=LATENCY_BUCKETS,
        registry=reference_registry,
    )
    for value in values:
        metrics.request_duration[("grpc", "ok")].observe(value)
        reference.labels("m", "grpc", "ok").observe(value)
    for protocol in ("http", "grpc"):  # an unobserved series is exposed too, with zeros
        for code in METRIC_CODES:
            reference.labels("m", protocol, code)
    ours = _lines(generate_latest(metrics.registry).decode(), "kiln_request_duration_seconds")
    theirs = _lines(generate_latest(reference_registry).decode(), "kiln_request_duration_seconds")
    assert sorted(ours) == sorted(theirs)
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE kiln_request_duration_seconds histogram" in text


def test_batch_sizes_and_stages_are_exposed() -> None:
    metrics = RuntimeMetrics("m")
    metrics.batch_done(16, 0.002)
    metrics.queue_wait(0.0001)
    metrics.stage["forward"].observe(0.001)
    text = generate_latest(metrics.registry).decode()
    assert 'kiln_batch_size_bucket{le="16.0",model="m"} 1.0' in text
    assert 'kiln_batch_size_bucket{le="8.0",model="m"} 0.0' in text
    assert 'kiln_compute_duration_seconds_count{model="m"} 1.0' in text
    assert 'kiln_queue_wait_seconds_sum{model="m"} 0.0001' in text
    assert 'kiln_stage_duration_seconds_count{model="m",stage="forward"} 1.0' in text
    assert 'kiln_stage_duration_seconds_count{model="m",stage="decode"} 0.0' in text


def test_startup_objects_are_frozen_out_of_collection() -> None:
    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
