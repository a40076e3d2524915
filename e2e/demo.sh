#!/usr/bin/env bash
# `make demo`: Kiln's main job on this machine. A real control plane with a real node (kubelet,
# containerd, kube-proxy) and fake GPU nodes; Kiln's CRD and operator; an InferenceService whose
# pods run Kiln's runtime image under the kubelet; the warm-up gate letting each pod in only
# after it met its p99; then a bounded load through the Service's cluster IP.
# MODEL_FROM=claim (the default) mounts the model from a claim; MODEL_FROM=s3 puts it in a bucket
# of a local S3 server (SeaweedFS on the real node's bridge address) and the pod fetches it.
set -euo pipefail
cd "$(dirname "$0")/.."

model_from=${MODEL_FROM:-claim}
case "$model_from" in
  claim | s3) ;;
  *) echo "MODEL_FROM is 'claim' (the default) or 's3', not '$model_from'" >&2; exit 2 ;;
esac

py=.venv/bin/python
ns=kiln-demo
state=.kiln/demo
image=kiln/runtime:dev
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Kiln's runtime image, built here (no registry is reachable; the first build takes minutes)"
make -s image-runtime RUNTIME_IMAGE="$image"

step "Local cluster: etcd, kube-apiserver, controller-manager, scheduler, a real node, kwok GPU nodes"
"$py" -m kiln_localcluster up --real-node
export KUBECONFIG="$PWD/.kiln/kubeconfig"
kubectl=$(bash e2e/cluster/binaries.sh)/kubectl
"$kubectl" get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count
echo "importing $image into the real node's containerd (once per image)"
"$py" -m kiln_localcluster import-image --image "$image"

step "Kiln's CRD"
"$kubectl" apply -k crds/
"$kubectl" wait --for=condition=Established --timeout=60s crd/inferenceservices.serving.kiln.dev

pids=()
trap 'for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; done' EXIT
mkdir -p "$state"
"$kubectl" create namespace "$ns" --dry-run=client -o yaml | "$kubectl" apply -f -
# The namespace admits only pods that meet Pod Security `restricted`, as Kiln's do.
"$kubectl" label --overwrite namespace "$ns" pod-security.kubernetes.io/enforce=restricted

step "A model built in code (the example MLP)"
"$py" -m kiln_runtime example-model --kind mlp --out "$state/models/mlp"
chmod -R a+rX "$state/models"  # the image runs as its own unprivileged user
if [ "$model_from" = s3 ]; then
  step "The model in the bucket 'models' of a local S3 server (log: $state/bucket.log)"
  # SeaweedFS, bound to the real node's bridge address only: the pods reach it, nothing else.
  "$py" -m kiln_localcluster serve-bucket --dir "$state/seaweedfs" --upload "$state/models" \
    --info "$state/bucket.json" >"$state/bucket.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 120); do  # up to 60 s
    [ -s "$state/bucket.json" ] && break
    kill -0 "${pids[-1]}" 2>/dev/null || { tail -n 20 "$state/bucket.log"; exit 1; }
    sleep 0.5
  done
  [ -s "$state/bucket.json" ] || { tail -n 20 "$state/bucket.log"; echo "no S3 server in 60 s"; exit 1; }
  bucket() { "$py" -c "import json, sys; print(json.load(open('$state/bucket.json'))[sys.argv[1]])" "$1"; }
  endpoint=$(bucket endpoint)
  echo "s3://models/ at $endpoint: $(bucket keys)"
  # The Secret the pod's init container reads; the InferenceService only names it.
  "$kubectl" create secret generic model-store -n "$ns" --dry-run=client -o yaml \
    --from-literal=AWS_ACCESS_KEY_ID="$(bucket AWS_ACCESS_KEY_ID)" \
    --from-literal=AWS_SECRET_ACCESS_KEY="$(bucket AWS_SECRET_ACCESS_KEY)" | "$kubectl" apply -f -
  manifest=$state/inferenceservice-s3.yaml
  sed "s|endpoint: ENDPOINT|endpoint: $endpoint|" e2e/demo/inferenceservice-s3.yaml >"$manifest"
