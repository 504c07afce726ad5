#!/usr/bin/env bash
# Starts the e2e suite's real node beside a running control plane (start-control-plane.sh):
# containerd 2 with runc and gVisor (runsc, systrap), the kubelet, a bridge CNI, kube-router's
# NetworkPolicy controller, the RuntimeClasses `runc` and `gvisor`, the local PersistentVolumes
# of StorageClass `e2e-local`, and the pause and executor images imported without a registry.
#
# Every address it uses is one it makes: the node's address on an interface of its own
# (node-common.sh, TEST-NET-2, on an empty bridge), the Pods' on a bridge of its own with no default route and a
# forward guard, so no packet of the suite leaves the machine. What it changes on the host
# (sysctls, firewall tables and sets, mounts, links, cgroups, directories) is recorded first,
# under $E2E_WORK/node/before, and stop-node.sh puts it back, also after a killed run.
#
# usage: start-node.sh   (E2E_WORK: the control plane's work directory; E2E_NODE_HELPER: a
#                         statically linked execution-helper, from build-executor-helper.sh)
# On success it writes $E2E_WORK/node/env, to be sourced by whoever runs the real-node tests.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/versions.sh"
source "$here/node-common.sh"

WORK="${E2E_WORK:-${TMPDIR:-/tmp}/execution-provider-e2e}"
N="$WORK/node"
HELPER="${E2E_NODE_HELPER:?E2E_NODE_HELPER must name a statically linked execution-helper}"
READY_DEADLINE="${E2E_READY_DEADLINE:-120}"
KUBECTL="$KUBE_DIR/kubectl" K="$WORK/admin.kubeconfig"
CTR="$CONTAINERD_DIR/ctr"

[[ -f "$K" && -f "$WORK/pki/ca.key" ]] || { echo "no control plane in $WORK: run start-control-plane.sh first" >&2; exit 1; }
for b in "$KUBE_DIR/kubelet" "$CONTAINERD_DIR/containerd" "$CONTAINERD_DIR/containerd-shim-runc-v2" "$CTR" \
  "$GVISOR_DIR/runsc" "$GVISOR_DIR/containerd-shim-runsc-v1" "$KUBE_ROUTER_DIR/kube-router" \
  /usr/sbin/runc /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback; do
  [[ -x "$b" ]] || { echo "missing $b: run tests/e2e/bin/build-bins.sh and build-node-bins.sh first" >&2; exit 1; }
done
for t in iptables ipset nft ip jq openssl; do
  command -v "$t" >/dev/null || { echo "missing $t: run tests/e2e/bin/build-node-bins.sh node-debs" >&2; exit 1; }
done
# One real node per machine: its interface names, addresses and ports are fixed. The lock keeps
# two starts apart; a node that is up is known by its interface.
exec 8>"$NODE_LOCK"
flock -n 8 || { echo "another start-node.sh holds $NODE_LOCK" >&2; exit 1; }
if ip link show "$NODE_IFACE" >/dev/null 2>&1; then
  echo "a real node is up on this machine (interface $NODE_IFACE exists): run stop-node.sh first" >&2
  exit 1
fi
if [[ -d "$N/pids" ]] && compgen -G "$N/pids/*.pid" >/dev/null; then
  echo "$N/pids holds PIDs of a running node: run stop-node.sh first" >&2
  exit 1
fi
rm -rf "$N" && mkdir -p "$N"/{before,pids,logs,pki,containerd,kubelet,cni/net.d,cni/ipam,cni/cache,runsc,volumes,images,cdi}

# --- What the host had before anything changes (stop-node.sh restores or removes the rest).
B="$N/before"
for s in "${NODE_SYSCTLS[@]}"; do
  v=$(sysctl -n "$s" 2>/dev/null) && printf '%s=%s\n' "$s" "$v" >>"$B/sysctls"
done
touch "$B/sysctls"
for d in "${NODE_HOST_DIRS[@]}"; do [[ -e $d ]] && echo "$d"; done >"$B/host-dirs" || true
nft list tables 2>/dev/null | sort >"$B/nft-tables" || true
ipset list -n 2>/dev/null | sort >"$B/ipsets" || true
ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort >"$B/links"

