#!/usr/bin/env bash
# Resolves the upstream binaries of Kiln's local control plane and prints the directory holding them.
# `binaries.sh node` resolves the real node's agents instead (kubelet, kube-proxy), in a cache
# entry of their own, so a machine that only needs the control plane never builds them.
#
# Why it exists: kind needs an image registry, which some machines cannot reach; the upstream
# binaries started as plain processes are the same control plane (envtest and kwokctl do this).
#
# Order of resolution (the first that yields every binary wins):
#   1. $KILN_K8S_BIN_DIR, a directory the user names;
#   2. the cache, ${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}/k8s/<versions>/;
#   3. the official release downloads (machines with internet);
#   4. a build with `go` through the Go module proxy.
# Steps 3 and 4 fill a temporary directory and rename it into the cache in one step, so the
# cache is never half-written. Progress goes to stderr; the directory alone goes to stdout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

mode=${1:-control-plane}
case "$mode" in
  control-plane)
    binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)
    key="${KUBERNETES_VERSION}-etcd${ETCD_VERSION}-kwok${KWOK_VERSION}" ;;
  node)
    binaries=(kubelet kube-proxy)
    key="${KUBERNETES_VERSION}-node" ;;
  *) echo "usage: binaries.sh [control-plane|node]" >&2; exit 2 ;;
esac
cache_root="${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}"
cache_dir="$cache_root/k8s/$key"

log() { printf '[k8s-binaries] %s\n' "$*" >&2; }

complete_in() {
  local dir=$1 b
  for b in "${binaries[@]}"; do [ -x "$dir/$b" ] || return 1; done
}

if [ -n "${KILN_K8S_BIN_DIR:-}" ]; then
  if complete_in "$KILN_K8S_BIN_DIR"; then echo "$KILN_K8S_BIN_DIR"; exit 0; fi
  log "KILN_K8S_BIN_DIR=$KILN_K8S_BIN_DIR lacks one of: ${binaries[*]}"
  exit 1
fi

if complete_in "$cache_dir"; then echo "$cache_dir"; exit 0; fi

mkdir -p "$cache_root/k8s"
staging=$(mktemp -d "$cache_root/k8s/.partial-$key.XXXXXX")
trap 'rm -rf "$staging"' EXIT

arch=$(go env GOARCH 2>/dev/null || { uname -m | sed 's/x86_64/amd64/;s/aarch64/arm64/'; })

download() {
  command -v curl >/dev/null || return 1
  local get=(curl -fsSL --connect-timeout 5 --max-time 600)
  local base="https://dl.k8s.io/release/$KUBERNETES_VERSION/bin/linux/$arch" b
  log "trying the official release downloads"
  if [ "$mode" = node ]; then
    for b in "${binaries[@]}"; do "${get[@]}" -o "$staging/$b" "$base/$b" || return 1; done
    chmod +x "$staging"/*
    return 0
  fi
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    "${get[@]}" -o "$staging/$b" "$base/$b" || return 1
  done
  "${get[@]}" -o "$staging/kwok" \
    "https://github.com/kubernetes-sigs/kwok/releases/download/$KWOK_VERSION/kwok-linux-$arch" || return 1
  "${get[@]}" "https://github.com/etcd-io/etcd/releases/download/$ETCD_VERSION/etcd-$ETCD_VERSION-linux-$arch.tar.gz" \
    | tar -xz -C "$staging" --strip-components=1 "etcd-$ETCD_VERSION-linux-$arch/etcd" || return 1
  chmod +x "$staging"/*
}

build_from_source() {
  command -v go >/dev/null || { log "no go toolchain: cannot build"; return 1; }
  local mod="$staging/src" gomod replaces minor
  mkdir -p "$mod"
  minor="v0.${KUBERNETES_VERSION#v1.}"
  local packages=() tools_imports
  if [ "$mode" = node ]; then
    packages=(k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
  else
    packages=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl go.etcd.io/etcd/server/v3)
  fi
  log "building ${packages[*]} with go (many minutes on 2 cores)"
  gomod=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  # k8s.io/kubernetes requires its staging modules at v0.0.0; point each at its published tag.
  replaces=$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 '"$minor"'#p' "$gomod")
  cat >"$mod/go.mod" <<EOF
module kiln.local/k8sbuild

go 1.24.0

require (
	k8s.io/kubernetes $KUBERNETES_VERSION
	go.etcd.io/etcd/server/v3 $ETCD_VERSION
)

replace (
$replaces
)
EOF
  tools_imports=$(printf '\t_ "%s"\n' "${packages[@]}")
  printf '//go:build tools\n\npackage tools\n\nimport (\n%s\n)\n' "$tools_imports" >"$mod/tools.go"
  (
    cd "$mod"
    export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
    log "resolving modules"
    go mod tidy -e >&2 2>&1 | tail -5 >&2 || true
    # Version stamp so `kubectl version` and the API server report the real release.
    local pkg=k8s.io/component-base/version
    local ld="-s -w -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)"
    ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
    log "compiling (go build -v lists packages)"
    go build -v -ldflags "$ld" -o "$staging/" "${packages[@]}" 2>&1 \
      | awk '{ n++; if (n % 200 == 0) printf "[k8s-binaries] %d packages compiled, now %s\n", n, $0; fflush() }' >&2
    [ "$mode" = node ] && exit 0
    mv "$staging/v3" "$staging/etcd" 2>/dev/null || mv "$staging/server" "$staging/etcd"
    log "compiling kwok $KWOK_VERSION"
    GOBIN="$staging" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
  )
  rm -rf "$mod"
}

if ! download; then
  log "download unavailable; falling back to a source build"
  rm -rf "${staging:?}"/*
  build_from_source || { log "could not obtain the binaries"; exit 1; }
fi
complete_in "$staging" || { log "incomplete result; cache left untouched"; exit 1; }
chmod 755 "$staging"
# One rename makes the cache entry appear whole; a concurrent winner is kept.
mv -T "$staging" "$cache_dir" 2>/dev/null || true
trap - EXIT
rm -rf "$staging"
complete_in "$cache_dir" || exit 1
log "ready in $cache_dir"
echo "$cache_dir"
