"""The adaptive wait: none at low load, bounded by the cap, learned from traffic; halves when
the clients leave the server idle."""

import math

import pytest

from kiln_runtime.batch_policy import (
    INLINE_BELOW_SECONDS,
    SHARED_CPU_INLINE_BELOW_SECONDS,
    BatchPlan,
    TrafficStats,
    batch_overhead,
    batch_plan,
    batch_wait_seconds,
    inline_limit_seconds,
    inline_rows,
    observe_arrival,
    observe_dispatch,
)

CAP = 0.002


def wait(
    queued: int,
    stats: TrafficStats,
    start: float = 10.0,
    now: float = 10.0,
    overhead: float = math.inf,
) -> float:
    return batch_wait_seconds(
        queued_rows=queued,
        target_rows=batch_plan(stats, 32, overhead).target_rows,
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


def dispatch(
    stats: TrafficStats, now: float, busy: float, rows: int, waiting: int | None = None
) -> TrafficStats:
    return observe_dispatch(
        stats,
        now=now,
        busy_seconds=busy,
        rows=rows,
        waiting_rows=rows if waiting is None else waiting,
        plan=BatchPlan(rows, rows),
    )


def test_idle_time_is_the_part_of_the_time_between_dispatches_the_server_was_not_busy() -> None:
    stats = dispatch(TrafficStats(), now=1.0, busy=5.0, rows=16)
    assert stats.idle_seconds_per_row == 0.0  # nothing to measure from yet
    stats = dispatch(stats, now=1.002, busy=5.0012, rows=16)  # 2 ms apart, 1.2 busy
    assert math.isclose(stats.idle_seconds_per_row, 0.0008 / 16)
    stats = dispatch(stats, now=1.004, busy=5.0032, rows=16)  # busy throughout: none idle
    assert stats.recent_idle_per_row == pytest.approx((0.0008 / 16, 0.0))
    # busy beyond the time (the model's thread on another core) is not negative idle time
    stats = dispatch(stats, now=1.005, busy=5.01, rows=16)
    assert stats.recent_idle_per_row == pytest.approx((0.0008 / 16, 0.0, 0.0))
    assert stats.idle_seconds_per_row == pytest.approx(0.0, abs=1e-12)  # the median


def test_one_pause_does_not_move_the_idle_time() -> None:
    stats, now, busy = TrafficStats(), 1.0, 0.0
    for pause in (0.0, 0.0, 0.0, 0.0, 0.05, 0.0, 0.0, 0.0, 0.0):  # 50 ms idle once
        now, busy = now + 0.001 + pause, busy + 0.001
        stats = dispatch(stats, now=now, busy=busy, rows=16)
    assert len(stats.recent_idle_per_row) == 8  # the last 8 batches
    assert stats.idle_seconds_per_row == 0.0
    for _ in range(5):  # idle before most batches: it counts
        now += 0.002
        stats = dispatch(stats, now=now, busy=busy, rows=16)
    assert math.isclose(stats.idle_seconds_per_row, 0.002 / 16)


def test_the_typical_batch_is_the_most_rows_recently_waiting_and_fades() -> None:
    stats = TrafficStats()
    for rows in (12, 4, 12, 4):  # closed-loop clients split in two groups
        stats = dispatch(stats, 1.0, 0.0, rows)
    assert stats.typical_batch_rows >= 12 * 0.9  # so the next wait aims at them together
    stats = dispatch(stats, 1.0, 0.0, rows=8, waiting=16)  # half of 16 waiting taken: 16
    assert stats.typical_batch_rows == 16
    for _ in range(40):
        stats = dispatch(stats, 1.0, 0.0, 1)
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


def test_a_cpu_model_computing_on_every_cpu_runs_longer_batches_inline() -> None:
    # one CPU, one torch thread (the benchmark's server; the default is a thread per CPU):
    # a model thread would only take turns with the loop, so batches up to 4 ms stay inline
    assert inline_limit_seconds(computes_on_cpu=True, compute_threads=1, cpus=1) == 0.004
    assert inline_limit_seconds(computes_on_cpu=True, compute_threads=8, cpus=8) == 0.004
    assert SHARED_CPU_INLINE_BELOW_SECONDS > INLINE_BELOW_SECONDS
    # the fp32 MLP on a slow host: 1.4 ms at 8 rows, 5 ms at 32: inline up to 25 rows, not 5
    assert inline_rows({1: 0.0004, 8: 0.0014, 32: 0.005}, 0.004, 32) == 25
    assert inline_rows({1: 0.0004, 8: 0.0014, 32: 0.005}, 0.001, 32) == 5


def test_a_thread_that_can_overlap_the_loop_keeps_the_short_limit() -> None:
    # a CPU left to the loop, a GPU computing, or threads unknown: hand off past 1 ms
    assert inline_limit_seconds(computes_on_cpu=True, compute_threads=1, cpus=2) == 0.001
    assert inline_limit_seconds(computes_on_cpu=False, compute_threads=1, cpus=1) == 0.001
    assert inline_limit_seconds(computes_on_cpu=True, compute_threads=None, cpus=1) == 0.001


def test_clients_idling_the_server_over_twice_what_a_batch_costs_get_halves() -> None:
    # 16 rows a batch, 25 µs idle per row: 0.4 ms per batch, over twice the 0.1 ms one more
    # batch costs. Batches aim at 8 and hold no more: the other 8 form the next.
    slow_clients = TrafficStats(16.0, 0.0001, idle_seconds_per_row=0.000025)
    assert batch_plan(slow_clients, 32, 0.0001) == BatchPlan(8, 8, halves=True)
    assert wait(8, slow_clients, overhead=0.0001) == 0.0
    assert math.isclose(wait(7, slow_clients, overhead=0.0001), 0.0001)
    # Over once but not twice: whole batches, unless halves are already what made it so.
    assert batch_plan(slow_clients, 32, 0.0003) == BatchPlan(16, 32)
    halving = TrafficStats(16.0, 0.0001, idle_seconds_per_row=0.000025, halves=True)
    assert batch_plan(halving, 32, 0.0003) == BatchPlan(8, 8, halves=True)
    assert batch_plan(halving, 32, 0.0005) == BatchPlan(16, 32)
    # Odd sizes round the half up; a batch of one is not split.
    assert batch_plan(TrafficStats(5.0, 0.0001, idle_seconds_per_row=1.0), 32, 0.0).max_rows == 3
    assert batch_plan(TrafficStats(1.0, 0.0001, idle_seconds_per_row=1.0), 32, 0.0).max_rows == 32


def test_clients_that_keep_the_server_busy_get_whole_batches() -> None:
    busy_server = TrafficStats(16.0, 0.00005, idle_seconds_per_row=0.0)
    assert batch_plan(busy_server, 32, 0.0) == BatchPlan(16, 32)
    assert math.isclose(wait(8, busy_server, overhead=0.0), 8 * 0.00005)
    # Before the model's cost is known (infinite), never halves.
    idle = TrafficStats(16.0, 0.0001, idle_seconds_per_row=1.0)
    assert batch_plan(idle, 32, math.inf) == BatchPlan(16, 32)


def test_the_batch_overhead_is_the_timings_line_taken_back_to_zero_rows() -> None:
    assert math.isclose(batch_overhead({1: 0.00015, 8: 0.0005, 32: 0.0014}), 0.0001)
    assert batch_overhead({4: 0.002}) == 0.002  # one size: all of it
    assert batch_overhead({1: 0.0001, 2: 0.0003}) == 0.0  # steeper than linear: none
    assert batch_overhead({1: 0.0005, 2: 0.0004}) == 0.0005  # noise: at most the smallest's
    assert math.isinf(batch_overhead({}))
