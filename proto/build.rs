//! Compiles plegd.v1 with protox, a protobuf compiler written in Rust that carries the
//! well-known types (google/protobuf/timestamp.proto): the build needs no protobuf files from
//! the system (Debian's protobuf-compiler ships without them; they are in libprotobuf-dev).

use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/plegd/v1/plegd.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    // What gRPC server reflection hands to generic clients (grpcurl, grpcui, Postman): the
    // API described with its imports, so they need no .proto file.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("plegd_descriptor_set.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
