//! Events as people and scripts read them: one human-readable line, or one JSON object, per
//! event ([`EventLine`]), the same whether `plegd run` prints it on stdout or `plegd watch`
//! from the API (which reads the API's messages back into plegd's types first).
//!
//! stdout is one of the event bus's subscribers: it never delays the relist or the API's
//! watchers. Events carry the runtime's exit code and reason as cached when they were
//! published, so a `ContainerDied` line says how the container ended.

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncWrite, AsyncWriteExt as _};
use tracing::warn;

use crate::{
    base::bus::{Followed, Follower},
    pleg::{Notice, Observation, ObservationKind, OomKill, PodLifecycleEvent, Store},
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

/// One event as printed, the same by `plegd run --output json` (from the bus) and `plegd
/// watch --output json` (from the API, read back into plegd's types): one line type, so a
/// field grows in both at once. A kernel notice (`plegd watch --kernel-observations`) prints
/// in the same shape, numbered 0.
///
/// Every field is always there. Text the runtime or the pod gives (ids, names, `reason`,
/// `image`) is a string, `""` when there is none, as the API's messages carry it; what plegd
/// may not know (`exit_code`, `signal`, `confirmed_by`, the host identity, `oom`) is `null`
/// until it does (docs/consuming.md, "Events in JSON").
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct EventLine<'a> {
    pub sequence: u64,
    /// The daemon run the sequence counts in, in hex.
    #[serde(serialize_with = "hex")]
    pub run_id: u64,
    #[serde(rename = "type")]
    pub event_type: &'static str,
    pub pod_uid: &'a str,
    pub pod_namespace: &'a str,
    pub pod_name: &'a str,
    pub container_id: &'a str,
    /// Empty for sandboxes.
    pub container_name: &'a str,
    pub observed_at: Stamp,
    pub emitted_at: Stamp,
    /// emitted_at - observed_at, in milliseconds.
    pub latency_ms: u64,
    pub sources: Vec<&'static str>,
    /// The runtime's exit code, for exited containers.
    pub exit_code: Option<i32>,
    /// The runtime's reason ("Error", "OOMKilled", "Completed"), for exited containers.
    pub reason: &'a str,
    /// Which of the runtime's stores confirmed the state: "task" or "cri".
    pub confirmed_by: Option<&'static str>,
    /// The signal that ended the container's init, on a death.
    pub signal: Option<i32>,
    pub image: &'a str,
    pub attempt: u32,
    /// Who the container is on the host, once known.
    pub cgroup_id: Option<u64>,
    pub cgroup_path: Option<&'a str>,
    pub init_pid: Option<u32>,
    /// The pod's labels and annotations plegd keeps (`--pod-labels`, `--pod-annotations`).
    pub pod_labels: &'a BTreeMap<String, String>,
    pub pod_annotations: &'a BTreeMap<String, String>,
    pub observations: Vec<String>,
    /// The kernel's account of the OOM kill the event tells of: which limit (`scope`,
    /// `cgroup`, `limit_bytes`) and which process (`victim_pid`, `victim_comm`,
    /// `victim_init`).
    pub oom: Option<&'a OomKill>,
}

/// The labels and annotations of a notice, which carries none.
static NO_METADATA: BTreeMap<String, String> = BTreeMap::new();

/// The kernel's account of an OOM kill among `observations`, if one is there.
pub fn oom_kill(observations: &[Observation]) -> Option<&OomKill> {
    observations.iter().find_map(|o| match &o.kind {
        ObservationKind::OomKill(kill) => Some(&**kill),
        _ => None,
    })
}

/// The observations consumers are shown, as printed (`source:fact`).
fn shown(observations: &[Observation]) -> Vec<String> {
    observations
        .iter()
        .filter(|o| o.kind.is_shown())
        .map(ToString::to_string)
        .collect()
}

impl<'a> EventLine<'a> {
    /// `event`, of the daemon run `run_id`.
    pub fn new(event: &'a PodLifecycleEvent, run_id: u64) -> Self {
        let (observed, emitted) = (Some(event.observed_at), Some(event.emitted_at));
        let host = event.host.as_deref();
        Self {
            sequence: event.sequence,
            run_id,
            event_type: event.event_type.name(),
            pod_uid: &event.pod.0,
            pod_namespace: &event.pod_namespace,
            pod_name: &event.pod_name,
            container_id: &event.container_id.0,
            container_name: &event.container_name,
            observed_at: Stamp(observed),
            emitted_at: Stamp(emitted),
            latency_ms: latency_ms(observed, emitted),
            sources: event.sources.iter().map(|s| s.name()).collect(),
            exit_code: event.exit_code,
            reason: &event.reason,
            confirmed_by: event.confirmed_by.map(Store::name),
            signal: event.signal,
            image: &event.image,
            attempt: event.attempt,
            cgroup_id: host.and_then(|h| h.cgroup_id),
            cgroup_path: host.and_then(|h| h.cgroup_path.as_deref()),
            init_pid: host.and_then(|h| h.init_pid),
            pod_labels: &event.pod_labels,
            pod_annotations: &event.pod_annotations,
            observations: shown(&event.observations),
            oom: oom_kill(&event.observations),
        }
    }

