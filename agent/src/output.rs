//! Events on stdout: one human-readable line, or one JSON object, per event.
//!
//! Each event is completed from the pod cache (written before the event was sent), so a
//! `ContainerDied` line carries the exit code and reason the runtime reported.

use std::time::SystemTime;

use serde::Serialize;

use crate::{
    config::OutputFormat,
    pleg::{
        cache::PodCache,
        event::{ObservationKind, PodLifecycleEvent, TriggerSource},
    },
};

/// One event as printed.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct EventLine {
    pub sequence: u64,
    #[serde(rename = "type")]
    pub event_type: String,
    pub pod_uid: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub container_id: Option<String>,
    pub container_name: String,
    /// RFC 3339, milliseconds.
    pub observed_at: String,
    pub emitted_at: String,
    /// emitted_at - observed_at, in milliseconds.
    pub latency_ms: u64,
    pub sources: Vec<&'static str>,
    /// The runtime's exit code, for exited containers.
    pub exit_code: Option<i32>,
    /// The runtime's reason ("Error", "OOMKilled", "Completed"), for exited containers.
    pub reason: Option<String>,
    pub observations: Vec<String>,
}

impl EventLine {
    pub fn new(event: &PodLifecycleEvent, cache: &PodCache) -> Self {
        let cached = cache.get(&event.pod);
        let container = event.container_id.as_ref().and_then(|id| {
            cached
                .record
                .as_ref()
                .and_then(|pod| pod.containers.get(id))
        });
        let latency = event
            .emitted_at
            .duration_since(event.observed_at)
            .unwrap_or_default();
        Self {
            sequence: event.sequence,
            event_type: format!("{:?}", event.event_type),
            pod_uid: event.pod.0.clone(),
            pod_namespace: event.pod_namespace.clone(),
            pod_name: event.pod_name.clone(),
            container_id: event.container_id.as_ref().map(|c| c.0.clone()),
            container_name: event.container_name.clone(),
            observed_at: rfc3339(event.observed_at),
            emitted_at: rfc3339(event.emitted_at),
            latency_ms: u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
            sources: event.sources.iter().map(|s| source_name(*s)).collect(),
            exit_code: container.and_then(|c| c.exit_code),
            reason: container
                .map(|c| c.reason.clone())
                .filter(|r| !r.is_empty()),
            observations: event
                .observations
                .iter()
                .map(|o| format!("{}:{}", source_name(o.source), observation(&o.kind)))
                .collect(),
        }
    }

    /// The line to print, without the newline.
    pub fn render(&self, format: OutputFormat) -> String {
        match format {
            OutputFormat::Json => {
                serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
            }
            OutputFormat::Text => self.text(),
        }
    }

    fn text(&self) -> String {
        let container = match (&self.container_id, self.container_name.as_str()) {
            (Some(id), "") => format!("sandbox {}", short(id)),
            (Some(id), name) => format!("{name} {}", short(id)),
            (None, _) => "-".to_owned(),
        };
        let mut line = format!(
            "{} #{:<5} {:<17} {}/{} {container} via {} ({}ms)",
            self.emitted_at,
            self.sequence,
            self.event_type,
            self.pod_namespace,
            self.pod_name,
            self.sources.join("+"),
            self.latency_ms,
        );
        if let Some(code) = self.exit_code {
            line.push_str(&format!(" exit={code}"));
        }
        if let Some(reason) = &self.reason {
            line.push_str(&format!(" reason={reason}"));
        }
        for observation in &self.observations {
            line.push_str(&format!(" {observation}"));
        }
        line
    }
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// The lowercase name of a source, as in the API and metrics.
pub fn source_name(source: TriggerSource) -> &'static str {
    match source {
        TriggerSource::Ebpf => "ebpf",
        TriggerSource::Containerd => "containerd",
        TriggerSource::CriEvents => "cri-events",
        TriggerSource::Relist => "relist",
    }
}

fn observation(kind: &ObservationKind) -> String {
    match kind {
        ObservationKind::ExitCode(code) => format!("exit_code={code}"),
        ObservationKind::Signal(signal) => format!("signal={signal}"),
        ObservationKind::OomKilled => "oom_killed".to_owned(),
        ObservationKind::Exec(path) => format!("exec={path}"),
        ObservationKind::Exited => "exited".to_owned(),
        ObservationKind::CgroupRemoved => "cgroup_removed".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::pleg::{
        event::{Observation, PodLifecycleEventType},
        record::{ContainerId, ContainerRecord, ContainerState, PodRecord, PodUid},
    };

    fn died_event() -> PodLifecycleEvent {
        let observed_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        PodLifecycleEvent {
            sequence: 7,
            pod: PodUid("uid-1".into()),
            pod_namespace: "default".into(),
            pod_name: "web".into(),
            container_id: Some(ContainerId("0123456789abcdef".into())),
            container_name: "app".into(),
            event_type: PodLifecycleEventType::ContainerDied,
            observed_at,
            emitted_at: observed_at + Duration::from_millis(42),
            sources: vec![TriggerSource::Ebpf, TriggerSource::Containerd],
            observations: vec![Observation {
                source: TriggerSource::Ebpf,
                kind: ObservationKind::Signal(9),
            }],
        }
    }

    fn cache_with_exit() -> PodCache {
        let cache = PodCache::new();
        let container = ContainerRecord {
            id: ContainerId("0123456789abcdef".into()),
            name: "app".into(),
            attempt: 0,
            image: "busybox".into(),
            state: ContainerState::Exited,
            sandbox: false,
            created_at: None,
            started_at: None,
            finished_at: None,
            exit_code: Some(137),
            reason: "Error".into(),
        };
        let pod = PodRecord {
            uid: PodUid("uid-1".into()),
            namespace: "default".into(),
            name: "web".into(),
            containers: [(container.id.clone(), container)].into(),
        };
        cache.set(pod.uid.clone(), Some(pod), tokio::time::Instant::now());
        cache
    }

    #[test]
    fn text_line_reads_well_and_carries_the_runtime_exit() {
        let line = EventLine::new(&died_event(), &cache_with_exit()).render(OutputFormat::Text);
        assert_eq!(
            line,
            "2027-01-15T08:00:00.042Z #7     ContainerDied     default/web app 0123456789ab via ebpf+containerd (42ms) exit=137 reason=Error ebpf:signal=9"
        );
    }

    #[test]
    fn json_line_has_every_field() {
        let line = EventLine::new(&died_event(), &cache_with_exit()).render(OutputFormat::Json);
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["type"], "ContainerDied");
        assert_eq!(value["sequence"], 7);
        assert_eq!(value["exit_code"], 137);
        assert_eq!(value["latency_ms"], 42);
        assert_eq!(value["sources"], serde_json::json!(["ebpf", "containerd"]));
        assert_eq!(value["observed_at"], "2027-01-15T08:00:00.000Z");
    }

    #[test]
    fn an_event_of_an_uncached_pod_still_prints() {
        let line = EventLine::new(&died_event(), &PodCache::new());
        assert_eq!(line.exit_code, None);
        assert!(line.render(OutputFormat::Text).contains("ContainerDied"));
    }
}
