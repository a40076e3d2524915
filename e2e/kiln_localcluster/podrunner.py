"""The local cluster's container runtime for Kiln runtime pods.

Why it exists: kwok runs no containers, yet the warm-up gate, the autoscaler and the demo need a
real ``kiln_runtime`` behind each pod. Like a kubelet, the runner watches the pods the scheduler
placed and kwok marked Running, and for each whose container runs ``python -m kiln_runtime`` it
starts that command as a local process inside a network namespace holding the pod's IP
(``podnet``). PersistentVolumeClaim mounts resolve, as a kubelet would, through the claim's bound
PersistentVolume to its ``hostPath`` or ``local`` directory. The fake GPU nodes have no GPU, so
a runtime config asking for CUDA is run on the CPU instead. The runner also publishes the metrics
endpoints of the pods it runs as Prometheus file-based discovery targets, labelled as Kubernetes
pod discovery would label them (Debian's Prometheus is built without Kubernetes discovery).
A pod that goes away has its process stopped with SIGTERM and its termination grace period,
then SIGKILL; a process that crashes is restarted with a doubling back-off, as a kubelet does.
Other pods are ignored.
"""

import json
import os
import signal
import ssl
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln_localcluster import podnet
from kiln_localcluster.processes import ProcessTable, Started, is_running, spawn, stop
from kiln_localcluster.targets import scrape_target, targets_file, write_targets

RUNTIME_COMMAND = ["python", "-m", "kiln_runtime"]
RUNTIME_CONFIG_ENV = "KILN_RUNTIME_CONFIG"
POLL_SECONDS = 0.5
FIRST_RESTART_BACKOFF_SECONDS = 5.0
MAX_RESTART_BACKOFF_SECONDS = 160.0
SHUTDOWN_GRACE_CAP_SECONDS = 5.0

Pod = dict[str, Any]


@dataclass
class _Running:
    process: Started
    grace: float
    exited_at: float | None = None
    restarts: int = 0

    @property
    def backoff(self) -> float:
        return float(
            min(MAX_RESTART_BACKOFF_SECONDS, FIRST_RESTART_BACKOFF_SECONDS * 2.0**self.restarts)
        )


def runs_kiln_runtime(pod: Pod) -> bool:
    """True for a pod whose first container is Kiln's runtime."""
    containers = pod["spec"].get("containers", [])
    return bool(containers) and containers[0].get("command", [])[:3] == RUNTIME_COMMAND


def local_argv(container: dict[str, Any], mounts: dict[str, str]) -> list[str]:
    """The container's command and args for this machine: its Python, host paths for mounts."""
    command = [sys.executable, *container["command"][1:], *container.get("args", [])]
    return [_rewrite(arg, mounts) for arg in command]