    /// A kernel notice, of the daemon run `run_id`: numbered 0, no record's fields.
    pub fn notice(notice: &'a Notice, run_id: u64) -> Self {
        let (observed, emitted) = (Some(notice.observed_at), Some(notice.emitted_at));
        Self {
            sequence: 0,
            run_id,
            event_type: notice.kind.name(),
            pod_uid: &notice.pod.0,
            pod_namespace: &notice.pod_namespace,
            pod_name: &notice.pod_name,
            container_id: &notice.container_id.0,
            container_name: &notice.container_name,
            observed_at: Stamp(observed),
            emitted_at: Stamp(emitted),
            latency_ms: latency_ms(observed, emitted),
            sources: vec![Notice::SOURCE.name()],
            exit_code: None,
            reason: "",
            confirmed_by: None,
            signal: None,
            image: "",
            attempt: 0,
            cgroup_id: None,
            cgroup_path: None,
            init_pid: None,
            pod_labels: &NO_METADATA,
            pod_annotations: &NO_METADATA,
            observations: shown(&notice.observations),
            oom: oom_kill(&notice.observations),
        }
    }

    /// The line `plegd run` prints, without the newline.
    pub fn render(&self, format: OutputFormat) -> String {
        match format {
            OutputFormat::Json => self.json(),
            OutputFormat::Text => self.text(),
        }
    }

    /// The JSON line.
    pub fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
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
        let mut line = format!(
            "{}/{} {} via {} ({}ms)",
            self.pod_namespace,
            self.pod_name,
            self.container(),
            self.sources.join("+"),
            self.latency_ms,
        );
        if let Some(code) = self.exit_code {
            line.push_str(&format!(" exit={code}"));
        }
        if !self.reason.is_empty() {
            line.push_str(&format!(" reason={}", self.reason));
        }
        // The CRI store is the usual confirmation, not worth a word on every line.
        if self.confirmed_by == Some("task") {
            line.push_str(" confirmed_by=task");
        }
        for observation in &self.observations {
            line.push_str(&format!(" {observation}"));
        }
        line
    }

    /// The container as a column: its name and short id, `sandbox` and its id, or `-`.
    fn container(&self) -> String {
        match (self.container_id, self.container_name) {
            ("", _) => "-".to_owned(),
            (id, "") => format!("sandbox {}", short(id)),
            (id, name) => format!("{name} {}", short(id)),
        }
    }

    /// The row of `plegd watch`'s table (under [`table_header`]).
    pub fn row(&self) -> String {
        let mut exit = match self.exit_code {
            Some(code) if self.reason.is_empty() => code.to_string(),
            Some(code) => format!("{code} {}", self.reason),
            None => String::new(),
        };
        for o in &self.observations {
            exit.push(' ');
            exit.push_str(o);
        }
        format!(
            "{:<24} {:>6}  {:<17} {:<32} {:<26} {:<18} {:>6}ms  {}",
            self.emitted_at,
            self.sequence,
            self.event_type,
            format!("{}/{}", self.pod_namespace, self.pod_name),
            self.container(),
            self.sources.join("+"),
            self.latency_ms,
            exit.trim_start(),
        )
        .trim_end()
        .to_owned()
    }
}

/// The head of `plegd watch`'s table, whose rows are [`EventLine::row`].
pub fn table_header() -> String {
    format!(
        "{:<24} {:>6}  {:<17} {:<32} {:<26} {:<18} {:>8}  {}",
        "TIME", "SEQ", "TYPE", "POD", "CONTAINER", "SOURCES", "LATENCY", "EXIT"
    )
}

