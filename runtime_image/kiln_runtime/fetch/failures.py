"""Why a download failed: one reason per kind, each with its own exit code.

The message of a ``FetchFailure`` is what the user reads on the InferenceService ("model
download failed: AccessDenied for s3://…"), so it names the cause and the URI, never a secret.
"""

from __future__ import annotations

import enum


class FailureKind(enum.Enum):
    """The reason word the message starts with, and the process's exit code."""

    INVALID = ("InvalidSource", 2)
    NOT_FOUND = ("NotFound", 3)
    ACCESS_DENIED = ("AccessDenied", 4)
    CHECKSUM_MISMATCH = ("ChecksumMismatch", 5)
    TOO_LARGE = ("TooLarge", 6)
    UNREACHABLE = ("Unreachable", 7)
    LOCAL_WRITE = ("LocalWriteFailed", 8)

    @property
    def reason(self) -> str:
        reason: str = self.value[0]
        return reason

    @property
    def exit_code(self) -> int:
        code: int = self.value[1]
        return code


class FetchFailure(Exception):
    """A download that cannot succeed by retrying (or whose retries are spent)."""

    def __init__(self, kind: FailureKind, uri: str, detail: str) -> None:
        super().__init__(f"model download failed: {kind.reason} for {uri}: {detail}")
        self.kind = kind
        self.uri = uri
        self.detail = detail


class TransientError(Exception):
    """A failure worth retrying: a dropped connection, a timeout, a 5xx, throttling."""
