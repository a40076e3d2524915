"""The container's termination log: one line saying why the process exits, for the operator.

Why it exists: the kubelet copies the file into the container's terminated state, where the
operator reads it for the InferenceService's Ready condition (a failed model download, a model
that does not load). Written by both of the runtime's commands, ``fetch`` and ``serve``.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

TERMINATION_LOG = Path("/dev/termination-log")
"""Where the kubelet reads a container's termination message (terminationMessagePath)."""
TERMINATION_MESSAGE_MAX = 4096
"""Kubernetes keeps at most 4096 bytes of a termination message."""


def write_termination_log(path: Path | None, message: str) -> None:
    """Best effort: outside a pod the file may not be writable, and that must not hide the
    process's own outcome (its exit code, its log). None writes nothing."""
    if path is None:
        return
    data = message.encode()[:TERMINATION_MESSAGE_MAX]
    try:
        path.write_bytes(data)
    except OSError as error:
        log.debug("cannot write the termination log %s: %s", path, error)
