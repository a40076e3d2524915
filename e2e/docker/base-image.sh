#!/usr/bin/env bash
# Build the local base image Kiln's runtime image starts from: Debian bookworm (minbase) with
# Python 3.11, made by debootstrap from the Debian archive and loaded with `docker import`.
# No image registry is reachable here, so nothing can be pulled. Idempotent: an existing image
# with the tag is kept unless KILN_REBUILD_BASE=1.
#
#   e2e/docker/base-image.sh [TAG]        (default kiln/debian-python:bookworm; needs root)
set -euo pipefail

TAG="${1:-kiln/debian-python:bookworm}"
SUITE="${KILN_BASE_SUITE:-bookworm}"
STATE_DIR="${KILN_STATE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/.kiln}"
# shellcheck source=e2e/docker/chroot.sh
source "$(dirname "$0")/chroot.sh"

if [ "${KILN_REBUILD_BASE:-0}" != 1 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "base image $TAG already present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "base-image: debootstrap needs root" >&2
  exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
fi

mkdir -p "$STATE_DIR"
rootfs="$(mktemp -d "$STATE_DIR/base-rootfs.XXXXXX")"
cleanup() { rm -rf "$rootfs"; }
trap cleanup EXIT

# The mirror is the one this host's apt already uses (its sources list names it).
mirror="${KILN_DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list.d/*.list 2>/dev/null \
    | awk '/^(deb|URIs:)/ && !/security/ { print $2; exit }' || true)"
fi
if [ -z "$mirror" ]; then
  echo "base-image: no Debian mirror in this host's apt sources; set KILN_DEBIAN_MIRROR" >&2
  exit 1
fi
echo "debootstrap $SUITE from $mirror"
with_rootfs_tmpdir debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  "$SUITE" "$rootfs" "$mirror" >"$STATE_DIR/debootstrap.log" 2>&1 \
  || { tail -20 "$STATE_DIR/debootstrap.log" >&2; exit 1; }
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
# Trust what this host trusts (e.g. the CA of an egress proxy), so images built on this base
# reach the package registries this host reaches.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
  in_rootfs "$rootfs" update-ca-certificates >/dev/null
fi

tar -C "$rootfs" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$TAG" >/dev/null
echo "built base image $TAG ($(docker image inspect -f '{{.Size}}' "$TAG") bytes)"
