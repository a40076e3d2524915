"""A process serving the operator's real metrics for one service, fed as a busy operator would.

`python -m tests.integration.observability.operator_metrics_process PORT NAMESPACE SERVICE`:
imports the operator's own metric definitions (`kiln_operator.telemetry` and the handlers'),
serves them with prometheus_client on loopback, and records a reconcile, an API request, an
autoscaler decision, a warm-up gate and a Prometheus query every 0.2 s, through the same
functions the operator calls. The dashboards' queries then run against Kiln's real metric names
and labels without a cluster; the cluster test (tests/integration/operator/
test_operator_metrics.py) shows the operator records them where this process only imitates it.
"""

import random
import sys
import time

import requests
from prometheus_client import start_http_server

from kiln_operator import telemetry
from kiln_operator.handlers import autoscaler, warmup_gate


def main() -> None:
    port, namespace, service = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    waiting = [0.0]
    telemetry.watch_workqueue(lambda: waiting[0], lambda: 2 * waiting[0], lambda: 1.0)
    start_http_server(port, addr="127.0.0.1")
    conditions = [
        {"type": "Ready", "status": "False", "reason": "WarmingUp"},
        {"type": "Stalled", "status": "False", "reason": "NotStalled"},
    ]
    rounds = 0
    deadline = time.monotonic() + 600  # bounded: the test stops it long before
    while time.monotonic() < deadline:
        rounds += 1
        waiting[0] = float(rounds % 5)
        telemetry.observe_reconcile("spec", "applied", "", random.uniform(0.005, 0.05))
        telemetry.observe_reconcile("resync", "converged", "", random.uniform(0.001, 0.01))
        telemetry.observe_api(
            "reconcile", "deployments", "patch", "200", random.uniform(0.002, 0.02)
        )
        telemetry.observe_api("kiln", "pods", "patch", "409", 0.004)
        telemetry.observe_decision(
            namespace, service, reason="Steady" if rounds % 3 else "LatencyAboveTarget",
            desired=2 if rounds < 150 else 3, previous=2, slo_p99_seconds=0.05,
        )  # fmt: skip
        telemetry.observe_conditions(namespace, service, conditions)
        autoscaler.EVALUATIONS.labels("decided").inc()
        autoscaler.EVALUATION_LAG.observe(random.uniform(0.001, 0.1))
        telemetry.WARMUP_GATES.labels(namespace, service, "passed").inc()
        telemetry.WARMUP_ATTEMPT_DURATION.labels("passed").observe(random.uniform(1, 4))
        warmup_gate.COLD_START.labels(namespace, service).observe(random.uniform(20, 40))
        warmup_gate.DOWNLOAD_SECONDS.labels(namespace, service).observe(random.uniform(3, 8))
        with telemetry.prometheus_query("signals"):
            time.sleep(0.002)
        try:
            with telemetry.prometheus_query("history"):
                raise requests.ConnectionError("refused")
        except requests.ConnectionError:
            pass
        time.sleep(0.2)


if __name__ == "__main__":
    main()
