# The executor image: a base with a POSIX shell, `sleep` and a Go toolchain, plus
# `execution-helper` installed at /mecatl-executor, the path k8s-executor §4.4 fixes and the
# provider's pods/exec runs (src/executor/pod_exec.rs HELPER_IN_IMAGE_PATH). Templates must
# reference the image by digest (image@sha256:...), and the base is pinned by digest too.
#
# UNTESTED HERE: this project's machines have no Docker engine, so this recipe has never been
# built by CI. Build from the repository root, passing the base pinned by its digest, e.g.:
#   digest=$(docker buildx imagetools inspect golang:1.25-bookworm --format '{{json .Manifest.Digest}}' | tr -d '"')
#   docker build -f kind/executor.Dockerfile \
#     --build-arg BASE_IMAGE="golang:1.25-bookworm@${digest}" -t localhost:5001/execution-executor:dev .
# No default digest is written here: a digest we could not verify would be worse than none, and
# the build fails fast without BASE_IMAGE.
ARG BASE_IMAGE

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin execution-helper

FROM ${BASE_IMAGE}
# The helper, owned by the sandbox user, at the fixed path; /workspace owned by that user
# (the PVC is mounted over it; fsGroup 65532 keeps it writable).
COPY --from=build --chown=65532:65532 --chmod=0755 /src/target/release/execution-helper /mecatl-executor
RUN mkdir -p /workspace && chown 65532:65532 /workspace \
    && test -x /bin/sh && command -v sleep >/dev/null
ENV HOME=/workspace TMPDIR=/tmp GOTMPDIR=/tmp \
    PATH=/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin
USER 65532:65532
WORKDIR /workspace
# The idle shell the Pod runs (the reconciler sets the same command); every request is a
# separate `pods/exec` of /mecatl-executor.
ENTRYPOINT ["/bin/sh", "-c", "trap : TERM INT; sleep infinity & wait"]
