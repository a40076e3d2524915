"""A real worker node for the local cluster: containerd + runc + CNI, kubelet and kube-proxy.

Why it exists: kwok's nodes run no containers, so what a user's cluster does with Kiln's output —
the runtime image under a kubelet, the generated pod spec (security context, probes, preStop,
volumes), traffic through a Service's cluster IP — needs a node agent of its own. Like
Kubernetes' ``hack/local-up-cluster.sh``, this runs the upstream kubelet and kube-proxy on this
machine against Debian's containerd, with a CNI bridge in a pod range the cluster owns.

What had to be configured, and why:
- containerd gets its own socket, state and config; its image store lives in the cache beside
  the Kubernetes binaries, so an imported image (the runtime's is several GB) survives
  ``down``/``up`` and new checkouts.
- No registry is reachable: the sandbox ("pause") image is a static binary built here from
  ``pause.c`` and imported, and ``sandbox_image`` names it. Kiln's runtime image is imported from
  Docker the same way, once per image ID; the image its tag named before is then removed.
- This machine's root lacks CAP_SYS_RESOURCE, so no process may lower its OOM score below its
  parent's; the kubelet asks for -998 for sandboxes. containerd's ``restrict_oom_score_adj``
  clamps such requests instead of failing every sandbox.
- The cgroupfs driver on both kubelet and containerd (no systemd here), swap tolerated, image
  garbage collection off (an imported image can never be pulled again), eviction thresholds low
  (the tests share the disk with everything else).
- The node's IP is the CNI bridge's own address, created before the kubelet starts, so the API
  server reaches the kubelet (logs, exec) and kube-proxy's node IP is an address this cluster owns.
- The node advertises ``nvidia.com/gpu`` as an extended resource patched into its status (the
  documented way without a device plugin) and the ``nvidia.com/gpu.product`` label; it has no GPU.
"""

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kiln_localcluster import pki
from kiln_localcluster.processes import ProcessTable, free_ports, spawn, stop, wait_started

