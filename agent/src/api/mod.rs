//! The daemon's API: the `plegd.v1` gRPC service with resumable event streams, grpc.health.v1,
//! Prometheus metrics, and the client side used by `plegd watch | pods | health`.
//!
//! - `bus`: bounded event history and per-subscriber queues; resume and lagged semantics.
//! - `convert`: domain types to `plegd.v1` messages.
//! - `server`: the tonic service (thin handlers over plain functions).
//! - `listen`: the unix socket, TLS and metrics listeners; grpc.health.v1 updates.
//! - `cut`: connections cut at shutdown when their watcher stopped reading.
//! - `metrics`: kubelet's PLEG metrics and plegd's own.
//! - `client`: the CLI subcommands that talk to a running daemon.

pub mod bus;
pub mod client;
pub mod convert;
mod cut;
pub mod listen;
pub mod metrics;
pub mod server;

pub use bus::EventBus;
pub use listen::{DEFAULT_SOCKET, Listeners};
pub use metrics::Metrics;

/// The bus of served events.
pub type ApiBus = EventBus<plegd_proto::v1::Event>;

/// A new run id: random, so a client can tell a restarted daemon (whose sequences start
/// again at 1) from the one it watched.
pub fn new_run_id() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    // std's hasher keys are random per process; mixing in the time guards against a reuse.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    hasher.finish().max(1)
}

/// Publishes a lifecycle event to the watchers and records its trigger-to-event latency.
pub fn publish(
    bus: &ApiBus,
    metrics: &Metrics,
    event: &crate::pleg::event::PodLifecycleEvent,
    cache: &crate::pleg::cache::PodCache,
) {
    use crate::pleg::event::TriggerSource;
    if event.sources.iter().any(|s| *s != TriggerSource::Relist) {
        metrics.trigger_to_event(
            event
                .emitted_at
                .duration_since(event.observed_at)
                .unwrap_or_default(),
        );
    }
    bus.publish(std::sync::Arc::new(convert::event(
        event,
        cache,
        bus.run_id(),
    )));
}
