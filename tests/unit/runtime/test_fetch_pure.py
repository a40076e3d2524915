"""The fetcher's pure parts: URIs, sha256, object paths, ETag and sha256 verification, backoff."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import zlib
from pathlib import PurePosixPath

import pytest

from kiln_runtime.fetch.failures import FailureKind, FetchFailure
from kiln_runtime.fetch.source import (
    HttpsSource,
    Limits,
    S3Source,
    parse_sha256,
    parse_source,
    relative_path,
)
from kiln_runtime.fetch.transfer import backoff_delay
from kiln_runtime.fetch.verify import Expected, StoreChecksum, Verifier


def test_s3_uris_name_an_object_or_a_prefix() -> None:
    one = parse_source("s3://models/mlp/v3/model.pt")
    tree = parse_source("s3://models/mlp/v3/")
    bucket = parse_source("s3://models")
    assert one == S3Source("s3://models/mlp/v3/model.pt", "models", "mlp/v3/model.pt")
    assert isinstance(one, S3Source) and not one.is_prefix
    assert isinstance(tree, S3Source) and tree.is_prefix and tree.key == "mlp/v3/"
    assert isinstance(bucket, S3Source) and bucket.is_prefix and bucket.key == ""


def test_https_uris_keep_the_file_name() -> None:
    source = parse_source("https://models.example/a/b/model.onnx?sig=1")
    assert source == HttpsSource("https://models.example/a/b/model.onnx?sig=1")
    assert isinstance(source, HttpsSource) and source.file_name == "model.onnx"


@pytest.mark.parametrize(
    ("uri", "detail"),
    [
        ("gs://bucket/model.pt", "only s3:// and https:// are fetched"),
        ("http://example/model.pt", "only s3:// and https:// are fetched"),
        ("s3://Bad_Bucket/model.pt", "'Bad_Bucket' is not a bucket name"),
        ("s3://models/a/../b.pt", "the key has a . or .. segment"),
        ("https://example/", "the path names no file"),
        ("https:///model.pt", "no host"),
    ],
)
def test_unusable_uris_are_refused_with_the_reason(uri: str, detail: str) -> None:
    with pytest.raises(FetchFailure) as caught:
        parse_source(uri)
    assert caught.value.kind is FailureKind.INVALID
    assert str(caught.value) == f"model download failed: InvalidSource for {uri}: {detail}"


def test_sha256_is_64_hex_digits_in_either_case() -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    assert parse_sha256(digest.upper(), "u") == digest
    assert parse_sha256(None, "u") is None
    with pytest.raises(FetchFailure, match="64 hexadecimal digits"):
        parse_sha256("abc", "u")


def test_objects_of_a_prefix_stay_inside_it() -> None:
    assert relative_path("m/", "m/tokenizer/vocab.txt") == PurePosixPath("tokenizer/vocab.txt")
    with pytest.raises(ValueError, match="does not stay inside"):
        relative_path("m/", "m/../../etc/passwd")


def test_each_failure_kind_has_its_own_exit_code() -> None:
    codes = [kind.exit_code for kind in FailureKind]
    assert len(set(codes)) == len(codes) and 0 not in codes and 1 not in codes


def _verify(expected: Expected, *chunks: bytes) -> str | None:
    verifier = Verifier(expected)
    for chunk in chunks:
        verifier.update(chunk)
    return verifier.mismatch()


def test_a_single_part_etag_is_the_md5() -> None:
    body = b"weights" * 1000
    etag = hashlib.md5(body).hexdigest()
    assert _verify(Expected(size=len(body), etag=etag), body[:10], body[10:]) is None
    wrong = _verify(Expected(size=len(body), etag="0" * 32), body)
    assert wrong == f"content hashes to ETag {etag}, the store has {'0' * 32}"


def test_a_multipart_etag_is_checked_across_chunk_boundaries() -> None:
    part = 1000
    body = bytes(range(256)) * 10  # 2560 bytes: parts of 1000, 1000, 560
    parts = [body[i : i + part] for i in range(0, len(body), part)]
    combined = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    expected = Expected(size=len(body), etag=f"{combined}-3", part_size=part)
    assert _verify(expected, body[:333], body[333:1999], body[1999:]) is None
    corrupted = body[:1500] + b"X" + body[1501:]
    assert _verify(expected, corrupted) is not None


def _crc32(data: bytes) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


def test_the_store_checksum_is_preferred_to_the_etag() -> None:
    body = b"weights" * 1000
    crc = base64.b64encode(_crc32(body)).decode()
    expected = Expected(size=len(body), etag="0" * 32, checksum=StoreChecksum("crc32", crc))
    verifier = Verifier(expected)
    verifier.update(body)
    assert verifier.mismatch() is None and verifier.checks == "size+crc32"
    wrong = _verify(
        dataclasses.replace(expected, checksum=StoreChecksum("crc32", "AAAAAA==")), body
    )
    assert wrong == f"content hashes to crc32 checksum {crc}, the store has AAAAAA=="


def test_a_composite_checksum_is_the_checksum_of_the_parts_checksums() -> None:
    part = 1000
    body = bytes(range(256)) * 10  # parts of 1000, 1000, 560
    parts = [body[i : i + part] for i in range(0, len(body), part)]
    for name, digest in (
        ("crc32", _crc32),
        ("sha256", lambda data: hashlib.sha256(data).digest()),
    ):
        combined = digest(b"".join(digest(p) for p in parts))
        value = f"{base64.b64encode(combined).decode()}-3"
        expected = Expected(size=len(body), part_size=part, checksum=StoreChecksum(name, value))
        assert _verify(expected, body[:333], body[333:1999], body[1999:]) is None
        assert _verify(expected, body[:1500] + b"X" + body[1501:]) is not None


def test_checksums_the_runtime_cannot_compute_fall_back_to_the_etag() -> None:
    body = b"abc"
    etag = hashlib.md5(body).hexdigest()
    crc32c = Expected(size=3, etag=etag, checksum=StoreChecksum("crc32c", "AAAAAA=="))
    composite_without_parts = Expected(size=3, etag=etag, checksum=StoreChecksum("crc32", "AA==-2"))
    for expected in (crc32c, composite_without_parts):
        verifier = Verifier(expected)
        verifier.update(body)
        assert verifier.mismatch() is None and verifier.checks == "size+etag"


def test_opaque_etags_fall_back_to_the_size() -> None:
    verifier = Verifier(Expected(size=3, etag="kms-opaque-etag"))
    verifier.update(b"abc")
    assert verifier.mismatch() is None and verifier.checks == "size"
    assert _verify(Expected(size=4, etag="kms-opaque-etag"), b"abc") == (
        "got 3 bytes, the store announced 4"
    )


def test_sha256_and_a_restart_from_zero() -> None:
    body = b"model bytes"
    verifier = Verifier(Expected(size=len(body), sha256=hashlib.sha256(body).hexdigest()))
    verifier.update(b"garbage from a first try")
    verifier.reset()
    verifier.update(body)
    assert verifier.mismatch() is None and verifier.checks == "size+sha256"


def test_backoff_doubles_up_to_its_ceiling() -> None:
    limits = Limits(backoff_seconds=1.0, backoff_max_seconds=5.0)
    assert [backoff_delay(limits, n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
