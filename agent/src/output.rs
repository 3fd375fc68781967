//! Events on stdout: one human-readable line, or one JSON object, per event.
//!
//! stdout is one of the event bus's subscribers: it never delays the relist or the API's
//! watchers. Events carry the runtime's exit code and reason as cached when they were
//! published, so a `ContainerDied` line says how the container ended.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncWrite, AsyncWriteExt as _};
use tracing::warn;

use crate::{
    base::bus::{Followed, Follower},
    pleg::{Observation, ObservationKind, OomKill, PodLifecycleEvent},
};

/// How events are written to stdout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    /// For people: a line per event, or a table.
    #[default]
    Text,
    /// For scripts: a JSON object per line (per event, or the whole listing or report).
    Json,
}

/// One event as printed.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct EventLine {
    pub sequence: u64,
    #[serde(rename = "type")]
    pub event_type: &'static str,
    pub pod_uid: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub container_id: Option<String>,
    pub container_name: String,
    pub observed_at: Stamp,
    pub emitted_at: Stamp,
    /// emitted_at - observed_at, in milliseconds.
    pub latency_ms: u64,
    pub sources: Vec<&'static str>,
    /// The runtime's exit code, for exited containers.
    pub exit_code: Option<i32>,
    /// The runtime's reason ("Error", "OOMKilled", "Completed"), for exited containers.
    pub reason: Option<String>,
    /// Which of the runtime's stores confirmed the state: "task" or "cri".
    pub confirmed_by: Option<&'static str>,
    /// The signal that ended the container's init, on a death.
    pub signal: Option<i32>,
    pub image: String,
    pub attempt: u32,
    /// Who the container is on the host, once known (`null` fields: not known).
    pub cgroup_id: Option<u64>,
    pub cgroup_path: Option<String>,
    pub init_pid: Option<u32>,
    /// The pod's labels and annotations plegd keeps (`--pod-labels`, `--pod-annotations`).
    pub pod_labels: BTreeMap<String, String>,
    pub pod_annotations: BTreeMap<String, String>,
    pub observations: Vec<String>,
    /// The kernel's account of the OOM kill the event tells of (`null`: none): which limit
    /// (`scope`, `cgroup`, `limit_bytes`) and which process (`victim_pid`, `victim_comm`,
    /// `victim_init`).
    pub oom: Option<Arc<OomKill>>,
}

/// The kernel's account of an OOM kill among `observations`, if one is there.
pub fn oom_kill(observations: &[Observation]) -> Option<Arc<OomKill>> {
    observations.iter().find_map(|o| match &o.kind {
        ObservationKind::OomKill(kill) => Some(Arc::clone(kill)),
        _ => None,
    })
}

