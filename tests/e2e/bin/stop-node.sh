#!/usr/bin/env bash
# Stops the real node start-node.sh started and puts the host back as start-node.sh recorded it
# ($WORK/node/before): every node process ends (the daemons it recorded, the container shims,
# gVisor's sandboxes and whatever runs in the node's cgroups), every mount under the node's
# directories goes, the links, firewall chains, tables and ipsets it or its daemons made are
# removed, the cgroups and host directories that did not exist before are removed, and the
# sysctls get their recorded values back. Safe to run twice, and after a run whose processes
# were killed: it works from what it finds, not from what it expects.
#
# usage: stop-node.sh [WORK]   (default $E2E_WORK or ${TMPDIR:-/tmp}/execution-provider-e2e)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/versions.sh"
source "$here/node-common.sh"
WORK="${1:-${E2E_WORK:-${TMPDIR:-/tmp}/execution-provider-e2e}}"
N="$WORK/node" B="$WORK/node/before"
[[ -d "$B" ]] || exit 0

# term_then_kill PID NAME: SIGTERM, up to 15 s to exit, then SIGKILL.
term_then_kill() {
  kill -TERM "$1" 2>/dev/null
  local deadline=$((SECONDS + 15))
  while kill -0 "$1" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  kill -0 "$1" 2>/dev/null && { echo "$2 ($1) ignored SIGTERM for 15s; killing it" >&2; kill -KILL "$1" 2>/dev/null; }
}

# --- The policy enforcer and the kubelet first (no new Pods), then containerd (a sandbox it was
# still creating for the kubelet would otherwise start after the sweep below), then everything
# that runs containers.
stop_recorded() { # NAME: the recorded daemon NAME, if it still runs that binary
  local f pid
  for f in "$N"/pids/*-"$1".pid; do
    [[ -f $f ]] || continue
    pid=$(cat "$f")
    [[ "$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)")" == "$1" ]] && term_then_kill "$pid" "$1"
    rm -f "$f"
  done
}
for name in kube-router kubelet containerd; do stop_recorded "$name"; done
# node_processes: the PIDs of the container shims, runc, gVisor, and every process in a cgroup
# of the node's (the Pods' sandboxes and containers).
node_processes() {
  local p exe
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    case "$exe" in
      "$CONTAINERD_DIR"/* | "$GVISOR_DIR"/* | "$KUBE_DIR/kubelet" | "$KUBE_ROUTER_DIR"/* | /usr/sbin/runc)
        echo "${p#/proc/}"; continue ;;
    esac
    grep -qE ':/(kubepods|k8s\.io)(/|$)' "$p/cgroup" 2>/dev/null && echo "${p#/proc/}"
  done
}
# SIGKILL until three sweeps half a second apart find none (a shim still starting a sandbox
# shows up in a later sweep).
deadline=$((SECONDS + 30)) quiet=0
while ((quiet < 3)); do
  pids=$(node_processes)
  if [[ -z $pids ]]; then
    quiet=$((quiet + 1))
  else
    quiet=0
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
  fi
  ((SECONDS < deadline)) || { echo "node processes outlived 30 s of SIGKILL: $pids" >&2; break; }
  sleep 0.5
done
rm -f "$N"/pids/*.pid

# --- Mounts under the node's directories (overlay roots, netns, volumes, kubelet's bind mounts),
# deepest first, until none is left.
our_mounts() {
  awk '{print $5}' /proc/self/mountinfo | while read -r m; do
    m=$(printf '%b' "$m")
    case "$m" in "$N"/* | "$N") echo "$m"; continue ;; esac
    for d in "${NODE_HOST_DIRS[@]}"; do
      [[ $m == "$d" || $m == "$d"/* ]] && ! grep -qxF "$d" "$B/host-dirs" && echo "$m"
    done
  done | sort -ru
}
for _ in 1 2 3 4 5; do
  mounts=$(our_mounts)
  [[ -z $mounts ]] && break
  while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done <<<"$mounts"
done

# --- Links: the node's interface, the Pod bridge, and veths that did not exist before.
for l in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
  grep -qxF "$l" "$B/links" && continue
  case "$l" in "$NODE_IFACE" | "$CNI_BRIDGE" | veth*) ip link del "$l" 2>/dev/null ;; esac
done

# --- Firewall: in tables that existed before, the chains of the node (KUBE-* of the kubelet and
# kube-router, E2E-* of start-node.sh) and the rules that jump to them; tables that did not
# exist before go whole; then the ipsets that did not exist before.
for ipt in iptables ip6tables; do
  command -v "$ipt" >/dev/null || continue
  for t in filter nat mangle raw; do
    rules=$("$ipt" -w -t "$t" -S 2>/dev/null) || continue
    grep -E '^-A [A-Z]+ .*-j (KUBE-|E2E-)' <<<"$rules" | grep -vE '^-A (KUBE-|E2E-)' | while read -r r; do
      # shellcheck disable=SC2086
      "$ipt" -w -t "$t" ${r/-A/-D} 2>/dev/null
    done
    for c in $(sed -n 's/^-N \(\(KUBE\|E2E\)-[^ ]*\)$/\1/p' <<<"$rules"); do "$ipt" -w -t "$t" -F "$c" 2>/dev/null; done
    for c in $(sed -n 's/^-N \(\(KUBE\|E2E\)-[^ ]*\)$/\1/p' <<<"$rules"); do "$ipt" -w -t "$t" -X "$c" 2>/dev/null; done
  done
done
if command -v nft >/dev/null; then
  nft list tables 2>/dev/null | sort | while read -r table; do
    # shellcheck disable=SC2086
    grep -qxF "$table" "$B/nft-tables" || nft delete $table
  done
fi
if command -v ipset >/dev/null; then
  for s in $(ipset list -n 2>/dev/null); do grep -qxF "$s" "$B/ipsets" || ipset destroy "$s" 2>/dev/null; done
fi

# --- cgroups of the node (every controller's hierarchy), deepest first.
for _ in 1 2 3; do
  dirs=$(find /sys/fs/cgroup -mindepth 2 -type d \( -path '*/kubepods*' -o -path '*/k8s.io*' \) 2>/dev/null | sort -r)
  [[ -z $dirs ]] && break
  while read -r d; do rmdir "$d" 2>/dev/null; done <<<"$dirs"
done

# --- sysctls back to their recorded values.
while IFS='=' read -r key value; do
  [[ -n $key ]] && [[ "$(sysctl -n "$key" 2>/dev/null)" != "$value" ]] && sysctl -qw "$key=$value"
done <"$B/sysctls"

# --- Host directories the node's daemons made outside its roots.
for d in "${NODE_HOST_DIRS[@]}"; do
  [[ -e $d ]] && ! grep -qxF "$d" "$B/host-dirs" && rm -rf --one-file-system "$d"
done

leftover=$(our_mounts)
[[ -z $leftover ]] || echo "stop-node: mounts left behind: $leftover" >&2
rm -rf --one-file-system "$N"
# The lock's file goes unless a start holds it now.
[[ -e $NODE_LOCK ]] && exec 8>>"$NODE_LOCK" && flock -n 8 && rm -f "$NODE_LOCK"
[[ -z $leftover ]]
