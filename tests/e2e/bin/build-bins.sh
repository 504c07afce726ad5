#!/usr/bin/env bash
# Builds the real control plane for the e2e suite from Go modules (no Docker, no download site):
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kubelet from k8s.io/kubernetes,
# etcd from go.etcd.io/etcd/server/v3, kwok from sigs.k8s.io/kwok and helm from helm.sh/helm/v3.
# Each component is cached by version under $E2E_CACHE and built only when missing.
# Go builds run at the lowest priority (and by default one package at a time), so Rust builds keep the CPU.
#
# usage: build-bins.sh [kube|etcd|kwok|helm ...]   (default: all). Timings go to $E2E_CACHE/build-times.log.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/versions.sh"
mkdir -p "$E2E_CACHE"
# One build of the cache at a time (CI, a test run building on first use, a developer): a
# second caller waits for the first and then finds the binaries cached.
exec 9>"$E2E_CACHE/build.lock"
if ! flock -n 9; then
  echo "build-bins: another build of $E2E_CACHE is running; waiting for it" >&2
  flock 9
fi
# E2E_GO_JOBS=1 (the default) builds one package at a time, for machines shared with other builds;
# CI on its own machine passes 2.
JOBS="${E2E_GO_JOBS:-1}"
export CGO_ENABLED=0 GOFLAGS="-mod=mod -p=$JOBS -buildvcs=false"
GO="nice -n 19 go"

# A module fetch from the Go module proxy (go get, go mod download) that fails is tried again,
# three times in all, 10 s apart: a fresh machine's first build fetches thousands of modules,
# and one TLS handshake timing out once failed a whole CI run.
fetch() {
  local try
  for try in 1 2 3; do
    "$@" && return 0
    [[ $try -lt 3 ]] && echo "build-bins: '$*' failed (try $try of 3); trying again in 10 s" >&2 && sleep 10
  done
  return 1
}

log_time() { # component seconds
  echo "$(date -u +%FT%TZ) $1 built in ${2}s" | tee -a "$E2E_CACHE/build-times.log" >&2
}

complete() { # dir binaries...
  local dir=$1; shift
  for b in "$@"; do [[ -x "$dir/$b" ]] || return 1; done
}

