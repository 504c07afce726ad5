# The execution-provider image: the `execution-provider` binary (serve) on a minimal non-root
# base. Build from the repository root:
#   docker build -f kind/provider.Dockerfile -t localhost:5001/execution-provider:dev .
# Not built on this project's machines (no Docker engine); kind/run-e2e.sh builds it.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin execution-provider

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/execution-provider /execution-provider
USER 65532:65532
ENTRYPOINT ["/execution-provider", "serve"]
