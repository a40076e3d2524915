#!/usr/bin/env bash
# Build an image from a context tar on standard input, and remove only the image it replaced.
#
# Why it exists: a rebuilt tag leaves its old image behind untagged (the runtime's is several
# GB). `docker image prune` would remove it, and with it the untagged build-stage layers the
# next build's cache needs (here, the torch layer: minutes of download each time).
#
#   tar -c ... | e2e/docker/build.sh TAG [docker build options...]
set -euo pipefail
tag=$1
shift
old=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
docker build --network host "$@" -t "$tag" -
new=$(docker image inspect --format '{{.Id}}' "$tag")
if [ -n "$old" ] && [ "$old" != "$new" ]; then
  docker rmi "$old" >/dev/null 2>&1 || true  # still used by a container or another tag: kept
fi
