"""The operator's scheduler: each tracked service's jobs at their own intervals, never two
passes of a job and service at once, nothing for an untracked service, and nothing while kopf's
pause state (here kopf's own ToggleSet, as `kopf_pause_state` returns it) is on."""

import asyncio
import contextlib
import itertools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, cast

import kopf
import pytest
from kopf._cogs.aiokits.aiotoggles import ToggleSet

from kiln_operator import constants
from kiln_operator.handlers import inferenceservice
from kiln_operator.handlers.inferenceservice import RESYNC_SECONDS, _resync_phase
from kiln_operator.k8s.cache import ObjectCache
from kiln_operator.k8s.scheduler import Job, Scheduler, _report_end
from tests.unit.operator.test_child_events import NoOwnWrites, RecordingQueue

# kopf types a decorated handler as its own callback protocol; called here as kopf would.
inferenceservice_event = cast(
    Callable[..., Awaitable[None]], inferenceservice.inferenceservice_event
)


class Recorder:
    """A job that records its passes (service, loop time) and returns the service's interval."""

    def __init__(self, intervals: dict[str, float], first_delay: float = 0.0) -> None:
        self.intervals = intervals
        self.first = first_delay
        self.passes: list[tuple[str, float]] = []
        self.lags: list[float] = []
        self.forgotten: list[str] = []
        self.hold: asyncio.Event | None = None

    def job(self, name: str = "job", retry_seconds: float = 0.05) -> Job:
        return Job(
            name,
            run=self.run,
            first_delay=lambda namespace, service: self.first,
            retry_seconds=retry_seconds,
            lag=self.lags.append,
            forget=lambda namespace, service: self.forgotten.append(service),
        )

    async def run(self, namespace: str, name: str) -> float:
        self.passes.append((name, asyncio.get_running_loop().time()))
        if self.hold is not None:
            await self.hold.wait()
        return self.intervals[name]

    def count(self, name: str) -> int:
        return sum(1 for service, _ in self.passes if service == name)


async def running(paused: ToggleSet, *jobs: Job, concurrency: int = 16) -> Scheduler:
    scheduler = Scheduler(paused, concurrency=concurrency)
    for job in jobs:
        scheduler.add_job(job)
    scheduler.start()
    return scheduler


async def test_each_service_runs_at_its_own_interval_and_later_passes_report_their_lag() -> None:
    recorder = Recorder({"fast": 0.05, "slow": 0.2}, first_delay=0.02)
    scheduler = await running(ToggleSet(any), recorder.job())
    started = asyncio.get_running_loop().time()
    scheduler.track("ns", "fast")
    scheduler.track("ns", "slow")
    scheduler.track("ns", "fast")  # tracked already: no second schedule
    await asyncio.sleep(0.43)
    await scheduler.close()
    assert 5 <= recorder.count("fast") <= 9  # 0.02 + n * 0.05 <= 0.43, a loaded machine later
    assert 2 <= recorder.count("slow") <= 3
    first_pass = min(at for _, at in recorder.passes)
    assert first_pass - started >= 0.02
    assert len(recorder.lags) == len(recorder.passes) - 2  # not for the first passes
    assert max(recorder.lags) < 0.1


async def test_an_untracked_service_is_run_no_more_and_forgotten_even_mid_pass() -> None:
    recorder = Recorder({"a": 0.03, "b": 0.03})
    scheduler = await running(ToggleSet(any), recorder.job())
    scheduler.track("ns", "a")
    scheduler.track("ns", "b")
    await asyncio.sleep(0.1)
    scheduler.untrack("ns", "a")
    assert recorder.forgotten == ["a"]
    passes_of_a = recorder.count("a")
    recorder.hold = asyncio.Event()
    await asyncio.sleep(0.05)  # b's pass now waits
    scheduler.untrack("ns", "b")
    await asyncio.sleep(0.01)
    assert recorder.forgotten == ["a", "b"]  # its cancelled pass forgot it
    await asyncio.sleep(0.1)
    assert recorder.count("a") == passes_of_a
    assert len(scheduler) == 0
    await scheduler.close()


