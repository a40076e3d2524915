#!/usr/bin/env bash
# Remove Kiln's CRDs, after saying what that deletes.
#
# Deleting a CRD deletes every object of its kind in every namespace: each InferenceService, and
# with it (through the garbage collector, by owner reference) its Deployment, pods, Service,
# PodDisruptionBudget and routes, so its model stops serving. The platform's profiles and
# policies go too. This lists all of them, then asks for `yes` (or takes --yes) before it
# deletes anything. kopf's peering CRDs (kopf.dev) are left: other kopf operators may use them.
#
#   bash manifests/uninstall-crds.sh          # lists, asks
#   bash manifests/uninstall-crds.sh --yes    # lists, deletes
set -euo pipefail

KUBECTL=${KUBECTL:-kubectl}
crds=$("$KUBECTL" get crd -o name | grep '\.serving\.kiln\.dev$' || true)
if [[ -z $crds ]]; then
  echo "no serving.kiln.dev CRD in the cluster: nothing to delete"
  exit 0
fi
echo "Deleting these CRDs:"
echo "$crds" | sed 's/^/  /'
echo "deletes every object of their kinds, and so each InferenceService's Deployment, pods,"
echo "Service, PodDisruptionBudget and routes (its model stops serving):"
count=0
for crd in $crds; do
  kind=${crd#*/}
  while read -r namespace name; do
    [[ -n $name ]] || continue
    count=$((count + 1))
    if [[ $namespace == "<none>" ]]; then
      echo "  $kind/$name"
    else
      echo "  $kind/$name in $namespace"
    fi
  done < <("$KUBECTL" get "$kind" -A --no-headers \
    -o custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name 2>/dev/null || true)
done
echo "($count objects)"

if [[ ${1:-} != "--yes" ]]; then
  read -r -p "Type yes to delete them: " answer || answer=""
  if [[ $answer != "yes" ]]; then
    echo "nothing deleted"
    exit 1
  fi
fi
# shellcheck disable=SC2086  # one name per word
"$KUBECTL" delete $crds --wait=true
