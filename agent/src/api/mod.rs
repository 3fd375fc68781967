//! The daemon's API: the `plegd.v1` gRPC service with resumable event streams, grpc.health.v1,
//! Prometheus metrics, and the client side used by `plegd watch | pods | health`.
//!
//! - `convert`: domain types to `plegd.v1` messages.
//! - `server`: the tonic service (thin handlers over plain functions).
//! - `listen`: the unix socket, TLS and metrics listeners; grpc.health.v1 updates.
//! - `peers`: who may use the unix socket (SO_PEERCRED allow-list) and its file modes.
//! - `cut`: connections cut at shutdown when their watcher stopped reading.
//! - `authority`: unix-socket requests whose `:authority` h2 would refuse (a socket path),
//!   read as `localhost`.
//! - `observations`: kernel observations streamed ahead of confirmation, on request.
//! - `client`: the CLI subcommands that talk to a running daemon.

mod authority;
pub mod client;
pub(crate) mod convert;
mod cut;
pub mod listen;
pub mod observations;
pub(crate) mod peers;
pub(crate) mod server;

use std::sync::Arc;

pub use listen::{DEFAULT_SOCKET, Listeners};
pub use observations::ObservationBus;

pub use crate::bus::{ApiBus, EventBus};
use crate::{
    metrics::Metrics,
    pleg::{
        cache::PodCache,
        event::{PodLifecycleEvent, TriggerSource},
        generator::TriggerSender,
        health::Health,
        sink::EventSink,
    },
    sources::status::SourceRegistry,
    sync_loop::SyncFeed,
};

/// A new run id: random, so a client can tell a restarted daemon (whose sequences start
/// again at 1) from the one it watched.
pub fn new_run_id() -> u64 {
    let id = getrandom::u64().unwrap_or_else(|error| {
        // The kernel's generator does not fail on Linux; if it ever did, the clock still
        // tells two runs apart.
        tracing::warn!(%error, "no random run id; using the clock");
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64
    });
    // 0 means "any run" in WatchRequest.
    id.max(1)
}

/// What a running daemon shares with its API servers (and tests).
#[derive(Clone, Debug)]
pub struct Shared {
    pub cache: Arc<PodCache>,
    pub health: Arc<Health>,
    pub triggers: TriggerSender,
    pub sources: SourceRegistry,
    /// Every published event: the one fan-out to watchers, the sync loop and stdout.
    pub bus: ApiBus,
    /// Kernel observations ahead of confirmation, for the watchers that ask.
    pub observations: ObservationBus,
    /// The sync loop's pod syncs, for the `SyncPods` watchers.
    pub syncs: SyncFeed,
    pub metrics: Metrics,
}

/// The relist's sink: each event is numbered with the run, counted in the trigger-to-event
/// latency, and published on the bus. Never blocks.
#[derive(Clone, Debug)]
pub struct BusSink {
    pub bus: ApiBus,
    pub metrics: Metrics,
}

impl EventSink for BusSink {
    fn publish(&self, event: PodLifecycleEvent) {
        if event.sources.iter().any(|s| *s != TriggerSource::Relist) {
            self.metrics.trigger_to_event(
                event
                    .emitted_at
                    .duration_since(event.observed_at)
                    .unwrap_or_default(),
            );
        }
        self.bus
            .publish(Arc::new(convert::event(&event, self.bus.run_id())));
    }
}
