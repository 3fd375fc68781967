//! The kernel's observations, streamed ahead of their confirmation to watchers that ask for
//! them (`include_kernel_observations`): never PLEG events, never numbered, best effort.

use std::{sync::Arc, time::SystemTime};

use plegd_proto::v1 as pb;
use tokio::sync::broadcast;

use crate::{
    api::convert,
    pleg::{
        cache::PodCache,
        event::{Observation, Scope, Trigger, TriggerSource},
        record::{ContainerId, PodUid},
        sink::ObservationSink,
    },
};

/// Kernel observations not yet read by the slowest watcher that asked for them; past that, a
/// watcher skips the oldest (observations are a preview: the PLEG events that confirm them
/// are never skipped).
pub const OBSERVATION_QUEUE: usize = 1024;

/// The fan-out of kernel observations to watchers. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ObservationBus {
    sender: broadcast::Sender<Arc<pb::Event>>,
    cache: Arc<PodCache>,
    run_id: u64,
}

impl ObservationBus {
    /// Observations named after the pods `cache` knows, in run `run_id`.
    pub fn new(cache: Arc<PodCache>, run_id: u64) -> Self {
        Self {
            sender: broadcast::channel(OBSERVATION_QUEUE).0,
            cache,
            run_id,
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<pb::Event>> {
        self.sender.subscribe()
    }

    fn send(
        &self,
        kind: pb::EventType,
        container: &ContainerId,
        observations: &[Observation],
        at: SystemTime,
    ) {
        // No watcher asked, or nothing a consumer would see (a cgroup made: only where to look).
        if self.sender.receiver_count() == 0 || !observations.iter().any(|o| o.kind.is_shown()) {
            return;
        }
        // The pod as last read: a container the runtime has not shown yet has none.
        let (pod_uid, pod_namespace, pod_name, container_name) = self
            .cache
            .pods()
            .into_iter()
            .find_map(|(uid, cached)| {
                let pod = cached.record?;
                let name = pod.containers.get(container)?.name.clone();
                Some((uid, pod.namespace.clone(), pod.name.clone(), name))
            })
            .unwrap_or((
                PodUid(String::new()),
                String::new(),
                String::new(),
                String::new(),
            ));
        let event = pb::Event {
            sequence: 0,
            pod_uid: pod_uid.0,
            pod_namespace,
            pod_name,
            container_id: container.0.clone(),
            container_name,
            r#type: kind as i32,
            observed_at: Some(convert::timestamp(at)),
            emitted_at: Some(convert::timestamp(SystemTime::now())),
            sources: vec![convert::source(TriggerSource::Ebpf) as i32],
            observations: observations
                .iter()
                .filter_map(convert::observation)
                .collect(),
            run_id: self.run_id,
            ..pb::Event::default()
        };
        // A watcher that left meanwhile: nothing to do.
        let _ = self.sender.send(Arc::new(event));
    }
}

impl ObservationSink for ObservationBus {
    fn ahead(&self, trigger: &Trigger) {
        if let Scope::Container(container) = &trigger.scope {
            self.send(
                pb::EventType::KernelObservation,
                container,
                &trigger.observations,
                trigger.observed_at,
            );
        }
    }

    fn unconfirmed(&self, container: &ContainerId, observations: &[Observation]) {
        self.send(
            pb::EventType::ObservationUnconfirmed,
            container,
            observations,
            SystemTime::now(),
        );
    }
}
