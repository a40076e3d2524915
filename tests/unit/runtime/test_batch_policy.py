"""The adaptive wait: none at low load, bounded by the cap, learned from traffic."""

import math

from kiln_runtime.batch_policy import (
    TrafficStats,
    batch_wait_seconds,
    inline_rows,
    observe_arrival,
    observe_batch,
)

CAP = 0.002


def wait(queued: int, stats: TrafficStats, start: float = 10.0, now: float = 10.0) -> float:
    return batch_wait_seconds(
        queued_rows=queued,
        max_batch_rows=32,
        stats=stats,
        max_delay_seconds=CAP,
        window_start=start,
        now=now,
    )


def test_low_load_dispatches_at_once() -> None:
    assert wait(1, TrafficStats()) == 0.0
    assert wait(1, TrafficStats(typical_batch_rows=1.9, mean_interarrival_seconds=0.0001)) == 0.0


def test_high_load_waits_for_the_expected_batch_within_the_cap() -> None:
    busy = TrafficStats(typical_batch_rows=16.0, mean_interarrival_seconds=0.0001)
    assert math.isclose(wait(4, busy), 12 * 0.0001)
    slow_arrivals = TrafficStats(typical_batch_rows=16.0, mean_interarrival_seconds=0.01)
    assert wait(4, slow_arrivals) == CAP


def test_the_cap_counts_from_the_window_start() -> None:
    busy = TrafficStats(typical_batch_rows=16.0, mean_interarrival_seconds=0.01)
    assert math.isclose(wait(4, busy, start=10.0, now=10.0015), CAP - 0.0015)
    assert wait(4, busy, start=10.0, now=10.003) == 0.0


def test_a_full_batch_or_the_usual_size_goes_now() -> None:
    busy = TrafficStats(typical_batch_rows=16.0, mean_interarrival_seconds=0.01)
    assert wait(32, busy) == 0.0
    assert wait(16, busy) == 0.0


def test_inter_arrival_average_follows_traffic() -> None:
    stats = observe_arrival(TrafficStats(), now=1.0)
    assert math.isinf(stats.mean_interarrival_seconds)
    stats = observe_arrival(stats, now=1.01)
    assert math.isclose(stats.mean_interarrival_seconds, 0.01)
    stats = observe_arrival(stats, now=1.02)
    assert math.isclose(stats.mean_interarrival_seconds, 0.01)


def test_the_typical_batch_is_the_largest_recent_one_and_fades() -> None:
    stats = TrafficStats()
    for rows in (12, 4, 12, 4):  # closed-loop clients split in two groups
        stats = observe_batch(stats, rows)
    assert stats.typical_batch_rows >= 12 * 0.9  # so the next wait aims at them together
    for _ in range(40):
        stats = observe_batch(stats, 1)
    assert stats.typical_batch_rows < 2  # load fell: lone requests go at once again


def test_batches_under_the_limit_compute_inline_interpolated_between_timed_sizes() -> None:
    # the fp32 MLP: 0.4 ms at 8 rows, 1.4 ms at 32; the limit is crossed at 8 + 0.6 / 1.0 * 24
    assert inline_rows({1: 0.0002, 8: 0.0004, 32: 0.0014}, 0.001, 32) == 22


def test_a_model_under_the_limit_at_every_size_computes_every_batch_inline() -> None:
    assert inline_rows({1: 0.0001, 8: 0.0002, 32: 0.0003}, 0.001, 64) == 64


def test_a_model_over_the_limit_at_its_smallest_size_never_computes_inline() -> None:
    assert inline_rows({1: 0.0066}, 0.001, 32) == 0
    assert inline_rows({}, 0.001, 32) == 0


def test_rows_are_rounded_down_and_never_beyond_the_batch_limit() -> None:
    assert inline_rows({4: 0.0009, 8: 0.0009, 16: 0.002}, 0.001, 32) == 8
    assert inline_rows({1: 0.0001, 64: 0.0011}, 0.001, 32) == 32
