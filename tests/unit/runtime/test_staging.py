"""The staging pool never hands out a buffer a host-to-device copy may still be reading.

A GPU copy is asynchronous; here a copy is a thread that reads the buffer after a delay and
records what it saw, and its event is a ``threading.Event`` set when the read is done: the
same ordering contract as ``torch.cuda.Event``, on the CPU.
"""

import threading
from collections.abc import Hashable

import numpy as np

from kiln_runtime.staging import StagingPool


class ThreadCopyEvent:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.waited = False

    def query(self) -> bool:
        return self.done.is_set()

    def synchronize(self) -> None:
        self.waited = True
        self.done.wait(10)


def allocate(key: Hashable) -> np.ndarray:
    return np.zeros(4, dtype=np.int64)


def upload(
    pool: StagingPool[np.ndarray], batch: int, seen: list[int], delay: float
) -> threading.Thread:
    """Stage ``batch`` and 'copy' it to the device asynchronously, as ``_upload_pinned`` does."""
    slot = pool.acquire("int64x4")
    slot.buffer[:] = batch  # what the next batch would overwrite
    event = ThreadCopyEvent()

    def copy() -> None:
        threading.Event().wait(delay)
        seen.append(int(slot.buffer[0]))  # the device reads the host buffer late
        event.done.set()

    copier = threading.Thread(target=copy)
    copier.start()
    pool.release(slot, event)
    return copier


def test_every_copy_reads_its_own_batch_even_when_the_pool_is_exhausted() -> None:
    pool: StagingPool[np.ndarray] = StagingPool(allocate, per_key=2)
    seen: list[int] = []
    # staged faster than the copies complete: the pool must wait for one, not reuse it
    copiers = [upload(pool, batch, seen, delay=0.02) for batch in range(6)]
    for copier in copiers:
        copier.join(10)
    assert sorted(seen) == list(range(6))
    assert pool.buffers == 2  # bounded: waited on the oldest copy instead of allocating


def test_a_completed_copy_frees_its_buffer_for_reuse_without_waiting() -> None:
    pool: StagingPool[np.ndarray] = StagingPool(allocate, per_key=2)
    first = pool.acquire("k")
    done = ThreadCopyEvent()
    done.done.set()
    pool.release(first, done)
    second = pool.acquire("k")
    assert second is first and not done.waited


def test_buffers_in_flight_are_not_handed_out_again() -> None:
    pool: StagingPool[np.ndarray] = StagingPool(allocate, per_key=3)
    busy = pool.acquire("k")
    pending = ThreadCopyEvent()
    pool.release(busy, pending)
    other = pool.acquire("k")
    assert other is not busy and not pending.waited
    pending.done.set()
