#!/usr/bin/env bash
# Kiln end to end on kind, for machines with Docker and internet access (kind pulls its node
# image). Not run in CI here: this project's CI machines reach no image registry, and the local
# control plane (`make demo`, `make test`) covers the same paths there.
#
# kind nodes have no GPUs: they advertise imitated ones, and the suite's one GPU service runs on
# their CPU (KILN_IMITATED_GPUS); the others are CPU services. Steps: a kind cluster;
# the operator and runtime images built locally and loaded into it; `kubectl apply -k
# manifests/`; then `tests/e2e`, the suite `make test` runs on the local cluster's real node.
set -euo pipefail
cd "$(dirname "$0")/.."

cluster=${KIND_CLUSTER:-kiln}
operator_image=${OPERATOR_IMAGE:-kiln/operator:dev}
runtime_image=${RUNTIME_IMAGE:-kiln/runtime:dev}
base_image=${BASE_IMAGE:-python:3.11-slim-bookworm}

for tool in kind kubectl docker; do
  command -v "$tool" >/dev/null || { echo "kind e2e needs $tool" >&2; exit 1; }
done

kind get clusters | grep -qx "$cluster" || kind create cluster --name "$cluster" --wait 120s
# Each context is its directory plus the project's constraints.txt (the Dockerfiles pin with it).
tar -c --exclude=__pycache__ -C operator Dockerfile pyproject.toml kiln_operator -C "$PWD" constraints.txt \
  | docker build --build-arg BASE_IMAGE="$base_image" -t "$operator_image" -
tar -c --exclude=__pycache__ --exclude='*.so' -C runtime_image Dockerfile pyproject.toml setup.py kiln_runtime \
  -C "$PWD" constraints.txt \
  | docker build --build-arg BASE_IMAGE="$base_image" -t "$runtime_image" -
# The CPU sample serves /opt/models/mlp.pt from inside the image: bake the example MLP in.
docker build -t "$runtime_image-example" - <<DOCKERFILE
FROM $runtime_image
USER root
RUN python -m kiln_runtime example-model --kind mlp --out /opt/models/mlp-example \
 && ln -s /opt/models/mlp-example/model.pt /opt/models/mlp.pt
USER 10001:10001
DOCKERFILE
kind load docker-image --name "$cluster" "$operator_image" "$runtime_image-example"

# kind has no GPUs: its nodes advertise imitated ones (an extended resource patched into the node
# status, the documented way without a device plugin, and the product label), and the operator
# runs with KILN_IMITATED_GPUS (the component manifests/components/imitated-gpus, the chart's
# imitatedGpus), so the suite's GPU service runs its runtime on the node's CPU.
gpu_product=NVIDIA-A100-SXM4-80GB
for node in $(kubectl get nodes -o name); do
  kubectl label --overwrite "$node" nvidia.com/gpu.product="$gpu_product"
  kubectl patch "$node" --subresource=status --type=merge \
    -p '{"status":{"capacity":{"nvidia.com/gpu":"8"}}}'
done

kubectl apply -k manifests/
kubectl -n kiln-system set image deployment/kiln-operator operator="$operator_image"
kubectl -n kiln-system set env deployment/kiln-operator KILN_IMITATED_GPUS=true
kubectl -n kiln-system rollout status deployment/kiln-operator --timeout=180s

# The same end-to-end suite as the local cluster's, against this cluster: the model is the one
# baked into the image, Services are reached through kubectl port-forward.
KILN_E2E_KUBECONFIG=$(mktemp)
kind get kubeconfig --name "$cluster" >"$KILN_E2E_KUBECONFIG"
export KILN_E2E_KUBECONFIG KILN_E2E_KUBECTL=$(command -v kubectl)
export KILN_E2E_RUNTIME_IMAGE="$runtime_image-example"
export KILN_E2E_MODEL_URI=/opt/models/mlp-example/model.pt
.venv/bin/python -m pytest tests/e2e
