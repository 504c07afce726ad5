#!/usr/bin/env bash
# Prints the host state the real node may touch, normalised so that two snapshots of an
# unchanged host are equal: sysctls (minus the counters that move on their own), the firewall
# (nftables ruleset, legacy iptables, ipsets), mounts, interfaces, addresses and routes, cgroup
# directories, the host directories of node-common.sh and the first level of the directories
# daemons write to, and any process running a node binary. Compared before start-node.sh and
# after stop-node.sh by the e2e suite (real_node.rs).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/versions.sh"
source "$here/node-common.sh"
section() { echo "### $1"; }
section sysctl
sysctl -a 2>/dev/null | grep -Ev '^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr|quota\.[a-z_]+)|kernel\.(ns_last_pid|random\.[a-z_]+|pty\.nr)|net\.netfilter\.nf_conntrack_count) =' | sort
section nftables
nft list ruleset 2>/dev/null
section iptables-legacy
for t in iptables-legacy-save ip6tables-legacy-save; do
  command -v "$t" >/dev/null && "$t" 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//'
done
section ipset
ipset list -n 2>/dev/null | sort
section mounts
awk '{print $5, $(NF-2), $(NF-1)}' /proc/self/mountinfo | sort
section links
ip -o link show | awk '{print $2}' | sort
section addresses
ip -o addr show | awk '{print $2, $3, $4}' | sort
section routes
ip route show table all | sort
ip -6 route show table all | sort
ip rule show | sort
section cgroups
# Only the node's names: other tests on this machine make cgroups of their own meanwhile.
find /sys/fs/cgroup -mindepth 2 -maxdepth 3 -type d \( -name 'kubepods*' -o -name k8s.io -o -name 'e2e-*' \) | sort
section host-dirs
for d in "${NODE_HOST_DIRS[@]}" "$NODE_LOCK"; do [[ -e $d ]] && echo "$d"; done
section top-level
find /run /run/lock /var/lib /var/log /var/run /etc /opt /usr/libexec -mindepth 1 -maxdepth 1 2>/dev/null | sort -u
section processes
for p in /proc/[0-9]*; do
  exe=$(readlink "$p/exe" 2>/dev/null) || continue
  case "$exe" in
    "$CONTAINERD_DIR"/* | "$GVISOR_DIR"/* | "$KUBE_DIR/kubelet" | "$KUBE_ROUTER_DIR"/*) echo "$exe" ;;
  esac
done | sort
