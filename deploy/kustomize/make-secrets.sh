#!/usr/bin/env bash
# Makes the keys of a managed Motor fleet on Kubernetes and the three Secrets that carry them
# (docs/kubernetes.md, "Keys"). The engine pods never get the management key: the engines run code
# Motor does not control (a model's own code with --trust-remote-code), and what they can read must
# not drive the controller or the coordinators.
#
#   motor-management-key    management.key         controller, coordinators; operators use it
#   motor-node-keys         nodes.yaml             controller: the node key's SHA-256 (register, heartbeat)
#   motor-node-credentials  node.key               nodemanagers: the node key they present to the controller
#                           operators.yaml         nodemanagers: the SHA-256 of the management key (the
#                                                  controller's calls, operators) and of the PreStop key
#                           prestop.key            nodemanagers: the key of their own PreStop hook (accepted
#                                                  by the nodemanager only)
#
# Usage: make-secrets.sh [-n NAMESPACE] [--dry-run]
#   --dry-run   print the Secrets as YAML (nothing is sent to the cluster)
# Without --dry-run the Secrets are applied with kubectl (run it once: running it again rotates every
# key, and the pods read the new files without a restart). The management key is also written to
# ./management.key (mode 0600) for the operator's `motor` CLI and grpcurl.
set -euo pipefail

namespace=motor
dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--namespace) namespace=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "make-secrets.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

key() { openssl rand -hex 32; }
digest() { printf %s "$1" | sha256sum | cut -d' ' -f1; }

management=$(key)
node=$(key)
prestop=$(key)

secret() {  # NAME --from-literal=FILE=VALUE ...
  local name=$1
  shift
  kubectl -n "$namespace" create secret generic "$name" "$@" --dry-run=client -o yaml
}

manifests=$(
  secret motor-management-key --from-literal=management.key="$management"
  echo ---
  secret motor-node-keys --from-literal=nodes.yaml="fleet-nodes: sha256:$(digest "$node")"
  echo ---
  secret motor-node-credentials \
    --from-literal=node.key="$node" \
    --from-literal=operators.yaml="$(printf 'management: sha256:%s\nprestop: sha256:%s\n' \
      "$(digest "$management")" "$(digest "$prestop")")" \
    --from-literal=prestop.key="$prestop"
)

if [ "$dry_run" = 1 ]; then
  printf '%s\n' "$manifests"
  exit 0
fi
printf '%s\n' "$manifests" | kubectl apply -f -
(umask 077 && printf '%s\n' "$management" > management.key)
echo "make-secrets.sh: 3 Secrets applied in namespace $namespace; the management key is in ./management.key" >&2
