"""The fake GPU nodes' pod range, and a service range no kube-proxy owns, stay on this machine.

Why it exists: kwok hands the pods of its fake GPU nodes IPs from the pod range, but no container
runs behind them, so nothing answers there. Traffic can still head for them: the operator's
warm-up gate probes a pod's IP, and a Service whose endpoints are such pods leads its cluster IP
there. This workplace allows traffic only to loopback and to the network namespaces its tests
create, so an ``unreachable`` route makes every such packet fail at once on this machine instead
of leaving it by the default route. Without the real node nobody routes the service range either
(the real node puts it on its bridge, where kube-proxy rewrites it), so it gets the same route.

Only the routes this module added are removed, by the ranges the cluster recorded.
"""

import os
import subprocess


def available() -> str | None:
    """None when routes can be set here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "routing needs root"
    try:
        subprocess.run(["ip", "-V"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "routing needs iproute2 (`ip`)"
    return None


def isolate(ranges: list[str]) -> None:
    """Make every address of ``ranges`` unreachable from this machine (a local route)."""
    for cidr in ranges:
        result = subprocess.run(
            ["ip", "route", "replace", "unreachable", cidr],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"ip route replace unreachable {cidr}: {result.stderr.strip()}")


def release(ranges: list[str]) -> None:
    """Remove the routes ``isolate`` added for ``ranges`` (an absent one is no error)."""
    for cidr in ranges:
        subprocess.run(
            ["ip", "route", "del", "unreachable", cidr], capture_output=True, check=False
        )