impl EventLine {
    pub fn new(event: &PodLifecycleEvent) -> Self {
        let (observed, emitted) = (Some(event.observed_at), Some(event.emitted_at));
        Self {
            sequence: event.sequence,
            event_type: event.event_type.name(),
            pod_uid: event.pod.0.clone(),
            pod_namespace: event.pod_namespace.clone(),
            pod_name: event.pod_name.clone(),
            container_id: Some(event.container_id.0.clone()).filter(|id| !id.is_empty()),
            container_name: event.container_name.clone(),
            observed_at: Stamp(observed),
            emitted_at: Stamp(emitted),
            latency_ms: latency_ms(observed, emitted),
            sources: event.sources.iter().map(|s| s.name()).collect(),
            exit_code: event.exit_code,
            reason: Some(event.reason.clone()).filter(|r| !r.is_empty()),
            confirmed_by: event.confirmed_by.map(|store| store.name()),
            signal: event.signal,
            image: event.image.clone(),
            attempt: event.attempt,
            cgroup_id: event.host.as_ref().and_then(|h| h.cgroup_id),
            cgroup_path: event.host.as_ref().and_then(|h| h.cgroup_path.clone()),
            init_pid: event.host.as_ref().and_then(|h| h.init_pid),
            pod_labels: event.pod_labels.clone(),
            pod_annotations: event.pod_annotations.clone(),
            observations: event
                .observations
                .iter()
                .filter(|o| o.kind.is_shown())
                .map(ToString::to_string)
                .collect(),
            oom: oom_kill(&event.observations),
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
        format!(
            "{} #{:<5} {:<17} {}",
            self.emitted_at,
            self.sequence,
            self.event_type,
            self.details()
        )
    }

    /// The event in a line, without its time and sequence (which a log record carries apart).
    pub fn summary(&self) -> String {
        format!("{} {}", self.event_type, self.details())
    }

    /// Whose event it is, through what, and how the container ended.
    fn details(&self) -> String {
        let container = match (&self.container_id, self.container_name.as_str()) {
            (Some(id), "") => format!("sandbox {}", short(id)),
            (Some(id), name) => format!("{name} {}", short(id)),
            (None, _) => "-".to_owned(),
        };
        let mut line = format!(
            "{}/{} {container} via {} ({}ms)",
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
        // The CRI layer is the usual confirmation, not worth a word on every line.
        if self.confirmed_by == Some("task") {
            line.push_str(" confirmed_by=task");
        }
        for observation in &self.observations {
            line.push_str(&format!(" {observation}"));
        }
        line
    }
}

/// Writes the events `events` follows to `out`, a line each, until the bus closes, then
/// flushes; returns the first write error. A writer that falls a whole queue behind (a pipe
/// nobody reads fast enough) catches up from the bus's history; what the history no longer
/// holds is skipped with a warning. Nothing here can delay the publisher.
pub async fn write_events<W: AsyncWrite + Unpin>(
    mut events: Follower<PodLifecycleEvent>,
    mut out: W,
    format: OutputFormat,
) -> std::io::Result<()> {
    while let Some(followed) = events.next().await {
        match followed {
            Followed::Event(event) => {
                let mut line = EventLine::new(&event).render(format);
                line.push('\n');
                // Not flushed here: tokio's stdout hands each write to a blocking thread at once
                // and std's stdout writes a whole line through, so a consumer piping stdout
                // sees each event as it happens; waiting for that thread to finish woke the
                // runtime once more per event (churn bench: a tenth of plegd's CPU went to
                // stdout). The next write, or the end, waits for it.
                out.write_all(line.as_bytes()).await?;
            }
            Followed::Skipped(skipped) => warn!(
                skipped = skipped.count(),
                first = skipped.from,
                "stdout fell behind past the event history; going on from the oldest event kept"
            ),
        }
    }
    out.flush().await
}

/// The first 12 characters of a container id.
pub(crate) fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// An event's time as printed: RFC 3339 in UTC, `-` when unknown; to the microsecond in JSON,
/// which consumers time plegd with (a delivery takes about a millisecond), and to the
/// millisecond in text, which people read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp(pub Option<SystemTime>);

impl Serialize for Stamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(t) => serializer.collect_str(&humantime::format_rfc3339_micros(t)),
            None => serializer.serialize_str("-"),
        }
    }
}

impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(t) => f.pad(&humantime::format_rfc3339_millis(t).to_string()),
            None => f.pad("-"),
        }
    }
}

