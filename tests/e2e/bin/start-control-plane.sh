#!/usr/bin/env bash
# Starts a real Kubernetes control plane on 127.0.0.1 for the e2e suite: etcd, kube-apiserver
# (client-certificate authentication, RBAC authorization, certificates generated here with
# openssl), kube-controller-manager, kube-scheduler and kwok (one fake node that marks Pods
# ready, provisions `kwok-volume` PVCs and serves pods/exec by running local commands).
# It waits for each component by polling with a deadline and records every PID it starts in
# $E2E_WORK/pids/, so stop-control-plane.sh stops exactly those processes.
#
# usage: start-control-plane.sh            (binaries from build-bins.sh; E2E_WORK picks the directory)
# On success it writes $E2E_WORK/env, to be sourced by whoever runs the suite.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/versions.sh"

WORK="${E2E_WORK:-${TMPDIR:-/tmp}/execution-provider-e2e}"
ETCD_PORT="${E2E_ETCD_PORT:-23790}"
ETCD_PEER_PORT="${E2E_ETCD_PEER_PORT:-23800}"
API_PORT="${E2E_API_PORT:-16443}"
KCM_PORT="${E2E_KCM_PORT:-16257}"
SCHED_PORT="${E2E_SCHED_PORT:-16259}"
KWOK_PORT="${E2E_KWOK_PORT:-16250}"
NODE_NAME="${E2E_NODE_NAME:-e2e-node}"
READY_DEADLINE="${E2E_READY_DEADLINE:-120}"
# Where the executor image keeps the helper (src/executor/pod_exec.rs HELPER_IN_IMAGE_PATH).
HELPER_IN_IMAGE="${E2E_HELPER_IN_IMAGE:-/mecatl-executor}"

for b in "$KUBE_DIR/kube-apiserver" "$KUBE_DIR/kube-controller-manager" "$KUBE_DIR/kube-scheduler" \
  "$KUBE_DIR/kubectl" "$ETCD_DIR/etcd" "$KWOK_DIR/kwok"; do
  [[ -x "$b" ]] || { echo "missing $b: run tests/e2e/bin/build-bins.sh first" >&2; exit 1; }
done
if [[ -d "$WORK/pids" ]] && compgen -G "$WORK/pids/*.pid" >/dev/null; then
  echo "$WORK/pids holds PIDs of a running control plane: run stop-control-plane.sh first" >&2
  exit 1
fi
rm -rf "$WORK" && mkdir -p "$WORK"/{pids,logs,pki,etcd,kcm,sched,workspaces}
P="$WORK/pki" K="$WORK/admin.kubeconfig" KUBECTL="$KUBE_DIR/kubectl"

