"""The runtime benchmark: kiln_runtime against Triton (via nvidia-pytriton) on loopback."""
