//! The `plegd.v1` gRPC API, generated from `proto/plegd/v1/plegd.proto`.

/// `plegd.v1`: events, pods and health as served by the plegd daemon.
pub mod v1 {
    tonic::include_proto!("plegd.v1");
}

/// plegd.v1 and the files it imports as an encoded `google.protobuf.FileDescriptorSet`, for
/// gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/plegd_descriptor_set.bin"));
