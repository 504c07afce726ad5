#!/usr/bin/env bash
# Builds the two images the e2e suite's real node runs, without Docker or a registry, as OCI
# image-layout archives that `ctr images import` takes (one uncompressed layer each, files
# owned as laid out, timestamps zeroed, so the same inputs give the same digest):
#   pause     the sandbox image: tests/e2e/node/pause.go, built once and cached ($PAUSE_DIR)
#   executor  the executor image of kind/executor.Dockerfile: kind/executor-rootfs.sh with
#             Debian's static busybox and HELPER (a statically linked execution-helper), and the
#             USER, WORKDIR, ENV and ENTRYPOINT lines of the Dockerfile's last stage
# For each it writes OUT/<name>.tar and OUT/<name>.ref (`name:tag@sha256:<manifest digest>`).
#
# usage: build-node-images.sh OUT HELPER
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
source "$here/versions.sh"
out=$1 helper=$2
mkdir -p "$out"

# oci_archive ROOTFS NAME:TAG CONFIG_JSON OUT_TAR: an OCI layout archive of ROOTFS as one layer;
# CONFIG_JSON is the image's `config` object. Prints the manifest digest.
oci_archive() {
  local rootfs=$1 ref=$2 config=$3 tarball=$4 d
  d=$(mktemp -d)
  mkdir -p "$d/blobs/sha256"
  # --xattrs writes pax headers, which would record atime and ctime: leave those out.
  tar --sort=name --mtime=@0 --numeric-owner --xattrs --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$rootfs" -cf "$d/layer.tar" .
  local layer layer_size
  layer=$(sha256sum "$d/layer.tar" | cut -d' ' -f1) layer_size=$(stat -c %s "$d/layer.tar")
  mv "$d/layer.tar" "$d/blobs/sha256/$layer"
  jq -cn --argjson config "$config" --arg diff "sha256:$layer" \
    '{architecture: "amd64", os: "linux", config: $config, rootfs: {type: "layers", diff_ids: [$diff]}}' >"$d/config"
  local cfg cfg_size
  cfg=$(sha256sum "$d/config" | cut -d' ' -f1) cfg_size=$(stat -c %s "$d/config")
  mv "$d/config" "$d/blobs/sha256/$cfg"
  jq -cn --arg cfg "sha256:$cfg" --argjson cfg_size "$cfg_size" --arg layer "sha256:$layer" --argjson layer_size "$layer_size" \
    '{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cfg, size: $cfg_size},
      layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $layer, size: $layer_size}]}' >"$d/manifest"
  local man man_size
  man=$(sha256sum "$d/manifest" | cut -d' ' -f1) man_size=$(stat -c %s "$d/manifest")
  mv "$d/manifest" "$d/blobs/sha256/$man"
  jq -cn --arg man "sha256:$man" --argjson size "$man_size" --arg ref "$ref" --arg tag "${ref##*:}" \
    '{schemaVersion: 2, manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $man, size: $size,
      annotations: {"io.containerd.image.name": $ref, "org.opencontainers.image.ref.name": $tag}}]}' >"$d/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$d/oci-layout"
  tar --sort=name --mtime=@0 --numeric-owner -C "$d" -cf "$tarball" oci-layout index.json blobs
  rm -rf "$d"
  echo "sha256:$man"
}

# --- pause: built once per source (its hash names the cache entry).
pause_src="$repo/tests/e2e/node/pause.go"
PAUSE_DIR="$E2E_CACHE/pause-$(sha256sum "$pause_src" | cut -c1-12)"
if [[ ! -x "$PAUSE_DIR/pause" ]]; then
  start=$SECONDS
  mkdir -p "$PAUSE_DIR.tmp"
  gocache=$(mktemp -d)
  CGO_ENABLED=0 GOCACHE="$gocache" GOFLAGS=-buildvcs=false nice -n 19 go build -trimpath -ldflags "-s -w" \
    -o "$PAUSE_DIR.tmp/pause" "$pause_src"
  rm -rf "$gocache" "$PAUSE_DIR" && mv "$PAUSE_DIR.tmp" "$PAUSE_DIR"
  echo "$(date -u +%FT%TZ) pause built in $((SECONDS - start))s" >>"$E2E_CACHE/build-times.log"
fi
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
install -m 0755 "$PAUSE_DIR/pause" "$rootfs/pause"
ref="e2e.local/pause:$(basename "$PAUSE_DIR" | cut -d- -f2)"
digest=$(oci_archive "$rootfs" "$ref" '{"Entrypoint": ["/pause"], "User": "65535:65535"}' "$out/pause.tar")
echo "$ref@$digest" >"$out/pause.ref"

# --- executor: the Dockerfile's last stage, with the rootfs script.
linkage=$(ldd "$helper" 2>&1 || true)
grep -qE 'not a dynamic executable|statically linked' <<<"$linkage" ||
  { echo "$helper is not statically linked (build it with the gnu target and crt-static; docs/e2e.md)" >&2; exit 1; }
dockerfile="$repo/kind/executor.Dockerfile"
last_stage=$(awk '/^FROM /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' "$dockerfile")
field() { sed -n "s/^$1 //p" <<<"$last_stage"; }
user=$(field USER | tail -1) workdir=$(field WORKDIR | tail -1) entrypoint=$(field ENTRYPOINT | tail -1)
env_json=$(field ENV | jq -R . | jq -sc .)
[[ -n $user && -n $workdir && -n $entrypoint ]] || { echo "$dockerfile: no USER, WORKDIR or ENTRYPOINT line" >&2; exit 1; }
config=$(jq -cn --arg user "$user" --arg wd "$workdir" --argjson ep "$entrypoint" --argjson env "$env_json" \
  '{User: $user, WorkingDir: $wd, Entrypoint: $ep, Env: $env}')
rm -rf "$rootfs" && mkdir -p "$rootfs"
sh "$repo/kind/executor-rootfs.sh" "$rootfs/root" /bin/busybox "$helper"
tag=$( (sha256sum "$helper"; sha256sum "$repo/kind/executor-rootfs.sh"; echo "$config") | sha256sum | cut -c1-12)
ref="e2e.local/execution-executor:$tag"
digest=$(oci_archive "$rootfs/root" "$ref" "$config" "$out/executor.tar")
echo "$ref@$digest" >"$out/executor.ref"
echo "images: $(cat "$out/pause.ref") $(cat "$out/executor.ref")" >&2
