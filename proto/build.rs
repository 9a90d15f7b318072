//! Generates the gRPC code from `tardi.proto` (needs `protoc`: Debian's `protobuf-compiler`,
//! installed by `scripts/setup.sh`).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=tardi.proto");
    tonic_prost_build::configure()
        // Checkpoints are shared by every backup's stream: `Bytes`, not copied `Vec`s.
        .bytes(".")
        .compile_protos(&["tardi.proto"], &["."])?;
    Ok(())
}
