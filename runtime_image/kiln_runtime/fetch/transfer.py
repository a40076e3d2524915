"""One object into one file: resume after a dropped connection, back off, bound, verify.

Why it exists: S3 and HTTPS differ only in how a byte range is opened; retrying, the size
limit, progress and verification are the same and live here once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kiln_runtime.fetch.failures import FailureKind, FetchFailure, TransientError
from kiln_runtime.fetch.source import Limits
from kiln_runtime.fetch.verify import Expected, Verifier

log = logging.getLogger(__name__)
PROGRESS_EVERY_SECONDS = 5.0
HASH_QUEUE_CHUNKS = 8
_MIB = 1024 * 1024


class RangeStream(Protocol):
    """An open response from ``offset`` on. ``resumed`` is False when the server sent the
    object from its start instead (it ignored the range)."""

    resumed: bool

    def chunks(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...


OpenRange = Callable[[int], RangeStream]


@dataclass
class Budget:
    """The bytes the whole model may still take, shared by every object of a prefix."""

    uri: str
    max_bytes: int
    used: int = 0
    started: float = field(default_factory=time.monotonic)

    def take(self, count: int) -> None:
        self.used += count
        if self.used > self.max_bytes:
            raise FetchFailure(
                FailureKind.TOO_LARGE,
                self.uri,
                f"more than the limit of {self.max_bytes} bytes",
            )

    def give_back(self, count: int) -> None:
        self.used -= count


def backoff_delay(limits: Limits, attempt: int) -> float:
    """The pause after failed try number ``attempt`` (1-based)."""
    return float(min(limits.backoff_seconds * 2 ** (attempt - 1), limits.backoff_max_seconds))


def download(
    open_range: OpenRange,
    target: Path,
    *,
    expected: Expected,
    limits: Limits,
    budget: Budget,
    label: str,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Write the object to ``target``; the byte count, verified. Raises FetchFailure."""
    verifier = Verifier(expected)
    attempt = 0
    try:
        with target.open("wb") as out:
            while True:
                attempt += 1
                try:
                    _one_try(open_range, out, verifier, budget, label)
                    break
                except TransientError as error:
                    if attempt >= limits.attempts:
                        raise FetchFailure(
                            FailureKind.UNREACHABLE,
                            budget.uri,
                            f"{label}: {error} (gave up after {attempt} tries)",
                        ) from error
                    delay = backoff_delay(limits, attempt)
                    log.warning(
                        "%s: %s; try %d of %d in %.1f s, from byte %d",
                        label,
                        error,
                        attempt + 1,
                        limits.attempts,
                        delay,
                        verifier.size,
                    )
                    sleep(delay)
    except OSError as error:
        raise FetchFailure(FailureKind.LOCAL_WRITE, budget.uri, f"{label}: {error}") from error
    mismatch = verifier.mismatch()
    if mismatch is not None:
        raise FetchFailure(FailureKind.CHECKSUM_MISMATCH, budget.uri, f"{label}: {mismatch}")
    log.info("%s: %d bytes, verified %s", label, verifier.size, verifier.checks)
    return verifier.size


def _one_try(
    open_range: OpenRange, out: _Writable, verifier: Verifier, budget: Budget, label: str
) -> None:
    stream = open_range(verifier.size)
    try:
        if not stream.resumed and verifier.size:
            budget.give_back(verifier.size)
            out.seek(0)
            out.truncate()
            verifier.reset()
        expected_size = verifier.expected.size
        received = verifier.size
        last_report = time.monotonic()
        with _Hasher(verifier) as hasher:
            for chunk in stream.chunks():
                received += len(chunk)
                if expected_size is not None and received > expected_size:
                    raise FetchFailure(
                        FailureKind.CHECKSUM_MISMATCH,
                        budget.uri,
                        f"{label}: more bytes than the {expected_size} announced",
                    )
                budget.take(len(chunk))
                out.write(chunk)
                hasher.put(chunk)
                now = time.monotonic()
                if now - last_report >= PROGRESS_EVERY_SECONDS:
                    last_report = now
                    _log_progress(label, received, expected_size, budget)
    finally:
        stream.close()
    if expected_size is not None and verifier.size < expected_size:
        raise TransientError(f"connection closed after {verifier.size} of {expected_size} bytes")


class _Hasher:
    """Hashes on a thread of its own, so that the MD5 (the ETag check, slower than a loopback
    socket) overlaps the next reads and writes: all three release the GIL. A bounded queue keeps
    at most HASH_QUEUE_CHUNKS chunks in memory; leaving the block waits for the thread, so the
    verifier has seen every byte written before any resume or check."""

    def __init__(self, verifier: Verifier) -> None:
        self._verifier = verifier
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=HASH_QUEUE_CHUNKS)
        self._thread = threading.Thread(target=self._run, name="fetch-hash", daemon=True)

    def __enter__(self) -> _Hasher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._queue.put(None)
        self._thread.join()

    def put(self, chunk: bytes) -> None:
        self._queue.put(chunk)

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            self._verifier.update(chunk)


def _log_progress(label: str, done: int, total: int | None, budget: Budget) -> None:
    elapsed = max(time.monotonic() - budget.started, 1e-9)
    of_total = f" of {total / _MIB:.1f} MiB ({100 * done / total:.0f} %)" if total else ""
    log.info(
        "%s: %.1f MiB%s, model so far %.1f MiB at %.1f MiB/s",
        label,
        done / _MIB,
        of_total,
        budget.used / _MIB,
        budget.used / _MIB / elapsed,
    )


class _Writable(Protocol):
    def write(self, data: bytes, /) -> int: ...

    def seek(self, offset: int, /) -> int: ...

    def truncate(self) -> int: ...
