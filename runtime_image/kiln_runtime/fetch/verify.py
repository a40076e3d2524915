"""Checks that the bytes written are the bytes the store holds: size, ETag, sha256.

Pure: fed the bytes as they stream past, in order. An S3 ETag of a single-part upload is the
MD5 of the object; of a multipart upload, the MD5 of the parts' MD5s followed by ``-<parts>``
(checked when the part size is known). Other ETags (server-side encryption with KMS) are opaque
and only the size is checked against them.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_SINGLE_PART = re.compile(r"^[0-9a-f]{32}$")
_MULTIPART = re.compile(r"^([0-9a-f]{32})-([0-9]+)$")


@dataclass(frozen=True)
class Expected:
    """What the store (or the spec) says the object is."""

    size: int | None = None
    etag: str | None = None
    """The ETag without its quotes."""
    part_size: int | None = None
    """The size of each part but the last, for a multipart ETag."""
    sha256: str | None = None


def etag_is_checkable(etag: str | None) -> bool:
    return etag is not None and bool(_SINGLE_PART.match(etag) or _MULTIPART.match(etag))


def is_multipart_etag(etag: str | None) -> bool:
    return etag is not None and bool(_MULTIPART.match(etag))


class Verifier:
    """Hashes what streams past and says, at the end, whether it matches ``Expected``."""

    def __init__(self, expected: Expected) -> None:
        self.expected = expected
        self.reset()

    def reset(self) -> None:
        """Start over (the server ignored a resume and sends the object from its start)."""
        self.size = 0
        self._sha256 = hashlib.sha256() if self.expected.sha256 else None
        self._etag = self.expected.etag if etag_is_checkable(self.expected.etag) else None
        multipart = is_multipart_etag(self._etag)
        if multipart and self.expected.part_size is None:
            self._etag = None
        self._part_size = self.expected.part_size if multipart else None
        self._part = hashlib.md5(usedforsecurity=False)
        self._part_filled = 0
        self._part_digests: list[bytes] = []

    def update(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self._sha256 is not None:
            self._sha256.update(chunk)
        if self._etag is None:
            return
        if self._part_size is None:
            self._part.update(chunk)
            return
        view = memoryview(chunk)
        while view:
            take = min(len(view), self._part_size - self._part_filled)
            self._part.update(view[:take])
            self._part_filled += take
            view = view[take:]
            if self._part_filled == self._part_size:
                self._part_digests.append(self._part.digest())
                self._part = hashlib.md5(usedforsecurity=False)
                self._part_filled = 0

    def mismatch(self) -> str | None:
        """None when everything checkable matches, else what differs."""
        expected = self.expected
        if expected.size is not None and self.size != expected.size:
            return f"got {self.size} bytes, the store announced {expected.size}"
        if self._sha256 is not None and self._sha256.hexdigest() != expected.sha256:
            return f"sha256 is {self._sha256.hexdigest()}, expected {expected.sha256}"
        if self._etag is None:
            return None
        if self._part_size is None:
            actual = self._part.hexdigest()
        else:
            digests = list(self._part_digests)
            if self._part_filled:
                digests.append(self._part.digest())
            combined = hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest()
            actual = f"{combined}-{len(digests)}"
        if actual != self._etag:
            return f"content hashes to ETag {actual}, the store has {self._etag}"
        return None

    @property
    def checks(self) -> str:
        """What was verified, for the log."""
        done = ["size"] if self.expected.size is not None else []
        if self._etag is not None:
            done.append("etag")
        if self._sha256 is not None:
            done.append("sha256")
        return "+".join(done) or "nothing"