/// A run id as printed: hex, as `plegd pods` and the notes of `plegd watch` say it.
fn hex<S: serde::Serializer>(run_id: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&format_args!("{run_id:x}"))
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
    let run_id = events.run_id();
    while let Some(followed) = events.next().await {
        match followed {
            Followed::Event(event) => {
                let mut line = EventLine::new(&event, run_id).render(format);
                line.push('\n');
                // Not flushed here: tokio's stdout hands each write to a blocking thread at once
                // and std's stdout writes a whole line through, so a consumer piping stdout
                // sees each event as it happens; waiting for that thread to finish would wake
                // the runtime once more per event. The next write, or the end, waits for it.
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
        pleg::{ContainerId, PodUid},
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
        let event = died_event();
        let line = EventLine::new(&event, 0xabc).render(OutputFormat::Text);
        assert_eq!(
            line,
            "2027-01-15T08:00:00.042Z #7     ContainerDied     default/web app 0123456789ab via ebpf+containerd (42ms) exit=137 reason=Error ebpf:signal=9"
        );
    }

    #[test]
    fn a_row_of_the_watch_table_reads_well() {
        let event = died_event();
        let line = EventLine::new(&event, 0xabc);
        assert_eq!(
            line.row(),
            "2027-01-15T08:00:00.042Z      7  ContainerDied     default/web                      app 0123456789ab           ebpf+containerd        42ms  137 Error ebpf:signal=9"
        );
        assert!(table_header().starts_with("TIME"));
        let sandbox = PodLifecycleEvent {
            container_name: String::new(),
            exit_code: None,
            observations: Vec::new(),
            ..died_event()
        };
        assert!(
            EventLine::new(&sandbox, 1)
                .row()
                .ends_with("sandbox 0123456789ab       ebpf+containerd        42ms"),
            "{}",
            EventLine::new(&sandbox, 1).row()
        );
    }

    #[test]
    fn json_line_has_every_field() {
        let event = died_event();
        let line = EventLine::new(&event, 0xabc).render(OutputFormat::Json);
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["type"], "ContainerDied");
        assert_eq!(value["sequence"], 7);
        assert_eq!(value["run_id"], "abc");
        assert_eq!(value["exit_code"], 137);
        assert_eq!(value["confirmed_by"], "cri");
        assert_eq!(value["latency_ms"], 42);
        assert_eq!(value["sources"], serde_json::json!(["ebpf", "containerd"]));
        assert_eq!(value["observed_at"], "2027-01-15T08:00:00.000000Z");
        assert_eq!(value["emitted_at"], "2027-01-15T08:00:00.042000Z");
        assert_eq!(value["container_id"], "0123456789abcdef");
        assert_eq!(value["oom"], serde_json::Value::Null);
        assert_eq!(value.as_object().unwrap().len(), 25, "{value}");
    }

    /// Text is `""` when empty, what plegd does not know `null`; every field is there.
    #[test]
    fn empty_text_is_an_empty_string_and_the_unknown_null() {
        let event = PodLifecycleEvent {
            container_id: ContainerId(String::new()),
            exit_code: None,
            reason: String::new(),
            confirmed_by: None,
            signal: None,
            host: None,
            ..died_event()
        };
        let line = EventLine::new(&event, 1);
        assert_eq!(line.exit_code, None);
        assert!(line.render(OutputFormat::Text).contains("ContainerDied"));
        let value: serde_json::Value = serde_json::from_str(&line.json()).unwrap();
        for field in ["container_id", "reason"] {
            assert_eq!(value[field], "", "{field}: {value}");
        }
        for field in [
            "exit_code",
            "confirmed_by",
            "signal",
            "cgroup_id",
            "cgroup_path",
            "init_pid",
            "oom",
        ] {
            assert!(value[field].is_null(), "{field}: {value}");
        }
    }

    /// A kernel notice prints in the events' shape: numbered 0, from the kernel, with its OOM
    /// kill's account.
    #[test]
    fn a_notice_prints_as_an_event_of_its_own_type() {
        let kill = Arc::new(OomKill {
            scope: crate::pleg::OomScope::Container,
            cgroup: Some("/k8s.io/c1".into()),
            limit_bytes: Some(32 << 20),
            victim_pid: 9,
            victim_comm: "dd".into(),
            victim_init: true,
        });
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let notice = Notice {
            kind: crate::pleg::NoticeKind::Ahead,
            pod: PodUid("uid-1".into()),
            pod_namespace: "default".into(),
            pod_name: "web".into(),
            container_id: ContainerId("0123456789abcdef".into()),
            container_name: "app".into(),
            observations: vec![crate::pleg::Observation {
                source: crate::pleg::Source::Ebpf,
                kind: crate::pleg::ObservationKind::OomKill(Arc::clone(&kill)),
            }],
            observed_at: at,
            emitted_at: at,
        };
        let line = EventLine::notice(&notice, 0xabc);
        let value: serde_json::Value = serde_json::from_str(&line.json()).unwrap();
        let event = died_event();
        let event_value: serde_json::Value =
            serde_json::from_str(&EventLine::new(&event, 1).json()).unwrap();
        let keys =
            |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&value), keys(&event_value));
        assert_eq!(value["type"], "KernelObservation");
        assert_eq!(value["sequence"], 0);
        assert_eq!(value["run_id"], "abc");
        assert_eq!(value["sources"], serde_json::json!(["ebpf"]));
        assert_eq!(value["oom"]["victim_comm"], "dd");
        assert_eq!(
            (value["image"].as_str(), &value["confirmed_by"]),
            (Some(""), &serde_json::Value::Null)
        );
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