else
  echo "offered to the cluster as the claim 'models'"
  "$py" -m kiln_localcluster provide-claim --namespace "$ns" --claim models --dir "$state/models"
  manifest=e2e/demo/inferenceservice.yaml
fi

step "The operator (log: $state/operator.log), reading the cluster's Prometheus"
KILN_PROMETHEUS_URL=$("$py" -c 'import json; print(json.load(open(".kiln/cluster/cluster.json"))["prometheus"])')
export KILN_PROMETHEUS_URL
echo "Prometheus: ${KILN_PROMETHEUS_URL:-none}"
# The real node advertises GPUs it does not have: a GPU service's runtime would run on its CPU.
KILN_IMITATED_GPUS=true "$py" -m kiln_operator run --standalone --namespace "$ns" >"$state/operator.log" 2>&1 &
pids+=($!)

step "An InferenceService: kubectl apply -f $manifest"
"$kubectl" apply -n "$ns" -f "$manifest"
echo "waiting for the pod to pass warm-up (the kubelet starts the image, the runtime loads and warms"
echo "itself, then the operator's gate measures p99 through the pod)"
[ "$model_from" = s3 ] && echo "(first its init container downloads the model from the bucket)"
"$kubectl" wait -n "$ns" --for=condition=Ready inferenceservice/mlp --timeout=300s
"$kubectl" get inferenceservices -n "$ns"
echo
"$kubectl" get pods -n "$ns" -o wide
echo
"$kubectl" get pods -n "$ns" -o \
  jsonpath='{range .items[*]}{.metadata.name}{"  "}{.status.conditions[?(@.type=="serving.kiln.dev/warmed-up")].message}{"\n"}{end}'

replicas() { "$kubectl" get deployment mlp -n "$ns" -o jsonpath='{.spec.replicas}'; }
watch_until() {  # watch_until SECONDS CONDITION: print the service every 5 s until CONDITION holds
  local until=$((SECONDS + $1))
  echo "DESIRED  READY  P99_MS  REASON"
  while [ $SECONDS -lt $until ]; do
    "$kubectl" get inferenceservice mlp -n "$ns" --no-headers \
      -o custom-columns='DESIRED:.status.autoscaling.desiredReplicas,READY:.status.readyReplicas,P99_MS:.status.autoscaling.observed.p99LatencyMilliseconds,REASON:.status.autoscaling.reason' 2>/dev/null || true
    eval "$2" && return 0
    sleep 5
  done
  return 1
}

step "Load: gRPC requests through the Service's cluster IP (kube-proxy) for 60 s; the autoscaler reacts"
"$py" e2e/demo/load.py --namespace "$ns" --service mlp --model mlp --seconds 60 --concurrency 32 &
load_pid=$!
scaled_up=yes
watch_until 60 '[ "$(replicas)" -gt 1 ]' && echo "scaled up to $(replicas) replicas" \
  || { scaled_up=no; echo "no scale-up within 60 s"; }
wait "$load_pid" || true

step "Load stopped: the autoscaler scales down once the hold window (30 s) has passed"
scaled_down=yes
watch_until 150 '[ "$(replicas)" -eq 1 ]' && echo "back to $(replicas) replica" \
  || { scaled_down=no; echo "still at $(replicas) replicas"; }
echo
"$kubectl" describe inferenceservice mlp -n "$ns" | sed -n '/^Events:/,$p'
if [ "$scaled_up" = no ] || [ "$scaled_down" = no ]; then
  echo "The autoscaler did not do its part (scaled up: $scaled_up, back down: $scaled_down):" >&2
  echo "see the conditions above and $state/operator.log" >&2
  exit 1
fi

step "Done"
echo "The cluster keeps running:  export KUBECONFIG=$KUBECONFIG"
echo "Run the operator again with 'make run-operator'; stop everything with 'make cluster-down'."
