"""Fake GPU nodes, shaped like the nodes of a real GPU pool.

Why it exists: Kiln schedules on GPU nodes by resource (`nvidia.com/gpu`), product label and
the taint GPU pools carry; the fake nodes must offer exactly that so scheduling is real.
"""

from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_TAINT_KEY = "nvidia.com/gpu"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"


def build_gpu_node(index: int, *, gpus: int, product: str, pod_cidr: str) -> dict[str, Any]:
    """A Node object for kwok to manage: GPUs in capacity, product label, NoSchedule taint."""
    name = f"kiln-gpu-{index}"
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                GPU_PRODUCT_LABEL: product,
                "nvidia.com/gpu.count": str(gpus),
            },
        },
        "spec": {
            "podCIDR": pod_cidr,
            "podCIDRs": [pod_cidr],
            "taints": [{"key": GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"}],
        },
        "status": {"capacity": resources, "allocatable": resources},
    }