started_ok=0
on_exit() {
  if [[ $started_ok == 0 ]]; then
    echo "real node failed to start; logs follow" >&2
    tail -n 30 "$N"/logs/*.log >&2 || true
    exec 8>&- # stop-node.sh removes the lock's file once nobody holds it
    "$here/stop-node.sh" "$WORK" || true
  fi
}
trap on_exit EXIT

t0=$SECONDS
wait_for() { # DESCRIPTION COMMAND...: polls every half second until it succeeds or the deadline.
  local what=$1; shift
  local deadline=$((SECONDS + READY_DEADLINE))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then echo "timed out after ${READY_DEADLINE}s waiting for $what" >&2; return 1; fi
    sleep 0.5
  done
  echo "ready: $what ($((SECONDS - t0))s since start)" >&2
}
launch() { # NAME BINARY ARGS...: starts a daemon in the background, logging and recording its PID.
  local name=$1; shift
  "$@" >"$N/logs/$name.log" 2>&1 8>&- &
  echo $! >"$N/pids/$(printf '%02d' "$(ls "$N/pids" | wc -l)")-$name.pid"
}

# --- Images: pause and the executor (build-node-images.sh), imported below.
bash "$here/build-node-images.sh" "$N/images" "$HELPER"
PAUSE_REF=$(cut -d@ -f1 "$N/images/pause.ref")
EXECUTOR_NAME=$(cut -d@ -f1 "$N/images/executor.ref") EXECUTOR_DIGEST=$(cut -d@ -f2 "$N/images/executor.ref")
EXECUTOR_IMAGE="${EXECUTOR_NAME%:*}@$EXECUTOR_DIGEST"

# --- The node's address, on an interface of its own: an empty bridge (this kernel has no
# `dummy` driver and loads no modules), so it leads nowhere.
ip link add "$NODE_IFACE" type bridge
ip addr add "$NODE_IP/32" dev "$NODE_IFACE"
ip link set "$NODE_IFACE" up
# Bridged Pod traffic passes the iptables hooks, where the policy enforcer filters it.
sysctl -qw net.bridge.bridge-nf-call-iptables=1

# --- Forward guard: nothing from the Pod bridge is forwarded anywhere but back into it.
iptables -w -N E2E-NODE-GUARD
iptables -w -A E2E-NODE-GUARD -i "$CNI_BRIDGE" ! -o "$CNI_BRIDGE" -j DROP
iptables -w -A E2E-NODE-GUARD -o "$CNI_BRIDGE" ! -i "$CNI_BRIDGE" -j DROP
iptables -w -I FORWARD 1 -j E2E-NODE-GUARD

# --- PKI: the kubelet's client identity (the Node authorizer's system:node:<name>), its serving
# certificate for the node address, and kube-router's client identity.
(
  cd "$N/pki"
  sign() { # name subject extensions
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    openssl x509 -req -in "$1.csr" -CA "$WORK/pki/ca.crt" -CAkey "$WORK/pki/ca.key" -CAcreateserial \
      -CAserial "$N/pki/ca.srl" -out "$1.crt" -days 30 -extfile <(printf '%s\n' "$3") 2>/dev/null
  }
  sign kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" 'extendedKeyUsage=clientAuth'
  sign kubelet-serving "/O=system:nodes/CN=system:node:$NODE_NAME" \
    "$(printf 'subjectAltName=IP:%s,DNS:%s\nextendedKeyUsage=serverAuth' "$NODE_IP" "$NODE_NAME")"
  sign kube-router "/O=system:masters/CN=e2e-kube-router" 'extendedKeyUsage=clientAuth'
)
node_kubeconfig() { # file cert-basename
  "$KUBECTL" config set-cluster e2e --server="$("$KUBECTL" --kubeconfig="$K" config view -o jsonpath='{.clusters[0].cluster.server}')" \
    --certificate-authority="$WORK/pki/ca.crt" --embed-certs=true --kubeconfig="$1" >/dev/null
  "$KUBECTL" config set-credentials node --client-certificate="$N/pki/$2.crt" --client-key="$N/pki/$2.key" \
    --embed-certs=true --kubeconfig="$1" >/dev/null
  "$KUBECTL" config set-context e2e --cluster=e2e --user=node --kubeconfig="$1" >/dev/null
  "$KUBECTL" config use-context e2e --kubeconfig="$1" >/dev/null
}
node_kubeconfig "$N/kubelet.kubeconfig" kubelet-client
node_kubeconfig "$N/kube-router.kubeconfig" kube-router

# --- CNI: one bridge, host-local addresses, no route beyond the Pod range, no masquerade.
cat >"$N/cni/net.d/10-e2e.conflist" <<CNI
{"cniVersion": "1.0.0", "name": "e2e-node", "plugins": [{"type": "bridge", "bridge": "$CNI_BRIDGE",
  "isGateway": true, "ipMasq": false, "hairpinMode": true,
  "ipam": {"type": "host-local", "dataDir": "$N/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]]}}]}
CNI

# --- containerd: its roots, sockets and runtimes' state under $N; runc and runsc handlers.
cat >"$N/runsc/runsc.toml" <<RUNSC
binary_name = "$GVISOR_DIR/runsc"
root = "$N/runsc/root"
[runsc_config]
  platform = "systrap"
RUNSC
C="$N/containerd"
# Every registry is this machine's discard port: an image that is not imported fails to pull
# at once, and no name is ever looked up (no DNS query leaves the machine).
mkdir -p "$C/registries/_default"
cat >"$C/registries/_default/hosts.toml" <<HOSTS
server = "http://127.0.0.1:9"
[host."http://127.0.0.1:9"]
  capabilities = ["pull", "resolve"]
HOSTS
cat >"$C/config.toml" <<TOML
version = 3
root = "$C/root"
state = "$C/state"
[grpc]
  address = "$C/run/containerd.sock"
[ttrpc]
  address = "$C/run/containerd.sock.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "$C/opt"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
  socket_path = "$C/run/nri.sock"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "$PAUSE_REF"
[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = "$C/registries"
[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  enable_cdi = false
  cdi_spec_dirs = ["$N/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$N/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    runtime_path = "$CONTAINERD_DIR/containerd-shim-runc-v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "/usr/sbin/runc"
      Root = "$C/runc-root"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]
    runtime_type = "io.containerd.runsc.v1"
    runtime_path = "$GVISOR_DIR/containerd-shim-runsc-v1"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc.options]
      TypeUrl = "io.containerd.runsc.v1.options"
      ConfigPath = "$N/runsc/runsc.toml"
TOML
launch containerd env PATH="$CONTAINERD_DIR:$GVISOR_DIR:$PATH" "$CONTAINERD_DIR/containerd" --config "$C/config.toml"
wait_for containerd "$CTR" -a "$C/run/containerd.sock" version
ctr() { # ctr warns about cgroup v1 on every call: keep the rest of its standard error
  "$CTR" -a "$C/run/containerd.sock" -n k8s.io "$@" 2> >(grep -v 'support for cgroup v1 is deprecated' >&2)
}
ctr images import "$N/images/pause.tar" >/dev/null
ctr images import "$N/images/executor.tar" >/dev/null
# The CRI finds an image by digest only under a name that carries the digest (what a pull by
# digest would have recorded): give the executor image that name too.
ctr images tag "$EXECUTOR_NAME" "$EXECUTOR_IMAGE" >/dev/null

# --- kubelet: the node address on its own interface, tainted so that only the real-node tests'
# Pods (which tolerate it) land here; no image garbage collection (nothing can be pulled back).
cat >"$N/kubelet/config.yaml" <<KUBELET
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$C/run/containerd.sock
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $N/pki/kubelet-serving.crt
tlsPrivateKeyFile: $N/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $WORK/pki/ca.crt}
authorization: {mode: AlwaysAllow}
failSwapOn: false
resolvConf: ""
podLogsDir: $N/pod-logs
volumePluginDir: $N/kubelet/volume-plugins
maxPods: 30
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%, nodefs.inodesFree: 2%}
registerWithTaints:
  - {key: $NODE_TAINT, value: "true", effect: NoSchedule}
KUBELET
launch kubelet "$KUBE_DIR/kubelet" --config="$N/kubelet/config.yaml" --kubeconfig="$N/kubelet.kubeconfig" \
  --root-dir="$N/kubelet/root" --cert-dir="$N/kubelet/pki" --hostname-override="$NODE_NAME" \
  --node-ip="$NODE_IP" --node-labels="$NODE_LABEL=true" --v=1
wait_for "node $NODE_NAME Ready" "$KUBECTL" --kubeconfig="$K" wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s

# --- kube-router: only its NetworkPolicy controller (iptables + ipset).
launch kube-router "$KUBE_ROUTER_DIR/kube-router" --kubeconfig="$N/kube-router.kubeconfig" \
  --hostname-override="$NODE_NAME" --run-firewall=true --run-router=false --run-service-proxy=false \
  --run-loadbalancer=false --enable-ipv6=false --health-port=0 --metrics-port=0
wait_for "kube-router's policy chains" iptables -w -S KUBE-ROUTER-FORWARD

# --- RuntimeClasses, the StorageClass and its local volumes (fsGroup applies to local volumes).
"$KUBECTL" --kubeconfig="$K" apply -f - >/dev/null <<OBJECTS
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: runc}
handler: runc
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: gvisor}
handler: runsc
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $STORAGE_CLASS}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
OBJECTS
# The volumes of an earlier start are gone with its node directory: their objects go too (those
# still bound wait for their claims), and this start's volumes get names of their own.
"$KUBECTL" --kubeconfig="$K" delete pv -l "$NODE_LABEL=true" --wait=false >/dev/null
generation=$(date +%s)
for i in $(seq -w 1 "$LOCAL_VOLUMES"); do
  mkdir -p "$N/volumes/v$i"
  cat <<PV
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: e2e-local-$generation-v$i, labels: {$NODE_LABEL: "true"}}
spec:
  capacity: {storage: 2Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: $STORAGE_CLASS
  local: {path: $N/volumes/v$i}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$NODE_NAME]}]
PV
done | "$KUBECTL" --kubeconfig="$K" apply -f - >/dev/null

cat >"$N/env" <<ENV
export E2E_REAL_NODE='$NODE_NAME'
export E2E_REAL_NODE_LABEL='$NODE_LABEL'
export E2E_REAL_NODE_TAINT='$NODE_TAINT'
export E2E_REAL_NODE_STORAGE_CLASS='$STORAGE_CLASS'
export E2E_REAL_NODE_EXECUTOR_IMAGE='$EXECUTOR_IMAGE'
export E2E_REAL_NODE_POD_CIDR='$POD_CIDR'
ENV
started_ok=1
echo "real node $NODE_NAME up in $((SECONDS - t0))s; source $N/env" >&2
