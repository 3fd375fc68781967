//! The daemon's API: the `plegd.v1` gRPC service with resumable event streams, grpc.health.v1,
//! Prometheus metrics, and the client side used by `plegd watch | pods | health`.
//!
//! - `convert`: plegd's domain types to `plegd.v1` messages and back, written once.
//! - `server`: the tonic service (thin handlers over plain functions).
//! - `listen`: the unix socket, TLS and metrics listeners; grpc.health.v1 updates.
//! - `peers`: who may use the unix socket (SO_PEERCRED allow-list) and its file modes.
//! - `admission`: what the API's peers may hold: connections, streams, time without one.
//! - `cut`: connections cut at shutdown when their watcher stopped reading, or when they go
//!   too long without a stream.
//! - `authority`: unix-socket requests whose `:authority` h2 would refuse (a socket path),
//!   read as `localhost`.
//! - `client`: the CLI subcommands that talk to a running daemon.

pub mod admission;
mod authority;
pub mod client;
pub(crate) mod convert;
mod cut;
pub mod listen;
pub(crate) mod peers;
pub(crate) mod server;

#[doc(hidden)]
pub use authority::{FuzzOutcome, fuzz_header_blocks};
pub use listen::{DEFAULT_SOCKET, Listeners};

use crate::{base::metrics::Metrics, pleg::Pleg, sources::status::SourceRegistry};

/// What a running daemon shares with its API servers (and tests).
#[derive(Clone, Debug)]
pub struct Shared {
    /// The PLEG: its events, syncs, notices, cache and health.
    pub pleg: Pleg,
    pub sources: SourceRegistry,
    pub metrics: Metrics,
}

impl Shared {
    /// Drops the per-container series of pods the cache has not held for a while
    /// ([`crate::base::metrics::GONE_POD_SERIES_RETENTION`]).
    pub fn forget_gone_pods(&self) {
        let pods = self.pleg.cache().pods();
        let live: std::collections::BTreeSet<(&str, &str)> = pods
            .iter()
            .filter_map(|(_, p)| p.record.as_ref())
            .map(|record| (record.namespace.as_str(), record.name.as_str()))
            .collect();
        self.metrics
            .forget_gone_pods(&live, std::time::Instant::now());
    }
}
