//! The client side of the API, behind `plegd watch`, `plegd pods` and `plegd health`.
//!
//! `watch` follows the stream across disconnects: it resumes from the last sequence it printed
//! (same daemon run), and when the daemon restarted or the events are gone it says so, lists
//! the pods, and follows from that listing on.

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use plegd_proto::v1::{self as pb, pleg_client::PlegClient};
use serde::Serialize;
use tonic::{Code, Status, transport::Channel};

use crate::{
    api::convert::{
        self, Watched, from_timestamp, source_name, store_from_pb, sync_reason_from_pb,
    },
    output::{EventLine, OutputFormat, Stamp, short, table_header},
    pleg::{Store, SyncReason},
};

/// How long a one-shot command waits for the daemon.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait between two reconnection attempts of `watch`.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// A command that could not complete.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach plegd at {socket}: {reason}")]
    Connect { socket: PathBuf, reason: String },
    #[error("plegd answered {}: {}", .0.code(), .0.message())]
    Rpc(#[from] Status),
    #[error("writing output: {0}")]
    Write(#[from] std::io::Error),
}

impl ClientError {
    /// Whether the daemon could not be reached at all (rather than answering with an error).
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Connect { .. } => true,
            Self::Rpc(status) => matches!(
                status.code(),
                Code::Unavailable | Code::DeadlineExceeded | Code::Unknown
            ),
            Self::Write(_) => false,
        }
    }
}

/// Connects to the API socket.
pub async fn connect(socket: &Path) -> Result<PlegClient<Channel>, ClientError> {
    let path = socket.to_owned();
    let channel = tonic::transport::Endpoint::from_static("http://plegd.local")
        .connect_timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .map_err(|error| ClientError::Connect {
            socket: socket.to_owned(),
            reason: root_cause(&error),
        })?;
    Ok(PlegClient::new(channel))
}

/// The innermost cause: tonic's "transport error" says less than the `connect` error it wraps.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut error = error;
    while let Some(source) = error.source() {
        error = source;
    }
    error.to_string()
}

/// What `plegd watch` asks for.
#[derive(Clone, Debug, Default)]
pub struct WatchOptions {
    pub socket: PathBuf,
    pub output: OutputFormat,
    /// First sequence wanted (0: from now on).
    pub from: u64,
    pub pod_namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    pub types: Vec<pb::EventType>,
    /// Also stream the kernel's observations ahead of confirmation.
    pub kernel_observations: bool,
    /// Stream pod syncs (levels) instead of events (edges).
    pub pod_syncs: bool,
    /// With `pod_syncs`: start with a sync of every pod (it always does after a reconnection:
    /// syncs cannot be resumed).
    pub initial_syncs: bool,
}

/// Where the watch stands: the run and the next sequence wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Position {
    run_id: u64,
    next: u64,
}