_PACKAGE = Path(__file__).resolve().parent
NODE_NAME = pki.NODE_NAME
BRIDGE = "kilnnode0"
POD_CIDR = "10.245.0.0/24"
NODE_IP = "10.245.0.1"
SANDBOX_IMAGE = "kiln.local/pause:1"
CNI_BIN_DIR = Path("/usr/lib/cni")
CONTAINERD_NAMESPACE = "k8s.io"
HOLD_SUFFIX = "kiln-previous"  # the tag an image keeps while its successor is imported
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def available() -> str | None:
    """None when this machine can run the node, else what is missing."""
    if os.geteuid() != 0:
        return "the real node needs root"
    for tool in ("containerd", "ctr", "runc", "iptables", "conntrack", "docker", "cc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run `make system-deps`)"
    if not (CNI_BIN_DIR / "bridge").exists():
        return f"the CNI plugins are not in {CNI_BIN_DIR} (run `make system-deps`)"
    return None


def _image_cache() -> Path:
    """The node's image store, beside the Kubernetes binaries' cache: one real node runs on a
    machine at a time, and an image imported once (the runtime's is several GB) stays."""
    root = (
        os.environ.get("KILN_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln"
    )
    return Path(root) / "node-images"


@dataclass(frozen=True)
class NodePaths:
    """Where the node keeps its state: ephemeral under the cluster, the image store beside it."""

    cluster_dir: Path
    state_dir: Path

    @property
    def run(self) -> Path:
        return self.cluster_dir / "node"

    @property
    def containerd_root(self) -> Path:
        return _image_cache() / "containerd"

    @property
    def imported(self) -> Path:
        """One file per image ID imported into containerd: the manifest its tag named then."""
        return _image_cache() / "imported"

    @property
    def socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def processes(self) -> Path:
        return self.run / "processes.json"


@dataclass(frozen=True)
class NodeCredentials:
    kubelet_kubeconfig: Path
    proxy_kubeconfig: Path
    ca_cert: Path


def ctr(paths: NodePaths, *args: str) -> str:
    """Run containerd's own client against this node's containerd."""
    result = subprocess.run(
        ["ctr", f"--address={paths.socket}", "-n", CONTAINERD_NAMESPACE, *args],
        capture_output=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"ctr {' '.join(args)}: {result.stderr.decode().strip()}")
    return result.stdout.decode()


def start(
    paths: NodePaths,
    node_bin_dir: Path,
    credentials: NodeCredentials,
    *,
    gpu_product: str,
    service_cidr: str,
    pod_cidr: str = POD_CIDR,
) -> None:
    """Start containerd, the kubelet and kube-proxy; the caller waits for the node to be Ready."""
    table = ProcessTable(paths.processes)
    logs = paths.run / "logs"
    _create_bridge(service_cidr)
    _write_containerd_config(paths)
    _write_cni_config(paths, pod_cidr, service_cidr)
    containerd = spawn(
        "containerd", ["containerd", f"--config={paths.run / 'containerd.toml'}"],
        logs / "containerd.log",
    )  # fmt: skip
    table.add(containerd)
    wait_started(containerd, paths.socket.exists, timeout=30)
    import_image(paths, SANDBOX_IMAGE, build=lambda: _build_sandbox_image(paths))

    kubelet_config = _write_kubelet_config(paths, credentials, pod_cidr)
    metrics_port, healthz_port = free_ports(2)
    table.add(
        spawn(
            "kubelet",
            [
                str(node_bin_dir / "kubelet"),
                f"--config={kubelet_config}",
                f"--kubeconfig={credentials.kubelet_kubeconfig}",
                f"--root-dir={paths.run / 'kubelet'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                f"--node-labels={GPU_PRODUCT_LABEL}={gpu_product}",
                "--v=1",
            ],
            logs / "kubelet.log",
        )
    )
    table.add(
        spawn(
            "kube-proxy",
            [
                str(node_bin_dir / "kube-proxy"),
                f"--kubeconfig={credentials.proxy_kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                f"--cluster-cidr={pod_cidr}",
                "--proxy-mode=iptables",
                # Leave the machine's conntrack table size alone (a sysctl outside this cluster).
                "--conntrack-max-per-core=0",
                f"--metrics-bind-address=127.0.0.1:{metrics_port}",
                f"--healthz-bind-address=127.0.0.1:{healthz_port}",
                "--v=1",
            ],
            logs / "kube-proxy.log",
        )
    )


def advertise_gpus_patch(gpus: int) -> str:
    """The status patch that advertises ``gpus`` GPUs as an extended resource."""
    return json.dumps({"status": {"capacity": {GPU_RESOURCE: str(gpus)}}})


def import_image(paths: NodePaths, image: str, build: Callable[[], None] | None = None) -> None:
    """Import a Docker image into the node's containerd once per image ID (no registry here).

    The store outlives the cluster and the checkout, and the kubelet's image garbage collection
    is off, so the image this one replaces under its tag is removed here: after the import, so
    that the layers the two share (torch's several GB among them) stay where they are."""
    if build is not None and not _docker_has(image):
        build()
    image_id = subprocess.run(
        ["docker", "image", "inspect", "--format={{.Id}}", image],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    # The marker holds the manifest the tag named after this image's import: the tag may have
    # moved to another import since.
    marker = paths.imported / image_id.replace(":", "-")
    listing = ctr(paths, "images", "ls")
    refs = _image_refs(listing)
    current = _names_of(image, refs)
    if marker.exists() and current and refs[current[0]] == marker.read_text():
        return
    _remove(paths, stale_images(listing))  # an earlier run's, before this import needs the space
    # The image the tag names now keeps a second name until the new one has unpacked: the
    # import moves the tag first, and containerd's garbage collection would otherwise take the
    # old image's layers, the very ones the new image reuses, from under the unpacking.
    holds = [f"{ref}-{HOLD_SUFFIX}" for ref in current]
    for ref, hold in zip(current, holds, strict=True):
        ctr(paths, "images", "tag", "--force", ref, hold)
    try:
        error = _stream_into_containerd(paths, image)
    finally:
        if holds:
            ctr(paths, "images", "rm", *holds)
    if error is not None:
        free = shutil.disk_usage(paths.containerd_root).free
        raise RuntimeError(
            f"importing {image} failed ({free / 2**30:.1f} GiB free in {paths.containerd_root}): "
            f"{error}"
        )
    listing = ctr(paths, "images", "ls")
    refs = _image_refs(listing)
    current = _names_of(image, refs)
    if not current:
        raise RuntimeError(f"importing {image}: containerd lists no image by that name")
    paths.imported.mkdir(parents=True, exist_ok=True)
    marker.write_text(refs[current[0]])
    _remove(paths, stale_images(listing))


def _names_of(image: str, refs: dict[str, str]) -> list[str]:
    """containerd's names for a Docker reference (``kiln/runtime:dev`` is
    ``docker.io/kiln/runtime:dev`` there)."""
    return [ref for ref in refs if ref == image or ref.endswith("/" + image)]


def _stream_into_containerd(paths: NodePaths, image: str) -> str | None:
    """``docker save | ctr images import``, streamed (the runtime image is several GB): the
    error, or None."""
    saved = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    imported = subprocess.run(
        ["ctr", f"--address={paths.socket}", "-n", CONTAINERD_NAMESPACE, "images", "import", "-"],
        stdin=saved.stdout, capture_output=True, timeout=1200, check=False,
    )  # fmt: skip
    if saved.stdout is not None:
        saved.stdout.close()
    if saved.wait(timeout=60) != 0 or imported.returncode != 0:
        return imported.stderr.decode().strip() or f"docker save {image} failed"
    return None


def _remove(paths: NodePaths, images: list[str]) -> None:
    if images:
        # --sync: containerd's garbage collection frees their layers (those no image shares).
        ctr(paths, "images", "rm", "--sync", *images)


def stale_images(listing: str) -> list[str]:
    """The images no tag names any more, from ``ctr images ls``.

    The CRI plugin names each image by its ID (``sha256:...``) as well as by its tag, so when a
    tag moves to a new import, the image it named stays behind under its ID alone: nothing here
    will run it again, and each is several GB. An ID naming the same manifest as a tag is kept."""
    refs = _image_refs(listing)
    by_id = {ref: digest for ref, digest in refs.items() if ref.startswith("sha256:")}
    tagged = {digest for ref, digest in refs.items() if ref not in by_id}
    return [ref for ref, digest in by_id.items() if digest not in tagged]


def _image_refs(listing: str) -> dict[str, str]:
    """``ctr images ls`` as {name: manifest digest} (columns REF TYPE DIGEST SIZE ...)."""
    rows = [line.split() for line in listing.splitlines()[1:]]
    return {row[0]: row[2] for row in rows if len(row) >= 3}


def teardown(paths: NodePaths, node_bin_dir: Path) -> None:
    """Stop the node: kubelet first (it would restart what is killed), then every container,
    containerd and kube-proxy; then undo what they left in the machine's network and mounts."""
    if not paths.processes.exists():
        return
    table = ProcessTable(paths.processes)
    started = paths.processes.stat().st_mtime
    for process in list(reversed(table.processes)):
        if process.name == "kubelet":
            stop(process)
            table.remove(process)
    with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired, OSError):
        for task in ctr(paths, "tasks", "ls", "-q").split():
            with contextlib.suppress(RuntimeError):
                ctr(paths, "tasks", "kill", "--signal=SIGKILL", task)
        deadline = time.monotonic() + 20
        while ctr(paths, "tasks", "ls", "-q").split() and time.monotonic() < deadline:
            for task in ctr(paths, "tasks", "ls", "-q").split():
                with contextlib.suppress(RuntimeError):
                    ctr(paths, "tasks", "delete", "--force", task)
            time.sleep(0.2)
        for container in ctr(paths, "containers", "ls", "-q").split():
            with contextlib.suppress(RuntimeError):
                ctr(paths, "containers", "delete", container)
    table.stop_all()
    subprocess.run(
        [str(node_bin_dir / "kube-proxy"), "--cleanup"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    _remove_kube_chains()
    _unmount_below(paths.run)
    _remove_sandbox_namespaces(since=started - 60)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)


# ---------------------------------------------------------------------- configuration files
def _create_bridge(service_cidr: str) -> None:
    """The CNI bridge, made before the kubelet so its address can be the node's IP, and the
    route that keeps cluster IPs on it: a packet to a cluster IP that kube-proxy has not (yet)
    rewritten must die on this bridge, never leave the machine by its default route."""
    if (
        subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True, check=False).returncode
        != 0
    ):
        subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
    prefix = POD_CIDR.split("/")[1]
    subprocess.run(["ip", "addr", "replace", f"{NODE_IP}/{prefix}", "dev", BRIDGE], check=True)
    subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True)
    subprocess.run(["ip", "route", "replace", service_cidr, "dev", BRIDGE], check=True)


def _write_containerd_config(paths: NodePaths) -> None:
    paths.run.mkdir(parents=True, exist_ok=True)
    paths.containerd_root.mkdir(parents=True, exist_ok=True)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    (paths.run / "containerd.toml").write_text(
        f"""version = 2
root = "{paths.containerd_root}"
state = "{paths.run / "containerd-state"}"
[grpc]
  address = "{paths.socket}"
[{cri}]
  sandbox_image = "{SANDBOX_IMAGE}"
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{paths.run / "cni"}"
"""
    )


def _write_cni_config(paths: NodePaths, pod_cidr: str, service_cidr: str) -> None:
    """Pods get their range and the service range, both through the bridge (kube-proxy rewrites
    a cluster IP there, on this machine); no default route, so nothing of theirs leaves it."""
    conf_dir = paths.run / "cni"
    conf_dir.mkdir(parents=True, exist_ok=True)
    ipam = {
        "type": "host-local",
        "ranges": [[{"subnet": pod_cidr, "gateway": NODE_IP}]],
        "routes": [{"dst": service_cidr, "gw": NODE_IP}],
        "dataDir": str(paths.run / "ipam"),
    }
    conflist = {
        "cniVersion": "1.0.0",
        "name": "kiln-node",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
             "hairpinMode": True, "ipam": ipam},
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "loopback"},
        ],
    }  # fmt: skip
    (conf_dir / "10-kiln-node.conflist").write_text(json.dumps(conflist, indent=2))


