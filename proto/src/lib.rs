//! The `plegd.v1` gRPC API, generated from `proto/plegd/v1/plegd.proto`.

/// `plegd.v1`: events, pods and health as served by the plegd daemon.
pub mod v1 {
    tonic::include_proto!("plegd.v1");
}
