#!/usr/bin/env bash
# Installs the Debian packages Kiln's tests and demo use, only those missing (needs root).
# Keeps `make test` self-sufficient on a fresh machine: nothing may rely on a hand install.
set -euo pipefail

packages=(
  curl ca-certificates  # binaries.sh: official release downloads where the internet is reachable
  iproute2              # network namespaces for fake pods with routable IPs
  prometheus            # the autoscaler's metrics source in tests and the demo
  containerd runc containernetworking-plugins  # the local cluster's real node
  iptables conntrack    # kube-proxy on the real node
  gcc libc6-dev         # the real node's static sandbox ("pause") binary; `make native` (mypyc)
  python3-dev           # `make native`: Python's headers, where the interpreter has none of its own
  redis-server          # the runtime's shared response cache, a real one in its tests
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "system-deps: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
  exit 1
fi
echo "system-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