def _write_kubelet_config(paths: NodePaths, credentials: NodeCredentials, pod_cidr: str) -> Path:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "address": NODE_IP,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(credentials.ca_cert)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "podCIDR": pod_cidr,
        "clusterDomain": "cluster.local",
        "resolvConf": "",
        "serializeImagePulls": False,
        # An imported image can never be pulled again: never collect one.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "enforceNodeAllocatable": [],
        "registerNode": True,
        "failCgroupV1": False,
        "maxPods": 50,
        # kube-proxy owns the node's iptables rules; the kubelet's own chains would outlive it.
        "makeIPTablesUtilChains": False,
    }  # fmt: skip
    path = paths.run / "kubelet-config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


# ---------------------------------------------------------------------- images
def _docker_has(image: str) -> bool:
    inspect = ["docker", "image", "inspect", image]
    return subprocess.run(inspect, capture_output=True, check=False).returncode == 0


def _build_sandbox_image(paths: NodePaths) -> None:
    """A static ``pause`` from our own C source, as a one-file image (nothing can be pulled)."""
    work = paths.run / "pause-build"
    work.mkdir(parents=True, exist_ok=True)
    _run(["cc", "-Os", "-static", "-o", str(work / "pause"), str(_PACKAGE / "pause.c")])
    _run(["tar", "-C", str(work), "-cf", str(work / "pause.tar"), "pause"])
    _run(["docker", "import", "--change", 'ENTRYPOINT ["/pause"]', str(work / "pause.tar"),
          SANDBOX_IMAGE])  # fmt: skip