/// Prints events to `out` (notes to `notes`) until the output fails or an error no retry can
/// fix; reconnects and resumes otherwise.
pub async fn watch<W: Write, N: Write>(
    options: &WatchOptions,
    out: &mut W,
    notes: &mut N,
) -> Result<(), ClientError> {
    let mut position = (options.from > 0).then_some(Position {
        run_id: 0,
        next: options.from,
    });
    let mut delay = Duration::from_millis(200);
    let mut header = false;
    loop {
        let outcome = if options.pod_syncs {
            syncs_once(options, out, &mut header).await
        } else {
            watch_once(options, &mut position, out, notes, &mut header).await
        };
        match outcome {
            Ok(()) => writeln!(notes, "# stream ended; reconnecting")?,
            Err(ClientError::Rpc(status)) if status.code() == Code::ResourceExhausted => {
                writeln!(notes, "# {}; resuming", status.message())?;
                continue;
            }
            Err(ClientError::Rpc(status)) if status.code() == Code::OutOfRange => {
                writeln!(notes, "# {}", status.message())?;
                position = None;
                continue;
            }
            Err(e) if e.is_unreachable() => {
                writeln!(notes, "# {e}; retrying in {delay:?}")?;
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(RECONNECT_MAX);
    }
}

async fn watch_once<W: Write, N: Write>(
    options: &WatchOptions,
    position: &mut Option<Position>,
    out: &mut W,
    notes: &mut N,
    header: &mut bool,
) -> Result<(), ClientError> {
    let mut client = connect(&options.socket).await?;
    let at = match *position {
        Some(at) => at,
        None => {
            // Start (or start over) from a listing: everything after it follows.
            let listing = client.list_pods(pb::ListPodsRequest {}).await?.into_inner();
            if options.from > 0 || *header {
                writeln!(
                    notes,
                    "# resynced: {} pods now (run {:x}); following from sequence {}",
                    listing.pods.len(),
                    listing.run_id,
                    listing.sequence + 1
                )?;
                // A JSON consumer gets the listing itself: its new baseline, what the events it
                // missed add up to.
                if options.output == OutputFormat::Json {
                    writeln!(out, "{}", json(&Resync::new(&listing)))?;
                    out.flush()?;
                }
            }
            Position {
                run_id: listing.run_id,
                next: listing.sequence + 1,
            }
        }
    };
    *position = Some(at);
    let request = pb::WatchRequest {
        from_sequence: at.next,
        pod_namespace: options.pod_namespace.clone(),
        pod_name: options.pod_name.clone(),
        pod_uid: options.pod_uid.clone(),
        types: options.types.iter().map(|t| *t as i32).collect(),
        include_observations: true,
        run_id: at.run_id,
        include_kernel_observations: options.kernel_observations,
    };
    let mut stream = client.watch(request).await?.into_inner();
    if !*header && options.output == OutputFormat::Text {
        writeln!(out, "{}", table_header())?;
        out.flush()?;
    }
    *header = true;
    while let Some(message) = stream.message().await? {
        // Kernel observations are not numbered: they do not move the resume point.
        if message.sequence != 0 {
            *position = Some(Position {
                run_id: message.run_id,
                next: message.sequence + 1,
            });
        }
        let watched = match convert::watched_from_pb(&message) {
            Ok(watched) => watched,
            Err(unknown) => {
                writeln!(notes, "# skipped sequence {}: {unknown}", message.sequence)?;
                continue;
            }
        };
        let line = match &watched {
            Watched::Event(event) => EventLine::new(event, message.run_id),
            Watched::Notice(notice) => EventLine::notice(notice, message.run_id),
        };
        match options.output {
            OutputFormat::Text => writeln!(out, "{}", line.row())?,
            OutputFormat::Json => writeln!(out, "{}", line.json())?,
        }
        out.flush()?;
    }
    Ok(())
}

/// One `SyncPods` call: prints syncs until the stream ends. The first call asks for initial
/// syncs as the options say, every later one (`header` set) always.
async fn syncs_once<W: Write>(
    options: &WatchOptions,
    out: &mut W,
    header: &mut bool,
) -> Result<(), ClientError> {
    let mut client = connect(&options.socket).await?;
    let request = pb::SyncPodsRequest {
        pod_namespace: options.pod_namespace.clone(),
        pod_name: options.pod_name.clone(),
        pod_uid: options.pod_uid.clone(),
        initial: options.initial_syncs || *header,
    };
    let mut stream = client.sync_pods(request).await?.into_inner();
    if !*header && options.output == OutputFormat::Text {
        writeln!(out, "{}", sync_header())?;
        out.flush()?;
    }
    *header = true;
    while let Some(sync) = stream.message().await? {
        let line = SyncLine::new(&sync);
        match options.output {
            OutputFormat::Text => writeln!(out, "{}", line.row())?,
            OutputFormat::Json => writeln!(out, "{}", json(&line))?,
        }
        out.flush()?;
    }
    Ok(())
}

fn sync_header() -> String {
    format!(
        "{:<24} {:>6}  {:<8} {:<32} CONTAINERS",
        "READ AT", "SEQ", "REASON", "POD"
    )
}

/// One pod sync as `plegd watch --pod-syncs` prints it.
#[derive(Debug, Serialize)]
pub struct SyncLine {
    pub reason: &'static str,
    pub sequence: u64,
    pub run_id: String,
    pub pod_uid: String,
    pub pod_namespace: String,
    pub pod_name: String,
    /// The pod's cached status; `null` once it is removed.
    pub status: Option<PodReport>,
}

impl SyncLine {
    pub fn new(sync: &pb::PodSync) -> Self {
        Self {
            reason: sync_reason_name(sync.reason()),
            sequence: sync.sequence,
            run_id: format!("{:x}", sync.run_id),
            pod_uid: sync.pod_uid.clone(),
            pod_namespace: sync.pod_namespace.clone(),
            pod_name: sync.pod_name.clone(),
            status: sync.status.as_ref().map(PodReport::new),
        }
    }

    /// The table row: each container as `name state [exit code and reason]`.
    pub fn row(&self) -> String {
        let (read_at, containers) = match &self.status {
            Some(status) => (
                status.read_at,
                status
                    .containers
                    .iter()
                    .map(ContainerReport::summary)
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            None => (Stamp(None), "-".to_owned()),
        };
        format!(
            "{read_at:<24} {:>6}  {:<8} {:<32} {containers}",
            self.sequence,
            self.reason,
            format!("{}/{}", self.pod_namespace, self.pod_name),
        )
        .trim_end()
        .to_owned()
    }
}

fn sync_reason_name(reason: pb::SyncReason) -> &'static str {
    sync_reason_from_pb(reason).map_or("unknown", SyncReason::name)
}

/// `plegd pods`: a table (or one JSON object) of cached pods and their containers.
pub async fn pods<W: Write>(
    socket: &Path,
    output: OutputFormat,
    out: &mut W,
) -> Result<(), ClientError> {
    let mut client = connect(socket).await?;
    let mut request = tonic::Request::new(pb::ListPodsRequest {});
    request.set_timeout(CALL_TIMEOUT);
    let listing = client.list_pods(request).await?.into_inner();
    if output == OutputFormat::Json {
        writeln!(out, "{}", json(&PodsReport::new(&listing)))?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<40} {:<36} {:<20} {:<13} {:<8} EXIT",
        "POD", "UID", "CONTAINER", "ID", "STATE"
    )?;
    for pod in &listing.pods {
        let name = format!("{}/{}", pod.namespace, pod.name);
        for c in &pod.containers {
            let container = if c.sandbox {
                "(sandbox)".to_owned()
            } else {
                c.name.clone()
            };
            let exit = if c.has_exit_code {
                format!("{} {}", c.exit_code, c.reason)
            } else {
                String::new()
            };
            writeln!(
                out,
                "{name:<40} {:<36} {container:<20} {:<13} {:<8} {}",
                pod.uid,
                short(&c.id),
                container_state_name(c.state()),
                exit.trim_end()
            )?;
        }
        if pod.containers.is_empty() {
            writeln!(out, "{name:<40} {:<36} -", pod.uid)?;
        }
    }
    writeln!(
        out,
        "{} pods; stream at sequence {} of run {:x}",
        listing.pods.len(),
        listing.sequence,
        listing.run_id
    )?;
    Ok(())
}

/// `plegd health`: prints overall and per-source health (text or one JSON object); returns
/// whether the PLEG is healthy.
pub async fn health<W: Write>(
    socket: &Path,
    output: OutputFormat,
    out: &mut W,
) -> Result<bool, ClientError> {
    let mut client = connect(socket).await?;
    let mut request = tonic::Request::new(pb::GetHealthRequest {});
    request.set_timeout(CALL_TIMEOUT);
    let health = client.get_health(request).await?.into_inner();
    if output == OutputFormat::Json {
        writeln!(out, "{}", json(&HealthReport::new(&health)))?;
        return Ok(health.healthy);
    }
    if health.healthy {
        writeln!(
            out,
            "pleg: healthy (run {:x}, last sequence {})",
            health.run_id, health.last_sequence
        )?;
    } else {
        writeln!(out, "pleg: unhealthy: {}", health.message)?;
    }
    for source in &health.sources {
        let mut line = format!(
            "{}: {}",
            source_name(source.source()),
            source_state_name(source.state())
        );
        if let Some(at) = from_timestamp(source.last_delivered.as_ref()) {
            let age = SystemTime::now().duration_since(at).unwrap_or_default();
            line.push_str(&format!(
                ", last delivered {} ago",
                humantime::format_duration(Duration::from_millis(age.as_millis() as u64))
            ));
        }
        if !source.detail.is_empty() {
            line.push_str(&format!(" ({})", source.detail));
        }
        writeln!(out, "{line}")?;
    }
    Ok(health.healthy)
}

fn json(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

fn container_state_name(state: pb::ContainerState) -> &'static str {
    match state {
        pb::ContainerState::Created => "created",
        pb::ContainerState::Running => "running",
        pb::ContainerState::Exited => "exited",
        pb::ContainerState::Unknown | pb::ContainerState::Unspecified => "unknown",
    }
}

fn source_state_name(state: pb::SourceState) -> &'static str {
    match state {
        pb::SourceState::Connected => "connected",
        pb::SourceState::Connecting => "connecting",
        pb::SourceState::Reconnecting => "reconnecting",
        pb::SourceState::Unsupported => "unsupported",
        pb::SourceState::Disabled => "disabled",
        pb::SourceState::Unspecified => "unknown",
    }
}

