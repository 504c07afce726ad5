//! Tests of execution-provider against k3s started by testcontainers. They need a Docker engine,
//! so they sit behind the `k3s` feature and are `#[ignore]`d; the machines this project is
//! developed on have no Docker, and CI runs the real-control-plane suite (`tests/e2e`) instead.
#![forbid(unsafe_code)]
