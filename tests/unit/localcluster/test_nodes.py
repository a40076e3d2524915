"""Fake GPU nodes look like a GPU pool's nodes to the scheduler."""

from kiln_localcluster.nodes import build_gpu_node


def test_gpu_node_offers_gpus_with_label_and_taint() -> None:
    node = build_gpu_node(2, gpus=8, product="NVIDIA-H100", pod_cidr="10.244.2.0/24")
    assert node["metadata"]["name"] == "kiln-gpu-2"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100"
    assert node["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    assert node["spec"]["podCIDR"] == "10.244.2.0/24"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
