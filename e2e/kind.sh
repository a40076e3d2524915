#!/usr/bin/env bash
# Kiln end to end on kind, for machines with Docker and internet access (kind pulls its node
# image). Not run in CI here: this project's CI machines reach no image registry, and the local
# control plane (`make demo`, `make test`) covers the same paths there.
#
# kind nodes have no GPUs: the sample is the CPU one (gpuCount 0). Steps: a kind cluster; the
# operator and runtime images built locally and loaded into it; `kubectl apply -k manifests/`;
# the sample applied and waited for Ready (the warm-up gate included).
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
docker build --build-arg BASE_IMAGE="$base_image" -t "$operator_image" operator
docker build --build-arg BASE_IMAGE="$base_image" -t "$runtime_image" runtime_image
# The CPU sample serves /opt/models/mlp.pt from inside the image: bake the example MLP in.
docker build -t "$runtime_image-example" - <<DOCKERFILE
FROM $runtime_image
USER root
RUN python -m kiln_runtime example-model --kind mlp --out /opt/models/mlp-example \
 && ln -s /opt/models/mlp-example/model.pt /opt/models/mlp.pt
USER 10001:10001
DOCKERFILE
kind load docker-image --name "$cluster" "$operator_image" "$runtime_image-example"

kubectl apply -k manifests/
kubectl -n kiln-system set image deployment/kiln-operator operator="$operator_image"
kubectl -n kiln-system rollout status deployment/kiln-operator --timeout=180s

kubectl create namespace kiln-e2e --dry-run=client -o yaml | kubectl apply -f -
sed "s#image: .*kiln-runtime.*#image: $runtime_image-example#" manifests/samples/cpu-test.yaml \
  | kubectl apply -n kiln-e2e -f -
kubectl wait -n kiln-e2e --for=condition=Ready inferenceservice --all --timeout=600s
kubectl get inferenceservices,pods -n kiln-e2e -o wide
