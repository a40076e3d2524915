"""Bring the local cluster up and down, and say where a running one is.

Why it exists: one place knows the order in which the cluster starts (certificates, etcd, the
API server, the other components, Prometheus, the nodes) and what "up" means:
every node Ready and the default service account there. The components' flags are in
``controlplane``, their credentials in ``pki`` and ``kubeconfig``. ``up`` is idempotent: a
healthy cluster is reused; anything else recorded is stopped first, and a failed start stops
what it started, so it leaves no orphans.
"""

import dataclasses
import datetime
import ipaddress
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from kiln_localcluster import controlplane, node, pki, podnet, prometheus, relay
from kiln_localcluster.controlplane import SERVICE_CIDR
from kiln_localcluster.kubeconfig import admin_ssl_context, write_kubeconfig
from kiln_localcluster.nodes import build_gpu_node
from kiln_localcluster.processes import (
    ProcessTable,
    exited_during_start,
    free_ports,
    is_running,
    spawn,
    wait_started,
)
from kiln_localcluster.targets import ApiReader, targets_file
from kiln_localcluster.waiting import http_ok, wait_for

BINARIES_SCRIPT = Path(__file__).resolve().parent.parent / "cluster" / "binaries.sh"
KUBERNETES_SERVICE_IP = str(ipaddress.ip_network(SERVICE_CIDR)[1])
"""The `kubernetes` Service's cluster IP (the range's first address), in the API server's
certificate: a pod's in-cluster client connects to it by that address."""


@dataclass(frozen=True)
class ClusterOptions:
    """What kind of cluster to start."""

    nodes: int = 4
    gpus_per_node: int = 8
    gpu_product: str = "NVIDIA-A100-SXM4-80GB"
    # Node i gets <prefix>.i.0/24; the pod IPs kwok hands out come from there.
    pod_cidr_prefix: str = "10.244"
    real_node: bool = False
    """Also run a real node (containerd, kubelet, kube-proxy) named `kiln-node`: see node.py."""


@dataclass(frozen=True)
class ClusterInfo:
    """Where a running cluster is; saved as cluster.json beside its processes."""

    server: str
    kubeconfig: str
    bin_dir: str
    audit_log: str
    etcd: str
    prometheus: str = ""
    """URL of the cluster's Prometheus (scraping Kiln pods), empty where none is installed."""