def local_env(container: dict[str, Any], mounts: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = _rewrite(variable["value"], mounts)
    if RUNTIME_CONFIG_ENV in env:
        env[RUNTIME_CONFIG_ENV] = on_cpu(env[RUNTIME_CONFIG_ENV])
    return env


def on_cpu(runtime_config: str) -> str:
    """The runtime config with CUDA replaced by the CPU: a fake GPU node has no GPU."""
    config = json.loads(runtime_config)
    optimization = config.get("optimization") or {}
    if optimization.get("device") == "cuda" or optimization.get("cudaGraphs"):
        optimization["device"] = "cpu"
        optimization["cudaGraphs"] = False
        config["optimization"] = optimization
    return json.dumps(config)


def _rewrite(value: str, mounts: dict[str, str]) -> str:
    for mount_path, host_path in mounts.items():
        if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
            return host_path + value[len(mount_path.rstrip("/")) :]
    return value


class ApiReader:
    """Read-only GETs against the local API server with the admin identity."""

    def __init__(self, server: str, context: ssl.SSLContext) -> None:
        self.server = server
        self.context = context

    def get(self, path: str, **query: str) -> Any:
        url = f"{self.server}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, context=self.context, timeout=10) as response:
            return json.load(response)


class PodRunner:
    """Keeps one local process per runnable pod until the pod goes away."""

    def __init__(
        self,
        api: ApiReader,
        net: podnet.PodNetwork,
        table: ProcessTable,
        logs: Path,
        targets_file: Path,
    ) -> None:
        self.api = api
        self.net = net
        self.table = table
        self.logs = logs
        self.targets_file = targets_file
        self.running: dict[str, _Running] = {}

    def publish_targets(self, pods: dict[str, Pod]) -> None:
        """Write the scrape targets of running pods (file_sd JSON), only when they changed."""
        write_targets(
            self.targets_file,
            [
                target
                for uid, pod in sorted(pods.items())
                if uid in self.running
                and is_running(self.running[uid].process)
                and (target := scrape_target(pod)) is not None
            ],
        )

    def sync(self) -> None:
        """One pass: start processes for new pods, stop those of departed pods, restart crashes."""
        pods = self.api.get("/api/v1/pods", fieldSelector="status.phase=Running")["items"]
        wanted = {
            p["metadata"]["uid"]: p
            for p in pods
            if runs_kiln_runtime(p)
            and p["status"].get("podIP")
            and not p["metadata"].get("deletionTimestamp")
        }
        stoppers = [
            threading.Thread(target=self._stop, args=(uid, self.running[uid].grace))
            for uid in list(self.running)
            if uid not in wanted
        ]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join()
        for uid, pod in wanted.items():
            current = self.running.get(uid)
            if current is None:
                self._start(pod)
            elif not is_running(current.process):
                now = time.monotonic()
                if current.exited_at is None:
                    current.exited_at = now
                    _log(f"{current.process.name} exited; restarting in {current.backoff:.0f}s")
                elif now - current.exited_at >= current.backoff:
                    self._forget(uid)
                    self._start(pod, restarts=current.restarts + 1)
        self.publish_targets(wanted)

    def shutdown(self) -> None:
        threads = [
            threading.Thread(
                target=self._stop, args=(uid, min(r.grace, SHUTDOWN_GRACE_CAP_SECONDS))
            )
            for uid, r in self.running.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _start(self, pod: Pod, restarts: int = 0) -> None:
        meta = pod["metadata"]
        uid, where = meta["uid"], f"{meta['namespace']}/{meta['name']}"
        try:
            mounts = self._host_mounts(pod)
        except (OSError, KeyError, ValueError) as error:
            _log(f"pod {where}: volumes not resolvable yet ({error})")
            return
        container = pod["spec"]["containers"][0]
        try:
            netns = podnet.attach(self.net, uid, pod["status"]["podIP"])
        except (RuntimeError, ValueError) as error:  # e.g. the bridge is gone: next pass retries
            podnet.detach(uid)
            _log(f"pod {where}: network not attachable ({error})")
            return
        argv = ["ip", "netns", "exec", netns, *local_argv(container, mounts)]
        process = spawn(
            f"pod:{uid}:{where}",
            argv,
            self.logs / f"{meta['namespace']}_{meta['name']}.log",
            env=local_env(container, mounts),
        )
        self.table.add(process)
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        self.running[uid] = _Running(process=process, grace=grace, restarts=restarts)
        _log(f"pod {where}: started pid {process.pid} at {pod['status']['podIP']}")

    def _stop(self, uid: str, grace: float) -> None:
        running = self.running[uid]
        stop(running.process, grace=grace)
        _log(f"{running.process.name}: stopped")
        self._forget(uid)

    def _forget(self, uid: str) -> None:
        podnet.detach(uid)
        process = self.running.pop(uid).process
        self.table.remove(process)

    def _host_mounts(self, pod: Pod) -> dict[str, str]:
        """Container mount path → host directory, for claim and hostPath volumes."""
        namespace = pod["metadata"]["namespace"]
        volumes: dict[str, str] = {}
        for volume in pod["spec"].get("volumes", []):
            if "hostPath" in volume:
                volumes[volume["name"]] = volume["hostPath"]["path"]
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                pvc = self.api.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
                pv_name = pvc["spec"].get("volumeName")
                if not pv_name:
                    raise ValueError(f"claim {claim} is not bound")
                pv = self.api.get(f"/api/v1/persistentvolumes/{pv_name}")["spec"]
                source = pv.get("hostPath") or pv.get("local")
                if source is None:
                    raise ValueError(f"volume {pv_name} is neither hostPath nor local")
                volumes[volume["name"]] = source["path"]
        mounts = {}
        for mount in pod["spec"]["containers"][0].get("volumeMounts", []):
            if mount["name"] in volumes:
                host = Path(volumes[mount["name"]]) / mount.get("subPath", "")
                mounts[mount["mountPath"]] = str(host).rstrip("/")
        return mounts


def run_forever(api: ApiReader, net: podnet.PodNetwork, state: Path) -> None:
    """The runner's main loop, until SIGTERM or SIGINT; then it stops every process it started."""
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    runner = PodRunner(
        api, net, ProcessTable(state / "pods.json"), state / "pod-logs", targets_file(state)
    )
    _log("watching for Kiln runtime pods")
    while not stopping.is_set():
        try:
            runner.sync()
        except OSError as error:  # API server briefly unavailable: try again next pass
            _log(f"sync failed: {error}")
        stopping.wait(POLL_SECONDS)
    runner.shutdown()


def _log(message: str) -> None:
    print(f"[pod-runner] {message}", file=sys.stderr, flush=True)
