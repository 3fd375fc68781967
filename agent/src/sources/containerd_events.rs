//! containerd's event stream (`Events.Subscribe`) as a trigger source: task and container
//! lifecycle events of the namespaces in use become [`Trigger`]s for the relist scheduler, the
//! same path as the kernel's, carrying what the event knows (exit status, OOM) as
//! observations. The stream replays nothing across a disconnect, so every (re)connect is
//! followed by a full relist (see [`crate::sources::reconnect`]).
//!
//! A connected stream can also fall silent (containerd's event exchange stuck, a half-dead
//! connection): nothing tells an idle stream from a dead one, so plegd publishes a heartbeat of
//! its own every [`ContainerdEventsConfig::heartbeat`] on containerd's Events service, in a
//! namespace no container lives in, and expects it back on its subscription before the next is
//! due. One that is not back declares the stream silent: the session ends as lost, the source
//! reconnects (relists run at the fast period while it is not connected) and the reconnect's
//! full relist finds what the silence hid. Detection takes at most two heartbeat periods.
//!
//! Exec processes share the `/tasks/exit` topic with a container's init process; an exec's
//! exit (its `id` is the exec id, not the container id) says nothing about the container and
//! is ignored.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use containerd_client::{
    events::{
        ContainerCreate, ContainerDelete, ContainerUpdate, TaskCreate, TaskDelete, TaskExit,
        TaskOom, TaskPaused, TaskResumed, TaskStart,
    },
    services::v1::{
        PublishRequest, SubscribeRequest, events_client::EventsClient,
        version_client::VersionClient,
    },
    types::Envelope,
};
use prost::Message;
use tokio_util::sync::CancellationToken;
use tonic::{Code, metadata::AsciiMetadataValue, transport::Channel};
use tracing::{debug, info};

use crate::{
    pleg::{ContainerId, ObservationKind, Source, Trigger, TriggerSender},
    sources::{
        reconnect::{Link, SessionEnd, SessionError, dial, run_forever, stream_session},
        status::SourceRegistry,
    },
};

/// The topics that say a container's lifecycle may have changed.
pub const TOPICS: [&str; 5] = [
    "/tasks/start",
    "/tasks/exit",
    "/tasks/oom",
    "/tasks/delete",
    "/containers/delete",
];

/// The topics that say only that a container exists: subscribed to only where a created
/// container is news ([`ContainerdEventsConfig::presence`]); otherwise containerd need not
/// send them, two per container.
pub const PRESENCE_TOPICS: [&str; 5] = [
    "/tasks/create",
    "/tasks/paused",
    "/tasks/resumed",
    "/containers/create",
    "/containers/update",
];

/// Default period of the heartbeat (`--event-heartbeat`).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);
/// The containerd namespace of plegd's heartbeats: no container lives there.
pub const HEARTBEAT_NAMESPACE: &str = "plegd";
/// The topic of plegd's heartbeats.
pub const HEARTBEAT_TOPIC: &str = "/plegd/heartbeat";
/// The type of a heartbeat's payload: a string naming the session and the beat.
const HEARTBEAT_TYPE: &str = "types.googleapis.com/google.protobuf.StringValue";

/// Where to subscribe.
#[derive(Clone, Debug)]
pub struct ContainerdEventsConfig {
    /// containerd's socket.
    pub socket: PathBuf,
    /// The namespaces whose events matter.
    pub namespaces: Vec<String>,
    /// Deadline of connecting and of the liveness probe.
    pub timeout: Duration,
    /// Period of the heartbeat, and how long each has to come back; zero: no heartbeat.
    pub heartbeat: Duration,
    /// Whether a container's presence alone is news (`--emit-changed`).
    pub presence: bool,
}

impl ContainerdEventsConfig {
    /// Subscribe filters: one per (namespace, topic), ORed by containerd, and the heartbeat's.
    pub fn filters(&self) -> Vec<String> {
        let presence = PRESENCE_TOPICS.iter().filter(|_| self.presence);
        let topics: Vec<&str> = TOPICS.iter().chain(presence).copied().collect();
        self.namespaces
            .iter()
            .flat_map(|ns| {
                topics
                    .iter()
                    .map(move |topic| format!("namespace=={ns:?},topic=={topic:?}"))
            })
            .chain([format!(
                "namespace=={HEARTBEAT_NAMESPACE:?},topic=={HEARTBEAT_TOPIC:?}"
            )])
            .collect()
    }
}

/// An event whose payload does not decode as its topic says.
#[derive(Debug, thiserror::Error)]
#[error("containerd event {topic}: {source}")]
pub struct DecodeError {
    topic: String,
    #[source]
    source: prost::DecodeError,
}

