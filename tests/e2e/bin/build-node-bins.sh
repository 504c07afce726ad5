#!/usr/bin/env bash
# Builds what the e2e suite's real node needs besides the kubelet (which build-bins.sh builds in
# the same `go build` as the control plane, since they share most packages):
#   node-debs    runc, the CNI plugins, iptables, ipset and busybox-static from Debian (apt-get)
#   containerd   containerd 2.x, its runc shim and ctr, from github.com/containerd/containerd/v2
#   gvisor       runsc and containerd-shim-runsc-v1 from gvisor.dev/gvisor, the shim patched so a
#                failure to lower its oom_score_adj is logged instead of fatal (machines without
#                CAP_SYS_RESOURCE); the patch is checked to have applied
#   kube-router  kube-router, run with only its NetworkPolicy controller (iptables + ipset)
# Each Go component is cached by version under $E2E_CACHE (versions.sh) and built only when
# missing, with a GOCACHE of its own that is removed after the build (nothing big stays behind).
# The pause and executor images are build-node-images.sh's.
#
# usage: build-node-bins.sh [node-debs|containerd|gvisor|kube-router ...]   (default: all)
# Timings go to $E2E_CACHE/build-times.log.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/versions.sh"
mkdir -p "$E2E_CACHE"
# One build of these components at a time; a second caller waits, then finds them cached. (The
# control plane's build-bins.sh has its own lock, so the two can run side by side.)
exec 9>"$E2E_CACHE/node-build.lock"
if ! flock -n 9; then
  echo "build-node-bins: another build of the node components is running; waiting for it" >&2
  flock 9
fi
JOBS="${E2E_GO_JOBS:-1}"
export CGO_ENABLED=0 GOFLAGS="-mod=mod -p=$JOBS -buildvcs=false"
GO="nice -n 19 go"

log_time() { # component seconds
  echo "$(date -u +%FT%TZ) $1 built in ${2}s" | tee -a "$E2E_CACHE/build-times.log" >&2
}

complete() { # dir binaries...
  local dir=$1; shift
  for b in "$@"; do [[ -x "$dir/$b" ]] || return 1; done
}

# module_copy MODULE@VERSION DEST: a writable copy of a module's source from the module proxy.
module_copy() {
  local src
  src="$($GO mod download -json "$1" | sed -n 's|.*"Dir": "\(.*\)".*|\1|p')"
  [[ -n "$src" ]] || { echo "could not download $1" >&2; exit 1; }
  rm -rf "$2" && mkdir -p "$(dirname "$2")" && cp -r "$src" "$2" && chmod -R u+w "$2"
}

# with_gocache DIR CMD...: runs CMD with a build cache of its own, removed afterwards.
with_gocache() {
  local dir=$1; shift
  rm -rf "$dir"
  GOCACHE="$dir" "$@"
  local rc=$?
  chmod -R u+w "$dir" 2>/dev/null; rm -rf "$dir"
  return $rc
}

build_node-debs() {
  local missing=() p
  for p in $NODE_DEBS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  local start=$SECONDS
  command -v apt-get >/dev/null || { echo "node-debs: no apt-get to install ${missing[*]}" >&2; exit 1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  log_time "node-debs (${missing[*]})" $((SECONDS - start))
}

build_containerd() {
  complete "$CONTAINERD_DIR" containerd containerd-shim-runc-v2 ctr && return 0
  local start=$SECONDS w="$E2E_CACHE/src/containerd-v$CONTAINERD_VERSION"
  module_copy "github.com/containerd/containerd/v2@v$CONTAINERD_VERSION" "$w"
  mkdir -p "$CONTAINERD_DIR.tmp"
  local pkg=github.com/containerd/containerd/v2/version
  (cd "$w" && with_gocache "$w.gocache" $GO build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X $pkg.Version=v$CONTAINERD_VERSION -X $pkg.Revision=module-proxy" \
    -o "$CONTAINERD_DIR.tmp/" ./cmd/containerd ./cmd/containerd-shim-runc-v2 ./cmd/ctr)
  rm -rf "$CONTAINERD_DIR" && mv "$CONTAINERD_DIR.tmp" "$CONTAINERD_DIR" && rm -rf "$w"
  log_time "containerd-v$CONTAINERD_VERSION" $((SECONDS - start))
}

build_gvisor() {
  complete "$GVISOR_DIR" runsc containerd-shim-runsc-v1 && return 0
  local start=$SECONDS w="$E2E_CACHE/src/gvisor-$GVISOR_VERSION"
  module_copy "gvisor.dev/gvisor@$GVISOR_VERSION" "$w"
  # The shim lowers its own oom_score_adj to -999 and gives up when it may not (no
  # CAP_SYS_RESOURCE here): ignore the error and keep the inherited score. One line changed.
  # Not a log line: the shim's start writes its bootstrap JSON to stdout, and a warning there
  # made containerd refuse it ("failed to create TTRPC connection: unsupported protocol").
  local m="$w/pkg/shim/v1/manager.go"
  [[ -f $m ]] || m="$w/pkg/shim/v1/service.go" # releases before 2025-06
  sed -i 's|^\(\t*\)return shim.BootstrapParams{}, fmt.Errorf("failed to set OOM Score on shim: %w", err)$|\1_ = err // no CAP_SYS_RESOURCE: keep the inherited score|' "$m"
  if grep -q 'fmt.Errorf("failed to set OOM Score on shim' "$m" || ! grep -q '_ = err // no CAP_SYS_RESOURCE' "$m"; then
    echo "gvisor: the shim's oom_score_adj patch did not apply to $m" >&2; exit 1
  fi
  mkdir -p "$GVISOR_DIR.tmp"
  (cd "$w" && with_gocache "$w.gocache" sh -c "$GO build -trimpath -ldflags '-s -w' -o '$GVISOR_DIR.tmp/runsc' ./runsc &&
    $GO build -trimpath -ldflags '-s -w' -o '$GVISOR_DIR.tmp/containerd-shim-runsc-v1' ./shim")
  rm -rf "$GVISOR_DIR" && mv "$GVISOR_DIR.tmp" "$GVISOR_DIR" && rm -rf "$w"
  log_time "gvisor-$GVISOR_VERSION (shim oom patch)" $((SECONDS - start))
}

build_kube-router() {
  complete "$KUBE_ROUTER_DIR" kube-router && return 0
  local start=$SECONDS w="$E2E_CACHE/src/kube-router-v$KUBE_ROUTER_VERSION"
  module_copy "github.com/cloudnativelabs/kube-router/v2@v$KUBE_ROUTER_VERSION" "$w"
  mkdir -p "$KUBE_ROUTER_DIR.tmp"
  (cd "$w" && with_gocache "$w.gocache" $GO build -trimpath \
    -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=v$KUBE_ROUTER_VERSION" \
    -o "$KUBE_ROUTER_DIR.tmp/kube-router" ./cmd/kube-router)
  rm -rf "$KUBE_ROUTER_DIR" && mv "$KUBE_ROUTER_DIR.tmp" "$KUBE_ROUTER_DIR" && rm -rf "$w"
  log_time "kube-router-v$KUBE_ROUTER_VERSION" $((SECONDS - start))
}

components=("$@")
[[ ${#components[@]} -gt 0 ]] || components=(node-debs containerd gvisor kube-router)
for c in "${components[@]}"; do
  case "$c" in
    node-debs | containerd | gvisor | kube-router)
      echo "build-node-bins: $c (built once, then cached under $E2E_CACHE)" >&2
      "build_$c" ;;
    *) echo "unknown component: $c" >&2; exit 2 ;;
  esac
done