build_kube() {
  # The kubelet is the real node's (start-node.sh); it shares most packages with the others, so
  # it is built in the same `go build`. A cache from before it was added builds only what is
  # missing, and the shared packages come from the Go build cache.
  local all=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet) bins=() b
  for b in "${all[@]}"; do [[ -x "$KUBE_DIR/$b" ]] || bins+=("$b"); done
  [[ ${#bins[@]} -eq 0 ]] && return 0
  local start=$SECONDS w="$E2E_CACHE/src/kubernetes-v$K8S_VERSION"
  rm -rf "$w" && mkdir -p "$w" && cd "$w"
  $GO mod init e2e.local/kubebins >/dev/null 2>&1
  # k8s.io/kubernetes requires its staging modules at the fake v0.0.0 and replaces them with
  # ./staging paths, which only apply in its own build: pin each one to its published v0.X.Y tag.
  local gomod staging
  gomod=$(fetch $GO mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's|.*"GoMod": "\(.*\)".*|\1|p')
  staging="v0.${K8S_VERSION#1.}"
  for m in $(sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*|\1|p' "$gomod"); do
    $GO mod edit -replace="$m=$m@$staging"
  done
  local pkgs=() p
  for p in "${bins[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$p"); done
  fetch $GO get $(for p in "${pkgs[@]}"; do echo "$p@v$K8S_VERSION"; done)
  # Version stamping: without it /version reports v0.0.0-master, which helm and kubectl reject.
  local minor ldf="-s -w" v
  minor=$(cut -d. -f2 <<<"$K8S_VERSION")
  for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor"
    ldf+=" -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
  done
  mkdir -p "$KUBE_DIR.tmp"
  $GO build -trimpath -tags selinux,notest -ldflags "$ldf" -o "$KUBE_DIR.tmp/" "${pkgs[@]}"
  for b in "${all[@]}"; do
    [[ -x "$KUBE_DIR.tmp/$b" ]] || cp -a "$KUBE_DIR/$b" "$KUBE_DIR.tmp/$b"
  done
  rm -rf "$KUBE_DIR" && mv "$KUBE_DIR.tmp" "$KUBE_DIR"
  log_time "kubernetes-v$K8S_VERSION (${bins[*]})" $((SECONDS - start))
}

build_etcd() {
  complete "$ETCD_DIR" etcd && return 0
  local start=$SECONDS w="$E2E_CACHE/src/etcd-v$ETCD_VERSION"
  rm -rf "$w" && mkdir -p "$w" && cd "$w"
  $GO mod init e2e.local/etcdbin >/dev/null 2>&1
  fetch $GO get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  mkdir -p "$ETCD_DIR.tmp"
  $GO build -trimpath -ldflags "-s -w" -o "$ETCD_DIR.tmp/etcd" go.etcd.io/etcd/server/v3
  rm -rf "$ETCD_DIR" && mv "$ETCD_DIR.tmp" "$ETCD_DIR"
  log_time "etcd-v$ETCD_VERSION" $((SECONDS - start))
}

build_kwok() {
  complete "$KWOK_DIR" kwok && [[ -d "$KWOK_DIR/stage" && -d "$KWOK_DIR/crd" ]] && return 0
  local start=$SECONDS w="$E2E_CACHE/src/kwok-v$KWOK_VERSION" src
  src="$(fetch $GO mod download -json "sigs.k8s.io/kwok@v$KWOK_VERSION" | sed -n 's|.*"Dir": "\(.*\)".*|\1|p')"
  rm -rf "$w" && cp -r "$src" "$w" && chmod -R u+w "$w"
  # kwok's local exec copies the exec stream's stdin into the process through a pipe that it
  # never closes, so the process never sees end-of-input. The helper reads a file request until
  # EOF and takes a closed stdin as the cancel signal of a running command, so close the pipe
  # once the stream's stdin ends. (One statement added after the copy; checked below.)
  local exec_go="$w/pkg/utils/exec/exec.go"
  sed -i 's|^\(\t*\)_, _ = io.Copy(inPipe, opt.In)$|&\n\1_ = inPipe.Close()|' "$exec_go"
  [[ $(grep -c '_ = inPipe.Close()' "$exec_go") -ge 1 ]] || { echo "kwok stdin patch did not apply" >&2; exit 1; }
  mkdir -p "$KWOK_DIR.tmp"
  (cd "$w" && GOFLAGS="-mod=mod -p=$JOBS -buildvcs=false" $GO build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" -o "$KWOK_DIR.tmp/kwok" ./cmd/kwok)
  # The stage definitions (node-initialize, pod-ready, ...) and kwok's CRDs ship in the module;
  # keep a copy with the binary so a cleaned module cache does not break a cached control plane.
  cp -r "$w/kustomize/stage" "$KWOK_DIR.tmp/stage" && cp -r "$w/kustomize/crd/bases" "$KWOK_DIR.tmp/crd"
  rm -rf "$KWOK_DIR" && mv "$KWOK_DIR.tmp" "$KWOK_DIR"
  log_time "kwok-v$KWOK_VERSION (stdin EOF patch)" $((SECONDS - start))
}

build_helm() {
  complete "$HELM_DIR" helm && return 0
  local start=$SECONDS w="$E2E_CACHE/src/helm-v$HELM_VERSION"
  rm -rf "$w" && mkdir -p "$w" && cd "$w"
  $GO mod init e2e.local/helmbin >/dev/null 2>&1
  fetch $GO get "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
  mkdir -p "$HELM_DIR.tmp"
  $GO build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" \
    -o "$HELM_DIR.tmp/helm" helm.sh/helm/v3/cmd/helm
  rm -rf "$HELM_DIR" && mv "$HELM_DIR.tmp" "$HELM_DIR"
  log_time "helm-v$HELM_VERSION" $((SECONDS - start))
}

components=("$@")
[[ ${#components[@]} -gt 0 ]] || components=(kube etcd kwok helm)
for c in "${components[@]}"; do
  case "$c" in
    kube | etcd | kwok | helm)
      echo "build-bins: $c (built once, then cached under $E2E_CACHE)" >&2
      "build_$c" ;;
    *) echo "unknown component: $c" >&2; exit 2 ;;
  esac
done
