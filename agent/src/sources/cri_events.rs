//! CRI `GetContainerEvents` (the stream kubelet's evented PLEG reads) as a trigger source, for
//! runtimes that implement it (containerd >= 1.7, CRI-O >= 1.26). Detected at start: a runtime
//! answering `Unimplemented` (containerd 1.6) turns the source off with one log line and health
//! says so. Each event becomes a [`Trigger`] for its container; the emitted events still come
//! from the relist's diff, which confirms what the stream said. Like containerd's stream it
//! replays nothing after a disconnect, so every (re)connect schedules a full relist.

use std::{
    path::PathBuf,
    time::{Duration, SystemTime},
};

use k8s_cri::v1::{
    ContainerEventResponse, ContainerEventType, ContainerState, GetEventsRequest, VersionRequest,
    runtime_service_client::RuntimeServiceClient,
};
use tokio_util::sync::CancellationToken;

use crate::{
    pleg::{ContainerId, Observation, ObservationKind, Scope, Source, Trigger, TriggerSender},
    sources::{
        reconnect::{Link, SessionEnd, dial, run_forever, stream_session},
        status::SourceRegistry,
    },
};

/// Where to ask.
#[derive(Clone, Debug)]
pub struct CriEventsConfig {
    /// The CRI runtime's socket.
    pub socket: PathBuf,
    /// Deadline of connecting and of the liveness probe.
    pub timeout: Duration,
}

/// Follows the runtime's container events until `shutdown`, reconnecting forever, or until the
/// runtime says it does not implement them.
pub async fn run(
    config: CriEventsConfig,
    triggers: TriggerSender,
    registry: SourceRegistry,
    shutdown: CancellationToken,
) {
    let link = Link {
        source: Source::CriEvents,
        registry,
        triggers,
        timeout: config.timeout,
    };
    run_forever(link, shutdown, |link| session(&config, link)).await;
}

async fn session(config: &CriEventsConfig, link: Link) -> SessionEnd {
    let channel = match dial(&config.socket, config.timeout).await {
        Ok(channel) => channel,
        Err(end) => return end,
    };
    let mut events = RuntimeServiceClient::new(channel.clone());
    let mut version = RuntimeServiceClient::new(channel);
    let subscribe = events.get_container_events(GetEventsRequest {});
    let probe = async {
        version
            .version(VersionRequest {
                version: "v1".into(),
            })
            .await
            .map(drop)
    };
    // No liveness probe: CRI has no call that puts an event of plegd's own on this stream.
    let silence = std::future::pending();
    stream_session(&link, subscribe, probe, silence, |event| {
        Ok::<_, std::convert::Infallible>(trigger_of(&event, SystemTime::now()))
    })
    .await
}

/// The trigger an event stands for, with the exit code when the event's own status of the
/// container says it exited. `None` for an event without a container id.
pub fn trigger_of(event: &ContainerEventResponse, now: SystemTime) -> Option<Trigger> {
    if event.container_id.is_empty() {
        return None;
    }
    let observed_at = u64::try_from(event.created_at)
        .ok()
        .filter(|nanos| *nanos > 0)
        .map_or(now, |nanos| {
            SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos)
        });
    let stopped = event.container_event_type == ContainerEventType::ContainerStoppedEvent as i32;
    let deleted = event.container_event_type == ContainerEventType::ContainerDeletedEvent as i32;
    let exit = event
        .containers_statuses
        .iter()
        .filter(|status| {
            stopped
                && status.id == event.container_id
                && status.state == ContainerState::ContainerExited as i32
        })
        .map(|status| Observation {
            source: Source::CriEvents,
            kind: ObservationKind::ExitCode(status.exit_code),
        })
        .take(1);
    let deletion = deleted.then_some(Observation {
        source: Source::CriEvents,
        kind: ObservationKind::Deleted,
    });
    Some(Trigger {
        scope: Scope::Container(ContainerId(event.container_id.clone())),
        source: Source::CriEvents,
        observed_at,
        observations: exit.chain(deletion).collect(),
    })
}

#[cfg(test)]
mod tests {
    use k8s_cri::v1::ContainerStatus;

    use super::*;

    fn event(id: &str, kind: ContainerEventType) -> ContainerEventResponse {
        ContainerEventResponse {
            container_id: id.into(),
            container_event_type: kind as i32,
            created_at: 1_500_000_000,
            ..ContainerEventResponse::default()
        }
    }

    #[test]
    fn an_event_triggers_its_container_at_its_time() {
        let trigger = trigger_of(
            &event("c", ContainerEventType::ContainerStartedEvent),
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        assert_eq!(trigger.scope, Scope::Container(ContainerId("c".into())));
        assert_eq!(trigger.source, Source::CriEvents);
        assert_eq!(
            trigger.observed_at,
            SystemTime::UNIX_EPOCH + Duration::from_millis(1_500)
        );
        assert!(trigger.observations.is_empty());
    }

    #[test]
    fn a_stop_carries_the_exit_code_of_its_own_container_status() {
        let mut stopped = event("c", ContainerEventType::ContainerStoppedEvent);
        stopped.containers_statuses = vec![
            ContainerStatus {
                id: "other".into(),
                state: ContainerState::ContainerExited as i32,
                exit_code: 1,
                ..ContainerStatus::default()
            },
            ContainerStatus {
                id: "c".into(),
                state: ContainerState::ContainerExited as i32,
                exit_code: 137,
                ..ContainerStatus::default()
            },
        ];
        let trigger = trigger_of(&stopped, SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(
            trigger.observations,
            [Observation {
                source: Source::CriEvents,
                kind: ObservationKind::ExitCode(137)
            }]
        );
    }

    #[test]
    fn a_deletion_says_so() {
        let trigger = trigger_of(
            &event("c", ContainerEventType::ContainerDeletedEvent),
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        assert_eq!(
            trigger.observations,
            [Observation {
                source: Source::CriEvents,
                kind: ObservationKind::Deleted
            }]
        );
    }

    #[test]
    fn events_without_a_container_or_time_are_handled() {
        assert!(
            trigger_of(
                &event("", ContainerEventType::ContainerCreatedEvent),
                SystemTime::UNIX_EPOCH
            )
            .is_none()
        );
        let mut untimed = event("c", ContainerEventType::ContainerDeletedEvent);
        untimed.created_at = 0;
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(7);
        assert_eq!(trigger_of(&untimed, now).unwrap().observed_at, now);
    }
}
