"""Retries of failed reconciles: backoff doubles up to a cap, one pending retry per object,
success forgets the failures."""

import asyncio

from kiln_operator.k8s.requeue import Requeue


async def test_a_failure_runs_the_object_again_after_its_backoff() -> None:
    ran: list[tuple[str, str]] = []
    done = asyncio.Event()

    async def run(namespace: str, name: str) -> None:
        ran.append((namespace, name))
        done.set()

    requeue = Requeue(run, base_seconds=0.01, cap_seconds=1)
    assert requeue.failed("ns", "a") == 0.01
    assert requeue.failed("ns", "a") == 0.02  # counted, but still one pending retry
    await asyncio.wait_for(done.wait(), timeout=5)
    await asyncio.sleep(0.05)
    assert ran == [("ns", "a")]
    await requeue.close()


async def test_backoff_doubles_up_to_the_cap_and_success_resets_it() -> None:
    async def run(namespace: str, name: str) -> None:
        return None

    requeue = Requeue(run, base_seconds=1, cap_seconds=5)
    assert [requeue.delay_after(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 5, 5]
    requeue.failed("ns", "a")
    requeue.failed("ns", "a")
    requeue.succeeded("ns", "a")  # also cancels the pending retry
    assert requeue.failed("ns", "a") == 1
    await requeue.close()


async def test_a_success_cancels_the_pending_retry() -> None:
    ran: list[str] = []

    async def run(namespace: str, name: str) -> None:
        ran.append(name)

    requeue = Requeue(run, base_seconds=0.05)
    requeue.failed("ns", "a")
    requeue.succeeded("ns", "a")
    await asyncio.sleep(0.15)
    assert ran == []
    await requeue.close()
