# The executor image: Debian's static busybox as the userland (a POSIX shell, `sleep` and the
# usual tools, no libc) and `execution-helper` at /mecatl-executor, the path k8s-executor §4.4
# fixes and the provider's pods/exec runs (src/executor/pod_exec.rs HELPER_IN_IMAGE_PATH). The
# helper is linked statically (the gnu target with crt-static), so nothing else is needed.
# kind/executor-rootfs.sh lays out the file system; the e2e suite's real node builds the same
# image without Docker from this file's USER, WORKDIR, ENV and ENTRYPOINT lines and that script
# (tests/e2e/bin/build-node-images.sh), so keep those instructions one per line.
# Templates must reference the image by digest (image@sha256:...). Build from the repository root:
#   docker build -f kind/executor.Dockerfile -t localhost:5001/execution-executor:dev .
# Add a toolchain on top (FROM this image, or a richer base with the same two steps) when the
# sandboxes need one.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked \
      --target x86_64-unknown-linux-gnu --bin execution-helper \
    && ldd target/x86_64-unknown-linux-gnu/release/execution-helper 2>&1 | grep -q 'not a dynamic executable'

FROM debian:bookworm-slim AS rootfs
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/execution-helper /helper
COPY kind/executor-rootfs.sh /executor-rootfs.sh
RUN apt-get update && cd /tmp && apt-get download busybox-static \
    && dpkg -x busybox-static_*.deb /bb && sh /executor-rootfs.sh /rootfs /bb/bin/busybox /helper

FROM scratch
COPY --from=rootfs /rootfs /
# COPY does not promise to keep the owners of another stage's files: set them again.
RUN chown 65532:65532 /workspace /mecatl-executor
ENV HOME=/workspace
ENV TMPDIR=/tmp
ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
USER 65532:65532
WORKDIR /workspace
# The supervisor is the Pod's main process (the reconciler sets the same command,
# docs/commands.md §2); every request is a `pods/exec` of /mecatl-executor that reaches it.
ENTRYPOINT ["/mecatl-executor", "supervise"]
