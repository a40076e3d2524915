#!/usr/bin/env bash
# The benchmark's compiled load generators from Debian: wrk (HTTP) and h2load (gRPC over
# HTTP/2, in nghttp2-client). Installs only what is missing (needs root then).
set -euo pipefail
missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v h2load >/dev/null 2>&1 || missing+=(nghttp2-client)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "bench: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