class LocalCluster:
    """The cluster whose state lives under ``state_dir`` (a checkout's ``.kiln``)."""

    def __init__(self, state_dir: Path, options: ClusterOptions | None = None) -> None:
        self.state_dir = state_dir
        self.options = options or ClusterOptions()
        self.dir = state_dir / "cluster"
        self.kubeconfig = state_dir / "kubeconfig"
        self._info_path = self.dir / "cluster.json"
        self._isolated_path = self.dir / "isolated-ranges.json"
        self.node_paths = node.NodePaths(cluster_dir=self.dir, state_dir=state_dir)

    # ------------------------------------------------------------------ queries
    def info(self) -> ClusterInfo | None:
        """The running cluster's coordinates, or None when it is not (fully) up."""
        info = self.recorded_info()
        if info is None:
            return None
        table = ProcessTable(self.dir / "processes.json")
        if not table.processes or not all(is_running(p) for p in table.processes):
            return None
        return info if self._api_ready(info.server) else None

    def node_running(self) -> bool:
        """Whether this cluster's real node (containerd, kubelet, kube-proxy) runs."""
        if not self.node_paths.processes.exists():
            return False
        table = ProcessTable(self.node_paths.processes)
        return bool(table.processes) and all(is_running(p) for p in table.processes)

    def recorded_info(self) -> ClusterInfo | None:
        """The coordinates the last start wrote, without checking that anything runs."""
        if not self._info_path.exists():
            return None
        return ClusterInfo(**json.loads(self._info_path.read_text()))

    def _ssl_context(self) -> ssl.SSLContext:
        return admin_ssl_context(pki.Pki(self.dir / "pki"))

    def api_reader(self, server: str) -> ApiReader:
        return ApiReader(server, self._ssl_context())

    def _api_ready(self, server: str) -> bool:
        try:
            with urllib.request.urlopen(
                f"{server}/readyz", context=self._ssl_context(), timeout=2
            ) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    # ------------------------------------------------------------------ up / down
    def reusable(self) -> ClusterInfo | None:
        """The running cluster if ``up`` would reuse it as it is."""
        running = self.info()
        return running if running is not None and self._has_its_node() else None

    def _has_its_node(self) -> bool:
        """Whether the real node runs, where this cluster has one."""
        return not self.options.real_node or self.node_running()

    def up(self) -> ClusterInfo:
        """Start the cluster (or reuse a healthy one) and wait until every node is Ready."""
        running = self.info()
        if running is not None and self._has_its_node():
            _say(f"local cluster already up at {running.server}")
            return running
        if running is not None:
            _say("the running local cluster has no real node: restarting it with one")
        self.down()
        bin_dir = resolve_binaries()
        started = time.monotonic()
        table = ProcessTable(self.dir / "processes.json")
        try:
            info = self._start(bin_dir, table)
        except BaseException:
            _say("start failed: stopping what was started")
            self._stop_started(table)
            raise
        _say(f"local cluster up in {time.monotonic() - started:.1f}s at {info.server}")
        return info

    def down(self) -> None:
        """Stop exactly the processes this cluster started (by PID) and forget its state."""
        table_path = self.dir / "processes.json"
        self._stop_started(ProcessTable(table_path) if table_path.exists() else None)
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.kubeconfig.unlink(missing_ok=True)

    def _stop_started(self, table: ProcessTable | None) -> None:
        """Stop the real node (if it got as far as starting), then the processes in `table`,
        and release the address ranges: for `down` and for a start that failed half-way."""
        if self.node_paths.processes.exists():
            node.teardown(self.node_paths, resolve_binaries("node"))
        if table is not None:
            table.stop_all()
        self._release_ranges()

    # ------------------------------------------------------------------ the start sequence
    def _start(self, bin_dir: Path, table: ProcessTable) -> ClusterInfo:
        info, material = self._start_control_plane(bin_dir, table)
        info = self._start_local_services(info, table)
        self._create_nodes(info, material)
        return info

    def _start_control_plane(
        self, bin_dir: Path, table: ProcessTable
    ) -> tuple[ClusterInfo, pki.Pki]:
        """etcd, the API server (each waited for), the controller manager, the scheduler and
        kwok; the admin's kubeconfig and cluster.json written once all of them run."""
        logs = self.dir / "logs"
        identities = [pki.ADMIN, pki.CONTROLLER_MANAGER, pki.SCHEDULER, pki.KWOK]
        if self.options.real_node:
            identities += [pki.KUBELET, pki.KUBE_PROXY]
        material = pki.create_pki(
            self.dir / "pki", identities, datetime.datetime.now(datetime.UTC),
            service_ip=KUBERNETES_SERVICE_IP,
        )  # fmt: skip
        etcd_port, peer_port, api_port = free_ports(3)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        server = f"https://127.0.0.1:{api_port}"
        kubeconfigs = {
            identity.name: self._write_kubeconfig(material, identity, server)
            for identity in (pki.CONTROLLER_MANAGER, pki.SCHEDULER, pki.KWOK)
        }
        admin_kubeconfig = self._write_kubeconfig(material, pki.ADMIN, server)
        audit_log = self.dir / "audit.log"
        info = ClusterInfo(
            server=server,
            kubeconfig=str(self.kubeconfig),
            bin_dir=str(bin_dir),
            audit_log=str(audit_log),
            etcd=etcd_url,
        )

        _say("starting etcd")
        etcd = spawn(
            "etcd",
            controlplane.etcd_argv(bin_dir, self.dir / "etcd", etcd_url, peer_port),
            logs / "etcd.log",
        )
        table.add(etcd)
        wait_started(etcd, lambda: http_ok(f"{etcd_url}/health"), timeout=30)

        _say("starting kube-apiserver")
        apiserver = spawn(
            "kube-apiserver",
            controlplane.apiserver_argv(bin_dir, etcd_url, api_port, material, audit_log),
            logs / "kube-apiserver.log",
        )
        table.add(apiserver)
        wait_started(apiserver, lambda: self._api_ready(server), timeout=60)

        _say("starting kube-controller-manager, kube-scheduler and kwok")
        table.add(
            spawn(
                "kube-controller-manager",
                controlplane.controller_manager_argv(
                    bin_dir, kubeconfigs[pki.CONTROLLER_MANAGER.name], material
                ),
                logs / "kube-controller-manager.log",
            )
        )
        table.add(
            spawn(
                "kube-scheduler",
                controlplane.scheduler_argv(bin_dir, kubeconfigs[pki.SCHEDULER.name]),
                logs / "kube-scheduler.log",
            )
        )
        table.add(
            spawn(
                "kwok",
                controlplane.kwok_argv(bin_dir, kubeconfigs[pki.KWOK.name]),
                logs / "kwok.log",
            )
        )

        for process in table.processes:
            if not is_running(process):
                raise exited_during_start(process.name, process.log)
        self.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(admin_kubeconfig, self.kubeconfig)
        self.kubeconfig.chmod(0o600)
        self._info_path.write_text(json.dumps(asdict(info), indent=2))
        return info, material

    def _isolate_ranges(self) -> None:
        """Keep the addresses nothing answers at on this machine (``podnet``): the fake GPU
        nodes' pod range and, without the real node, the service range. The ranges are recorded
        so that only this cluster removes its routes."""
        ranges = [f"{self.options.pod_cidr_prefix}.0.0/16"] if self.options.nodes else []
        if not self.options.real_node:  # the real node routes it onto its bridge (kube-proxy)
            ranges.append(SERVICE_CIDR)
        if not ranges:
            return
        if (reason := podnet.available()) is not None:
            _say(f"{' and '.join(ranges)} left unrouted: {reason}")
            return
        self._isolated_path.write_text(json.dumps(ranges))
        podnet.isolate(ranges)

    def _release_ranges(self) -> None:
        if self._isolated_path.exists():
            podnet.release(json.loads(self._isolated_path.read_text()))
            self._isolated_path.unlink()

    def _start_local_services(self, info: ClusterInfo, table: ProcessTable) -> ClusterInfo:
        """The processes beside the control plane, each where this machine allows it:
        Prometheus, and with a real node the publisher of its scrape targets; and the routes
        that keep unanswered addresses on this machine."""
        logs = self.dir / "logs"
        self._isolate_ranges()
        if (missing := prometheus.available()) is None:
            _say("starting prometheus")
            monitor = prometheus.start_prometheus(targets_file(self.dir), self.dir / "prometheus")
            table.add(monitor.process)
            info = dataclasses.replace(info, prometheus=monitor.url)
            self._info_path.write_text(json.dumps(asdict(info), indent=2))
        else:
            _say(f"no prometheus: {missing}")

        if self.options.real_node:
            table.add(spawn("targets", self._own_command("publish-targets"), logs / "targets.log"))
        return info

    def _own_command(self, command: str) -> list[str]:
        """``python -m kiln_localcluster <command>`` for this cluster: a helper process."""
        return [sys.executable, "-m", "kiln_localcluster", command, f"--state-dir={self.state_dir}"]

    def _create_nodes(self, info: ClusterInfo, material: pki.Pki) -> None:
        """The fake GPU nodes (and the real node, if asked for); waits until every node is Ready
        and the default service account exists."""
        _say(f"creating {self.options.nodes} fake GPU nodes")
        nodes = [
            build_gpu_node(
                i,
                gpus=self.options.gpus_per_node,
                product=self.options.gpu_product,
                pod_cidr=f"{self.options.pod_cidr_prefix}.{i}.0/24",
            )
            for i in range(self.options.nodes)
        ]
        if nodes:
            kubectl(info, "apply", "-f", "-", input=yaml.safe_dump_all(nodes))
        if self.options.real_node:
            self._start_real_node(info, material, info.server)
        kubectl(info, "wait", "--for=condition=Ready", "node", "--all", "--timeout=120s")
        wait_for(
            lambda: (
                kubectl(
                    info, "get", "serviceaccount", "default", "-n", "default", check=False
                ).returncode
                == 0
            ),
            timeout=30,
            description="the default service account (service-account controller)",
        )

    def _start_real_node(self, info: ClusterInfo, material: pki.Pki, server: str) -> None:
        if (missing := node.available()) is not None:
            raise RuntimeError(f"cannot run the real node: {missing}")
        _say("starting the real node (containerd, kubelet, kube-proxy)")
        node.start(
            self.node_paths,
            resolve_binaries("node"),
            node.NodeCredentials(
                kubelet_kubeconfig=self._write_kubeconfig(material, pki.KUBELET, server),
                proxy_kubeconfig=self._write_kubeconfig(material, pki.KUBE_PROXY, server),
                ca_cert=material.ca_cert,
            ),
            gpu_product=self.options.gpu_product,
            service_cidr=SERVICE_CIDR,
        )
        wait_for(
            lambda: kubectl(info, "get", "node", node.NODE_NAME, check=False).returncode == 0,
            timeout=60,
            description=f"node {node.NODE_NAME} registered by its kubelet",
        )
        kubectl(
            info, "patch", "node", node.NODE_NAME, "--subresource=status", "--type=merge",
            "-p", node.advertise_gpus_patch(self.options.gpus_per_node),
        )  # fmt: skip
        self._relay_to_pods(info)

    def _relay_to_pods(self, info: ClusterInfo) -> None:
        """The API server and Prometheus reachable from pods (`relay`): a relay on the node's
        bridge address, in the node's process table (it lives and dies with the bridge), and
        the API server's relay published as the `kubernetes` Service's endpoint."""
        ports = relayed_ports(info)
        process = spawn("relay", self._own_command("relay"), self.dir / "logs" / "relay.log")
        ProcessTable(self.node_paths.processes).add(process)
        wait_started(process, lambda: all(_accepts(node.NODE_IP, p) for p in ports), timeout=30)
        slice_ = relay.kubernetes_endpoint_slice(node.NODE_IP, ports[0])
        kubectl(info, "apply", "-f", "-", input=slice_)

    def pod_prometheus_url(self) -> str:
        """The cluster's Prometheus as a pod on the real node reaches it (through the relay);
        empty where the cluster has no Prometheus."""
        info = self.recorded_info()
        if info is None or not info.prometheus:
            return ""
        return relay.node_url(info.prometheus, node.NODE_IP)

    def import_image(self, image: str) -> None:
        """Make a Docker image of this machine available to the real node's containerd."""
        node.import_image(self.node_paths, image)

    def _write_kubeconfig(self, material: pki.Pki, identity: pki.Identity, server: str) -> Path:
        return write_kubeconfig(self.dir / "kubeconfigs", material, identity, server)


def kubectl(
    info: ClusterInfo, *args: str, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the cluster's own kubectl against it; raise with kubectl's stderr on failure."""
    result = subprocess.run(
        [str(Path(info.bin_dir) / "kubectl"), f"--kubeconfig={info.kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def relayed_ports(info: ClusterInfo) -> list[int]:
    """The loopback ports relayed to pods: the API server's first, then Prometheus' if any."""
    urls = [info.server, *([info.prometheus] if info.prometheus else [])]
    return [int(urllib.parse.urlsplit(url).port or 0) for url in urls]


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def resolve_binaries(kind: str = "control-plane") -> Path:
    """The directory of the pinned binaries of ``kind`` (control-plane or node); the script may
    build them (progress on stderr)."""
    result = subprocess.run(
        ["bash", str(BINARIES_SCRIPT), kind],
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        check=True,
    )
    return Path(result.stdout.strip().splitlines()[-1])


def _say(message: str) -> None:
    print(f"[kiln-localcluster] {message}", file=sys.stderr, flush=True)
