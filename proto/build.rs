//! Compiles plegd.v1 with protox, a protobuf compiler written in Rust that carries the
//! well-known types (google/protobuf/timestamp.proto): the build needs no protobuf files from
//! the system (Debian's protobuf-compiler ships without them; they are in libprotobuf-dev).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/plegd/v1/plegd.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
