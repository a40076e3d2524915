"""The pod runner runs only Kiln runtime pods, with mount paths mapped to host directories."""

import json
import sys

from kiln_localcluster.podrunner import local_argv, local_env, on_cpu, runs_kiln_runtime


def pod_with(command: list[str]) -> dict[str, object]:
    return {"spec": {"containers": [{"name": "c", "command": command}]}}


def test_only_kiln_runtime_pods_are_run() -> None:
    assert runs_kiln_runtime(pod_with(["python", "-m", "kiln_runtime", "serve"]))
    assert not runs_kiln_runtime(pod_with(["python", "-m", "http.server"]))
    assert not runs_kiln_runtime({"spec": {"containers": [{"name": "c", "image": "x"}]}})


def test_mount_paths_become_host_paths_in_args_and_env() -> None:
    container = {
        "command": ["python", "-m", "kiln_runtime", "serve"],
        "args": ["--model-path", "/models/m/model.pt", "--model-name", "/models/mx"],
        "env": [{"name": "CFG", "value": "/models/m"}, {"name": "REF", "valueFrom": {}}],
    }
    mounts = {"/models/m": "/srv/volumes/m"}
    assert local_argv(container, mounts) == [
        sys.executable,
        "-m",
        "kiln_runtime",
        "serve",
        "--model-path",
        "/srv/volumes/m/model.pt",
        "--model-name",
        "/models/mx",
    ]
    env = local_env(container, mounts)
    assert env["CFG"] == "/srv/volumes/m"
    assert "REF" not in env


def test_a_cuda_config_runs_on_the_cpu_of_a_fake_gpu_node() -> None:
    config = {
        "model": {"name": "m"},
        "optimization": {"device": "cuda", "cudaGraphs": True, "precision": "bf16"},
    }
    assert json.loads(on_cpu(json.dumps(config)))["optimization"] == {
        "device": "cpu",
        "cudaGraphs": False,
        "precision": "bf16",
    }
    untouched = {"optimization": {"device": "auto"}}
    assert json.loads(on_cpu(json.dumps(untouched))) == untouched
