"""An S3 or HTTPS endpoint that drops connection attempts fails the fetch in seconds.

The issue asks each failure to reach the InferenceService within 30 s; the fetcher's first
call (HEAD or list) must therefore give up well within that. The endpoint here is a loopback
socket whose accept queue is full, so the kernel drops further SYNs exactly as a blackholed
address does: nothing outside 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import botocore.exceptions
import pytest

from kiln_runtime.fetch import command, https, s3
from kiln_runtime.fetch.failures import FailureKind, FetchFailure, TransientError
from kiln_runtime.fetch.source import Credentials, Limits, S3Source, StoreSettings

BOUND_SECONDS = 15.0


@pytest.fixture
def blackholed_endpoint() -> Iterator[str]:
    """http://127.0.0.1:PORT of a listener that never accepts and whose queue is full."""
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # room for one queued connection...
        filler.connect(listener.getsockname())  # ...taken: later SYNs are dropped
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture(autouse=True)
def no_outside_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing from the environment may send boto3 elsewhere (a proxy, a config file's
    endpoint, the instance metadata service)."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "*")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def arguments(tmp_path: Path, uri: str, endpoint: str) -> argparse.Namespace:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / command.ACCESS_KEY_FILE).write_text("access")
    (secret / command.SECRET_KEY_FILE).write_text("secret")
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(
        ["--uri", uri, "--dest", str(tmp_path / "volume"), "--endpoint", endpoint,
         "--path-style", "--credentials-dir", str(secret)]
    )  # fmt: skip


def test_an_unreachable_store_fails_the_fetch_within_the_bound(
    tmp_path: Path, blackholed_endpoint: str
) -> None:
    args = arguments(tmp_path, "s3://models/mlp/model.pt", blackholed_endpoint)
    started = time.monotonic()
    with pytest.raises(FetchFailure) as failure:
        command.fetch(args)
    elapsed = time.monotonic() - started
    assert failure.value.kind is FailureKind.UNREACHABLE
    assert failure.value.detail.startswith("head: ")
    assert elapsed < BOUND_SECONDS
    assert not (tmp_path / "volume" / "model").exists()


def test_an_unreachable_https_host_fails_the_fetch_within_the_bound(
    tmp_path: Path, blackholed_endpoint: str
) -> None:
    host = blackholed_endpoint.removeprefix("http://")
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(
        ["--uri", f"https://{host}/mlp/model.pt", "--dest", str(tmp_path / "volume")]
    )
    started = time.monotonic()
    with pytest.raises(FetchFailure) as failure:
        command.fetch(args)
    elapsed = time.monotonic() - started
    assert failure.value.kind is FailureKind.UNREACHABLE
    assert elapsed < BOUND_SECONDS
    assert not (tmp_path / "volume" / "model").exists()


def test_only_the_first_https_request_takes_the_short_settings() -> None:
    limits = Limits()
    retries, timeout = https.first_request_settings(limits)
    assert retries.total == limits.metadata_attempts - 1
    assert timeout.connect_timeout == limits.metadata_connect_timeout_seconds
    pool = https.make_pool(StoreSettings(), limits)
    assert pool.connection_pool_kw["retries"].total == limits.attempts - 1
    assert pool.connection_pool_kw["timeout"].connect_timeout == limits.connect_timeout_seconds


def test_listing_is_bounded_the_same_way_and_only_transfers_stay_patient() -> None:
    limits = Limits()
    clients = s3.make_clients(StoreSettings(), Credentials("access", "secret"), limits)
    metadata, transfer = clients.metadata.meta.config, clients.transfer.meta.config
    assert metadata.retries["total_max_attempts"] == limits.metadata_attempts
    worst = limits.metadata_attempts * limits.metadata_connect_timeout_seconds
    assert metadata.connect_timeout == limits.metadata_connect_timeout_seconds
    assert worst + 1 < BOUND_SECONDS  # botocore's backoff after a connection error is < 1 s
    assert transfer.retries["total_max_attempts"] == limits.attempts
    assert transfer.connect_timeout == limits.connect_timeout_seconds


@pytest.mark.parametrize(
    "error",
    [
        botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1/"),
        botocore.exceptions.ConnectTimeoutError(endpoint_url="http://127.0.0.1:1/"),
    ],
)
def test_a_connection_error_is_transient_and_final_before_a_body(error: Exception) -> None:
    transient = s3.classify(error, "s3://models/m.pt", "head")
    assert isinstance(transient, TransientError)
    with pytest.raises(FetchFailure) as failure:
        s3.list_objects(Refusing(error), S3Source("s3://models/m.pt", "models", "m.pt"), Limits())
    assert failure.value.kind is FailureKind.UNREACHABLE


class Refusing:
    """A client whose every call fails with ``error``, as botocore raises it after its tries."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def head_object(self, **_: object) -> None:
        raise self.error