/// `plegd pods --output json`.
#[derive(Debug, Serialize)]
struct PodsReport {
    run_id: String,
    sequence: u64,
    pods: Vec<PodReport>,
}

#[derive(Debug, Serialize)]
pub struct PodReport {
    uid: String,
    namespace: String,
    name: String,
    /// When the runtime was read for this status.
    read_at: Stamp,
    containers: Vec<ContainerReport>,
}

#[derive(Debug, Serialize)]
pub struct ContainerReport {
    id: String,
    name: String,
    sandbox: bool,
    attempt: u32,
    image: String,
    state: &'static str,
    exit_code: Option<i32>,
    reason: String,
    /// Which of the runtime's records the state comes from (`cri`, `task`).
    confirmed_by: Option<&'static str>,
    created_at: Stamp,
    started_at: Stamp,
    finished_at: Stamp,
}

impl PodsReport {
    fn new(listing: &pb::ListPodsResponse) -> Self {
        Self {
            run_id: format!("{:x}", listing.run_id),
            sequence: listing.sequence,
            pods: listing.pods.iter().map(PodReport::new).collect(),
        }
    }
}

impl PodReport {
    fn new(pod: &pb::PodStatus) -> Self {
        Self {
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            read_at: Stamp(from_timestamp(pod.timestamp.as_ref())),
            containers: pod
                .containers
                .iter()
                .map(|c| ContainerReport {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    sandbox: c.sandbox,
                    attempt: c.attempt,
                    image: c.image.clone(),
                    state: container_state_name(c.state()),
                    exit_code: c.has_exit_code.then_some(c.exit_code),
                    reason: c.reason.clone(),
                    confirmed_by: store_from_pb(c.confirmed_by()).map(Store::name),
                    created_at: Stamp(from_timestamp(c.created_at.as_ref())),
                    started_at: Stamp(from_timestamp(c.started_at.as_ref())),
                    finished_at: Stamp(from_timestamp(c.finished_at.as_ref())),
                })
                .collect(),
        }
    }
}

