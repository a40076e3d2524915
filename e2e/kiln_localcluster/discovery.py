"""A Prometheus that discovers Kiln's pods as a user's in-cluster Prometheus does.

Why it exists: docs/prometheus.md ships a scrape configuration (manifests/prometheus/) for users
without the Prometheus Operator: Kubernetes pod discovery with the Prometheus pod's own
ServiceAccount token, relabelled by Kiln's labels. The tests run that very file. Debian's
Prometheus has no Kubernetes discovery, so this one is built from Prometheus's Go module
(e2e/gotools/build.sh prometheus).

The local API server listens on loopback only, so Prometheus runs on the host (where the pod IPs
are reachable through the node's bridge) but sees the cluster as a pod does: in a mount
namespace of its own, the ServiceAccount's token, the cluster's CA and the namespace are mounted
at /var/run/secrets/kubernetes.io/serviceaccount, and KUBERNETES_SERVICE_HOST/PORT name the API
server, exactly the inputs a kubelet gives a pod and client-go's in-cluster configuration reads.
The scrape configuration therefore carries no api_server and no credentials, as the shipped one.
"""

import base64
import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kiln_localcluster.cluster import ClusterInfo, kubectl
from kiln_localcluster.processes import free_ports, spawn, wait_started
from kiln_localcluster.prometheus import LocalPrometheus
from kiln_localcluster.waiting import http_ok

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where a kubelet mounts a pod's ServiceAccount credentials (and client-go reads them)."""
TOKEN_SECONDS = 3 * 3600
"""Lifetime of the token requested for Prometheus: longer than any test session's use of it."""
_POD_VIEW = (
    "sa=$1; shift; mount -t tmpfs -o mode=0755,size=1m kiln-pod-view /run"
    f' && mkdir -p {SERVICE_ACCOUNT_DIR} && mount --bind -o ro "$sa" {SERVICE_ACCOUNT_DIR}'
    ' && exec "$@"'
)
"""In a private mount namespace: a fresh /run (the host's is untouched), the credentials bound
where a pod has them, then Prometheus in this process's place (so its PID is the one spawned)."""


@dataclass(frozen=True)
class ServiceAccount:
    namespace: str
    name: str


def discovery_config(scrape_config_file: Path, interval_seconds: float) -> dict[str, Any]:
    """prometheus.yml: the global intervals, and the shipped scrape configuration included as
    it is (`scrape_config_files`), so its jobs take the global interval."""
    interval = f"{round(interval_seconds * 1000)}ms"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_config_files": [str(scrape_config_file)],
    }


def _cluster_ca(info: ClusterInfo) -> bytes:
    config = yaml.safe_load(Path(info.kubeconfig).read_text())
    cluster = config["clusters"][0]["cluster"]
    if "certificate-authority-data" in cluster:
        return base64.b64decode(cluster["certificate-authority-data"])
    return Path(cluster["certificate-authority"]).read_bytes()


def pod_credentials(info: ClusterInfo, account: ServiceAccount, directory: Path) -> Path:
    """A directory holding what the kubelet mounts into a pod of `account`: a token requested
    from the API server (TokenRequest, as a projected token is), the cluster's CA, the
    namespace."""
    token = kubectl(
        info, "create", "token", account.name, "-n", account.namespace,
        f"--duration={TOKEN_SECONDS}s",
    ).stdout.strip()  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes(_cluster_ca(info))
    (directory / "namespace").write_text(account.namespace)
    return directory


def start_discovering_prometheus(
    binary: Path,
    info: ClusterInfo,
    account: ServiceAccount,
    *,
    scrape_config_file: Path,
    directory: Path,
    interval_seconds: float = 1.0,
) -> LocalPrometheus:
    """Start `binary` (a Prometheus with Kubernetes discovery) on a free loopback port with
    `scrape_config_file` and `account`'s credentials as a pod would have them; wait until ready.
    Needs root (a mount namespace)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "prometheus.yml"
    config.write_text(yaml.safe_dump(discovery_config(scrape_config_file, interval_seconds)))
    credentials = pod_credentials(info, account, directory / "serviceaccount")
    server = urllib.parse.urlsplit(info.server)
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "KUBERNETES_SERVICE_HOST": server.hostname or "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(server.port or 443),
    }
    process = spawn("prometheus", [
        "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _POD_VIEW, "sh",
        str(credentials), str(binary), f"--config.file={config}",
        f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=2h", "--log.level=warn",
    ], directory / "prometheus.log", env=env)  # fmt: skip
    wait_started(process, lambda: http_ok(f"{url}/-/ready"), timeout=30)
    return LocalPrometheus(process=process, url=url)
