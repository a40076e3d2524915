"""Objects from S3 or any S3-compatible store, through boto3.

The only module that talks S3. botocore signs, retries throttling and 5xx on each call, and
honours the workload-identity variables (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE) when no
static keys are given; this module adds resuming a dropped body (``transfer``), maps the store's
errors to the user's reasons, and lists a prefix within the limits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import urllib3.exceptions

from kiln_runtime.fetch.failures import FailureKind, FetchFailure, TransientError
from kiln_runtime.fetch.source import (
    Credentials,
    Limits,
    S3Source,
    StoreSettings,
    relative_path,
)
from kiln_runtime.fetch.verify import STORE_CHECKSUMS, Expected, StoreChecksum, is_multipart_etag

log = logging.getLogger(__name__)
CHUNK_BYTES = 1024 * 1024
HEAD_MIN_BYTES = 16 * 1024 * 1024
"""An object of a prefix this large is asked for its checksum and part size (a HEAD, which
the listing does not answer), so that it is verified by the cheapest check the store offers;
smaller ones keep the listing's ETag, where a request would cost more than the hashing."""

_NOT_FOUND_CODES = {"404", "NoSuchKey", "NoSuchBucket", "NotFound"}
_DENIED_CODES = {
    "403",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
}
# Raised while a response body streams: the connection went away under us.
_STREAM_ERRORS: tuple[type[BaseException], ...] = (
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.IncompleteReadError,
    urllib3.exceptions.HTTPError,
    ConnectionError,
    TimeoutError,
)


@dataclass(frozen=True)
class ObjectInfo:
    """One object to download and where it lands, relative to the model directory."""

    key: str
    relative: PurePosixPath
    expected: Expected


@dataclass(frozen=True)
class Clients:
    """Two boto3 S3 clients of one session (credentials are looked up once)."""

    metadata: Any
    """For HEAD and list: ``limits.metadata_attempts`` short tries, so an unreachable store
    fails in seconds instead of after every patient retry of a transfer."""
    transfer: Any
    """For the GETs of the bodies: ``limits.attempts`` tries of each request, and ``transfer``
    resumes a dropped body on top of them."""


def make_clients(
    settings: StoreSettings, credentials: Credentials | None, limits: Limits
) -> Clients:
    """The S3 clients for these settings (credentials None: boto3's default chain)."""
    session = boto3.session.Session(
        aws_access_key_id=credentials.access_key_id if credentials else None,
        aws_secret_access_key=credentials.secret_access_key if credentials else None,
        aws_session_token=credentials.session_token if credentials else None,
        region_name=settings.region or "us-east-1",
    )
    verify: bool | str = settings.ca_bundle or settings.verify_tls

    def client(connect_timeout: float, attempts: int) -> Any:
        config = botocore.config.Config(
            connect_timeout=connect_timeout,
            read_timeout=limits.read_timeout_seconds,
            # total_max_attempts counts the first try; botocore's max_attempts counts retries.
            retries={"total_max_attempts": attempts, "mode": "standard"},
            s3={"addressing_style": "path" if settings.path_style else "auto"},
            user_agent_extra="kiln-runtime-fetch",
            # The verifier checks every byte once, resumed ranges included; botocore would
            # hash whole-object GETs a second time.
            response_checksum_validation="when_required",
        )
        return session.client("s3", endpoint_url=settings.endpoint, verify=verify, config=config)

    return Clients(
        metadata=client(limits.metadata_connect_timeout_seconds, limits.metadata_attempts),
        transfer=client(limits.connect_timeout_seconds, limits.attempts),
    )


