"""The reconcile work queue: one reconcile per key at a time, no duplicates while waiting, a key
added during its reconcile runs again after it, failures retried with backoff."""

import asyncio

from kopf._cogs.aiokits.aiotoggles import ToggleSet

from kiln_operator.k8s.workqueue import Request, WorkQueue


async def settle(seconds: float = 0.05) -> None:
    await asyncio.sleep(seconds)


async def test_a_key_waiting_is_not_queued_twice_and_fresh_reads_are_kept() -> None:
    seen: list[tuple[str, Request]] = []

    async def work(namespace: str, name: str, request: Request) -> None:
        seen.append((name, request))

    queue = WorkQueue(work, workers=1)
    queue.add("ns", "a", trigger="spec")
    queue.add("ns", "a", trigger="child")
    queue.add("ns", "a", trigger="resync", fresh=True)
    queue.add("ns", "b", trigger="child")
    assert len(queue) == 2
    queue.start()
    await settle()
    assert seen == [("a", Request("resync", True, urgent=True)), ("b", Request("child", False))]
    await queue.close()


async def test_a_change_of_the_service_itself_goes_before_child_refreshes_and_resyncs() -> None:
    seen: list[str] = []

    async def work(namespace: str, name: str, request: Request) -> None:
        seen.append(f"{name}:{request.trigger}")

    queue = WorkQueue(work, workers=1)
    queue.add("ns", "old-1", trigger="child")
    queue.add("ns", "old-2", trigger="resync", fresh=True)
    queue.add("ns", "new-1", trigger="spec")
    queue.add("ns", "old-3", trigger="listing", fresh=True)
    queue.add("ns", "old-1", trigger="child")  # still waits behind the urgent keys
    queue.add("ns", "new-2", trigger="spec")
    queue.add("ns", "old-3", trigger="spec")  # promoted, after the urgent keys before it
    queue.start()
    await settle()
    assert seen == ["new-1:spec", "new-2:spec", "old-3:spec", "old-1:child", "old-2:resync"]
    await queue.close()


async def test_one_reconcile_per_key_at_a_time_and_a_change_meanwhile_runs_after_it() -> None:
    running: set[str] = set()
    overlaps: list[str] = []
    runs: list[str] = []
    release = asyncio.Event()

    async def work(namespace: str, name: str, request: Request) -> None:
        if name in running:
            overlaps.append(name)
        running.add(name)
        runs.append(request.trigger)
        if len(runs) == 1:
            await release.wait()
        running.discard(name)

    queue = WorkQueue(work, workers=4)
    queue.start()
    queue.add("ns", "a", trigger="spec")
    await settle()
    queue.add("ns", "a", trigger="child")  # arrives while the first reconcile runs
    queue.add("ns", "a", trigger="child")
    await settle()
    assert runs == ["spec"]
    release.set()
    await settle()
    assert runs == ["spec", "child"]
    assert overlaps == []
    await queue.close()


async def test_a_failure_is_retried_after_its_backoff_and_success_resets_it() -> None:
    attempts: list[str] = []

    async def work(namespace: str, name: str, request: Request) -> None:
        attempts.append(request.trigger)
        if len(attempts) < 3:
            raise RuntimeError("API server timeout")

    queue = WorkQueue(work, workers=1, base_seconds=0.01, cap_seconds=0.02)
    assert [queue.delay_after(n) for n in (1, 2, 3)] == [0.01, 0.02, 0.02]
    queue.start()
    queue.add("ns", "a", trigger="spec")
    await settle(0.2)
    assert attempts == ["spec", "retry", "retry"]
    assert queue._failures == {}  # reset by the success
    await queue.close()


async def test_forget_drops_a_pending_retry() -> None:
    attempts: list[str] = []

    async def work(namespace: str, name: str, request: Request) -> None:
        attempts.append(request.trigger)
        raise RuntimeError("conflict")

    queue = WorkQueue(work, workers=1, base_seconds=0.05)
    queue.start()
    queue.add("ns", "a", trigger="spec")
    await settle(0.01)
    queue.forget("ns", "a")  # deleted meanwhile
    await settle(0.15)
    assert attempts == ["spec"]
    await queue.close()


async def test_a_paused_operator_drops_the_keys_it_takes_and_reconciles_once_resumed() -> None:
    seen: list[str] = []

    async def work(namespace: str, name: str, request: Request) -> None:
        seen.append(name)

    paused = ToggleSet(any)
    peering = await paused.make_toggle(True, name="another replica is active")
    queue = WorkQueue(work, workers=2, paused=paused)
    queue.start()
    queue.add("ns", "a", trigger="spec")  # queued before the pause took effect, or sneaking in
    await settle()
    assert seen == []
    assert len(queue) == 0  # dropped, not kept for later

    await peering.turn_to(False)
    queue.add("ns", "a", trigger="listing", fresh=True)  # the listing after the resume
    await settle()
    assert seen == ["a"]
    await queue.close()
