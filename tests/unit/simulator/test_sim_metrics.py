"""The simulated Prometheus: quantiles with bucket error, windows, lag, outages."""

import math

import numpy as np
import pytest

from kiln_operator.simulator.model import LATENCY_BUCKETS
from kiln_operator.simulator.prometheus import (
    BatchCounters,
    PrometheusDown,
    PrometheusView,
    Scrapes,
    histogram_quantile,
)


def cumulative(per_bucket: list[int]) -> np.ndarray:
    assert len(per_bucket) == len(LATENCY_BUCKETS) + 1
    return np.cumsum(np.array(per_bucket, dtype=np.int64))


def test_quantile_interpolates_inside_the_bucket() -> None:
    # 100 observations, all in (1.0, 2.5]: the 99th lands 99 % of the way through the bucket.
    counts = cumulative([0, 0, 0, 0, 0, 0, 100, 0, 0, 0])
    assert histogram_quantile(0.99, counts) == pytest.approx(1.0 + 1.5 * 0.99)


def test_quantile_in_the_inf_bucket_is_the_highest_bound_and_empty_is_nan() -> None:
    assert histogram_quantile(0.99, cumulative([0] * 9 + [10])) == LATENCY_BUCKETS[-1]
    assert math.isnan(histogram_quantile(0.99, cumulative([0] * 10)))


def scrapes() -> Scrapes:
    store = Scrapes(interval=15.0)
    for step in range(9):
        counts = cumulative([0, 0, 0, 0, 10 * step, 0, 0, 0, 0, 0])
        # Batches of 6 rows taking 1.5 s each: 5 per scrape interval.
        batches = BatchCounters(
            rows=30 * step, batches=5 * step, compute_seconds=7.5 * step, ok=30 * step
        )
        store.record(
            15.0 * step, counts, requests=30 * step, queue=step, busy_seconds=7.5 * step,
            ready=2, batches=batches,
        )  # fmt: skip
    return store


def test_rate_uses_the_window_and_the_newest_visible_scrape() -> None:
    view = PrometheusView(scrapes())
    assert view.request_rate(120.0, 60.0) == pytest.approx(2.0)
    # At 134 s the newest sample is still the one of 120 s: the lag of a 15 s scrape.
    assert view.sample_time(134.0) == 120.0
    assert view.queue_per_replica(134.0) == pytest.approx(8 / 2)
    assert view.utilization(120.0, 60.0) == pytest.approx(0.25)
    assert view.p99(120.0, 60.0) == pytest.approx(0.25 + 0.25 * 0.99)


def test_batch_window_gives_the_rates_the_operator_reads() -> None:
    window = PrometheusView(scrapes()).batch_window(134.0, 60.0)
    assert window is not None
    assert window.rows_per_second / window.batches_per_second == pytest.approx(6.0)
    assert window.compute_seconds_per_second / window.batches_per_second == pytest.approx(1.5)
    assert window.ok_per_second == pytest.approx(2.0)
    assert PrometheusView(scrapes()).batch_window(0.0, 60.0) is None  # one scrape: no rate


def test_outage_and_no_data_fail_the_query() -> None:
    view = PrometheusView(scrapes(), outage=(60.0, 120.0))
    with pytest.raises(PrometheusDown, match="refused"):
        view.request_rate(90.0, 60.0)
    assert view.request_rate(120.0, 60.0) == pytest.approx(2.0)
    with pytest.raises(PrometheusDown, match="no samples"):
        PrometheusView(Scrapes(interval=15.0)).p99(0.0, 60.0)
