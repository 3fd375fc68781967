//! Events out of the node: every event as an OpenTelemetry log record, sent to an OTLP/gRPC
//! receiver (`--otlp-endpoint`, usually the node's OpenTelemetry Collector).
//!
//! - **Never in the relist's way**: the exporter is one more follower of the event bus
//!   ([`Follower`]); publishing never waits for it. Its queue is its read-ahead
//!   (`--event-channel-capacity`) and then the bus's history (`--event-history`): while the
//!   receiver is out of reach the exporter retries one batch and reads nothing else; when it
//!   comes back, the exporter catches up from the history, and what fell out of it meanwhile
//!   is dropped, oldest first, and counted (`plegd_otlp_dropped_total`).
//! - **At least once, in order, and exactly once across clean restarts**: a batch is retried
//!   until the receiver acknowledges it, and the exporter's place is the last sequence
//!   acknowledged; a clean shutdown saves it with the run, and a start that continues the run
//!   resumes right after it. A crash starts a new run (whose events it cannot have sent). A
//!   batch whose acknowledgement was lost on the way is sent again: records carry
//!   `plegd.run_id` and `plegd.sequence` for receivers that must not count one twice.
//! - Kernel notices, which are not events (unnumbered, best effort), are not exported.

mod record;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceResponse, logs_service_client::LogsServiceClient,
};
use tokio::time::Instant;
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

/// Records per export request at most: well under a receiver's default 4 MiB message.
pub const MAX_BATCH: usize = 512;

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
    /// Reads `config`'s TLS files; connects lazily (a receiver not up yet is no error).
    pub fn new(config: &OtlpConfig) -> Result<Self, ExportError> {
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
        let task = tokio::spawn(sender.run(events));
        Self {
            task: AbortOnDropHandle::new(task),
            acknowledged,
        }
    }

    /// The last sequence the receiver acknowledged (or that came before the first exported).
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
    async fn run(mut self, mut events: Follower<PodLifecycleEvent>) {
        let mut backoff = Backoff::new(RETRY).full_jitter(time_seed());
        let mut failing_since: Option<Instant> = None;
        while let Some(batch) = next_batch(&mut events, &self.metrics).await {
            let last = batch.last().map_or(0, |event| event.sequence);
            let records: Vec<_> = batch.iter().map(|e| record(e, self.run_id)).collect();
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

/// The next batch: the next event, and those that follow within [`LINGER`], [`MAX_BATCH`] at
/// most; `None` once the bus is closed and every event read. Skipped events are counted as
/// dropped on the way.
async fn next_batch(
    events: &mut Follower<PodLifecycleEvent>,
    metrics: &Metrics,
) -> Option<Vec<Arc<PodLifecycleEvent>>> {
    let mut batch = Vec::new();
    let mut deadline = None;
    while batch.len() < MAX_BATCH {
        let next = match deadline {
            None => events.next().await,
            Some(deadline) => match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(next) => next,
                Err(_) => break,
            },
        };
        match next {
            Some(Followed::Event(event)) => {
                deadline.get_or_insert_with(|| Instant::now() + LINGER);
                batch.push(event);
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
    (!batch.is_empty()).then_some(batch)
}

#[cfg(test)]
mod tests;