/// Follows containerd's events until `shutdown`, reconnecting forever (or until containerd
/// says it has no event service).
pub async fn run(
    config: ContainerdEventsConfig,
    triggers: TriggerSender,
    registry: SourceRegistry,
    shutdown: CancellationToken,
) {
    let link = Link {
        source: Source::Containerd,
        registry,
        triggers,
        timeout: config.timeout,
    };
    run_forever(link, shutdown, |link| session(&config, link)).await;
}

async fn session(config: &ContainerdEventsConfig, link: Link) -> SessionEnd {
    let channel = match dial(&config.socket, config.timeout).await {
        Ok(channel) => channel,
        Err(end) => return end,
    };
    let mut events = EventsClient::new(channel.clone());
    let mut version = VersionClient::new(channel.clone());
    let subscribe = events.subscribe(SubscribeRequest {
        filters: config.filters(),
    });
    let probe = async { version.version(()).await.map(drop) };
    let beats =
        Heartbeats::new(getrandom::u64().unwrap_or_else(|_| crate::base::backoff::time_seed()));
    let silence = beats
        .clone()
        .send(EventsClient::new(channel), config.heartbeat, config.timeout);
    stream_session(&link, subscribe, probe, silence, |envelope| {
        if beats.came_back(&envelope) {
            return Ok(None);
        }
        trigger_of(&envelope, SystemTime::now())
    })
    .await
}

/// The heartbeats of one session: how many were published and which came back.
#[derive(Clone, Debug)]
struct Heartbeats {
    /// Tells this session's beats from another plegd's (or an earlier session's) on the same
    /// containerd.
    session: u64,
    published: Arc<AtomicU64>,
    /// The highest beat that came back.
    back: Arc<AtomicU64>,
}

impl Heartbeats {
    fn new(session: u64) -> Self {
        Self {
            session,
            published: Arc::default(),
            back: Arc::default(),
        }
    }

    /// The next beat's payload.
    fn next(&self) -> String {
        let beat = self.published.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{:016x}/{beat}", self.session)
    }

    /// Whether every published beat came back.
    fn all_back(&self) -> bool {
        self.back.load(Ordering::Relaxed) >= self.published.load(Ordering::Relaxed)
    }

    /// Whether `envelope` is a heartbeat (it is no trigger then); records it if it is this
    /// session's.
    fn came_back(&self, envelope: &Envelope) -> bool {
        if envelope.topic != HEARTBEAT_TOPIC {
            return false;
        }
        let text = envelope
            .event
            .as_ref()
            .and_then(|any| String::decode(any.value.as_slice()).ok())
            .unwrap_or_default();
        let beat = text
            .split_once('/')
            .filter(|(session, _)| *session == format!("{:016x}", self.session))
            .and_then(|(_, beat)| beat.parse::<u64>().ok());
        if let Some(beat) = beat {
            self.back.fetch_max(beat, Ordering::Relaxed);
        }
        true
    }

    /// Publishes a beat every `period` through `events`; resolves when one did not come back
    /// before the next was due. A publish that fails for lack of an answer counts as not
    /// back; one that containerd refuses (see [`refused`]) turns the heartbeat off for this
    /// session.
    async fn send(
        self,
        mut events: EventsClient<Channel>,
        period: Duration,
        timeout: Duration,
    ) -> SessionError {
        // `--event-heartbeat 0`: nothing published, the stream is never declared silent.
        if period.is_zero() {
            return std::future::pending().await;
        }
        // The first beat a period after the stream is up: one published before containerd
        // registered the subscription would never come back.
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !self.all_back() {
                return SessionError::Silent(period);
            }
            let mut request = tonic::Request::new(PublishRequest {
                topic: HEARTBEAT_TOPIC.to_owned(),
                event: Some(prost_types::Any {
                    type_url: HEARTBEAT_TYPE.to_owned(),
                    value: self.next().encode_to_vec(),
                }),
            });
            request.metadata_mut().insert(
                "containerd-namespace",
                AsciiMetadataValue::from_static(HEARTBEAT_NAMESPACE),
            );
            // A beat must be back before the next is due anyway: a publish that does not
            // answer within a period (a silent connection) must not hold up that verdict for
            // the whole runtime call deadline.
            let deadline = timeout.min(period);
            match tokio::time::timeout(deadline, events.publish(request)).await {
                Ok(Ok(_)) => {}
                Err(_) => debug!(?deadline, "the heartbeat's publish did not return"),
                Ok(Err(status)) if refused(status.code()) => {
                    info!(
                        code = ?status.code(),
                        "event stream heartbeat off (the runtime refuses to publish it: {}); a silent stream is found by the full relists only",
                        status.message()
                    );
                    return std::future::pending().await;
                }
                Ok(Err(status)) => debug!(%status, "the heartbeat's publish failed"),
            }
        }
    }
}

