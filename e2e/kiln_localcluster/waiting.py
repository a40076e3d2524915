"""Deadline-bounded waiting: the one way Kiln's tests and tools wait for a condition.

Why it exists: a bare sleep either wastes time or flakes; a wait that polls a predicate until a
deadline and then fails naming what it waited for does neither.
"""

import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.2,
    description: str,
) -> T:
    """Return the first truthy value of ``predicate()``; raise ``TimeoutError`` at the deadline.

    An exception raised by the predicate counts as "not yet"; the last one is chained to the
    ``TimeoutError`` so a failure says why the condition never held.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
        except Exception as error:  # the condition may legitimately error until it holds
            last_error = error
        else:
            if value:
                return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {description}") from (
                last_error
            )
        time.sleep(interval)


def http_ok(url: str) -> bool:
    """True when ``url`` answers 200 within a second: a health probe for ``wait_for``."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False
