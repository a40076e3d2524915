"""One file over HTTPS, through urllib3 (the HTTP client botocore itself is built on).

urllib3 retries failed connections and 429/5xx answers with backoff before any body arrives;
the first request of a fetch takes the short metadata settings (few tries, a short connect
timeout) so an unreachable host is reported within seconds, as S3's HEAD is; a body cut short
is resumed by ``transfer`` with a Range request (a server that ignores the range sends the
whole file again, and the download starts over).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import urllib3
import urllib3.exceptions

from kiln_runtime.fetch.failures import FailureKind, FetchFailure, TransientError
from kiln_runtime.fetch.s3 import CHUNK_BYTES
from kiln_runtime.fetch.source import HttpsSource, Limits, StoreSettings

log = logging.getLogger(__name__)
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def _retries(limits: Limits, attempts: int) -> urllib3.Retry:
    return urllib3.Retry(
        total=attempts - 1,
        redirect=5,
        backoff_factor=limits.backoff_seconds,
        backoff_max=limits.backoff_max_seconds,
        status_forcelist=_RETRY_STATUSES,
        allowed_methods=frozenset({"GET"}),
        raise_on_status=False,
    )


def make_pool(settings: StoreSettings, limits: Limits) -> urllib3.PoolManager:
    retries = _retries(limits, limits.attempts)
    timeout = urllib3.Timeout(
        connect=limits.connect_timeout_seconds, read=limits.read_timeout_seconds
    )
    if not settings.verify_tls:
        # Said once in the fetch log instead of urllib3's warning on every request.
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        log.warning("TLS certificates are not verified (tlsVerify is false)")
        return urllib3.PoolManager(cert_reqs="CERT_NONE", retries=retries, timeout=timeout)
    return urllib3.PoolManager(
        cert_reqs="CERT_REQUIRED", ca_certs=settings.ca_bundle, retries=retries, timeout=timeout
    )


def first_request_settings(limits: Limits) -> tuple[urllib3.Retry, urllib3.Timeout]:
    """Retries and timeout of a fetch's first GET: it plays the part of S3's HEAD (does the
    host answer at all?), so it is bounded as that is, by the metadata settings."""
    timeout = urllib3.Timeout(
        connect=limits.metadata_connect_timeout_seconds, read=limits.read_timeout_seconds
    )
    return _retries(limits, limits.metadata_attempts), timeout


class HttpsRangeStream:
    """A GET from ``offset`` on; ``first`` (the fetch's first request) is bounded by
    ``first_request_settings`` instead of the pool's patient ones."""

    def __init__(
        self,
        pool: urllib3.PoolManager,
        source: HttpsSource,
        offset: int,
        first: tuple[urllib3.Retry, urllib3.Timeout] | None = None,
    ) -> None:
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            if first is None:
                response = pool.request("GET", source.uri, headers=headers, preload_content=False)
            else:
                retries, timeout = first
                response = pool.request(
                    "GET", source.uri, headers=headers, preload_content=False,
                    retries=retries, timeout=timeout,
                )  # fmt: skip
        except urllib3.exceptions.SSLError as error:
            raise FetchFailure(FailureKind.UNREACHABLE, source.uri, f"TLS: {error}") from error
        except urllib3.exceptions.MaxRetryError as error:
            reason = error.reason
            if isinstance(reason, urllib3.exceptions.SSLError):
                raise FetchFailure(FailureKind.UNREACHABLE, source.uri, f"TLS: {reason}") from error
            raise TransientError(str(reason or error)) from error
        except urllib3.exceptions.HTTPError as error:
            raise TransientError(str(error)) from error
        status = response.status
        if status in (200, 206):
            self.resumed = status == 206
            self.length = _content_length(response, offset if self.resumed else 0)
            self._response = response
            return
        response.release_conn()
        detail = f"HTTP {status} {response.reason or ''}".strip()
        if status in {404, 410}:
            raise FetchFailure(FailureKind.NOT_FOUND, source.uri, detail)
        if status in (401, 403):
            raise FetchFailure(FailureKind.ACCESS_DENIED, source.uri, detail)
        if status in _RETRY_STATUSES:
            raise TransientError(detail)
        raise FetchFailure(FailureKind.UNREACHABLE, source.uri, detail)

    def chunks(self) -> Iterator[bytes]:
        try:
            yield from self._response.stream(CHUNK_BYTES, decode_content=False)
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as error:
            raise TransientError(str(error)) from error

    def close(self) -> None:
        self._response.release_conn()


def _content_length(response: urllib3.BaseHTTPResponse, offset: int) -> int | None:
    """The whole file's size, if the server said it."""
    header = response.headers.get("Content-Length")
    if header is None or not header.isdigit():
        return None
    return offset + int(header)