def classify(error: Exception, uri: str, what: str) -> Exception:
    """The FetchFailure or TransientError a boto3 error means."""
    if isinstance(error, botocore.exceptions.ClientError):
        details = error.response.get("Error", {})
        code = str(details.get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        message = str(details.get("Message", "")) or code
        detail = f"{what}: {code} ({message})" if message != code else f"{what}: {code}"
        if code in _NOT_FOUND_CODES or status == 404:
            return FetchFailure(FailureKind.NOT_FOUND, uri, detail)
        if code in _DENIED_CODES or status in (401, 403):
            return FetchFailure(FailureKind.ACCESS_DENIED, uri, detail)
        if code in ("PreconditionFailed",) or status == 412:
            return FetchFailure(
                FailureKind.CHECKSUM_MISMATCH, uri, f"{what}: the object changed while downloading"
            )
        if status >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout"):
            return TransientError(detail)
        return FetchFailure(FailureKind.UNREACHABLE, uri, detail)
    if isinstance(error, botocore.exceptions.NoCredentialsError):
        return FetchFailure(
            FailureKind.ACCESS_DENIED,
            uri,
            "no credentials: name a Secret in spec.model.storage or give the pod an identity",
        )
    if isinstance(error, botocore.exceptions.SSLError):
        return FetchFailure(FailureKind.UNREACHABLE, uri, f"{what}: TLS: {error}")
    # botocore's ConnectionError: refused, timed out connecting, closed; not a `|` with the
    # tuple, which isinstance cannot take (a TypeError instead of the user's reason).
    if isinstance(error, (botocore.exceptions.ConnectionError, *_STREAM_ERRORS)):
        return TransientError(f"{what}: {error}")
    if isinstance(error, botocore.exceptions.BotoCoreError):
        return FetchFailure(FailureKind.UNREACHABLE, uri, f"{what}: {error}")
    return error


def list_objects(client: Any, source: S3Source, limits: Limits) -> list[ObjectInfo]:
    """Every object to download: the one key, or all keys under the prefix, within limits."""
    if not source.is_prefix:
        name = PurePosixPath(source.key).name
        return [ObjectInfo(source.key, PurePosixPath(name), _head(client, source, source.key))]
    objects: list[ObjectInfo] = []
    total = 0
    try:
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=source.bucket, Prefix=source.key
        )
        for page in pages:
            for item in page.get("Contents", []):
                key: str = item["Key"]
                if key.endswith("/"):
                    continue  # a "folder" marker, not a file
                try:
                    relative = relative_path(source.key, key)
                except ValueError as error:
                    raise FetchFailure(FailureKind.INVALID, source.uri, str(error)) from error
                size = int(item["Size"])
                total += size
                objects.append(ObjectInfo(key, relative, _expected(size, item.get("ETag"))))
                if len(objects) > limits.max_objects:
                    raise FetchFailure(
                        FailureKind.TOO_LARGE,
                        source.uri,
                        f"more than the limit of {limits.max_objects} objects",
                    )
                if total > limits.max_bytes:
                    raise FetchFailure(
                        FailureKind.TOO_LARGE,
                        source.uri,
                        f"more than the limit of {limits.max_bytes} bytes",
                    )
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
        raise _as_failure(classify(error, source.uri, "listing"), source.uri) from error
    if not objects:
        raise FetchFailure(FailureKind.NOT_FOUND, source.uri, "no object under this prefix")
    return [
        ObjectInfo(item.key, item.relative, _head(client, source, item.key))
        if (item.expected.size or 0) >= HEAD_MIN_BYTES
        else item
        for item in objects
    ]


def _expected(size: int, etag: object) -> Expected:
    return Expected(size=size, etag=str(etag).strip('"') if etag else None)


def _head(client: Any, source: S3Source, key: str) -> Expected:
    """The object's size, ETag, checksum (of the algorithms the verifier computes) and, for a
    multipart upload, its part size (a HEAD of part 1)."""
    try:
        head = client.head_object(Bucket=source.bucket, Key=key, ChecksumMode="ENABLED")
        checksum = next(
            (
                StoreChecksum(name, str(head[field]))
                for name in STORE_CHECKSUMS
                if (field := f"Checksum{name.upper()}") in head
            ),
            None,
        )
        expected = _expected(int(head["ContentLength"]), head.get("ETag"))
        composite = checksum is not None and "-" in checksum.value
        part_size = None
        if is_multipart_etag(expected.etag) or composite:
            first = client.head_object(Bucket=source.bucket, Key=key, PartNumber=1)
            part_size = int(first["ContentLength"])
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
        raise _as_failure(classify(error, source.uri, "head"), source.uri) from error
    return Expected(size=expected.size, etag=expected.etag, part_size=part_size, checksum=checksum)


def _as_failure(error: Exception, uri: str) -> Exception:
    """Before a body streams there is nothing to resume: a transient error that outlived
    botocore's own retries is final."""
    if isinstance(error, TransientError):
        return FetchFailure(FailureKind.UNREACHABLE, uri, str(error))
    return error


class S3RangeStream:
    """A GET of one object from ``offset`` on, pinned to the ETag listed (If-Match)."""

    def __init__(self, client: Any, source: S3Source, info: ObjectInfo, offset: int) -> None:
        request: dict[str, Any] = {"Bucket": source.bucket, "Key": info.key}
        if info.expected.etag:
            request["IfMatch"] = f'"{info.expected.etag}"'
        if offset:
            request["Range"] = f"bytes={offset}-"
        try:
            response = client.get_object(**request)
        except Exception as error:
            raise classify(error, source.uri, info.key) from error
        self.resumed = offset == 0 or "ContentRange" in response
        self._body = response["Body"]

    def chunks(self) -> Iterator[bytes]:
        try:
            yield from self._body.iter_chunks(CHUNK_BYTES)
        except _STREAM_ERRORS as error:
            raise TransientError(str(error)) from error

    def close(self) -> None:
        self._body.close()
