"""Pod networking for the local cluster: each runnable pod gets its IP in its own network namespace.

Why it exists: Endpoints and EndpointSlices refuse loopback addresses, so a fake pod whose server
listens on 127.x never joins a Service. Instead, as a CNI plugin would, each pod that really runs
gets a network namespace holding the IP kwok assigned, joined by a veth pair to a bridge that owns
the whole pod range. Traffic to any pod IP therefore stays on this machine: an address with no
namespace behind it is unanswered on the bridge, never routed out. The service range has no
kube-proxy behind it, so it is made unreachable for the same reason.

Only namespaces and links this module creates are removed, by the names it recorded.
"""

import hashlib
import ipaddress
import os
import re
import subprocess
from dataclasses import dataclass

BRIDGE = "kiln0"
NETNS_PREFIX = "kiln-"


@dataclass(frozen=True)
class PodNetwork:
    """The address plan: the pod range (on the bridge) and the service range (unreachable)."""

    pod_cidr: str = "10.244.0.0/16"
    service_cidr: str = "10.96.0.0/16"

    @property
    def gateway(self) -> str:
        """The bridge's address: the last usable address of the pod range."""
        network = ipaddress.ip_network(self.pod_cidr)
        return str(network.broadcast_address - 1)

    @property
    def prefix_length(self) -> int:
        return ipaddress.ip_network(self.pod_cidr).prefixlen


def available() -> str | None:
    """None when pod networking can be set up here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "pod networking needs root (network namespaces)"
    try:
        subprocess.run(["ip", "-V"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "pod networking needs iproute2 (`ip`)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def create_bridge(net: PodNetwork) -> None:
    """Create the bridge owning the pod range, fresh, and make the service range unreachable.

    A bridge and pod namespaces left by an earlier run whose processes were killed (a stopped
    session) would still hold pod IPs that the new cluster hands out again; they go first.
    """
    remove_bridge(net)
    for netns in stale_namespaces():
        _ip("netns", "del", netns, check=False)
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "replace", f"{net.gateway}/{net.prefix_length}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    _ip("route", "replace", "unreachable", net.service_cidr)


def stale_namespaces() -> list[str]:
    """Pod namespaces of this module's naming (kiln-<10 hex digits>) that exist now."""
    listing = _ip("netns", "list").stdout.split("\n")
    names = [line.split()[0] for line in listing if line.strip()]
    return [n for n in names if re.fullmatch(rf"{NETNS_PREFIX}[0-9a-f]{{10}}", n)]


def remove_bridge(net: PodNetwork) -> None:
    _ip("route", "del", "unreachable", net.service_cidr, check=False)
    _ip("link", "del", BRIDGE, check=False)


def names_for(pod_uid: str) -> tuple[str, str]:
    """Deterministic (namespace, host-side veth) names for a pod; interface names ≤ 15 chars."""
    digest = hashlib.sha256(pod_uid.encode()).hexdigest()[:10]
    return f"{NETNS_PREFIX}{digest}", f"kv{digest}"


def attach(net: PodNetwork, pod_uid: str, pod_ip: str) -> str:
    """Create the pod's namespace with ``pod_ip`` on eth0, routed via the bridge; return it."""
    if ipaddress.ip_address(pod_ip) not in ipaddress.ip_network(net.pod_cidr):
        raise ValueError(f"pod IP {pod_ip} is outside the pod range {net.pod_cidr}")
    netns, host_veth = names_for(pod_uid)
    detach(pod_uid)  # a leftover from an interrupted run
    _ip("netns", "add", netns)
    _ip("link", "add", host_veth, "type", "veth", "peer", "name", f"{host_veth}p")
    _ip("link", "set", f"{host_veth}p", "netns", netns)
    _ip("link", "set", host_veth, "master", BRIDGE)
    _ip("link", "set", host_veth, "up")
    _ip("-n", netns, "link", "set", f"{host_veth}p", "name", "eth0")
    _ip("-n", netns, "addr", "add", f"{pod_ip}/{net.prefix_length}", "dev", "eth0")
    _ip("-n", netns, "link", "set", "eth0", "up")
    _ip("-n", netns, "link", "set", "lo", "up")
    _ip("-n", netns, "route", "add", "default", "via", net.gateway)
    return netns


def detach(pod_uid: str) -> None:
    """Remove the pod's namespace and veth pair if they exist."""
    netns, host_veth = names_for(pod_uid)
    _ip("link", "del", host_veth, check=False)
    _ip("netns", "del", netns, check=False)
