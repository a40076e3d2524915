"""The capacity estimate: a batch-time line fitted from window means, read at the full batch."""

import pytest

from kiln_operator.autoscaling.capacity import BatchWindow, CapacityFit


def window(mean_rows: float, *, overhead: float = 0.6, per_row: float = 0.15) -> BatchWindow:
    """Ten batches per second of `mean_rows` rows on a model whose batch takes
    `overhead + per_row * rows` seconds, one row per request."""
    batches = 10.0
    return BatchWindow(
        rows_per_second=batches * mean_rows,
        batches_per_second=batches,
        compute_seconds_per_second=batches * (overhead + per_row * mean_rows),
        ok_per_second=batches * mean_rows,
    )


def test_two_batch_sizes_fit_the_line_and_give_the_full_batch_capacity() -> None:
    fit = CapacityFit().add(window(1.0)).add(window(3.0))
    estimate = fit.estimate(max_batch_rows=8)
    assert estimate is not None and estimate.fitted
    assert estimate.requests_per_second == pytest.approx(8 / (0.6 + 0.15 * 8))


def test_one_batch_size_is_a_lower_bound_until_the_sizes_spread() -> None:
    fit = CapacityFit()
    for _ in range(20):
        fit = fit.add(window(1.0))
    estimate = fit.estimate(max_batch_rows=8)
    assert estimate is not None and not estimate.fitted
    assert estimate.requests_per_second == pytest.approx(1 / 0.75)  # rows per compute-second
    full = CapacityFit().add(window(8.0)).estimate(max_batch_rows=8)
    assert full is not None and full.fitted  # full batches are the capacity itself
    assert full.requests_per_second == pytest.approx(8 / 1.8)


def test_requests_of_several_rows_divide_the_row_capacity() -> None:
    two_rows = [
        BatchWindow(w.rows_per_second, w.batches_per_second, w.compute_seconds_per_second,
                    w.ok_per_second / 2)
        for w in (window(2.0), window(6.0))
    ]  # fmt: skip
    estimate = CapacityFit().add(two_rows[0]).add(two_rows[1]).estimate(max_batch_rows=8)
    assert estimate is not None
    assert estimate.requests_per_second == pytest.approx(8 / 1.8 / 2)


def test_windows_without_batches_change_nothing_and_old_points_fade() -> None:
    fit = CapacityFit().add(window(2.0))
    idle = BatchWindow(0.0, 0.0, 0.0, 0.0)
    assert fit.add(idle) == fit
    assert CapacityFit().estimate(8) is None
    # The model got twice as fast: after enough new points the estimate follows.
    for size in [1.0, 3.0] * 600:
        fit = fit.add(window(size, overhead=0.3, per_row=0.075))
    estimate = fit.estimate(8)
    assert estimate is not None
    assert estimate.requests_per_second == pytest.approx(8 / 0.9, rel=0.01)


def test_noise_never_gives_a_negative_slope_or_intercept() -> None:
    # A larger batch measured faster than a smaller one: the slope is clamped to 0, so a
    # batch takes the mean time whatever its size.
    fit = CapacityFit().add(window(2.0, overhead=0.5, per_row=0.0))
    fit = fit.add(window(4.0, overhead=0.4, per_row=0.0))
    estimate = fit.estimate(8)
    assert estimate is not None
    assert estimate.requests_per_second == pytest.approx(8 / 0.45, rel=0.01)  # decay
    # Time growing faster than the rows (intercept below 0): proportional to the rows.
    steep = CapacityFit().add(window(1.0, overhead=0.0, per_row=0.1))
    steep = steep.add(window(3.0, overhead=0.0, per_row=0.2))
    estimate = steep.estimate(8)
    assert estimate is not None
    mean_rows, mean_seconds = 2.0, (0.1 + 0.6) / 2
    assert estimate.requests_per_second == pytest.approx(mean_rows / mean_seconds, rel=0.01)


def test_with_a_response_cache_the_capacity_counts_the_hits_a_replica_also_serves() -> None:
    """Cache hits are in kiln_requests_total (the demand and ok rates) but never in a batch:
    rows per request falls with the hit ratio, so the capacity in requests per second rises
    by 1 / (1 - hit ratio), and demand / capacity (the replicas) is what the computed
    requests alone need. Same model, same batches: 90 % hits serve 10x the requests."""
    computed = 100.0  # requests per second that reach the model, one row each, batches of 4
    plain = BatchWindow(computed, computed / 4, computed / 4 * 0.004, ok_per_second=computed)
    cached = BatchWindow(computed, computed / 4, computed / 4 * 0.004, ok_per_second=computed * 10)
    without = CapacityFit().add(plain).estimate(4)
    with_hits = CapacityFit().add(cached).estimate(4)
    assert without is not None and with_hits is not None
    assert with_hits.requests_per_second == pytest.approx(10 * without.requests_per_second)
    assert computed / without.requests_per_second == pytest.approx(
        10 * computed / with_hits.requests_per_second
    )
