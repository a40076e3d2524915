"""The pod network's address plan and names are deterministic and fit the kernel's limits."""

import pytest

from kiln_localcluster import podnet


def test_gateway_is_last_usable_address_of_the_pod_range() -> None:
    assert podnet.PodNetwork("10.244.0.0/16").gateway == "10.244.255.254"


def test_names_are_stable_and_short() -> None:
    netns, veth = podnet.names_for("0b9d7c1e-uid")
    assert (netns, veth) == podnet.names_for("0b9d7c1e-uid")
    assert netns.startswith(podnet.NETNS_PREFIX)
    assert len(veth) + 1 <= 15  # the peer is named <veth>p before it becomes eth0


def test_an_ip_outside_the_pod_range_is_refused() -> None:
    with pytest.raises(ValueError, match="outside the pod range"):
        podnet.attach(podnet.PodNetwork("10.244.0.0/16"), "uid", "192.0.2.1")
