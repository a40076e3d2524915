#!/usr/bin/env bash
# Builds one pinned Go tool the runtime's protocol tests drive, caches it, prints its path.
#
#   go-tool.sh h2spec     the HTTP/2 conformance suite (RFC 7540/9113, HPACK)
#   go-tool.sh grpcurl    a gRPC client that lists services through server reflection
#
# Why: neither is packaged for every distribution, and their release downloads need the open
# internet; `go install` through the Go module proxy builds the pinned version anywhere `go`
# is. Like e2e/cluster/binaries.sh: $KILN_GO_TOOL_DIR (a directory holding the binary) wins,
# then the cache (${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}/go-tools/<tool>-<version>/),
# then a build into a temporary directory renamed into the cache in one step (never half-
# written). Progress goes to stderr; the binary's path alone goes to stdout.
set -euo pipefail

tool=${1:?usage: go-tool.sh h2spec|grpcurl}
case "$tool" in
  h2spec)  module=github.com/summerwind/h2spec/cmd/h2spec; version=v2.2.1+incompatible ;;
  grpcurl) module=github.com/fullstorydev/grpcurl/cmd/grpcurl; version=v1.9.3 ;;
  *) echo "usage: go-tool.sh h2spec|grpcurl" >&2; exit 2 ;;
esac

if [ -n "${KILN_GO_TOOL_DIR:-}" ] && [ -x "$KILN_GO_TOOL_DIR/$tool" ]; then
  echo "$KILN_GO_TOOL_DIR/$tool"; exit 0
fi
cache_root="${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}/go-tools"
cache_dir="$cache_root/$tool-$version"
if [ -x "$cache_dir/$tool" ]; then echo "$cache_dir/$tool"; exit 0; fi

command -v go >/dev/null || { echo "[go-tool] $tool is not cached and go is not installed" >&2; exit 1; }
mkdir -p "$cache_root"
staging=$(mktemp -d "$cache_root/.partial-$tool.XXXXXX")
trap 'rm -rf "$staging"' EXIT
echo "[go-tool] building $module@$version" >&2
GOBIN="$staging" GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 \
  go install "$module@$version" >&2
mv -T "$staging" "$cache_dir" 2>/dev/null || true  # a concurrent build may have won
trap - EXIT
echo "$cache_dir/$tool"
