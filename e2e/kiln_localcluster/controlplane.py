"""The command lines that make the upstream binaries a working control plane.

Why it exists: one place knows the flags each component needs here (TLS, RBAC, service-account
tokens, PodSecurity admission, an audit log of writes, kwok's fake GPU nodes) and why each
unusual one is set. Each function only builds an argv; ``cluster`` starts the processes, in
order, and waits for each.
"""

from pathlib import Path

from kiln_localcluster import pki

_PACKAGE = Path(__file__).resolve().parent
SERVICE_CIDR = "10.96.0.0/16"


def etcd_argv(bin_dir: Path, data_dir: Path, client_url: str, peer_port: int) -> list[str]:
    """A single-member etcd on loopback; no fsync (the cluster is thrown away, not recovered)."""
    return [
        str(bin_dir / "etcd"),
        "--name=kiln",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-cluster=kiln=http://127.0.0.1:{peer_port}",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def apiserver_argv(
    bin_dir: Path, etcd_url: str, port: int, material: pki.Pki, audit_log: Path
) -> list[str]:
    """kube-apiserver on loopback, with TLS, Node and RBAC authorization, the admission plugins
    of a production cluster and an audit log of every write."""
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--advertise-address=127.0.0.1",
        # The endpoint reconciler refuses a loopback address; the `kubernetes` Service's
        # endpoints are not needed by anything that runs here.
        "--endpoint-reconciler-type=none",
        f"--tls-cert-file={material.serving_cert}",
        f"--tls-private-key-file={material.serving_key}",
        f"--client-ca-file={material.ca_cert}",
        # The Node authorizer and NodeRestriction confine the real node's kubelet to
        # its own node and pods, as in any production cluster.
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,PodSecurity,"
        "DefaultTolerationSeconds,ResourceQuota,LimitRanger,NodeRestriction",
        # The API server's client identity towards kubelets (logs, exec).
        f"--kubelet-client-certificate={material.client_cert(pki.ADMIN)}",
        f"--kubelet-client-key={material.client_key(pki.ADMIN)}",
        # By its IP: a node name resolves nowhere here, and must not be asked of DNS.
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=true",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={material.service_account_pub}",
        f"--service-account-signing-key-file={material.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # Allocate cluster IPs only through IPAddress objects (the default from 1.34):
        # 1.33 still also updates the legacy bitmap, one etcd key rewritten per Service,
        # which makes Service creation crawl when hundreds are created at once.
        "--feature-gates=DisableAllocatorDualWrite=true",
        f"--audit-policy-file={_PACKAGE / 'audit-policy.yaml'}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
        "--audit-log-mode=blocking",
        "--audit-log-maxsize=200",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(bin_dir: Path, kubeconfig: Path, material: pki.Pki) -> list[str]:
    """kube-controller-manager, each controller with its own service-account credentials."""
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        "--leader-elect=false",
        # Without the ServiceCIDR controller: it rewrites the default ServiceCIDR's
        # status for every allocated cluster IP, and the API server then rebuilds
        # its IP allocator each time, stalling Service creation when hundreds are
        # created at once. The local cluster has one fixed ServiceCIDR.
        "--controllers=*,-service-cidr-controller",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={material.service_account_key}",
        f"--root-ca-file={material.ca_cert}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--concurrent-deployment-syncs=10",
        "--concurrent-replicaset-syncs=10",
        "--concurrent-gc-syncs=20",
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        "--v=1",
    ]


def scheduler_argv(bin_dir: Path, kubeconfig: Path) -> list[str]:
    return [
        str(bin_dir / "kube-scheduler"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        "--leader-elect=false",
        "--v=1",
    ]


def kwok_argv(bin_dir: Path, kubeconfig: Path) -> list[str]:
    """kwok, playing the kubelet of the fake GPU nodes only (those annotated for it), with
    Kiln's pod stages; the real node's own kubelet is left alone."""
    return [
        str(bin_dir / "kwok"),
        f"--kubeconfig={kubeconfig}",
        f"--config={_PACKAGE / 'kwok-pod-stages.yaml'}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        "--node-lease-duration-seconds=40",
        "--server-address=",
    ]
