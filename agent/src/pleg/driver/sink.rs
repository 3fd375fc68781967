//! Where the PLEG's output goes: the relist hands each event to an [`EventSink`], one call per
//! event, in sequence order; the trigger sender (`driver::triggers`) tells a kernel trigger's
//! observations on their own as [`Notice`]s, as the trigger is sent.
//!
//! The PLEG's own sink publishes on its event bus, whose subscribers (API watchers, the sync
//! loop, stdout) each have their own bounded queue: publishing never waits on a consumer, so
//! no consumer can stall the relist or make it discard.

use std::{sync::Arc, time::SystemTime};

use tokio::sync::{broadcast, mpsc};
use tracing::info;

use crate::{
    base::{bus::EventBus, metrics::Metrics},
    pleg::{
        decide::reconcile::Correction,
        model::{
            event::{Notice, NoticeKind, PodLifecycleEvent, PodLifecycleEventType},
            record::{ContainerId, PodUid},
            source::Source,
            trigger::{Observation, ObservationKind},
        },
        shared::cache::PodCache,
    },
};

/// Kernel notices not yet read by the slowest consumer that asked for them; past that, it
/// skips the oldest (notices are a preview: the events that confirm them are never skipped).
pub const NOTICE_QUEUE: usize = 1024;

/// Takes each event the relist generates. Must not block.
pub trait EventSink: Send + Sync + 'static {
    fn publish(&self, event: PodLifecycleEvent);

    /// The CRI store shows a death's reason other than the one its event told.
    fn corrected(&self, pod: &PodUid, correction: &Correction) {
        let _ = (pod, correction);
    }
}

/// For tests and tools: events land in an unbounded channel (dropped once its receiver is).
impl EventSink for mpsc::UnboundedSender<PodLifecycleEvent> {
    fn publish(&self, event: PodLifecycleEvent) {
        let _ = self.send(event);
    }
}

/// The PLEG's sink: each event counted in the trigger-to-event latency and published on the
/// bus. Never blocks.
#[derive(Clone, Debug)]
pub struct BusSink {
    pub bus: EventBus<PodLifecycleEvent>,
    pub metrics: Metrics,
}

impl EventSink for BusSink {
    fn publish(&self, event: PodLifecycleEvent) {
        self.count(&event);
        self.bus.publish(Arc::new(event));
    }

    /// Counted and said: a consumer that acted on the event's reason acted on another than the
    /// one kubelet will show. The pod's status (and its next sync) carries CRI's.
    fn corrected(&self, pod: &PodUid, correction: &Correction) {
        info!(
            %pod,
            container = %correction.container,
            told = correction.told,
            shown = correction.shown,
            "the CRI store shows another reason for the death than its event told"
        );
        self.metrics.reason_corrected();
    }
}

impl BusSink {
    /// Its trigger-to-event latency (a source saw it), and each container's starts and
    /// terminations, by reason (sandboxes are not counted, as kube-state-metrics does not).
    fn count(&self, event: &PodLifecycleEvent) {
        if event.sources.iter().any(|s| *s != Source::Relist) {
            self.metrics.trigger_to_event(
                event
                    .emitted_at
                    .duration_since(event.observed_at)
                    .unwrap_or_default(),
            );
        }
        if event.container_name.is_empty() {
            return;
        }
        let (namespace, pod, container) = (
            event.pod_namespace.as_str(),
            event.pod_name.as_str(),
            event.container_name.as_str(),
        );
        match event.event_type {
            PodLifecycleEventType::ContainerStarted => {
                self.metrics.container_started(namespace, pod, container);
            }
            PodLifecycleEventType::ContainerDied => {
                let reason = if event.reason.is_empty() {
                    "Unknown"
                } else {
                    &event.reason
                };
                self.metrics
                    .container_terminated(namespace, pod, container, reason);
            }
            PodLifecycleEventType::ContainerRemoved | PodLifecycleEventType::ContainerChanged => {}
        }
    }
}

/// The fan-out of [`Notice`]s, named after the pods the cache knows. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Notices {
    sender: broadcast::Sender<Arc<Notice>>,
    cache: Arc<PodCache>,
}

impl Notices {
    pub fn new(cache: Arc<PodCache>) -> Self {
        Self {
            sender: broadcast::channel(NOTICE_QUEUE).0,
            cache,
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Notice>> {
        self.sender.subscribe()
    }

    /// Tells `observations` of `container`: nothing when no consumer asked, or when none is
    /// shown (a cgroup made says only where to look).
    pub fn tell(
        &self,
        kind: NoticeKind,
        container: &ContainerId,
        observations: &[Observation],
        observed_at: SystemTime,
    ) {
        if self.sender.receiver_count() == 0 || !observations.iter().any(|o| o.kind.is_shown()) {
            return;
        }
        // The pod as last read: a container the runtime has not shown yet has none.
        let named = observations.iter().find_map(|o| match &o.kind {
            ObservationKind::Identity(identity) => identity.pod.as_ref(),
            _ => None,
        });
        let pod = self.cache.holding(named, container);
        let notice = Notice {
            kind,
            pod: pod
                .as_ref()
                .map_or_else(|| PodUid(String::new()), |p| p.uid.clone()),
            pod_namespace: pod
                .as_ref()
                .map(|p| p.namespace.clone())
                .unwrap_or_default(),
            pod_name: pod.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
            container_id: container.clone(),
            container_name: pod
                .as_ref()
                .and_then(|p| p.containers.get(container))
                .map(|c| c.name.clone())
                .unwrap_or_default(),
            observations: observations
                .iter()
                .filter(|o| o.kind.is_shown())
                .cloned()
                .collect(),
            observed_at,
            emitted_at: SystemTime::now(),
        };
        // A consumer that left meanwhile: nothing to do.
        let _ = self.sender.send(Arc::new(notice));
    }
}
