#!/usr/bin/env bash
# `make demo`: Kiln's main job on this machine — a real local control plane with fake GPU nodes.
# Later stages (operator, sample InferenceService, load) are added as they land.
set -euo pipefail
cd "$(dirname "$0")/.."

py=.venv/bin/python
"$py" -m kiln_localcluster up
export KUBECONFIG="$PWD/.kiln/kubeconfig"
kubectl=$(bash e2e/cluster/binaries.sh)/kubectl

echo
echo "== GPU nodes (kwok) =="
"$kubectl" get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count
echo
echo "The cluster keeps running: export KUBECONFIG=$KUBECONFIG ; stop it with 'make cluster-down'."