# On any failure, stop what was started and show the logs.
started_ok=0
on_exit() {
  if [[ $started_ok == 0 ]]; then
    echo "control plane failed to start; logs follow" >&2
    tail -n 30 "$WORK"/logs/*.log >&2 || true
    "$here/stop-control-plane.sh" "$WORK" || true
  fi
}
trap on_exit EXIT

# wait_for DESCRIPTION COMMAND...: polls COMMAND every half second until it succeeds or the deadline.
wait_for() {
  local what=$1; shift
  local deadline=$((SECONDS + READY_DEADLINE))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then echo "timed out after ${READY_DEADLINE}s waiting for $what" >&2; return 1; fi
    sleep 0.5
  done
  echo "ready: $what ($((SECONDS - t0))s since start)" >&2
}

# launch NAME BINARY ARGS...: starts a component in the background, logging and recording its PID.
launch() {
  local name=$1; shift
  "$@" >"$WORK/logs/$name.log" 2>&1 &
  echo $! >"$WORK/pids/$(printf '%02d' "$(ls "$WORK/pids" | wc -l)")-$name.pid"
}

t0=$SECONDS
# --- PKI: a CA, the API server's serving certificate, an admin client (system:masters), the
# controller-manager and scheduler clients, and the service-account signing key.
(
  cd "$P"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=execution-provider-e2e-ca" 2>/dev/null
  client_cert() { # file subject
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 3650 \
      -extfile <(printf 'extendedKeyUsage=clientAuth\n') 2>/dev/null
  }
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 3650 \
    -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.96.0.1\nextendedKeyUsage=serverAuth\n') 2>/dev/null
  client_cert admin "/O=system:masters/CN=e2e-admin"
  client_cert kcm "/CN=system:kube-controller-manager"
  client_cert sched "/CN=system:kube-scheduler"
  client_cert kwok "/O=system:masters/CN=e2e-kwok"
  # What the API server presents to a kubelet (pods/exec, logs) of the real node (start-node.sh),
  # whose kubelet admits only clients of this CA.
  client_cert kubelet-client "/O=system:masters/CN=e2e-apiserver-kubelet-client"
  openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
)
kubeconfig() { # file user-cert-basename
  "$KUBECTL" config set-cluster e2e --server="https://127.0.0.1:$API_PORT" --certificate-authority="$P/ca.crt" --embed-certs=true --kubeconfig="$1" >/dev/null
  "$KUBECTL" config set-credentials "$2" --client-certificate="$P/$2.crt" --client-key="$P/$2.key" --embed-certs=true --kubeconfig="$1" >/dev/null
  "$KUBECTL" config set-context e2e --cluster=e2e --user="$2" --kubeconfig="$1" >/dev/null
  "$KUBECTL" config use-context e2e --kubeconfig="$1" >/dev/null
}
kubeconfig "$K" admin
kubeconfig "$WORK/kcm.kubeconfig" kcm
kubeconfig "$WORK/sched.kubeconfig" sched
kubeconfig "$WORK/kwok.kubeconfig" kwok

# --- etcd
launch etcd "$ETCD_DIR/etcd" --name=e2e --data-dir="$WORK/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="e2e=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync=true --log-level=warn
wait_for etcd curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

# --- kube-apiserver: loopback only, RBAC, client certificates; the endpoint reconciler is off
# because 127.0.0.1 may not be published as the `kubernetes` Service endpoint. A node's
# InternalIP comes first (the real node's, on its own interface), then its Hostname (kwok's node
# has only `localhost`, where kwok serves exec).
launch kube-apiserver "$KUBE_DIR/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --secure-port="$API_PORT" \
  --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
  --client-ca-file="$P/ca.crt" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
  --service-cluster-ip-range=10.96.0.0/16 \
  --authorization-mode=Node,RBAC \
  --allow-privileged=false \
  --kubelet-preferred-address-types=InternalIP,Hostname \
  --kubelet-client-certificate="$P/kubelet-client.crt" --kubelet-client-key="$P/kubelet-client.key" \
  --cert-dir="$WORK/apiserver-certs" --v=1
wait_for kube-apiserver "$KUBECTL" --kubeconfig="$K" get --raw=/readyz

# --- kube-controller-manager: default ServiceAccounts, garbage collection, namespace deletion,
# PVC protection finalizers, Deployment -> ReplicaSet -> Pod, ResourceQuota usage (resynced
# every 10s, so a quota created before its CRD was discovered is computed promptly).
launch kube-controller-manager "$KUBE_DIR/kube-controller-manager" \
  --kubeconfig="$WORK/kcm.kubeconfig" --authentication-kubeconfig="$WORK/kcm.kubeconfig" \
  --authorization-kubeconfig="$WORK/kcm.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --cert-dir="$WORK/kcm" --leader-elect=false \
  --use-service-account-credentials=true \
  --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
  --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
  --node-monitor-period=25s --node-monitor-grace-period=3m20s \
  --resource-quota-sync-period=10s \
  --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics
wait_for kube-controller-manager curl -kfsS "https://127.0.0.1:$KCM_PORT/healthz"

# --- kube-scheduler: binds executor Pods to the kwok node (kwok does not bind Pods itself).
launch kube-scheduler "$KUBE_DIR/kube-scheduler" \
  --kubeconfig="$WORK/sched.kubeconfig" --authentication-kubeconfig="$WORK/sched.kubeconfig" \
  --authorization-kubeconfig="$WORK/sched.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --cert-dir="$WORK/sched" --leader-elect=false \
  --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics
wait_for kube-scheduler curl -kfsS "https://127.0.0.1:$SCHED_PORT/healthz"

# --- kwok: the node, Pod readiness, volume provisioning, and exec served by local processes.
# It manages only nodes annotated as its own: the real node (start-node.sh) has a kubelet.
# Exec rules are Exec objects (one per executor Pod, created by the suite), so its CRD goes in.
S="$KWOK_DIR/stage"
# kwok runs the exec'd argv as a local process, and the provider always execs the helper at its
# path in the executor image. That path gets a link to the suite's wrapper, which runs the helper
# cargo built on the Pod's workspace (see execution-helper-kwok). It is removed on stop, and an
# existing file there that is not our link is refused rather than replaced.
install -m 0755 "$here/execution-helper-kwok" "$WORK/execution-helper-kwok"
if [[ -e "$HELPER_IN_IMAGE" || -L "$HELPER_IN_IMAGE" ]]; then
  case "$(readlink "$HELPER_IN_IMAGE" || true)" in
    */execution-provider-e2e*/execution-helper-kwok | */execution-helper-kwok) rm -f "$HELPER_IN_IMAGE" ;;
    *) echo "$HELPER_IN_IMAGE exists and is not the e2e helper link; refusing to replace it" >&2; exit 1 ;;
  esac
