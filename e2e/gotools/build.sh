#!/usr/bin/env bash
# Builds one of the Go tools the GitOps tests use, caches it outside the checkout, and prints the
# path of the executable:
#   build.sh helm           Helm $HELM_VERSION (versions.env), from its module
#   build.sh kstatus        kstatus/ : the kstatus library behind a command (JSON in, verdicts out)
#   build.sh argocd-health  argocdhealth/ : a compiled `go test` binary running Argo CD's own Lua
#                           evaluation over manifests/argocd/resource_customizations
#   build.sh gateway-api-crds  the Gateway API's standard-channel CRDs of $GATEWAY_API_VERSION,
#                           from the sigs.k8s.io/gateway-api module (a directory of YAML files)
#   build.sh jaeger         Jaeger's all-in-one $JAEGER_VERSION (OTLP in, query API out, traces
#                           in memory), built inside its module: its go.mod has a replace
#                           directive, which `go install module@version` refuses
#   build.sh prometheus-operator-crds  the monitoring.coreos.com CRDs of $PROMETHEUS_OPERATOR_VERSION,
#                           from the Prometheus Operator's module (example/prometheus-operator-crd)
#   build.sh prometheus     Prometheus $PROMETHEUS_VERSION from its module, with Kubernetes service
#                           discovery only (Debian's package is built without it): the discovery
#                           tests run the configuration docs/prometheus.md ships
#
# Why it exists: these are large Go builds (Argo CD's module graph takes many minutes on 2 cores);
# each is built once per pinned version and source, like e2e/cluster/binaries.sh does for the
# Kubernetes binaries. Cache: ${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}/gotools/
# <tool>-<key>/, where the key is the pinned version (helm) or a hash of the module's go.mod,
# go.sum and sources (so editing the test or bumping a pin rebuilds). A temporary directory is
# renamed into place only when complete. Go comes from PATH; GOTOOLCHAIN=auto lets it fetch the
# toolchain a go.mod asks for through the Go module proxy. Progress goes to stderr.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto} GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0

tool=${1:-}
case "$tool" in
  helm) key=$HELM_VERSION ;;
  gateway-api-crds) key=$GATEWAY_API_VERSION ;;
  jaeger) key=$JAEGER_VERSION ;;
  prometheus-operator-crds) key=$PROMETHEUS_OPERATOR_VERSION ;;
  prometheus) key=$PROMETHEUS_VERSION ;;
  kstatus | argocd-health)
    src="$here/${tool/argocd-health/argocdhealth}"
    key=$(cd "$src" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-16) ;;
  *) echo "usage: build.sh helm|kstatus|argocd-health|gateway-api-crds|jaeger|prometheus-operator-crds|prometheus" >&2; exit 2 ;;
esac
cache_root="${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}/gotools"
entry="$cache_root/$tool-$key"
if [ -x "$entry/$tool" ]; then echo "$entry/$tool"; exit 0; fi

log() { printf '[gotools] %s\n' "$*" >&2; }
command -v go >/dev/null || { log "no go toolchain on PATH: cannot build $tool"; exit 1; }
mkdir -p "$cache_root"
staging=$(mktemp -d "$cache_root/.partial-$tool.XXXXXX")
trap 'rm -rf "$staging"' EXIT
started=$SECONDS
log "building $tool ($key); the first build of a version takes minutes"
case "$tool" in
  helm)
    v=helm.sh/helm/v3
    ld="-s -w -X $v/internal/version.version=$HELM_VERSION -X $v/internal/version.gitTreeState=clean"
    for p in pkg/lint/rules pkg/chartutil; do
      ld="$ld -X $v/$p.k8sVersionMajor=1 -X $v/$p.k8sVersionMinor=$HELM_K8S_MINOR"
    done
    (cd "$staging" && GOFLAGS=-buildvcs=false GOBIN="$staging" go install -ldflags "$ld" "$v/cmd/helm@$HELM_VERSION")
    ;;
  kstatus)
    (cd "$src" && go build -ldflags "-s -w" -o "$staging/$tool" .) ;;
  jaeger)
    module=$(cd "$staging" && go mod download -json "github.com/jaegertracing/jaeger@$JAEGER_VERSION" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$module/cmd/all-in-one" ] || { log "no cmd/all-in-one in jaeger@$JAEGER_VERSION"; exit 1; }
    (cd "$module" && GOFLAGS="-mod=mod -buildvcs=false" go build -ldflags "-s -w" -o "$staging/$tool" ./cmd/all-in-one) ;;
  argocd-health)
    (cd "$src" && go test -c -ldflags "-s -w" -o "$staging/$tool" .) ;;
  gateway-api-crds)
    module=$(cd "$staging" && go mod download -json "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$module/config/crd/standard" ] || { log "no CRDs in sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION"; exit 1; }
    mkdir "$staging/$tool"
    cp "$module"/config/crd/standard/gateway.networking.k8s.io_*.yaml "$staging/$tool/"
    chmod -R u+w,a+rX "$staging/$tool" ;;
  prometheus-operator-crds)
    module=$(cd "$staging" && go mod download -json \
      "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    crds="$module/example/prometheus-operator-crd"
    [ -d "$crds" ] || { log "no CRDs in the Prometheus Operator's $PROMETHEUS_OPERATOR_VERSION"; exit 1; }
    mkdir "$staging/$tool"
    cp "$crds"/monitoring.coreos.com_*.yaml "$staging/$tool/"
    chmod -R u+w,a+rX "$staging/$tool" ;;
  prometheus)
    # Only Kubernetes discovery compiled in (Prometheus' own build tags): a fraction of the
    # module graph (no cloud SDKs). The web UI's assets are left out (builtinassets unset); the
    # HTTP API, which is all the tests use, is complete.
    v=github.com/prometheus/common/version release=${PROMETHEUS_VERSION#v0.}  # 316.0 -> 3.16.0
    release="${release:0:1}.${release:1}"
    ld="-s -w -X $v.Version=$release -X $v.Branch=module -X $v.BuildUser=kiln"
    (cd "$staging" && GOBIN="$staging" go install -tags remove_all_sd,enable_kubernetes_sd \
      -ldflags "$ld" "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION") ;;
esac
[ -x "$staging/$tool" ] || { log "no $tool produced; cache left untouched"; exit 1; }
chmod 755 "$staging"
# One rename makes the entry appear whole; a concurrent winner is kept.
mv -T "$staging" "$entry" 2>/dev/null || true
trap - EXIT
rm -rf "$staging"
[ -x "$entry/$tool" ] || exit 1
log "$tool ready in $((SECONDS - started)) s"
echo "$entry/$tool"