async def test_a_pass_never_overlaps_the_previous_one_and_concurrency_is_bounded() -> None:
    in_flight: set[str] = set()
    overlaps: list[str] = []
    most = 0

    async def run(namespace: str, name: str) -> float:
        nonlocal most
        if name in in_flight:
            overlaps.append(name)
        in_flight.add(name)
        most = max(most, len(in_flight))
        await asyncio.sleep(0.05)  # longer than the interval
        in_flight.discard(name)
        return 0.01

    job = Job("slow", run=run, first_delay=lambda namespace, name: 0.0, retry_seconds=1.0)
    scheduler = await running(ToggleSet(any), job, concurrency=3)
    for index in range(6):
        scheduler.track("ns", f"svc-{index}")
    await asyncio.sleep(0.3)
    await scheduler.close()
    assert overlaps == []
    assert most == 3


async def test_a_failed_pass_is_tried_again_after_the_retry_delay() -> None:
    attempts: list[float] = []

    async def run(namespace: str, name: str) -> float:
        attempts.append(asyncio.get_running_loop().time())
        raise RuntimeError("Prometheus unreachable")

    job = Job("failing", run=run, first_delay=lambda namespace, name: 0.0, retry_seconds=0.05)
    scheduler = await running(ToggleSet(any), job)
    scheduler.track("ns", "a")
    await asyncio.sleep(0.18)
    await scheduler.close()
    assert 3 <= len(attempts) <= 4
    assert all(later - earlier >= 0.05 for earlier, later in itertools.pairwise(attempts))


async def until(predicate: Callable[[], bool], seconds: float) -> None:
    """Until `predicate` holds (or `seconds` pass: the caller's assert then says what failed)."""
    for _ in range(round(seconds / 0.005)):
        if predicate():
            return
        await asyncio.sleep(0.005)


async def test_run_soon_brings_the_next_pass_forward_and_the_one_it_replaces_never_runs() -> None:
    recorder = Recorder({"a": 2.0, "b": 2.0})
    scheduler = await running(ToggleSet(any), recorder.job())
    loop = asyncio.get_running_loop()
    scheduler.track("ns", "a")
    scheduler.track("ns", "b")
    await until(lambda: recorder.count("a") == recorder.count("b") == 1, 1.0)
    asked = loop.time()  # the next passes are due 2 s after the first ones
    scheduler.run_soon("job", "ns", "a")
    scheduler.run_soon("job", "ns", "gone")  # not tracked: nothing
    scheduler.run_soon("other-job", "ns", "a")  # no such job: nothing
    await until(lambda: recorder.count("a") == 2, 1.0)
    assert recorder.count("a") == 2 and recorder.count("b") == 1
    assert recorder.passes[-1][0] == "a" and recorder.passes[-1][1] - asked < 1.0
    await asyncio.sleep(asked + 3.0 - loop.time())
    await scheduler.close()
    # a: the first pass, the one brought forward and one 2 s after it; the pass it replaced
    # (due 2 s after the first) never ran. b: its own two.
    assert recorder.count("a") == 3 and recorder.count("b") == 2
    assert len(recorder.lags) == 2  # a pass brought forward reports no lag


async def test_run_soon_during_a_pass_runs_the_next_right_after_it_never_alongside() -> None:
    recorder = Recorder({"a": 5.0})
    recorder.hold = asyncio.Event()
    scheduler = await running(ToggleSet(any), recorder.job())
    scheduler.track("ns", "a")
    await until(lambda: recorder.count("a") == 1, 1.0)
    scheduler.run_soon("job", "ns", "a")  # the first pass is still running
    await asyncio.sleep(0.05)
    assert recorder.count("a") == 1
    recorder.hold.set()
    await until(lambda: recorder.count("a") == 2, 1.0)
    await scheduler.close()
    assert recorder.count("a") == 2  # right after the first, not 5 s later