fi
ln -s "$WORK/execution-helper-kwok" "$HELPER_IN_IMAGE"
echo "$HELPER_IN_IMAGE" >"$WORK/helper-link"
"$KUBECTL" --kubeconfig="$K" apply -f "$KWOK_DIR/crd/kwok.x-k8s.io_execs.yaml" >/dev/null
"$KUBECTL" --kubeconfig="$K" apply -f "$S/volume/fast/storage-class.yaml" >/dev/null
launch kwok "$KWOK_DIR/kwok" --kubeconfig="$WORK/kwok.kubeconfig" \
  --config="$S/node/fast/node-initialize.yaml" \
  --config="$S/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
  --config="$S/pod/fast/pod-ready.yaml" --config="$S/pod/fast/pod-complete.yaml" \
  --config="$here/stages/pod-delete-terminal.yaml" --config="$here/stages/pod-delete-unfinalized.yaml" \
  --config="$here/stages/pod-terminate.yaml" \
  --config="$S/volume/fast/pvc-provision.yaml" --config="$S/volume/fast/pv-bind.yaml" \
  --config="$S/volume/fast/pvc-delete.yaml" --config="$S/volume/fast/pv-delete.yaml" \
  --enable-crds=Exec \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake --node-name=localhost --node-ip= --node-port="$KWOK_PORT" \
  --server-address="127.0.0.1:$KWOK_PORT" --node-lease-duration-seconds=40 --cidr=10.244.0.0/16
"$KUBECTL" --kubeconfig="$K" apply -f - >/dev/null <<NODE
apiVersion: v1
kind: Node
metadata:
  name: $NODE_NAME
  annotations: {node.alpha.kubernetes.io/ttl: "0", kwok.x-k8s.io/node: fake}
  labels: {kubernetes.io/hostname: $NODE_NAME, kubernetes.io/os: linux, kubernetes.io/arch: amd64, type: kwok}
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "110", ephemeral-storage: 500Gi}
  capacity: {cpu: "32", memory: 256Gi, pods: "110", ephemeral-storage: 500Gi}
NODE
wait_for "node $NODE_NAME Ready" "$KUBECTL" --kubeconfig="$K" wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
wait_for "default ServiceAccount" "$KUBECTL" --kubeconfig="$K" -n default get serviceaccount default

cat >"$WORK/env" <<ENV
export E2E_WORK='$WORK'
export E2E_KUBECONFIG='$K'
export E2E_KUBECTL='$KUBECTL'
export E2E_HELM='$HELM_DIR/helm'
export E2E_KWOK_NODE='$NODE_NAME'
export E2E_K8S_VERSION='$K8S_VERSION'
ENV
started_ok=1
echo "control plane up in $((SECONDS - t0))s; source $WORK/env" >&2
