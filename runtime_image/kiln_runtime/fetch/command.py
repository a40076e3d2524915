"""``python -m kiln_runtime fetch``: the init container's whole job, and its exit code.

Exit 0 with the model at ``<dest>/model``; otherwise the exit code of the failure's kind
(``failures.FailureKind``) and its one-line message in the termination log, where the operator
reads it for the InferenceService's Ready condition.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from kiln_runtime.fetch.cache import ModelCache
from kiln_runtime.fetch.failures import FailureKind, FetchFailure, TransientError
from kiln_runtime.fetch.source import (
    DEFAULT_MAX_BYTES,
    Credentials,
    HttpsSource,
    Limits,
    S3Source,
    StoreSettings,
    parse_sha256,
    parse_source,
)
from kiln_runtime.fetch.staging import already_fetched, new_staging, publish
from kiln_runtime.fetch.transfer import Budget, download
from kiln_runtime.fetch.verify import Expected
from kiln_runtime.termination import TERMINATION_LOG, write_termination_log

log = logging.getLogger(__name__)
DEFAULT_CACHE_MAX_BYTES = 256 * 1024**3
ACCESS_KEY_FILE = "AWS_ACCESS_KEY_ID"
SECRET_KEY_FILE = "AWS_SECRET_ACCESS_KEY"
SESSION_TOKEN_FILE = "AWS_SESSION_TOKEN"
CA_BUNDLE_FILE = "ca.crt"


@dataclass(frozen=True)
class FetchResult:
    path: Path
    bytes: int
    seconds: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--uri", required=True, help="s3://bucket/key, s3://bucket/prefix/, https://…"
    )
    parser.add_argument(
        "--dest", type=Path, required=True, help="the volume; the model lands in DEST/model"
    )
    parser.add_argument("--sha256", default=None, help="the expected sha256 of a single file")
    parser.add_argument(
        "--endpoint", default=None, help="an S3-compatible store's URL (default AWS)"
    )
    parser.add_argument("--region", default=None)
    parser.add_argument(
        "--path-style", action="store_true", help="address buckets as ENDPOINT/BUCKET"
    )
    parser.add_argument("--no-verify-tls", dest="verify_tls", action="store_false")
    parser.add_argument(
        "--credentials-dir",
        type=Path,
        default=None,
        help=f"a mounted Secret: {ACCESS_KEY_FILE}, {SECRET_KEY_FILE}, [{SESSION_TOKEN_FILE}], "
        f"[{CA_BUNDLE_FILE}]",
    )
    parser.add_argument(
        "--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="refuse a model larger than this"
    )
    parser.add_argument("--attempts", type=int, default=Limits.attempts, help="tries per object")
    parser.add_argument("--backoff-seconds", type=float, default=Limits.backoff_seconds)
    parser.add_argument("--read-timeout-seconds", type=float, default=Limits.read_timeout_seconds)
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="a volume shared by the model's pods: restore from it, keep downloads in it",
    )
    parser.add_argument("--cache-max-bytes", type=int, default=DEFAULT_CACHE_MAX_BYTES)
    parser.add_argument("--termination-log", type=Path, default=TERMINATION_LOG)
    parser.add_argument("--log-level", default="INFO")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Fetch, and leave the outcome in the termination log; the exit code."""
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        result = fetch(args)
    except FetchFailure as failure:
        log.error("%s", failure)
        write_termination_log(args.termination_log, str(failure))
        return failure.kind.exit_code
    except Exception as error:  # a bug or an error no table knows: still the user's to read
        log.exception("unexpected error")
        message = f"model download failed: {type(error).__name__} for {args.uri}: {error}"
        write_termination_log(args.termination_log, message)
        return 1
    message = f"model fetched: {result.bytes} bytes in {result.seconds:.3f} s from {args.uri}"
    log.info("%s into %s", message, result.path)
    write_termination_log(args.termination_log, message)
    return 0


def fetch(args: argparse.Namespace) -> FetchResult:
    """Download ``args.uri`` into ``<args.dest>/model``, verified. Raises FetchFailure."""
    source = parse_source(args.uri)
    sha256 = parse_sha256(args.sha256, args.uri)
    if args.max_bytes <= 0 or args.attempts <= 0:
        raise FetchFailure(FailureKind.INVALID, args.uri, "limits must be positive")
    limits = Limits(
        max_bytes=args.max_bytes,
        attempts=args.attempts,
        backoff_seconds=args.backoff_seconds,
        read_timeout_seconds=args.read_timeout_seconds,
    )
    credentials, ca_bundle = _read_credentials(args.credentials_dir, args.uri)
    settings = StoreSettings(
        endpoint=args.endpoint,
        region=args.region,
        path_style=args.path_style,
        verify_tls=args.verify_tls,
        ca_bundle=ca_bundle,
    )
    identity = f"{args.uri}\nsha256={sha256 or ''}\n"
    if already_fetched(args.dest, identity):
        log.info("%s is already in %s", args.uri, args.dest)
        return FetchResult(args.dest / "model", 0, 0.0)
    started = time.monotonic()
    try:
        staging = new_staging(args.dest)
    except OSError as error:
        raise FetchFailure(FailureKind.LOCAL_WRITE, args.uri, str(error)) from error
    try:
        budget = Budget(uri=args.uri, max_bytes=limits.max_bytes)
        if isinstance(source, S3Source):
            if sha256 is not None and source.is_prefix:
                raise FetchFailure(FailureKind.INVALID, args.uri, "sha256 needs a single object")
            total = _fetch_s3(
                source,
                cache=None
                if args.cache_dir is None
                else ModelCache(args.cache_dir, args.cache_max_bytes),
                settings=settings,
                credentials=credentials,
                limits=limits,
                budget=budget,
                staging=staging,
                sha256=sha256,
            )
        else:
            total = _fetch_https(
                source,
                settings=settings,
                limits=limits,
                budget=budget,
                staging=staging,
                sha256=sha256,
            )
        try:
            path = publish(staging, args.dest, identity)
        except OSError as error:
            raise FetchFailure(FailureKind.LOCAL_WRITE, args.uri, str(error)) from error
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return FetchResult(path, total, time.monotonic() - started)