/// `emitted - observed` in whole milliseconds.
pub(crate) fn latency_ms(observed: Option<SystemTime>, emitted: Option<SystemTime>) -> u64 {
    let latency = match (observed, emitted) {
        (Some(o), Some(e)) => e.duration_since(o).unwrap_or_default(),
        _ => Duration::ZERO,
    };
    u64::try_from(latency.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;
    use crate::{
        base::bus::EventBus,
        pleg::{ContainerId, PodUid, Store},
    };

    fn died_event() -> PodLifecycleEvent {
        let observed_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        PodLifecycleEvent {
            sequence: 7,
            pod: PodUid("uid-1".into()),
            pod_namespace: "default".into(),
            pod_name: "web".into(),
            container_id: ContainerId("0123456789abcdef".into()),
            observed_at,
            emitted_at: observed_at + Duration::from_millis(42),
            reason: "Error".into(),
            confirmed_by: Some(Store::Cri),
            ..crate::runtime::testing::event(7, "web")
        }
    }

    #[test]
    fn text_line_reads_well_and_carries_the_runtime_exit() {
        let line = EventLine::new(&died_event()).render(OutputFormat::Text);
        assert_eq!(
            line,
            "2027-01-15T08:00:00.042Z #7     ContainerDied     default/web app 0123456789ab via ebpf+containerd (42ms) exit=137 reason=Error ebpf:signal=9"
        );
    }

    #[test]
    fn json_line_has_every_field() {
        let line = EventLine::new(&died_event()).render(OutputFormat::Json);
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["type"], "ContainerDied");
        assert_eq!(value["sequence"], 7);
        assert_eq!(value["exit_code"], 137);
        assert_eq!(value["confirmed_by"], "cri");
        assert_eq!(value["latency_ms"], 42);
        assert_eq!(value["sources"], serde_json::json!(["ebpf", "containerd"]));
        assert_eq!(value["observed_at"], "2027-01-15T08:00:00.000000Z");
        assert_eq!(value["emitted_at"], "2027-01-15T08:00:00.042000Z");
        assert_eq!(value["container_id"], "0123456789abcdef");
    }

    #[test]
    fn an_event_without_an_exit_still_prints() {
        let line = EventLine::new(&PodLifecycleEvent {
            exit_code: None,
            reason: String::new(),
            confirmed_by: None,
            ..died_event()
        });
        assert_eq!(line.exit_code, None);
        assert!(line.render(OutputFormat::Text).contains("ContainerDied"));
    }

    fn event(sequence: u64) -> Arc<PodLifecycleEvent> {
        Arc::new(PodLifecycleEvent {
            sequence,
            ..died_event()
        })
    }

    fn sequences(written: &[u8]) -> Vec<u64> {
        String::from_utf8_lossy(written)
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["sequence"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    }

    /// A writer whose reader is slow catches up from the history: every event is written once,
    /// in order, and the publisher never waited.
    #[tokio::test]
    async fn a_writer_that_falls_behind_catches_up_from_the_history() {
        let bus = EventBus::new(1, 1000, 8);
        // A pipe of 64 bytes: the writer blocks on it after the first line.
        let (pipe, mut reader) = tokio::io::duplex(64);
        let events = bus.follow(1, 2);
        let writer = tokio::spawn(write_events(events, pipe, OutputFormat::Json));
        tokio::task::yield_now().await;
        for s in 1..=50 {
            bus.publish(event(s));
        }
        bus.close();
        let mut written = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut written)
            .await
            .unwrap();
        writer.await.unwrap().unwrap();
        assert_eq!(sequences(&written), (1..=50).collect::<Vec<_>>());
    }

    /// Past the history, the writer skips what it no longer holds rather than stopping.
    #[tokio::test]
    async fn a_writer_behind_the_history_skips_what_it_no_longer_holds() {
        use tokio::io::AsyncBufReadExt as _;

        let bus = EventBus::new(1, 5, 8);
        let (pipe, reader) = tokio::io::duplex(1 << 16);
        let mut lines = tokio::io::BufReader::new(reader).lines();
        let events = bus.follow(1, 2);
        let writer = tokio::spawn(write_events(events, pipe, OutputFormat::Json));
        tokio::task::yield_now().await;
        // All while the writer waits for its first event: it gets that one, then lags, and the
        // history keeps only 46..=50.
        for s in 1..=50 {
            bus.publish(event(s));
        }
        // Once line 1 is out, the writer has found the history too short and goes on from its
        // oldest event (this runtime has one thread: it did so before this task ran again).
        let first = lines.next_line().await.unwrap().unwrap();
        assert_eq!(sequences(first.as_bytes()), [1]);
        for s in 51..=52 {
            bus.publish(event(s));
        }
        bus.close();
        let mut rest = Vec::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            rest.extend(sequences(line.as_bytes()));
        }
        writer.await.unwrap().unwrap();
        assert_eq!(rest, [46, 47, 48, 49, 50, 51, 52]);
    }
}
