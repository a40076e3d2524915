"""Checks that the bytes written are the bytes the store holds: size, checksum, sha256.

Pure: fed the bytes as they stream past, in order. The store's content check, cheapest first:
- its additional checksum (``x-amz-checksum-crc32``/``-sha1``/``-sha256``, returned with
  ``ChecksumMode=ENABLED``): of the whole object, or for a multipart upload ("COMPOSITE") the
  checksum of the parts' checksums followed by ``-<parts>``. CRC32 runs about 6x faster than
  MD5 here (zlib against hashlib's MD5), and verification is most of the fetcher's CPU;
- else its ETag: of a single-part upload the MD5 of the object; of a multipart upload the MD5
  of the parts' MD5s followed by ``-<parts>``.
Multipart forms need the part size. Checksums the standard library cannot compute (CRC32C,
CRC64NVME) and opaque ETags (server-side encryption with KMS) fall back to the next check, at
worst the size alone. The spec's ``sha256`` pins the content itself and is always checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

_SINGLE_PART = re.compile(r"^[0-9a-f]{32}$")
_MULTIPART = re.compile(r"^([0-9a-f]{32})-([0-9]+)$")
_CHECKSUM = re.compile(r"^([A-Za-z0-9+/=]+)(-[0-9]+)?$")


class _Hash(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...

    def digest(self) -> bytes: ...


class _Crc32:
    """zlib's CRC32 with hashlib's interface; its digest is big-endian, as S3 encodes it."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: bytes | memoryview, /) -> None:
        self._value = zlib.crc32(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(4, "big")


def _md5() -> _Hash:
    return hashlib.md5(usedforsecurity=False)


STORE_CHECKSUMS: dict[str, Callable[[], _Hash]] = {
    "crc32": _Crc32,
    "sha1": lambda: hashlib.sha1(usedforsecurity=False),
    "sha256": hashlib.sha256,
}
"""The store checksums verified, cheapest first, by their S3 name (``ChecksumCRC32`` …)."""


@dataclass(frozen=True)
class StoreChecksum:
    """An ``x-amz-checksum-*`` value: the algorithm and the base64 value, ``-<parts>`` for a
    multipart upload's composite."""

    algorithm: str
    value: str


@dataclass(frozen=True)
class Expected:
    """What the store (or the spec) says the object is."""

    size: int | None = None
    etag: str | None = None
    """The ETag without its quotes."""
    part_size: int | None = None
    """The size of each part but the last, for a multipart ETag or checksum."""
    sha256: str | None = None
    checksum: StoreChecksum | None = None


def etag_is_checkable(etag: str | None) -> bool:
    return etag is not None and bool(_SINGLE_PART.match(etag) or _MULTIPART.match(etag))


def is_multipart_etag(etag: str | None) -> bool:
    return etag is not None and bool(_MULTIPART.match(etag))


@dataclass(frozen=True)
class _Check:
    """One content check: which hash, over parts of what size (None: the whole object), and
    the expected value as the store writes it."""

    name: str
    new_hash: Callable[[], _Hash]
    part_size: int | None
    expected: str
    encode: Callable[[bytes], str]


def _hex(digest: bytes) -> str:
    return digest.hex()


def _base64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _store_check(expected: Expected) -> _Check | None:
    """The check of the store's content hash, cheapest first; None when nothing is checkable."""
    checksum = expected.checksum
    if checksum is not None and checksum.algorithm in STORE_CHECKSUMS:
        match = _CHECKSUM.match(checksum.value)
        composite = bool(match and match.group(2))
        if match and _is_base64(match.group(1)) and (not composite or expected.part_size):
            return _Check(
                checksum.algorithm,
                STORE_CHECKSUMS[checksum.algorithm],
                expected.part_size if composite else None,
                checksum.value,
                _base64,
            )
    etag = expected.etag
    if etag_is_checkable(etag) and etag is not None:
        if not is_multipart_etag(etag):
            return _Check("etag", _md5, None, etag, _hex)
        if expected.part_size:
            return _Check("etag", _md5, expected.part_size, etag, _hex)
    return None


def _is_base64(value: str) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except binascii.Error:
        return False
    return True


class Verifier:
    """Hashes what streams past and says, at the end, whether it matches ``Expected``."""

    def __init__(self, expected: Expected) -> None:
        self.expected = expected
        self._check = _store_check(expected)
        self.reset()

    def reset(self) -> None:
        """Start over (the server ignored a resume and sends the object from its start)."""
        self.size = 0
        self._sha256 = hashlib.sha256() if self.expected.sha256 else None
        self._part: _Hash | None = self._check.new_hash() if self._check else None
        self._part_filled = 0
        self._part_digests: list[bytes] = []

    def update(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self._sha256 is not None:
            self._sha256.update(chunk)
        if self._check is None or self._part is None:
            return
        part_size = self._check.part_size
        if part_size is None:
            self._part.update(chunk)
            return
        view = memoryview(chunk)
        while view:
            take = min(len(view), part_size - self._part_filled)
            self._part.update(view[:take])
            self._part_filled += take
            view = view[take:]
            if self._part_filled == part_size:
                self._part_digests.append(self._part.digest())
                self._part = self._check.new_hash()
                self._part_filled = 0

    def mismatch(self) -> str | None:
        """None when everything checkable matches, else what differs."""
        expected = self.expected
        if expected.size is not None and self.size != expected.size:
            return f"got {self.size} bytes, the store announced {expected.size}"
        if self._sha256 is not None and self._sha256.hexdigest() != expected.sha256:
            return f"sha256 is {self._sha256.hexdigest()}, expected {expected.sha256}"
        check = self._check
        if check is None or self._part is None:
            return None
        if check.part_size is None:
            actual = check.encode(self._part.digest())
        else:
            digests = list(self._part_digests)
            if self._part_filled:
                digests.append(self._part.digest())
            combined = check.new_hash()
            combined.update(b"".join(digests))
            actual = f"{check.encode(combined.digest())}-{len(digests)}"
        if actual != check.expected:
            label = "ETag" if check.name == "etag" else f"{check.name} checksum"
            return f"content hashes to {label} {actual}, the store has {check.expected}"
        return None

    @property
    def checks(self) -> str:
        """What was verified, for the log."""
        done = ["size"] if self.expected.size is not None else []
        if self._check is not None:
            done.append(self._check.name)
        if self._sha256 is not None:
            done.append("sha256")
        return "+".join(done) or "nothing"