/// Whether a publish failed because the runtime will not take it (rather than for lack of an
/// answer): sending more would not help.
fn refused(code: Code) -> bool {
    matches!(
        code,
        Code::Unimplemented
            | Code::InvalidArgument
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::Unauthenticated
    )
}

/// The trigger an event stands for; `None` for events that say nothing about a container's
/// lifecycle (an exec's exit, other topics).
pub fn trigger_of(envelope: &Envelope, now: SystemTime) -> Result<Option<Trigger>, DecodeError> {
    let payload = envelope
        .event
        .as_ref()
        .map_or(&[][..], |any| any.value.as_slice());
    let published = envelope
        .timestamp
        .and_then(|t| SystemTime::try_from(t).ok())
        .unwrap_or(now);
    let said = match envelope.topic.strip_prefix("/tasks/") {
        Some(task) => task_event(task, payload, published),
        None => container_event(&envelope.topic, payload, published),
    }
    .map_err(|source| DecodeError {
        topic: envelope.topic.clone(),
        source,
    })?;
    let Some(Said {
        container,
        kind,
        at,
    }) = said.filter(|said| !said.container.is_empty())
    else {
        return Ok(None);
    };
    Ok(Some(Trigger::about(
        ContainerId(container),
        Source::Containerd,
        at,
        [kind],
    )))
}

/// What one event says of its container: which, what, and when.
struct Said {
    container: String,
    kind: ObservationKind,
    at: SystemTime,
}

impl Said {
    fn at(container: String, kind: ObservationKind, at: SystemTime) -> Option<Self> {
        Some(Self {
            container,
            kind,
            at,
        })
    }
}

/// What a `/tasks/<task>` event published at `published` says.
fn task_event(
    task: &str,
    payload: &[u8],
    published: SystemTime,
) -> Result<Option<Said>, prost::DecodeError> {
    let said = |container, kind| Ok(Said::at(container, kind, published));
    match task {
        "exit" => {
            let exit = TaskExit::decode(payload)?;
            if is_exec(&exit.id, &exit.container_id) {
                return Ok(None);
            }
            let at = exit
                .exited_at
                .and_then(|t| SystemTime::try_from(t).ok())
                .unwrap_or(published);
            let code = exit.exit_status as i32;
            Ok(Said::at(
                exit.container_id,
                ObservationKind::TaskExited { code, at },
                at,
            ))
        }
        "oom" => said(
            TaskOom::decode(payload)?.container_id,
            ObservationKind::OomKilled,
        ),
        "delete" => {
            let delete = TaskDelete::decode(payload)?;
            if is_exec(&delete.id, &delete.container_id) {
                return Ok(None);
            }
            said(delete.container_id, ObservationKind::TaskDeleted)
        }
        "create" => said(
            TaskCreate::decode(payload)?.container_id,
            ObservationKind::Present,
        ),
        // Only a container's init is started as a task; execs publish /tasks/exec-started.
        "start" => {
            let start = TaskStart::decode(payload)?;
            let pid = start.pid;
            said(
                start.container_id,
                ObservationKind::TaskStarted { at: published, pid },
            )
        }
        "paused" => said(
            TaskPaused::decode(payload)?.container_id,
            ObservationKind::Present,
        ),
        "resumed" => said(
            TaskResumed::decode(payload)?.container_id,
            ObservationKind::Present,
        ),
        _ => Ok(None),
    }
}

/// What a `/containers/*` event (`topic`) published at `published` says.
fn container_event(
    topic: &str,
    payload: &[u8],
    published: SystemTime,
) -> Result<Option<Said>, prost::DecodeError> {
    let (container, kind) = match topic {
        "/containers/create" => (
            ContainerCreate::decode(payload)?.id,
            ObservationKind::Present,
        ),
        "/containers/update" => (
            ContainerUpdate::decode(payload)?.id,
            ObservationKind::Present,
        ),
        "/containers/delete" => (
            ContainerDelete::decode(payload)?.id,
            ObservationKind::Deleted,
        ),
        _ => return Ok(None),
    };
    Ok(Said::at(container, kind, published))
}

