//! Other agents on the node, as plegd's coexistence tests see them: a CRI `GetContainerEvents`
//! subscriber (kubelet's evented PLEG, Falco's container plugin) and a containerd
//! `Events.Subscribe` subscriber (`ctr events`, monitoring agents), each recording everything
//! it receives; and barriers that say when a subscriber has received everything published
//! before them.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use containerd_client::services::v1::{
    PublishRequest, SubscribeRequest, events_client::EventsClient,
};
use k8s_cri::v1::{GetEventsRequest, runtime_service_client::RuntimeServiceClient};
use prost::Message as _;
use tonic::metadata::AsciiMetadataValue;

use crate::{unix_channel, wait};

/// The containerd namespace of the markers the tests publish: no container lives there, and
/// plegd's subscription (its namespaces' task and container topics) never sees it.
pub const MARKER_NAMESPACE: &str = "plegd-test-marker";
/// The topic of the test's markers.
pub const MARKER_TOPIC: &str = "/plegd-test/marker";

/// One CRI container event as a subscriber received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriEvent {
    pub container_id: String,
    /// `ContainerEventType` as its i32.
    pub kind: i32,
}

/// A `GetContainerEvents` subscriber of its own connection, reading as fast as events come.
pub struct CriSubscriber {
    received: Arc<Mutex<Vec<CriEvent>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CriSubscriber {
    /// Subscribes on `socket` (the call is made in the reading task: containerd answers it
    /// with its first event).
    pub async fn start(socket: &Path) -> anyhow::Result<Self> {
        let channel = unix_channel(socket).await?;
        let received = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&received);
        let task = tokio::spawn(async move {
            let Ok(response) = RuntimeServiceClient::new(channel)
                .get_container_events(GetEventsRequest {})
                .await
            else {
                return;
            };
            let mut stream = response.into_inner();
            while let Ok(Some(event)) = stream.message().await {
                record.lock().expect("events lock").push(CriEvent {
                    container_id: event.container_id,
                    kind: event.container_event_type,
                });
            }
        });
        Ok(Self { received, task })
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<CriEvent> {
        self.received.lock().expect("events lock").clone()
    }

    /// How many of the received events are about one of `ids`.
    pub fn count_for(&self, ids: &[String]) -> usize {
        self.received()
            .iter()
            .filter(|e| ids.contains(&e.container_id))
            .count()
    }

    /// Waits until an event about `id` arrived, at most `timeout`.
    pub async fn wait_for(&self, id: &str, timeout: Duration) -> Result<(), wait::Timeout> {
        wait::until(&format!("a CRI event about {id}"), timeout, || {
            let seen = self.received().iter().any(|e| e.container_id == id);
            async move { anyhow::Ok(seen.then_some(())) }
        })
        .await
    }
}

impl Drop for CriSubscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One containerd event as a subscriber received it.
#[derive(Clone, Debug)]
pub struct Envelope {
    pub namespace: String,
    pub topic: String,
    /// The payload's bytes (ids appear in them as plain strings).
    pub payload: Vec<u8>,
}

impl Envelope {
    /// Whether the payload names `id`.
    pub fn mentions(&self, id: &str) -> bool {
        self.payload
            .windows(id.len())
            .any(|window| window == id.as_bytes())
    }
}

/// An `Events.Subscribe` subscriber of its own connection with `filters` (none: every event),
/// reading as fast as events come.
pub struct EventsSubscriber {
    received: Arc<Mutex<Vec<Envelope>>>,
    task: tokio::task::JoinHandle<()>,
    socket: std::path::PathBuf,
}

impl EventsSubscriber {
    /// Subscribes on `socket` and waits until the subscription is registered (a marker
    /// published after it came back).
    pub async fn start(socket: &Path, filters: Vec<String>) -> anyhow::Result<Self> {
        let channel = unix_channel(socket).await?;
        let received = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&received);
        let task = tokio::spawn(async move {
            let Ok(response) = EventsClient::new(channel)
                .subscribe(SubscribeRequest { filters })
                .await
            else {
                return;
            };
            let mut stream = response.into_inner();
            while let Ok(Some(envelope)) = stream.message().await {
                record.lock().expect("events lock").push(Envelope {
                    namespace: envelope.namespace,
                    topic: envelope.topic,
                    payload: envelope.event.map(|any| any.value).unwrap_or_default(),
                });
            }
        });
        let subscriber = Self {
            received,
            task,
            socket: socket.to_owned(),
        };
        // A marker published before containerd registered the subscription never arrives:
        // publish until one does.
        let mut registered = false;
        for attempt in 0..50 {
            let marker = format!("subscribed-{attempt}");
            publish_marker(socket, &marker).await?;
            if subscriber
                .wait_marker(&marker, Duration::from_millis(200))
                .await
                .is_ok()
            {
                registered = true;
                break;
            }
        }
        anyhow::ensure!(registered, "the Events subscription never saw a marker");
        Ok(subscriber)
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Envelope> {
        self.received.lock().expect("events lock").clone()
    }

    /// The received events that name one of `ids`, counted by topic.
    pub fn topics_for(&self, ids: &[String]) -> BTreeMap<String, usize> {
        let mut topics = BTreeMap::new();
        for envelope in self.received() {
            if ids.iter().any(|id| envelope.mentions(id)) {
                *topics.entry(envelope.topic).or_default() += 1;
            }
        }
        topics
    }

    /// Publishes a marker and waits until it came back: every event containerd published
    /// before it has then been received (its exchange delivers in order to each subscriber).
    pub async fn barrier(&self, name: &str, timeout: Duration) -> anyhow::Result<()> {
        publish_marker(&self.socket, name).await?;
        self.wait_marker(name, timeout)
            .await
            .with_context(|| format!("marker {name}"))
    }

    async fn wait_marker(&self, name: &str, timeout: Duration) -> Result<(), wait::Timeout> {
        wait::until(&format!("marker {name}"), timeout, || {
            let seen = self
                .received()
                .iter()
                .any(|e| e.topic == MARKER_TOPIC && e.mentions(name));
            async move { anyhow::Ok(seen.then_some(())) }
        })
        .await
    }
}

impl Drop for EventsSubscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Publishes a marker event named `name` on containerd's exchange, in [`MARKER_NAMESPACE`].
pub async fn publish_marker(socket: &Path, name: &str) -> anyhow::Result<()> {
    let mut events = EventsClient::new(unix_channel(socket).await?);
    let mut request = tonic::Request::new(PublishRequest {
        topic: MARKER_TOPIC.to_owned(),
        event: Some(prost_types::Any {
            type_url: "types.googleapis.com/google.protobuf.StringValue".to_owned(),
            value: name.to_owned().encode_to_vec(),
        }),
    });
    request.metadata_mut().insert(
        "containerd-namespace",
        AsciiMetadataValue::from_static(MARKER_NAMESPACE),
    );
    events
        .publish(request)
        .await
        .context("publishing a marker")?;
    Ok(())
}
