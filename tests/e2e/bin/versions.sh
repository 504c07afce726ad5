# Versions and cache locations for the real-control-plane e2e suite. Sourced by the other scripts.
# Every binary is built from its Go module once and cached by version outside the repository.
K8S_VERSION="${K8S_VERSION:-1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-0.8.0}"
HELM_VERSION="${HELM_VERSION:-3.19.0}"
E2E_CACHE="${E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/execution-provider/k8s}"
KUBE_DIR="$E2E_CACHE/kubernetes-v$K8S_VERSION"
ETCD_DIR="$E2E_CACHE/etcd-v$ETCD_VERSION"
# "-e2e1": kwok built with the stdin end-of-input fix of build-bins.sh; bump it when that changes.
KWOK_DIR="$E2E_CACHE/kwok-v$KWOK_VERSION-e2e1"
HELM_DIR="$E2E_CACHE/helm-v$HELM_VERSION"
