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
# The real node (docs/e2e.md "The real node"): containerd, gVisor and kube-router built from
# their Go modules; runc, the CNI plugins, iptables and ipset are Debian packages (node-debs).
CONTAINERD_VERSION="${CONTAINERD_VERSION:-2.2.9}"
# gVisor publishes no tags on the module proxy (and `@go` is refused): the newest pseudo-version.
GVISOR_VERSION="${GVISOR_VERSION:-v0.0.0-20260905035102-160fafc42237}"
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-2.1.0}"
CONTAINERD_DIR="$E2E_CACHE/containerd-v$CONTAINERD_VERSION"
# "-oom2": the shim built with the oom_score_adj patch of build-node-bins.sh; bump it when that changes.
GVISOR_DIR="$E2E_CACHE/gvisor-$GVISOR_VERSION-oom2"
KUBE_ROUTER_DIR="$E2E_CACHE/kube-router-v$KUBE_ROUTER_VERSION"
NODE_DEBS="runc containernetworking-plugins iptables ipset nftables busybox-static jq"