/// One containerd event through the decoder of its stream: the fuzz target's entry point, not
/// an API. The first byte picks a topic (or, past the topics, decodes the rest as a whole
/// envelope); the rest is the event's payload.
#[doc(hidden)]
pub fn fuzz_containerd_event(data: &[u8]) -> Option<Trigger> {
    let (&pick, rest) = data.split_first()?;
    let envelope = match TOPICS.get(usize::from(pick)) {
        Some(topic) => Envelope {
            topic: (*topic).to_owned(),
            event: Some(prost_types::Any {
                type_url: String::new(),
                value: rest.to_vec(),
            }),
            ..Envelope::default()
        },
        None => Envelope::decode(rest).ok()?,
    };
    trigger_of(&envelope, SystemTime::UNIX_EPOCH).ok().flatten()
}

/// Whether a task event is about an exec process rather than the container's init process
/// (whose process id is the container id).
fn is_exec(process_id: &str, container_id: &str) -> bool {
    !process_id.is_empty() && process_id != container_id
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prost_types::{Any, Timestamp};

    use super::*;
    use crate::pleg::{Observation, Scope};

    fn envelope(topic: &str, type_url: &str, payload: &impl Message) -> Envelope {
        Envelope {
            timestamp: Some(Timestamp {
                seconds: 1_000,
                nanos: 0,
            }),
            namespace: "k8s.io".into(),
            topic: topic.into(),
            event: Some(Any {
                type_url: type_url.into(),
                value: payload.encode_to_vec(),
            }),
        }
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn an_exit_carries_its_status_and_time() {
        let exit = TaskExit {
            container_id: "c1".into(),
            id: "c1".into(),
            pid: 42,
            exit_status: 137,
            exited_at: Some(Timestamp {
                seconds: 999,
                nanos: 0,
            }),
        };
        let trigger = trigger_of(
            &envelope("/tasks/exit", "containerd.events.TaskExit", &exit),
            at(2_000),
        )
        .unwrap()
        .unwrap();
        assert_eq!(trigger.scope, Scope::Container(ContainerId("c1".into())));
        assert_eq!(trigger.source, Source::Containerd);
        assert_eq!(trigger.observed_at, at(999));
        assert_eq!(
            trigger.observations,
            [Observation {
                source: Source::Containerd,
                kind: ObservationKind::TaskExited {
                    code: 137,
                    at: at(999)
                }
            }]
        );
    }

    #[test]
    fn a_start_is_the_task_services_record_of_it() {
        let start = TaskStart {
            container_id: "c1".into(),
            pid: 42,
        };
        let mut envelope = envelope("/tasks/start", "containerd.events.TaskStart", &start);
        envelope.timestamp = Some(Timestamp {
            seconds: 5,
            nanos: 0,
        });
        let trigger = trigger_of(&envelope, at(2_000)).unwrap().unwrap();
        assert_eq!(trigger.observed_at, at(5));
        assert_eq!(
            trigger.observations,
            [Observation {
                source: Source::Containerd,
                kind: ObservationKind::TaskStarted { at: at(5), pid: 42 }
            }]
        );
    }

    #[test]
    fn an_exec_exit_is_not_the_containers() {
        let exit = TaskExit {
            container_id: "c1".into(),
            id: "exec-7".into(),
            pid: 43,
            exit_status: 5,
            exited_at: None,
        };
        assert_eq!(
            trigger_of(
                &envelope("/tasks/exit", "/containerd.events.TaskExit", &exit),
                at(1)
            )
            .unwrap(),
            None
        );
        let delete = TaskDelete {
            container_id: "c1".into(),
            id: "exec-7".into(),
            ..TaskDelete::default()
        };
        assert_eq!(
            trigger_of(&envelope("/tasks/delete", "", &delete), at(1)).unwrap(),
            None
        );
    }

    #[test]
    fn lifecycle_topics_say_the_container_is_there_or_its_task_gone() {
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "/tasks/create",
                TaskCreate {
                    container_id: "c".into(),
                    ..TaskCreate::default()
                }
                .encode_to_vec(),
            ),
            (
                "/tasks/delete",
                TaskDelete {
                    container_id: "c".into(),
                    ..TaskDelete::default()
                }
                .encode_to_vec(),
            ),
            (
                "/tasks/paused",
                TaskPaused {
                    container_id: "c".into(),
                }
                .encode_to_vec(),
            ),
            (
                "/tasks/resumed",
                TaskResumed {
                    container_id: "c".into(),
                }
                .encode_to_vec(),
            ),
            (
                "/containers/create",
                ContainerCreate {
                    id: "c".into(),
                    ..ContainerCreate::default()
                }
                .encode_to_vec(),
            ),
            (
                "/containers/update",
                ContainerUpdate {
                    id: "c".into(),
                    ..ContainerUpdate::default()
                }
                .encode_to_vec(),
            ),
        ];
        for (topic, value) in cases {
            let mut env = envelope(topic, "", &TaskOom::default());
            env.event.as_mut().unwrap().value = value;
            let trigger = trigger_of(&env, at(5)).unwrap().unwrap();
            assert_eq!(
                trigger.scope,
                Scope::Container(ContainerId("c".into())),
                "{topic}"
            );
            let said = if topic == "/tasks/delete" {
                ObservationKind::TaskDeleted
            } else {
                ObservationKind::Present
            };
            assert_eq!(
                trigger.observations,
                [Observation {
                    source: Source::Containerd,
                    kind: said
                }],
                "{topic}"
            );
            assert_eq!(trigger.observed_at, at(1_000), "{topic}");
        }
    }

    #[test]
    fn a_deletion_is_observed() {
        let mut env = envelope("/containers/delete", "", &TaskOom::default());
        env.event.as_mut().unwrap().value = ContainerDelete { id: "c".into() }.encode_to_vec();
        let trigger = trigger_of(&env, at(5)).unwrap().unwrap();
        assert_eq!(trigger.scope, Scope::Container(ContainerId("c".into())));
        assert_eq!(
            trigger.observations,
            [Observation {
                source: Source::Containerd,
                kind: ObservationKind::Deleted
            }]
        );
    }

    #[test]
    fn an_oom_is_observed() {
        let oom = TaskOom {
            container_id: "c".into(),
        };
        let trigger = trigger_of(&envelope("/tasks/oom", "", &oom), at(1))
            .unwrap()
            .unwrap();
        assert_eq!(trigger.observations[0].kind, ObservationKind::OomKilled);
    }

    #[test]
    fn other_topics_are_ignored_and_garbage_is_an_error() {
        let oom = TaskOom {
            container_id: "c".into(),
        };
        assert_eq!(
            trigger_of(&envelope("/images/create", "", &oom), at(1)).unwrap(),
            None
        );
        let mut bad = envelope("/tasks/exit", "", &oom);
        bad.event.as_mut().unwrap().value = vec![0xff, 0xff, 0xff];
        let err = trigger_of(&bad, at(1)).unwrap_err();
        assert!(err.to_string().contains("/tasks/exit"), "{err}");
    }

    #[test]
    fn filters_cover_every_topic_of_every_namespace() {
        let mut config = ContainerdEventsConfig {
            socket: PathBuf::new(),
            namespaces: vec!["k8s.io".into(), "other".into()],
            timeout: Duration::from_secs(1),
            heartbeat: DEFAULT_HEARTBEAT,
            presence: false,
        };
        let filters = config.filters();
        assert_eq!(filters.len(), 11);
        assert_eq!(filters[0], r#"namespace=="k8s.io",topic=="/tasks/start""#);
        assert!(filters.contains(&r#"namespace=="other",topic=="/containers/delete""#.to_owned()));
        assert!(!filters.iter().any(|f| f.contains("/containers/create")));
        assert_eq!(
            filters[10],
            r#"namespace=="plegd",topic=="/plegd/heartbeat""#
        );
        config.presence = true;
        let filters = config.filters();
        assert_eq!(filters.len(), 21);
        assert!(filters.contains(&r#"namespace=="other",topic=="/containers/create""#.to_owned()));
    }

    fn beat(payload: &str) -> Envelope {
        let mut beat = envelope(HEARTBEAT_TOPIC, HEARTBEAT_TYPE, &payload.to_owned());
        beat.namespace = HEARTBEAT_NAMESPACE.into();
        beat
    }

    #[test]
    fn only_this_sessions_beats_count_and_none_is_a_trigger() {
        let beats = Heartbeats::new(7);
        assert!(beats.all_back(), "nothing published yet");
        let first = beats.next();
        assert!(!beats.all_back());
        // Another session's beat, and garbage, are heartbeats but not this one's.
        assert!(beats.came_back(&beat(&format!("{:016x}/1", 8))));
        assert!(beats.came_back(&beat("nonsense")));
        assert!(!beats.all_back());
        assert!(beats.came_back(&beat(&first)));
        assert!(beats.all_back());
        // A late older beat does not hide a missing newer one.
        let _second = beats.next();
        assert!(beats.came_back(&beat(&first)));
        assert!(!beats.all_back());
        assert!(!beats.came_back(&envelope("/tasks/exit", "", &TaskOom::default())));
    }
}
