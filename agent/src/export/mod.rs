//! Events out of the node: every event as an OpenTelemetry log record, sent to an OTLP/gRPC
//! receiver (`--otlp-endpoint`, usually the node's OpenTelemetry Collector).
//!
//! - **Never in the relist's way**: the exporter is one more follower of the event bus
//!   ([`Follower`]); publishing never waits for it. Its queue is its read-ahead
//!   (`--event-channel-capacity`) and then the bus's history (`--event-history`): while the
//!   receiver is out of reach the exporter retries one batch and reads nothing else; when it
//!   comes back, the exporter catches up from the history, and what fell out of it meanwhile
//!   is dropped, oldest first, and counted (`plegd_otlp_dropped_total`).
//! - **At least once, in order, and exactly once across clean restarts, unless refused**: a
//!   batch is retried until the receiver acknowledges it, and the exporter's place is the last
//!   sequence acknowledged; a clean shutdown saves it with the run, and a start that continues
//!   the run resumes right after it. A crash starts a new run (whose events it cannot have
//!   sent). A batch whose acknowledgement was lost on the way is sent again: records carry
//!   `plegd.run_id` and `plegd.sequence` for receivers that must not count one twice. A batch
//!   the receiver refuses for good (it says the request itself is wrong, and
//!   the same request would be refused forever) is dropped and counted
//!   (`plegd_otlp_refused_total`), and the export goes on with the next.
//! - **Bounded**: a batch is at most [`MAX_BATCH`] records and [`MAX_BATCH_BYTES`] (but for a
//!   single record larger than that, sent alone).
//! - Kernel notices, which are not events (unnumbered, best effort), are not exported.

mod record;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use opentelemetry_proto::tonic::{
    collector::logs::v1::{ExportLogsServiceResponse, logs_service_client::LogsServiceClient},
    logs::v1::LogRecord,
};
use prost::Message as _;
use tokio::{sync::watch, time::Instant};
use tokio_util::task::AbortOnDropHandle;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tracing::{info, warn};

pub use self::record::Origin;
use self::record::record;
use crate::{
    base::{
        backoff::{Backoff, Exponential, time_seed},
        bus::{Followed, Follower},
        metrics::Metrics,
    },
    config::OtlpConfig,
    pleg::PodLifecycleEvent,
};

/// Records per export request at most.
pub const MAX_BATCH: usize = 512;

/// Bytes of records per export request at most: a quarter of the 4 MiB message gRPC servers
/// (and the OpenTelemetry Collector's OTLP receiver) take by default, so a batch of the
/// largest events (`--pod-metadata-max-bytes` of labels and annotations each) still goes.
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// How long a batch waits for more events after its first: a burst goes in one request, a
/// lone event leaves within this.
pub const LINGER: Duration = Duration::from_millis(200);

/// Deadline of one export call, connecting included.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits between retries of a batch the receiver did not take: a receiver back from a restart
/// is found within 10 s, at one call per 10 s meanwhile.
const RETRY: Exponential =
    Exponential::doubling(Duration::from_millis(500), Duration::from_secs(10));

