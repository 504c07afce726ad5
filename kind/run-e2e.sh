#!/usr/bin/env bash
# Runs the end-to-end suite (tests/e2e) against a kind cluster, for machines with Docker.
# NOT run by this project's CI: its machines have no Docker engine, so CI runs the same suite
# against a control plane built from Go modules (tests/e2e/bin/, docs/e2e.md).
#
# What it does: starts a local registry (localhost:5001), creates the kind cluster of
# kind/cluster.yaml wired to it, builds and pushes the executor image (kind/executor.Dockerfile)
# and the provider image (kind/provider.Dockerfile), then runs `cargo test --test e2e` with the
# suite pointed at the cluster: the real kubelet and the executor image serve pods/exec instead
# of kwok, and kind's `standard` storage class provisions the workspaces.
# Needs: docker, kind, kubectl, helm, cargo. Deletes only the cluster and registry it created.
#
# usage: kind/run-e2e.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in docker kind kubectl helm cargo; do
  command -v "$tool" >/dev/null || { echo "kind/run-e2e.sh needs $tool on PATH" >&2; exit 1; }
done

CLUSTER="execution-provider-e2e-$$"
REGISTRY="execution-provider-e2e-registry-$$"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/execution-provider-kind.XXXXXX")"
cleanup() {
  kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  docker rm -f "$REGISTRY" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

docker run -d --restart=no -p 127.0.0.1:5001:5000 --name "$REGISTRY" registry:2 >/dev/null
kind create cluster --name "$CLUSTER" --config kind/cluster.yaml --kubeconfig "$WORK/kubeconfig" --wait 120s
docker network connect kind "$REGISTRY" 2>/dev/null || true
for node in $(kind get nodes --name "$CLUSTER"); do
  docker exec "$node" mkdir -p /etc/containerd/certs.d/localhost:5001
  printf '[host."http://%s:5000"]\n' "$REGISTRY" |
    docker exec -i "$node" cp /dev/stdin /etc/containerd/certs.d/localhost:5001/hosts.toml
done

push() { # dockerfile name -> prints name@sha256:digest
  docker build -q -f "$1" -t "localhost:5001/$2:e2e" . >/dev/null
  docker push -q "localhost:5001/$2:e2e" >/dev/null
  docker inspect --format '{{index .RepoDigests 0}}' "localhost:5001/$2:e2e"
}
executor_image="$(push kind/executor.Dockerfile execution-executor)"
provider_image="$(push kind/provider.Dockerfile execution-provider)"
kubectl --kubeconfig "$WORK/kubeconfig" apply -f - >/dev/null <<'RC'
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: e2e-runc}
handler: runc
RC

export E2E_KUBECONFIG="$WORK/kubeconfig" E2E_WORK="$WORK"
export E2E_KUBECTL="$(command -v kubectl)" E2E_HELM="$(command -v helm)"
export E2E_STORAGE_CLASS=standard E2E_EXECUTOR_IMAGE="$executor_image" E2E_PROVIDER_IMAGE="$provider_image"
export E2E_EXEC_BACKEND=kubelet   # no kwok: pods/exec reaches the executor image's helper
cargo test --test e2e "$@" -- --test-threads=2