async def test_a_paused_operator_runs_nothing_forgets_every_service_and_tracks_anew_after() -> None:
    paused = ToggleSet(any)
    peering = await paused.make_toggle(False, name="another replica is active")
    recorder = Recorder({"a": 0.02, "b": 0.02})
    resync = Recorder({"a": 10.0, "b": 10.0})
    scheduler = await running(paused, recorder.job(), resync.job("resync"))
    scheduler.track("ns", "a")
    await asyncio.sleep(0.05)
    recorder.hold = asyncio.Event()  # the next pass is in flight when the pause comes
    await asyncio.sleep(0.03)

    await peering.turn_to(True)
    await asyncio.sleep(0.01)
    assert sorted(recorder.forgotten) == ["a"]
    assert resync.forgotten == ["a"]
    scheduler.track("ns", "b")  # an event sneaking in while paused
    passes = len(recorder.passes)
    await asyncio.sleep(0.1)
    assert len(recorder.passes) == passes
    assert len(scheduler) == 0

    recorder.hold = None
    await peering.turn_to(False)
    await asyncio.sleep(0.05)
    assert len(recorder.passes) == passes  # nothing is tracked until the listing tracks it
    scheduler.track("ns", "a")
    await asyncio.sleep(0.05)
    assert recorder.count("a") > passes
    assert recorder.count("b") == 0
    await scheduler.close()


async def test_a_job_added_later_runs_on_the_services_tracked_before() -> None:
    recorder = Recorder({"a": 10.0})
    scheduler = await running(ToggleSet(any))
    scheduler.track("ns", "a")
    await asyncio.sleep(0.01)
    scheduler.add_job(recorder.job())
    await asyncio.sleep(0.02)
    await scheduler.close()
    assert recorder.count("a") == 1


async def test_the_services_events_track_it_and_its_deletion_untracks_it_and_forgets_it() -> None:
    recorder = Recorder({"mlp": 10.0}, first_delay=10.0)
    scheduler = Scheduler(ToggleSet(any))
    scheduler.add_job(recorder.job())
    memo = kopf.Memo(
        cache=ObjectCache(), reconciler=NoOwnWrites(), workqueue=RecordingQueue(),
        scheduler=scheduler,
    )  # fmt: skip
    body: dict[str, Any] = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "mlp", "namespace": "ns", "resourceVersion": "1"},
        "spec": {},
    }
    for event in (None, "MODIFIED"):
        await inferenceservice_event(
            type=event, body=body, namespace="ns", name="mlp", meta=body["metadata"], memo=memo
        )
    assert len(scheduler) == 1
    gone = "2026-11-25T00:00:00Z"
    deleting = {**body, "metadata": {**body["metadata"], "deletionTimestamp": gone}}
    await inferenceservice_event(
        type="MODIFIED", body=deleting, namespace="ns", name="mlp", meta=deleting["metadata"],
        memo=memo,
    )  # fmt: skip
    assert len(scheduler) == 0
    assert recorder.forgotten == ["mlp"]


def test_first_resyncs_of_services_seen_together_spread_over_the_interval() -> None:
    phases = [_resync_phase("ns", f"svc-{index:04d}") for index in range(1000)]
    assert all(0.5 * RESYNC_SECONDS <= phase < 1.5 * RESYNC_SECONDS for phase in phases)
    assert _resync_phase("ns", "svc-0001") == _resync_phase("ns", "svc-0001")
    per_second = Counter(int(phase) for phase in phases)
    # 1,000 over 300 s: about 3.3 a second, nowhere a crowd
    assert max(per_second.values()) <= 12
    assert len(per_second) >= 0.9 * RESYNC_SECONDS


async def test_a_scheduling_task_ended_by_an_error_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken() -> None:
        raise RuntimeError("a bug")

    task = asyncio.get_running_loop().create_task(broken(), name="kiln-scheduler")
    with contextlib.suppress(RuntimeError):
        await task
    with caplog.at_level(logging.ERROR):
        _report_end(task)
    assert "kiln-scheduler ended: no more autoscaler passes or resyncs" in caplog.text