def _fetch_s3(
    source: S3Source,
    *,
    cache: ModelCache | None,
    settings: StoreSettings,
    credentials: Credentials | None,
    limits: Limits,
    budget: Budget,
    staging: Path,
    sha256: str | None,
) -> int:
    from kiln_runtime.fetch import s3

    clients = s3.make_clients(settings, credentials, limits)
    objects = s3.list_objects(clients.metadata, source, limits)
    announced = sum(item.expected.size or 0 for item in objects)
    if announced > limits.max_bytes:
        raise FetchFailure(
            FailureKind.TOO_LARGE,
            source.uri,
            f"{announced} bytes is more than the limit of {limits.max_bytes}",
        )
    log.info("%s: %d object(s), %d bytes", source.uri, len(objects), announced)
    cache_key = ModelCache.key(
        source.uri,
        [f"{item.key} {item.expected.size} {item.expected.etag}" for item in objects]
        + [f"sha256 {sha256}"],
    )
    listing = {item.relative: item.expected.size or 0 for item in objects}
    if cache is not None and cache.restore(cache_key, staging, listing) is not None:
        return 0
    total = 0
    for item in objects:
        expected = item.expected
        if sha256 is not None:
            expected = dataclasses.replace(expected, sha256=sha256)
        target = staging / item.relative
        target.parent.mkdir(parents=True, exist_ok=True)

        def open_range(offset: int, item: s3.ObjectInfo = item) -> s3.S3RangeStream:
            return s3.S3RangeStream(clients.transfer, source, item, offset)

        total += download(
            open_range, target, expected=expected, limits=limits, budget=budget, label=item.key
        )
    if cache is not None:
        cache.store(cache_key, staging, total)
    return total


def _fetch_https(
    source: HttpsSource,
    *,
    settings: StoreSettings,
    limits: Limits,
    budget: Budget,
    staging: Path,
    sha256: str | None,
) -> int:
    from kiln_runtime.fetch import https

    pool = https.make_pool(settings, limits)
    try:
        first = https.HttpsRangeStream(pool, source, 0, first=https.first_request_settings(limits))
    except TransientError as error:  # urllib3 has already retried it
        raise FetchFailure(FailureKind.UNREACHABLE, source.uri, str(error)) from error
    if first.length is not None and first.length > limits.max_bytes:
        first.close()
        raise FetchFailure(
            FailureKind.TOO_LARGE,
            source.uri,
            f"{first.length} bytes is more than the limit of {limits.max_bytes}",
        )
    pending: list[https.HttpsRangeStream] = [first]

    def open_range(offset: int) -> https.HttpsRangeStream:
        if pending:
            return pending.pop()
        return https.HttpsRangeStream(pool, source, offset)

    expected = Expected(size=first.length, sha256=sha256)
    return download(
        open_range,
        staging / source.file_name,
        expected=expected,
        limits=limits,
        budget=budget,
        label=source.file_name,
    )


def _read_credentials(directory: Path | None, uri: str) -> tuple[Credentials | None, str | None]:
    """Static keys and a CA bundle from a mounted Secret; (None, None) without one."""
    if directory is None:
        return None, None
    if not directory.is_dir():
        raise FetchFailure(
            FailureKind.INVALID, uri, f"the credentials directory {directory} is missing"
        )

    def read(name: str) -> str | None:
        path = directory / name
        return path.read_text().strip() if path.is_file() else None

    access_key, secret_key = read(ACCESS_KEY_FILE), read(SECRET_KEY_FILE)
    ca_bundle = str(directory / CA_BUNDLE_FILE) if (directory / CA_BUNDLE_FILE).is_file() else None
    if access_key is None and secret_key is None:
        return None, ca_bundle  # a Secret with only a CA bundle: identity from the pod
    if not access_key or not secret_key:
        raise FetchFailure(
            FailureKind.INVALID,
            uri,
            f"the Secret must hold both {ACCESS_KEY_FILE} and {SECRET_KEY_FILE}",
        )
    return Credentials(access_key, secret_key, read(SESSION_TOKEN_FILE)), ca_bundle
