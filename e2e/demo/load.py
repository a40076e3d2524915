"""The demo's load: `kiln_localcluster.load` over a Service's ready pods, from the command line."""

import argparse
import asyncio
import sys
from pathlib import Path

from kiln_localcluster.cluster import LocalCluster
from kiln_localcluster.load import ready_endpoints, run_load


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--service", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    info = LocalCluster(Path(".kiln")).info()
    if info is None:
        print("the local cluster is not running", file=sys.stderr)
        return 1

    def endpoints() -> list[str]:
        return ready_endpoints(info, args.namespace, args.service)

    if not endpoints():
        print("the Service has no ready endpoints", file=sys.stderr)
        return 1
    report = asyncio.run(run_load(
        endpoints, args.model, seconds=args.seconds, max_requests=args.max_requests,
        concurrency=args.concurrency,
    ))  # fmt: skip
    print(report.summary(len(endpoints())))
    return 0 if report.latencies_ms and report.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
