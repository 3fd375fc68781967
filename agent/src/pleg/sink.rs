//! Where the relist hands the events it generates: one call per event, in sequence order.
//!
//! The daemon's sink publishes on the event bus, the single fan-out whose subscribers (API
//! watchers, the sync loop, stdout) each have their own bounded queue: publishing never waits
//! on a consumer, so no consumer can stall the relist or make it discard.

use tokio::sync::mpsc;

use crate::pleg::{
    event::{Observation, PodLifecycleEvent, Trigger},
    record::ContainerId,
};

/// Takes each event the relist generates. Must not block.
pub trait EventSink: Send + Sync + 'static {
    fn publish(&self, event: PodLifecycleEvent);
}

/// For tests and tools: events land in an unbounded channel (dropped once its receiver is).
impl EventSink for mpsc::UnboundedSender<PodLifecycleEvent> {
    fn publish(&self, event: PodLifecycleEvent) {
        let _ = self.send(event);
    }
}

/// Where the kernel's observations go ahead of their confirmation (the API's opt-in stream):
/// never PLEG events, each later matched by the event that carries it or said unconfirmed.
/// Must not block.
pub trait ObservationSink: std::fmt::Debug + Send + Sync + 'static {
    /// A kernel trigger with observations, as its source hands it over.
    fn ahead(&self, trigger: &Trigger);
    /// The runtime never confirmed what the kernel observed of `container`.
    fn unconfirmed(&self, container: &ContainerId, observations: &[Observation]);
}
