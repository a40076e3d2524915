"""The demo's load: `kiln_localcluster.load` through a Service, from the command line.

By default the requests go to the Service's cluster IP, as any client in a cluster sends them:
kube-proxy on the real node picks a ready pod per connection, so the load keeps several
connections open (and the demo's InferenceService ends them at a maximum age, so they spread
over replicas the autoscaler adds). `--pod-ips` spreads them over the ready pods' IPs instead,
for services on the fake GPU nodes, which have no kube-proxy.
"""

import argparse
import asyncio
import sys
from pathlib import Path

from kiln_localcluster.cluster import LocalCluster
from kiln_localcluster.load import cluster_ip, ready_endpoints, run_load


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--service", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--connections", type=int, default=8, help="connections to the Service")
    parser.add_argument("--pod-ips", action="store_true", help="spread over the ready pods' IPs")
    args = parser.parse_args()
    info = LocalCluster(Path(".kiln")).info()
    if info is None:
        print("the local cluster is not running", file=sys.stderr)
        return 1
    if not ready_endpoints(info, args.namespace, args.service):
        print("the Service has no ready endpoints", file=sys.stderr)
        return 1
    address = None if args.pod_ips else cluster_ip(info, args.namespace, args.service)

    def targets() -> list[str]:
        return ready_endpoints(info, args.namespace, args.service) if address is None else [address]

    where = "the ready pods' IPs" if address is None else f"the Service's cluster IP {address}"
    print(f"sending gRPC requests to {where} for {args.seconds:.0f} s", flush=True)
    report = asyncio.run(run_load(
        targets, args.model, seconds=args.seconds, max_requests=args.max_requests,
        concurrency=args.concurrency,
        connections_per_target=1 if address is None else args.connections,
    ))  # fmt: skip
    print(report.summary(len(ready_endpoints(info, args.namespace, args.service))))
    return 0 if report.latencies_ms and report.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
