# What start-node.sh creates and stop-node.sh removes, defined once. Sourced.
NODE_NAME="${E2E_REAL_NODE_NAME:-e2e-real}"
# TEST-NET-2 (RFC 5737) on an interface of our own (an empty bridge): a local address, never
# routed anywhere.
NODE_IP="${E2E_REAL_NODE_IP:-198.51.100.10}"
NODE_IFACE=e2enode0
CNI_BRIDGE=e2ecni0
POD_CIDR="${E2E_REAL_POD_CIDR:-10.245.0.0/24}"
KUBELET_PORT="${E2E_KUBELET_PORT:-10350}"
KUBELET_HEALTHZ_PORT="${E2E_KUBELET_HEALTHZ_PORT:-10358}"
NODE_LABEL=execution.mecatl.dev/e2e-node
NODE_TAINT=execution.mecatl.dev/e2e-real-node
STORAGE_CLASS=e2e-local
LOCAL_VOLUMES="${E2E_LOCAL_VOLUMES:-16}"
NODE_LOCK=/run/lock/execution-provider-e2e-node
# The sysctls the kubelet (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops, the keys
# limits), the bridge CNI (ip_forward) and start-node.sh (the bridge netfilter hook) may change.
NODE_SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv6.conf.all.forwarding
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables)
# Host directories written outside the configured roots (the kubelet's device-plugin socket dir,
# /var/log/containers links and its /var/lib/kubelet leftovers, the CNI library's cache, kube-router's
# state, and libmount's /run/mount of the umounts at stop); removed at stop when they did not
# exist before.
NODE_HOST_DIRS=(/var/lib/kubelet /var/log/containers /var/log/pods /var/lib/cni /var/lib/kube-router
  /run/containerd /var/lib/containerd /opt/containerd /etc/containerd /run/netns /var/run/netns
  /etc/kubernetes /usr/libexec/kubernetes /run/runc /run/runsc /var/run/runsc /run/xtables.lock
  /etc/cni /opt/cni /var/run/kube-router /run/kube-router /etc/cdi /var/run/cdi /run/cdi
  /run/mount)
