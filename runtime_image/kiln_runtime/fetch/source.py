"""Where to fetch from and how: the URI parsed, and the settings of the store.

Pure: no network, no files. A URI ending in ``/`` is a prefix (a directory-shaped model that
downloads whole); any other names one object, kept under its own file name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from kiln_runtime.fetch.failures import FailureKind, FetchFailure

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_MAX_BYTES = 64 * 1024**3
"""The default size limit of a whole model (all objects of a prefix together): 64 GiB."""
DEFAULT_MAX_OBJECTS = 10_000
"""The most objects a prefix may hold."""


@dataclass(frozen=True)
class S3Source:
    """``s3://bucket/key`` (one object) or ``s3://bucket/prefix/`` (every object under it)."""

    uri: str
    bucket: str
    key: str

    @property
    def is_prefix(self) -> bool:
        return self.key == "" or self.key.endswith("/")


@dataclass(frozen=True)
class HttpsSource:
    """``https://host/path``: one file, kept under the last segment of its path."""

    uri: str

    @property
    def file_name(self) -> str:
        return PurePosixPath(urlsplit(self.uri).path).name


Source = S3Source | HttpsSource


@dataclass(frozen=True)
class StoreSettings:
    """How to reach the store. Every field is optional: AWS's defaults apply."""

    endpoint: str | None = None
    """An S3-compatible store's URL, e.g. https://minio.storage:9000; None is AWS."""
    region: str | None = None
    path_style: bool = False
    """Address buckets as <endpoint>/<bucket> instead of <bucket>.<endpoint>."""
    verify_tls: bool = True
    ca_bundle: str | None = None
    """A PEM file of CAs to trust in addition to the system's."""


@dataclass(frozen=True)
class Credentials:
    """Static keys read from the mounted Secret (without one: boto3's default chain, which
    includes workload identity)."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


@dataclass(frozen=True)
class Limits:
    """Bounds on what one fetch may take."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_objects: int = DEFAULT_MAX_OBJECTS
    attempts: int = 5
    """Tries per object (the first and the retries), each resuming where the last stopped."""
    backoff_seconds: float = 1.0
    """The first pause between tries; doubled each time, up to ``backoff_max_seconds``."""
    backoff_max_seconds: float = 30.0
    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 60.0
    """The longest wait for the next bytes of a response, not for the whole download."""
    metadata_attempts: int = 3
    """Tries of each HEAD or list request, the first calls to the store. Few and short, so
    that an unreachable store (an endpoint that drops packets) is reported within about
    ``metadata_attempts * metadata_connect_timeout_seconds`` — the issue asks a failure to
    reach the InferenceService within 30 s — while the transfer keeps the patient settings."""
    metadata_connect_timeout_seconds: float = 3.0
    """Long enough for one lost SYN (retransmitted after 1 s) and a TLS handshake."""


def parse_source(uri: str) -> Source:
    """The source a URI names, or a FetchFailure(INVALID) saying what is wrong with it."""
    parts = urlsplit(uri)
    if parts.scheme == "s3":
        bucket, key = parts.netloc, parts.path.removeprefix("/")
        if not _BUCKET.match(bucket):
            raise FetchFailure(FailureKind.INVALID, uri, f"{bucket!r} is not a bucket name")
        if parts.query or parts.fragment:
            raise FetchFailure(FailureKind.INVALID, uri, "an s3 URI has no query or fragment")
        if any(segment in (".", "..") for segment in key.split("/")):
            raise FetchFailure(FailureKind.INVALID, uri, "the key has a . or .. segment")
        return S3Source(uri=uri, bucket=bucket, key=key)
    if parts.scheme == "https":
        if not parts.hostname:
            raise FetchFailure(FailureKind.INVALID, uri, "no host")
        name = PurePosixPath(parts.path).name
        if not name or name in (".", ".."):
            raise FetchFailure(FailureKind.INVALID, uri, "the path names no file")
        return HttpsSource(uri=uri)
    raise FetchFailure(FailureKind.INVALID, uri, "only s3:// and https:// are fetched")


def parse_sha256(value: str | None, uri: str) -> str | None:
    """A lower-case hex sha256, or None."""
    if value is None or value == "":
        return None
    digest = value.lower()
    if not _SHA256.match(digest):
        raise FetchFailure(FailureKind.INVALID, uri, "sha256 must be 64 hexadecimal digits")
    return digest


def relative_path(prefix: str, key: str) -> PurePosixPath:
    """Where an object of a prefix lands, relative to the model directory; refuses escapes."""
    relative = PurePosixPath(key.removeprefix(prefix))
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise ValueError(f"object key {key!r} does not stay inside its prefix")
    return relative
