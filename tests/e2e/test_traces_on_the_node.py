"""A caller's trace continues into the model on the real node: an InferenceService with
`spec.runtime.tracing` exports its pods' spans over OTLP to Jaeger (listening on the node's bridge
address, where pods reach the host), and requests sent with a W3C traceparent through the
Service's cluster IP come back from Jaeger's query API under that parent, stage by stage, the
stages adding up to the request's span within the bound the loopback test states."""

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml

from kiln_localcluster.node import NODE_IP
from tests.e2e.conftest import E2ECluster, Model, service_address
from tests.e2e.test_real_node import GRPC, HTTP, MODEL, apply_manifest_and_serve, inference_service
from tests.gotools import FIRST_BUILD_TEST_TIMEOUT
from tests.jaeger import (
    UNACCOUNTED_BOUND_SECONDS,
    running_jaeger,
    traceparent,
    uncovered_by_stages,
)
from tests.sessioncluster import missing_component

# the fixture may build Jaeger first (minutes on a fresh machine; e2e/gotools caches it)
pytestmark = pytest.mark.timeout(FIRST_BUILD_TEST_TIMEOUT)


def test_a_traceparent_through_the_service_continues_into_the_pods_spans(
    cluster: E2ECluster, namespace: str, model: Model, tmp_path: Path
) -> None:
    if cluster.local is None:
        missing_component("Jaeger listens on the local node's bridge address: local only")
        return
    name = MODEL  # the runtime serves the model under its service's name
    with running_jaeger(NODE_IP, tmp_path) as (otlp, query):
        body = yaml.safe_load(inference_service(name, model))
        # ratio 0: only requests whose caller sampled them are traced (not the warm-up's)
        tracing = {"otlpEndpoint": otlp, "samplingRatio": 0.0}
        body["spec"]["runtime"] = {**body["spec"]["runtime"], "tracing": tracing}
        apply_manifest_and_serve(cluster, namespace, yaml.safe_dump(body), name)
        sent: list[tuple[str, str]] = []
        tensor = np.ones((1, 512), dtype=np.float32)
        with service_address(cluster, namespace, name) as address:
            http = httpclient.InferenceServerClient(address[HTTP], network_timeout=10.0)
            for n in range(3):
                trace_id, parent = f"{0xE2E0 + n:032x}", f"{0xE2E0 + n:016x}"
                given = httpclient.InferInput("INPUT__0", [1, 512], "FP32")
                given.set_data_from_numpy(tensor)
                http.infer(MODEL, [given], headers={"traceparent": traceparent(trace_id, parent)})
                sent.append((trace_id, parent))
            http.close()
            grpc = grpcclient.InferenceServerClient(address[GRPC])
            trace_id, parent = f"{0xE2EF:032x}", f"{0xE2EF:016x}"
            given_grpc = grpcclient.InferInput("INPUT__0", [1, 512], "FP32")
            given_grpc.set_data_from_numpy(tensor)
            grpc.infer(
                MODEL, [given_grpc], headers={"traceparent": traceparent(trace_id, parent)},
                client_timeout=10.0,
            )  # fmt: skip
            grpc.close()
            sent.append((trace_id, parent))
        gaps = uncovered_by_stages(query, sent, timeout=60)
        assert max(gaps) <= UNACCOUNTED_BOUND_SECONDS
