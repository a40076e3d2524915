"""model_download_failure: why the pods of an s3:// or https:// model cannot start, if they
cannot fetch it.

Why it exists: the fetch init container's failure lives in each pod's status, where a model
owner does not look; its termination message ("model download failed: AccessDenied for
s3://…") belongs on the InferenceService's Ready condition. Pure: pods in, message out.
"""

import re
from dataclasses import dataclass
from typing import Any

from kiln_operator import constants

MESSAGE_MAX_CHARS = 1024
"""A condition message is read by people; the fetcher's line is far shorter than this."""
_FETCHED = re.compile(r"^model fetched: (\d+) bytes in ([0-9.]+) s\b")


@dataclass(frozen=True)
class Download:
    """What one pod's fetch init container downloaded, and how long it took."""

    bytes: int
    seconds: float


def model_download(pod: dict[str, Any]) -> Download | None:
    """The pod's finished fetch, from its init container's termination message, else None."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") != constants.FETCH_CONTAINER:
            continue
        terminated = (status.get("state") or {}).get("terminated") or {}
        if int(terminated.get("exitCode", -1)) != 0:
            return None
        match = _FETCHED.match(str(terminated.get("message") or ""))
        if match is None:
            return None
        return Download(bytes=int(match.group(1)), seconds=float(match.group(2)))
    return None


def model_download_failure(pods: list[dict[str, Any]]) -> str | None:
    """The fetch failure of the first pod (by name) whose fetch init container failed, else
    None. A container that crash-loops reports its last failure through the whole cycle —
    waiting in back-off and running its retry alike — so Ready keeps one reason and message
    (and the event is posted once) until a retry succeeds or the pod goes away."""
    for pod in sorted(pods, key=lambda p: str(p.get("metadata", {}).get("name", ""))):
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
            if status.get("name") != constants.FETCH_CONTAINER:
                continue
            message = _failure(status)
            if message is not None:
                return message
    return None


def _failure(status: dict[str, Any]) -> str | None:
    """The container's current failure, else its last one (while it waits or retries)."""
    state = status.get("state") or {}
    terminated = state.get("terminated") or (status.get("lastState") or {}).get("terminated")
    if not terminated or int(terminated.get("exitCode") or 0) == 0:
        return None
    message = str(terminated.get("message") or "").strip()
    if not message.startswith("model download failed"):
        reason = terminated.get("reason") or "Error"
        detail = f": {message}" if message else ""
        message = (
            f"model download failed: exit code {terminated.get('exitCode')} ({reason}){detail}"
        )
    return message[:MESSAGE_MAX_CHARS]