/// The exporter cannot start: its TLS files cannot be read or used.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("otlp-endpoint {endpoint}: {source}")]
    Endpoint {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The OTLP receiver, not connected yet: its files read and its settings checked.
pub struct Receiver {
    client: LogsServiceClient<Channel>,
    endpoint: String,
}

impl Receiver {
    /// Reads `config`'s TLS files; connects lazily (a receiver not up yet is no error). Warns
    /// when events would cross the network in clear text.
    pub fn new(config: &OtlpConfig) -> Result<Self, ExportError> {
        if let Some(host) = plaintext_beyond_loopback(&config.endpoint) {
            warn!(
                endpoint = %config.endpoint,
                host,
                "the OTLP endpoint is plain http to a host that is not this one: every event \
                 (pod names, labels and annotations) crosses the network unencrypted and \
                 unauthenticated; use https:// with --otlp-tls-ca"
            );
        }
        Ok(Self {
            client: LogsServiceClient::new(channel(config)?),
            endpoint: config.endpoint.clone(),
        })
    }
}

/// A running exporter. Dropping it stops it.
pub struct Exporter {
    task: AbortOnDropHandle<()>,
    acknowledged: Arc<AtomicU64>,
    /// Ends (its sender dropped) when the task does, however it does.
    running: watch::Receiver<()>,
}

impl Exporter {
    /// Starts exporting the events `events` follows, of run `run_id`, to `receiver`; the
    /// events before `events`' first count as acknowledged.
    pub fn start(
        receiver: Receiver,
        events: Follower<PodLifecycleEvent>,
        run_id: u64,
        origin: Origin,
        metrics: Metrics,
    ) -> Self {
        let acknowledged = Arc::new(AtomicU64::new(events.next_sequence().saturating_sub(1)));
        info!(
            endpoint = %receiver.endpoint,
            from = events.next_sequence(),
            "exporting events over OTLP"
        );
        let sender = Sender {
            client: receiver.client,
            endpoint: receiver.endpoint,
            origin,
            run_id,
            metrics,
            acknowledged: Arc::clone(&acknowledged),
        };
        let (alive, running) = watch::channel(());
        let task = tokio::spawn(async move {
            let _alive = alive;
            sender.run(events).await;
        });
        Self {
            task: AbortOnDropHandle::new(task),
            acknowledged,
            running,
        }
    }

    /// Resolves when the exporter's task ends: once the events are closed and every one read,
    /// or before, if it panicked.
    pub async fn ended(&self) {
        let mut running = self.running.clone();
        while running.changed().await.is_ok() {}
    }

    /// The last sequence the receiver acknowledged or refused for good (or that came before
    /// the first exported).
    pub fn acknowledged(&self) -> u64 {
        self.acknowledged.load(Ordering::Acquire)
    }

    /// Waits until every event of the closed bus is acknowledged, for `grace` at most, then
    /// stops; returns the last sequence acknowledged.
    pub async fn finish(mut self, grace: Duration) -> u64 {
        if tokio::time::timeout(grace, &mut self.task).await.is_err() {
            warn!(
                ?grace,
                acknowledged = self.acknowledged(),
                "the OTLP receiver did not take every event before shutdown; \
                 the next start that continues the run sends the rest"
            );
        }
        self.acknowledged()
    }
}

/// The host of `endpoint` if it is plain `http://` to a host other than this one (by name or
/// address: `localhost`, 127.0.0.0/8, `::1`); names are not resolved.
fn plaintext_beyond_loopback(endpoint: &str) -> Option<String> {
    let uri: http::Uri = endpoint.parse().ok()?;
    if uri.scheme_str() != Some("http") {
        return None;
    }
    let host = uri.host()?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    (!loopback).then(|| host.to_owned())
}

/// Whether the receiver said that this request will never be taken, so retrying it is
/// pointless: OTLP's rule (the specification's "Failures" section) for INVALID_ARGUMENT, and
/// for RESOURCE_EXHAUSTED without a `RetryInfo` (a gRPC server's answer to a message over its
/// limit). Every other failure may pass (the receiver restarting, overloaded, reconfigured)
/// and is retried.
fn never_taken(status: &tonic::Status) -> bool {
    match status.code() {
        tonic::Code::InvalidArgument => true,
        tonic::Code::ResourceExhausted => !retry_info(status.details()),
        _ => false,
    }
}

/// Whether a status's details (a `google.rpc.Status`) carry a `google.rpc.RetryInfo`.
fn retry_info(details: &[u8]) -> bool {
    /// `google.rpc.Status`, for its details only.
    #[derive(Clone, PartialEq, prost::Message)]
    struct RpcStatus {
        #[prost(message, repeated, tag = "3")]
        details: Vec<prost_types::Any>,
    }
    RpcStatus::decode(details).is_ok_and(|status| {
        status
            .details
            .iter()
            .any(|any| any.type_url.ends_with("/google.rpc.RetryInfo"))
    })
}

fn channel(config: &OtlpConfig) -> Result<Channel, ExportError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|source| ExportError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let invalid = |source| ExportError::Endpoint {
        endpoint: config.endpoint.clone(),
        source,
    };
    let mut endpoint = Endpoint::from_shared(config.endpoint.clone())
        .map_err(invalid)?
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .tcp_keepalive(Some(Duration::from_secs(30)));
    if config.tls() {
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &config.ca {
            tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let Some((cert, key)) = &config.identity {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        endpoint = endpoint.tls_config(tls).map_err(invalid)?;
    }
    Ok(endpoint.connect_lazy())
}

/// The exporter's loop and what it sends with.
struct Sender {
    client: LogsServiceClient<Channel>,
    endpoint: String,
    origin: Origin,
    run_id: u64,
    metrics: Metrics,
    acknowledged: Arc<AtomicU64>,
}

impl Sender {
    async fn run(mut self, events: Follower<PodLifecycleEvent>) {
        let mut batches = Batcher::new(events, self.run_id);
        let mut backoff = Backoff::new(RETRY).full_jitter(time_seed());
        let mut failing_since: Option<Instant> = None;
        let mut refusals = Refusals::default();
        while let Some(batch) = batches.next(&self.metrics).await {
            let Batch { records, last, .. } = batch;
            let count = records.len() as u64;
            let request = self.origin.request(records);
            loop {
                match self.client.export(request.clone()).await {
                    Ok(response) => {
                        self.acknowledged(count, last, response.get_ref());
                        if let Some(since) = failing_since.take() {
                            info!(
                                endpoint = %self.endpoint,
                                after = ?since.elapsed(),
                                "the OTLP receiver takes events again"
                            );
                        }
                        refusals.taken(&self.endpoint);
                        backoff.reset();
                        break;
                    }
                    Err(status) if never_taken(&status) => {
                        self.metrics.otlp_refused(count);
                        self.acknowledged.store(last, Ordering::Release);
                        refusals.refused(&self.endpoint, count, &status);
                        backoff.reset();
                        break;
                    }
                    Err(status) => {
                        self.metrics.otlp_export_failed();
                        if failing_since.is_none() {
                            failing_since = Some(Instant::now());
                            warn!(
                                endpoint = %self.endpoint,
                                code = ?status.code(),
                                message = status.message(),
                                "the OTLP receiver did not take a batch; retrying it until it \
                                 does (events are kept up to --event-history meanwhile)"
                            );
                        }
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                }
            }
        }
    }

    fn acknowledged(&self, count: u64, last: u64, response: &ExportLogsServiceResponse) {
        let mut rejected = 0;
        if let Some(partial) = &response.partial_success {
            rejected = u64::try_from(partial.rejected_log_records).unwrap_or(0);
            if rejected > 0 {
                warn!(
                    rejected,
                    message = partial.error_message,
                    "the OTLP receiver rejected events; not retried"
                );
            }
        }
        self.metrics.otlp_exported(count, rejected);
        self.acknowledged.store(last, Ordering::Release);
    }
}

/// The batches refused in a row: the first is a warning, the rest are told when one is taken
/// again, so a receiver that refuses everything costs one log line, not one per batch.
#[derive(Debug, Default)]
struct Refusals {
    batches: u64,
    events: u64,
}

impl Refusals {
    fn refused(&mut self, endpoint: &str, count: u64, status: &tonic::Status) {
        if self.batches == 0 {
            warn!(
                endpoint,
                code = ?status.code(),
                message = status.message(),
                events = count,
                "the OTLP receiver refused a batch for good; dropping it \
                 (plegd_otlp_refused_total) and going on with the next"
            );
        }
        self.batches += 1;
        self.events += count;
    }

    fn taken(&mut self, endpoint: &str) {
        if self.batches > 1 {
            warn!(
                endpoint,
                batches = self.batches,
                events = self.events,
                "the OTLP receiver takes batches again, after refusing these for good"
            );
        }
        *self = Self::default();
    }
}

/// Records to send in one request.
#[derive(Debug, Default)]
struct Batch {
    records: Vec<LogRecord>,
    /// Their size in the request.
    bytes: usize,
    /// The last one's sequence.
    last: u64,
}

/// Reads the events into batches of records: the next event, and those that follow within
/// [`LINGER`], [`MAX_BATCH`] records and [`MAX_BATCH_BYTES`] at most (a record larger than
/// that goes alone). Skipped events are counted as dropped on the way.
struct Batcher {
    events: Follower<PodLifecycleEvent>,
    run_id: u64,
    /// The record read last that did not fit in its batch, with its sequence and size: the
    /// next batch's first.
    held: Option<(LogRecord, u64, usize)>,
}

impl Batcher {
    fn new(events: Follower<PodLifecycleEvent>, run_id: u64) -> Self {
        Self {
            events,
            run_id,
            held: None,
        }
    }

    /// The next batch; `None` once the bus is closed and every event read.
    async fn next(&mut self, metrics: &Metrics) -> Option<Batch> {
        let mut batch = Batch::default();
        let mut deadline = None;
        if let Some((record, sequence, size)) = self.held.take() {
            deadline = Some(Instant::now() + LINGER);
            batch.add(record, sequence, size);
        }
        while batch.records.len() < MAX_BATCH {
            let next = match deadline {
                None => self.events.next().await,
                Some(deadline) => {
                    match tokio::time::timeout_at(deadline, self.events.next()).await {
                        Ok(next) => next,
                        Err(_) => break,
                    }
                }
            };
            match next {
                Some(Followed::Event(event)) => {
                    let record = record(&event, self.run_id);
                    let size = size_in_request(&record);
                    if !batch.records.is_empty() && batch.bytes + size > MAX_BATCH_BYTES {
                        self.held = Some((record, event.sequence, size));
                        break;
                    }
                    deadline.get_or_insert_with(|| Instant::now() + LINGER);
                    batch.add(record, event.sequence, size);
                }
                Some(Followed::Skipped(skipped)) => {
                    metrics.otlp_dropped(skipped.count());
                    warn!(
                        dropped = skipped.count(),
                        first = skipped.from,
                        "events fell out of the history before the OTLP receiver took them"
                    );
                }
                None => break,
            }
        }
        (!batch.records.is_empty()).then_some(batch)
    }
}

impl Batch {
    fn add(&mut self, record: LogRecord, sequence: u64, size: usize) {
        self.records.push(record);
        self.bytes += size;
        self.last = sequence;
    }
}

/// What `record` adds to an export request: itself, its tag and its length.
fn size_in_request(record: &LogRecord) -> usize {
    let len = record.encoded_len();
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

#[cfg(test)]
mod tests;
