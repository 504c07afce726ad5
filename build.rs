//! Compiles the wire API with protox (no system `protoc`), generates the tonic server and client,
//! and writes the encoded descriptor set that gRPC reflection and the descriptor snapshot read.

use std::path::PathBuf;

use protox::prost::Message as _;

const PROTO_ROOT: &str = "proto";
const PROTO_FILE: &str = "mecatl/execution/v1/execution.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");

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