impl ContainerReport {
    /// `name state [exit code and reason]`, sandboxes named `sandbox`.
    fn summary(&self) -> String {
        let name = if self.sandbox { "sandbox" } else { &self.name };
        let mut summary = format!("{name} {}", self.state);
        if let Some(code) = self.exit_code {
            summary.push_str(&format!(" {code}"));
        }
        if !self.reason.is_empty() {
            summary.push_str(&format!(" {}", self.reason));
        }
        summary
    }
}

/// The line `plegd watch --output json` prints when it had to start over from a listing.
#[derive(Debug, Serialize)]
struct Resync {
    resync: PodsReport,
}

impl Resync {
    fn new(listing: &pb::ListPodsResponse) -> Self {
        Self {
            resync: PodsReport::new(listing),
        }
    }
}

/// `plegd health --output json`.
#[derive(Debug, Serialize)]
struct HealthReport {
    healthy: bool,
    message: String,
    run_id: String,
    last_sequence: u64,
    sources: Vec<SourceReport>,
}

#[derive(Debug, Serialize)]
struct SourceReport {
    source: &'static str,
    state: &'static str,
    detail: String,
    last_delivered: Stamp,
}

impl HealthReport {
    fn new(health: &pb::Health) -> Self {
        Self {
            healthy: health.healthy,
            message: health.message.clone(),
            run_id: format!("{:x}", health.run_id),
            last_sequence: health.last_sequence,
            sources: health
                .sources
                .iter()
                .map(|s| SourceReport {
                    source: source_name(s.source()),
                    state: source_state_name(s.state()),
                    detail: s.detail.clone(),
                    last_delivered: Stamp(from_timestamp(s.last_delivered.as_ref())),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pleg::{ContainerId, PodLifecycleEvent, PodLifecycleEventType, Source};

    /// A message of the stream prints through the one line type, read back into plegd's
    /// types: the row `plegd watch` shows, and the JSON `plegd run --output json` would print
    /// for the same event.
    #[test]
    fn a_watched_event_prints_as_plegd_run_prints_it() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let event = PodLifecycleEvent {
            sequence: 12,
            pod_namespace: "default".into(),
            pod_name: "web".into(),
            container_id: ContainerId("0123456789abcdef".into()),
            container_name: "app".into(),
            event_type: PodLifecycleEventType::ContainerDied,
            observed_at: at,
            emitted_at: at + Duration::from_millis(4),
            sources: vec![Source::Containerd],
            observations: Vec::new(),
            exit_code: Some(137),
            reason: "Error".into(),
            ..crate::runtime::testing::event(12, "web")
        };
        let message = convert::event(&event, 0xabc);
        let Ok(Watched::Event(read)) = convert::watched_from_pb(&message) else {
            panic!("{message:?}");
        };
        let line = EventLine::new(&read, message.run_id);
        assert_eq!(
            line.row(),
            "2027-01-15T08:00:00.004Z     12  ContainerDied     default/web                      app 0123456789ab           containerd              4ms  137 Error"
        );
        assert_eq!(line.json(), EventLine::new(&event, 0xabc).json());
        let json: serde_json::Value = serde_json::from_str(&line.json()).unwrap();
        assert_eq!(json["type"], "ContainerDied");
        assert_eq!(json["latency_ms"], 4);
        assert_eq!(json["run_id"], "abc");
        assert_eq!(json["emitted_at"], "2027-01-15T08:00:00.004000Z");
    }

    #[test]
    fn a_sync_row_shows_each_container_and_json_the_whole_status() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let container = |name: &str, sandbox, state: pb::ContainerState| pb::ContainerStatus {
            id: format!("{name}-id"),
            name: name.into(),
            sandbox,
            state: state as i32,
            ..pb::ContainerStatus::default()
        };
        let sync = pb::PodSync {
            pod_uid: "u".into(),
            pod_namespace: "default".into(),
            pod_name: "web".into(),
            reason: pb::SyncReason::Event as i32,
            status: Some(pb::PodStatus {
                uid: "u".into(),
                namespace: "default".into(),
                name: "web".into(),
                labels: Default::default(),
                annotations: Default::default(),
                containers: vec![
                    container("", true, pb::ContainerState::Running),
                    pb::ContainerStatus {
                        exit_code: 137,
                        has_exit_code: true,
                        reason: "Error".into(),
                        confirmed_by: pb::Layer::Task as i32,
                        ..container("app", false, pb::ContainerState::Exited)
                    },
                ],
                timestamp: Some(at.into()),
            }),
            sequence: 12,
            run_id: 0xabc,
        };
        let line = SyncLine::new(&sync);
        assert_eq!(
            line.row(),
            "2027-01-15T08:00:00.000Z     12  event    default/web                      sandbox running, app exited 137 Error"
        );
        assert!(sync_header().starts_with("READ AT"));
        let json = serde_json::to_value(&line).unwrap();
        assert_eq!(json["reason"], "event");
        assert_eq!(json["status"]["containers"][1]["exit_code"], 137);
        assert_eq!(json["status"]["containers"][1]["confirmed_by"], "task");
        assert_eq!(json["status"]["read_at"], "2027-01-15T08:00:00.000000Z");
        assert_eq!(json["status"]["containers"][1]["finished_at"], "-");
        let removed = SyncLine::new(&pb::PodSync {
            reason: pb::SyncReason::Removed as i32,
            status: None,
            ..sync
        });
        assert!(serde_json::to_value(&removed).unwrap()["status"].is_null());
        assert!(
            removed
                .row()
                .ends_with("removed  default/web                      -")
        );
    }
}
