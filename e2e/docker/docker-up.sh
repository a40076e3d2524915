#!/usr/bin/env bash
# Start the Docker engine for the image tests: install Debian's docker.io if dockerd is missing,
# start dockerd in the background (as root), wait for its socket. Idempotent: an engine that
# already answers is left alone. No image can be pulled here; see base-image.sh.
#
# The engine runs without a bridge network or iptables rules (the test host allows loopback
# traffic only): containers use the host's network and bind loopback addresses.
set -euo pipefail

STATE_DIR="${KILN_STATE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/.kiln}"
SOCKET="${KILN_DOCKER_SOCKET:-/var/run/docker.sock}"
WAIT_SECONDS="${KILN_DOCKER_WAIT_SECONDS:-60}"
mkdir -p "$STATE_DIR"

if docker -H "unix://$SOCKET" info >/dev/null 2>&1; then
  echo "docker engine already running at $SOCKET"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "docker-up: starting dockerd needs root" >&2
  exit 1
fi

if ! command -v dockerd >/dev/null 2>&1; then
  echo "installing docker.io (Debian)"
  if [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v lock || true)" ]; then
    apt-get update -q
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io
fi

# The storage driver: overlay2 where the kernel allows it (also inside a container whose root
# is not overlayfs), else vfs, which works everywhere (slower, more disk).
driver="${KILN_DOCKER_STORAGE_DRIVER:-}"
if [ -z "$driver" ]; then
  if [ "$(stat -f -c %T /var/lib/docker 2>/dev/null || stat -f -c %T /var/lib)" = "overlayfs" ]; then
    driver=vfs
  else
    driver=overlay2
  fi
fi

start_dockerd() {
  nohup dockerd --host "unix://$SOCKET" --storage-driver "$1" --bridge none --iptables=false \
    --ip6tables=false >"$STATE_DIR/dockerd.log" 2>&1 &
  echo $! >"$STATE_DIR/dockerd.pid"
}

wait_for_engine() {
  local deadline=$((SECONDS + WAIT_SECONDS))
  while ((SECONDS < deadline)); do
    if docker -H "unix://$SOCKET" info >/dev/null 2>&1; then
      return 0
    fi
    if ! kill -0 "$(cat "$STATE_DIR/dockerd.pid")" 2>/dev/null; then
      return 1
    fi
    sleep 0.5
  done
  return 1
}

start_dockerd "$driver"
if ! wait_for_engine; then
  if [ "$driver" != vfs ]; then
    echo "dockerd with $driver did not come up; retrying with vfs" >&2
    kill "$(cat "$STATE_DIR/dockerd.pid")" 2>/dev/null || true
    sleep 1
    start_dockerd vfs
    wait_for_engine || { tail -20 "$STATE_DIR/dockerd.log" >&2; exit 1; }
  else
    tail -20 "$STATE_DIR/dockerd.log" >&2
    exit 1
  fi
fi
echo "docker engine running (pid $(cat "$STATE_DIR/dockerd.pid"), log $STATE_DIR/dockerd.log)"
running="$(docker -H "unix://$SOCKET" info --format '{{.Driver}}' 2>/dev/null || true)"
root="$(docker -H "unix://$SOCKET" info --format '{{.DockerRootDir}}' 2>/dev/null || true)"
echo "storage driver: ${running:-unknown}"
if [ "$running" = vfs ]; then
  # Every layer is a full copy on vfs: say so where a full disk would otherwise be the first sign.
  free_gib=$(df -P -BG "${root:-/var/lib/docker}" | awk 'NR == 2 { sub("G", "", $4); print $4 }')
  echo "docker-up: the vfs store copies every layer in full; building the runtime image from" \
    "nothing peaks at about 31 GiB here (docs/runtime.md, \"The image\"); ${free_gib} GiB free" >&2
fi
