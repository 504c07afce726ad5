//! Compiles the wire API with protox (no system `protoc`), generates the tonic server and client,
//! and writes the encoded descriptor set that gRPC reflection and the descriptor snapshot read.

use std::path::PathBuf;

use protox::prost::Message as _;

const PROTO_ROOT: &str = "proto";
const PROTO_FILE: &str = "mecatl/execution/v1/execution.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    kubectl_for_tests();

    // Imports (google/protobuf/*) resolve from protox's bundled well-known types and are kept in
    // the set, so reflection clients can resolve every referenced type.
    let fds = protox::compile([PROTO_FILE], [PROTO_ROOT])?;

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("execution_descriptor.bin"),
        fds.encode_to_vec(),
    )?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Every proto map becomes a BTreeMap: iteration order feeds digests (the catalogue's
        // inventory revision) and must be deterministic; HashMap is disallowed in this crate.
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}

/// Finds a `kubectl` for the test that drives `dev` with it (`$KUBECTL`, else the first on
/// `PATH`): with one, `has_kubectl` is set and `EXECUTION_PROVIDER_TEST_KUBECTL` names it;
/// without, that test is compiled as ignored, saying why. `PATH` is not tracked (it differs
/// between shells and would rebuild the crate); set `KUBECTL` to point at a new one.
fn kubectl_for_tests() {
    println!("cargo::rustc-check-cfg=cfg(has_kubectl)");
    println!("cargo:rerun-if-env-changed=KUBECTL");
    let explicit = std::env::var_os("KUBECTL").map(PathBuf::from);
    let on_path = || {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("kubectl"))
                .find(|candidate| candidate.is_file())
        })
    };
    if let Some(kubectl) = explicit.or_else(on_path) {
        println!("cargo:rerun-if-changed={}", kubectl.display());
        println!("cargo:rustc-cfg=has_kubectl");
        println!(
            "cargo:rustc-env=EXECUTION_PROVIDER_TEST_KUBECTL={}",
            kubectl.display()
        );
    }
}
