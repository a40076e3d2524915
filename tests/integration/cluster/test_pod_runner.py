"""A pod running Kiln's runtime is a real server at its pod IP, and joins its Service's endpoints.

This is what the warm-up gate, the autoscaler and the demo stand on: kwok schedules and marks the
pod Running, the pod runner starts ``kiln_runtime`` in a network namespace holding the pod's IP,
and the endpoint-slice controller lists that IP for the Service.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http

from kiln_localcluster import podnet
from kiln_localcluster.volumes import provision_claim
from kiln_localcluster.waiting import http_ok, wait_for
from tests.integration.conftest import Cluster

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("pod_network"),
]


def runtime_deployment(name: str, claim: str) -> dict[str, Any]:
    mount = f"/models/{claim}"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "containers": [
                        {
                            "name": "runtime",
                            "image": "kiln-runtime:dev",
                            "command": ["python", "-m", "kiln_runtime", "serve"],
                            "args": [
                                "--model-path",
                                f"{mount}/model.pt",
                                "--model-name",
                                "mlp",
                                "--config",
                                f"{mount}/config.json",
                            ],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "volumeMounts": [
                                {"name": "model", "mountPath": mount, "readOnly": True}
                            ],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "model",
                            "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
                        }
                    ],
                },
            },
        },
    }


def netns_names() -> str:
    return subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout


def test_runtime_pod_serves_at_its_ip_and_joins_the_service(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "kiln_runtime",
            "example-model",
            "--kind",
            "mlp",
            "--out",
            str(models),
        ],
        check=True,
        capture_output=True,
    )
    provision_claim(cluster.info, namespace, "models", models)
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(runtime_deployment("mlp", "models"))
    )
    cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "mlp"},
                "spec": {"selector": {"app": "mlp"}, "ports": [{"name": "http", "port": 8000}]},
            }
        ),
    )

    pod = wait_for(
        lambda: next(
            iter(
                p
                for p in cluster.get_json("pods", "-n", namespace, "-l", "app=mlp")["items"]
                if p["status"].get("podIP")
            ),
            None,
        ),
        timeout=60,
        description="the runtime pod with an IP",
    )
    ip = pod["status"]["podIP"]
    wait_for(
        lambda: http_ok(f"http://{ip}:8000/v2/health/ready"),
        timeout=90,
        description=f"kiln_runtime ready at {ip}",
    )

    client = triton_http.InferenceServerClient(f"{ip}:8000")
    batch = triton_http.InferInput("INPUT__0", [2, 512], "FP32")
    batch.set_data_from_numpy(np.ones((2, 512), dtype=np.float32))
    result = client.infer("mlp", [batch])
    assert result.as_numpy("OUTPUT__0").shape == (2, 10)

    def endpoint_ips() -> set[str]:
        slices = cluster.get_json(
            "endpointslices", "-n", namespace, "-l", "kubernetes.io/service-name=mlp"
        )["items"]
        return {a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]}

    assert wait_for(lambda: ip in endpoint_ips(), timeout=30, description="pod IP in endpoints")

    netns, _ = podnet.names_for(pod["metadata"]["uid"])
    cluster.kubectl("delete", "deployment", "mlp", "-n", namespace, "--wait=false")
    wait_for(
        lambda: not http_ok(f"http://{ip}:8000/v2/health/live"),
        timeout=30,
        description="the runtime stopped after its pod went away",
    )
    wait_for(
        lambda: netns not in netns_names(),
        timeout=30,
        description=f"network namespace {netns} removed",
    )
