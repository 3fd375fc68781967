//! Where the relist hands the events it generates: one call per event, in sequence order.
//!
//! The daemon's sink publishes on the event bus, the single fan-out whose subscribers (API
//! watchers, the sync loop, stdout) each have their own bounded queue: publishing never waits
//! on a consumer, so no consumer can stall the relist or make it discard.

use tokio::sync::mpsc;

use crate::pleg::event::PodLifecycleEvent;

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
