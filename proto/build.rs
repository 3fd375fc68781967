fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure().compile_protos(&["proto/plegd/v1/plegd.proto"], &["proto"])?;
    Ok(())
}