def _run(args: list[str]) -> None:
    """Run a build step; its failure says the command and what it printed (e.g. Docker's
    daemon not running), not only an exit status."""
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        raise RuntimeError(f"{' '.join(args[:2])} failed ({result.returncode}): {output}")


# ---------------------------------------------------------------------- clean-up
def _unmount_below(directory: Path) -> None:
    """Lazily unmount whatever the kubelet and containerd left mounted under ``directory``."""
    prefix = str(directory.resolve())
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)


def _remove_kube_chains() -> None:
    """What ``kube-proxy --cleanup`` leaves (KUBE-FIREWALL, canaries, KUBE-MARK-MASQ): every
    KUBE-* chain and every rule that jumps to one, rewritten table by table in one restore."""
    for table in ("filter", "nat", "mangle"):
        saved = subprocess.run(
            ["iptables-save", "-t", table], capture_output=True, text=True, check=False
        ).stdout
        if "KUBE-" not in saved:
            continue
        kept = [line for line in saved.splitlines() if "KUBE-" not in line]
        subprocess.run(
            ["iptables-restore", "-T", table], input="\n".join(kept) + "\n",
            capture_output=True, text=True, check=False,
        )  # fmt: skip


def _remove_sandbox_namespaces(since: float) -> None:
    """The CNI namespaces of sandboxes killed without a CNI DEL, made by this node's run."""
    netns_dir = Path("/var/run/netns")
    if not netns_dir.exists():
        return
    for netns in netns_dir.glob("cni-*"):
        with contextlib.suppress(OSError):
            if netns.stat().st_mtime >= since:
                subprocess.run(["ip", "netns", "del", netns.name], capture_output=True, check=False)
