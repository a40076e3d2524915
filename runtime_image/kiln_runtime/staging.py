"""Page-locked staging buffers for host-to-device copies, each reused only once its copy is done.

A non-blocking upload from a pinned host buffer returns before the GPU has read the buffer.
Reusing that buffer for the next batch at once would overwrite data the previous copy may
still be reading (a data race). So every staged batch takes a buffer whose last copy has
completed (its event says so), a new one while the pool is below its size, or else waits on the
oldest copy. The pool knows nothing of torch: it is given how to allocate a buffer and the
event of each copy, which keeps its logic testable without a GPU.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

B = TypeVar("B")


class CopyEvent(Protocol):
    """What the pool needs of a recorded copy (``torch.cuda.Event`` in production)."""

    def query(self) -> bool: ...  # True once the work recorded before it has completed

    def synchronize(self) -> None: ...  # block until then


@dataclass(eq=False)
class Slot(Generic[B]):
    key: Hashable
    buffer: B
    copied: CopyEvent | None = None  # the last copy that read the buffer; None: never used


class StagingPool(Generic[B]):
    """Up to ``per_key`` buffers per (dtype, size) key, handed out only when free."""

    def __init__(self, allocate: Callable[[Hashable], B], per_key: int = 3) -> None:
        self._allocate = allocate
        self._per_key = per_key
        self._slots: dict[Hashable, collections.deque[Slot[B]]] = {}

    def acquire(self, key: Hashable) -> Slot[B]:
        """A slot whose buffer no copy is reading; the caller fills it, then ``release``s it."""
        slots = self._slots.setdefault(key, collections.deque())
        for slot in slots:
            if slot.copied is None or slot.copied.query():
                slots.remove(slot)
                return slot
        if len(slots) < self._per_key:
            return Slot(key, self._allocate(key))
        oldest = slots.popleft()
        assert oldest.copied is not None  # every pooled slot has been used
        oldest.copied.synchronize()
        return oldest

    def release(self, slot: Slot[B], copied: CopyEvent) -> None:
        """Return ``slot``; ``copied`` completes when the copy reading its buffer has."""
        slot.copied = copied
        self._slots.setdefault(slot.key, collections.deque()).append(slot)

    @property
    def buffers(self) -> int:
        return sum(len(slots) for slots in self._slots.values())
