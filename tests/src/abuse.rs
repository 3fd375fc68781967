//! Hostile and careless clients of plegd's API, all at once, and what plegd showed meanwhile.
//!
//! The abuse (issue 48's, as someone who wants plegd blind would try it):
//! - TCP connections to the TLS port that never finish a handshake, half silent, half stopping
//!   after a TLS record header; each one connects again as soon as plegd closes it; half of them
//!   from one greedy address, half from a crowd of addresses (the cap per address and the cap
//!   on the listener both show);
//! - connections to the unix socket sending random bytes or HTTP/2's preface and nothing more,
//!   connecting again when closed;
//! - Watch and SyncPods streams, over a few mTLS channels, that are never read;
//! - requests no client should send, each expecting its status.
//!
//! Meanwhile the monitor samples plegd's descriptors, RSS and health, and a new watcher connects
//! to the unix socket and waits for its first event. [`Abuse::stop`] ends it all and waits for
//! plegd's descriptors to come back to where they were.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use plegd_proto::v1::{self as pb, pleg_client::PlegClient};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    task::JoinSet,
};
use tonic::{
    Code,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};

use crate::bench::{Jitter, cpu_time, metric_series_at, rss_bytes};

/// How much of each kind of abuse.
#[derive(Clone, Debug)]
pub struct Scale {
    /// Connections held open to the TLS port without a handshake.
    pub handshakes: usize,
    /// Loopback addresses the crowd's half of them come from (127.0.1.2, 127.0.1.3, ...); the
    /// other half come from one greedy address (127.0.1.1).
    pub crowd: u8,
    /// Connections to the unix socket with garbage or a bare preface.
    pub garbage: usize,
    /// Watch streams never read.
    pub watches: usize,
    /// SyncPods streams never read.
    pub syncs: usize,
    /// The mTLS channels those streams share.
    pub channels: usize,
}

impl Default for Scale {
    /// Issue 48's numbers.
    fn default() -> Self {
        Self {
            handshakes: 1_200,
            crowd: 10,
            garbage: 100,
            watches: 200,
            syncs: 50,
            channels: 10,
        }
    }
}

/// The plegd under abuse: its process, its listeners, and a client certificate its TLS listener
/// accepts (for the streams that are never read: careless, not hostile).
#[derive(Clone)]
pub struct Target {
    pub pid: i32,
    pub socket: PathBuf,
    pub tls: SocketAddr,
    /// Its /metrics, for what it counted of the abuse.
    pub metrics: SocketAddr,
    pub ca_pem: String,
    /// (certificate, key) in PEM.
    pub client: (String, String),
}

/// One look at plegd.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Since the abuse began.
    pub at: Duration,
    pub fds: usize,
    pub rss: u64,
    /// CPU time it has used, all told.
    pub cpu: Duration,
    /// `Err`: GetHealth failed, or said unhealthy (why).
    pub health: Result<(), String>,
}

/// A new watcher's way in during the abuse.
#[derive(Clone, Copy, Debug)]
pub struct Joined {
    /// From dialing to the Watch call's response.
    pub connected: Duration,
    /// From dialing to its first event.
    pub first_event: Duration,
}

/// What the abuse saw.
#[derive(Debug)]
pub struct Report {
    pub before: Sample,
    pub samples: Vec<Sample>,
    /// Once the abuse ended and the descriptors settled (or the wait gave up).
    pub after: Sample,
    /// How long after the end of the abuse `after` was taken.
    pub settled_in: Duration,
    /// Whether the descriptors came back to `before`'s (within [`FD_SLACK`]).
    pub settled: bool,
    /// Connections the flood opened, and how many of those plegd closed.
    pub opened: u64,
    pub closed_by_plegd: u64,
    /// Connection attempts that failed (refused, reset).
    pub failed_connects: u64,
    /// Streams opened and never read.
    pub never_read: usize,
    /// plegd's own count of what it refused and closed (`plegd_api_refused_total` and
    /// `plegd_api_closed_total`, by labels).
    pub counted: BTreeMap<String, f64>,
    /// Requests that did not get the status they should have (empty: all did).
    pub wrong_statuses: Vec<String>,
    pub new_watcher: Result<Joined, String>,
}

/// Descriptors plegd may hold above its baseline once the abuse is over (a containerd
/// connection renewed, a metrics scrape in flight).
pub const FD_SLACK: usize = 4;

/// How long after the abuse began the new watcher tries its way in: the flood is at full
/// strength by then (every connection opened, the first deadlines not yet passed).
const NEW_WATCHER_AFTER: Duration = Duration::from_secs(3);
/// Between two connections of one flooder: each comes back a second after plegd closed it (a
/// persistent peer, several hundred connections a second, not a hot loop that would measure the
/// test machine's CPU rather than plegd).
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);
const SAMPLE_EVERY: Duration = Duration::from_millis(500);
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// A running abuse; [`Abuse::stop`] ends it.
pub struct Abuse {
    target: Target,
    began: Instant,
    before: Sample,
    flood: JoinSet<()>,
    counts: Arc<Counts>,
    /// The never-read streams and their channels, dropped at the end.
    held: Vec<Box<dyn Send>>,
    never_read: usize,
    monitor: tokio::task::JoinHandle<Vec<Sample>>,
    stop_monitor: tokio::sync::watch::Sender<bool>,
    probe: tokio::task::JoinHandle<(Result<Joined, String>, Vec<String>)>,
}

#[derive(Default)]
struct Counts {
    opened: AtomicU64,
    closed: AtomicU64,
    failed: AtomicU64,
}

impl Abuse {
    /// Opens the never-read streams, then starts the flood, the monitor and the new watcher.
    pub async fn start(target: Target, scale: &Scale) -> anyhow::Result<Self> {
        raise_own_nofile()?;
        let began = Instant::now();
        let health = health_client(&target.socket).await?;
        let before = sample(&target, began, &health).await;
        before
            .health
            .clone()
            .map_err(|e| anyhow::anyhow!("plegd unhealthy before the abuse: {e}"))?;

        let mut held: Vec<Box<dyn Send>> = Vec::new();
        for c in 0..scale.channels {
            let channel = tls_channel(&target).await?;
            let mut client = PlegClient::new(channel.clone());
            let share =
                |total: usize| total / scale.channels + usize::from(c < total % scale.channels);
            for _ in 0..share(scale.watches) {
                let stream = client
                    .watch(pb::WatchRequest::default())
                    .await
                    .context("a Watch stream before the abuse")?;
                held.push(Box::new(stream));
            }
            for _ in 0..share(scale.syncs) {
                let stream = client
                    .sync_pods(pb::SyncPodsRequest {
                        initial: true,
                        ..Default::default()
                    })
                    .await
                    .context("a SyncPods stream before the abuse")?;
                held.push(Box::new(stream));
            }
            held.push(Box::new(channel));
        }

        let counts = Arc::new(Counts::default());
        let mut flood = JoinSet::new();
        let mut jitter = Jitter::new(0x48);
        for i in 0..scale.handshakes {
            let source = match i % 2 {
                0 => Ipv4Addr::new(127, 0, 1, 1),
                _ => Ipv4Addr::new(127, 0, 1, 2 + (i / 2 % usize::from(scale.crowd)) as u8),
            };
            let header = i % 4 < 2;
            flood.spawn(handshaker(source, target.tls, header, Arc::clone(&counts)));
        }
        for i in 0..scale.garbage {
            let opening = if i % 2 == 0 {
                (0..64).map(|_| jitter.pick(256) as u8).collect()
            } else {
                PREFACE.to_vec()
            };
            flood.spawn(garbler(target.socket.clone(), opening, Arc::clone(&counts)));
        }

        let (stop_monitor, stopped) = tokio::sync::watch::channel(false);
        let monitor = tokio::spawn(monitor(target.clone(), began, health, stopped));
        let probe = tokio::spawn(probe(target.socket.clone()));
        Ok(Self {
            target,
            began,
            before,
            flood,
            counts,
            held,
            never_read: scale.watches + scale.syncs,
            monitor,
            stop_monitor,
            probe,
        })
    }

    /// Ends the abuse and waits (bounded) for plegd's descriptors to come back.
    pub async fn stop(mut self) -> anyhow::Result<Report> {
        let (new_watcher, wrong_statuses) = self.probe.await?;
        self.flood.shutdown().await;
        drop(std::mem::take(&mut self.held));
        let ended = Instant::now();
        let settled = loop {
            if open_fds(self.target.pid) <= self.before.fds + FD_SLACK {
                break true;
            }
            if ended.elapsed() > SETTLE_WITHIN {
                break false;
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        };
        let settled_in = ended.elapsed();
        let health = health_client(&self.target.socket).await?;
        let after = sample(&self.target, self.began, &health).await;
        let _ = self.stop_monitor.send(true);
        let samples = self.monitor.await?;
        let mut counted = BTreeMap::new();
        for family in ["plegd_api_refused_total", "plegd_api_closed_total"] {
            for (labels, value) in metric_series_at(self.target.metrics, family)? {
                counted.insert(format!("{family}{labels}"), value);
            }
        }
        Ok(Report {
            before: self.before,
            samples,
            after,
            settled_in,
            settled,
            opened: self.counts.opened.load(Ordering::Relaxed),
            closed_by_plegd: self.counts.closed.load(Ordering::Relaxed),
            failed_connects: self.counts.failed.load(Ordering::Relaxed),
            never_read: self.never_read,
            counted,
            wrong_statuses,
            new_watcher,
        })
    }
}

impl Report {
    pub fn peak_fds(&self) -> usize {
        self.samples.iter().map(|s| s.fds).max().unwrap_or(0)
    }

    pub fn peak_rss(&self) -> u64 {
        self.samples.iter().map(|s| s.rss).max().unwrap_or(0)
    }

    /// What went wrong, judged against `memory_max` (the unit's MemoryMax): empty when plegd
    /// held.
    pub fn problems(&self, memory_max: u64) -> Vec<String> {
        let mut problems = Vec::new();
        for sample in &self.samples {
            if let Err(e) = &sample.health {
                problems.push(format!(
                    "at {:.1} s plegd's health was not ok: {e}",
                    sample.at.as_secs_f64()
                ));
            }
        }
        if self.peak_rss() >= memory_max {
            problems.push(format!(
                "RSS reached {} MiB, the unit's MemoryMax is {} MiB",
                self.peak_rss() >> 20,
                memory_max >> 20
            ));
        }
        if !self.settled {
            problems.push(format!(
                "descriptors {} {:.0} s after the abuse, {} before it",
                self.after.fds,
                self.settled_in.as_secs_f64(),
                self.before.fds
            ));
        }
        if let Err(e) = &self.new_watcher {
            problems.push(format!("a new watcher during the abuse: {e}"));
        }
        if self.closed_by_plegd == 0 {
            problems.push("plegd closed none of the flood's connections".to_owned());
        }
        // What plegd must have counted: handshakes that never finished on the TLS port,
        // garbage and bare prefaces on the socket, and the flood past the TLS listener's caps.
        for (family, listener, reason) in [
            ("plegd_api_closed_total", "tls", "no-call"),
            ("plegd_api_closed_total", "unix", "no-call"),
            ("plegd_api_refused_total", "tls", "listener-full"),
            ("plegd_api_refused_total", "tls", "peer-full"),
        ] {
            let counted = self.counted.iter().any(|(key, value)| {
                key.starts_with(family)
                    && key.contains(&format!("listener=\"{listener}\""))
                    && key.contains(&format!("reason=\"{reason}\""))
                    && *value > 0.0
            });
            if !counted {
                problems.push(format!(
                    "plegd counted no {family} on {listener} for {reason}: {:?}",
                    self.counted
                ));
            }
        }
        problems.extend(self.wrong_statuses.iter().cloned());
        problems
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
        writeln!(
            f,
            "abuse: descriptors {} before, {} at most during, {} after ({:.1} s after the end); \
             RSS {:.1} / {:.1} / {:.1} MiB",
            self.before.fds,
            self.peak_fds(),
            self.after.fds,
            self.settled_in.as_secs_f64(),
            mib(self.before.rss),
            mib(self.peak_rss()),
            mib(self.after.rss),
        )?;
        writeln!(
            f,
            "abuse: flood opened {} connections, plegd closed {}, {} attempts failed; {} streams \
             never read; health ok in {} of {} samples",
            self.opened,
            self.closed_by_plegd,
            self.failed_connects,
            self.never_read,
            self.samples.iter().filter(|s| s.health.is_ok()).count(),
            self.samples.len(),
        )?;
        let (first, last) = (
            self.samples.first().unwrap_or(&self.before),
            self.samples.last().unwrap_or(&self.after),
        );
        let busy = (last.cpu.saturating_sub(first.cpu)).as_secs_f64()
            / (last.at.saturating_sub(first.at)).as_secs_f64().max(1e-3);
        writeln!(
            f,
            "abuse: plegd's CPU {:.0} % of a core while abused; it counted {:?}",
            busy * 100.0,
            self.counted
        )?;
        match &self.new_watcher {
            Ok(joined) => write!(
                f,
                "abuse: a new watcher connected in {:.1} ms, first event after {:.1} ms",
                joined.connected.as_secs_f64() * 1e3,
                joined.first_event.as_secs_f64() * 1e3
            ),
            Err(e) => write!(f, "abuse: a new watcher failed: {e}"),
        }
    }
}

/// HTTP/2's connection preface, and nothing after it (no SETTINGS).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A TLS handshake record's header announcing 512 bytes that never come.
const TLS_HEADER: [u8; 5] = [0x16, 0x03, 0x01, 0x02, 0x00];

/// One flooder of the TLS port: connects from `source`, sends `TLS_HEADER` if `header`, then
/// waits for plegd to close, and again, until aborted.
async fn handshaker(source: Ipv4Addr, to: SocketAddr, header: bool, counts: Arc<Counts>) {
    loop {
        let connected = async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::from((source, 0)))?;
            socket.connect(to).await
        };
        match connected.await {
            Ok(mut stream) => {
                counts.opened.fetch_add(1, Ordering::Relaxed);
                if header {
                    let _ = stream.write_all(&TLS_HEADER).await;
                }
                held_until_closed(&mut stream, &counts).await;
            }
            Err(_) => {
                counts.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
}

/// One flooder of the unix socket: connects, sends `opening`, waits for plegd to close, and
/// again, until aborted.
async fn garbler(socket: PathBuf, opening: Vec<u8>, counts: Arc<Counts>) {
    loop {
        match tokio::net::UnixStream::connect(&socket).await {
            Ok(mut stream) => {
                counts.opened.fetch_add(1, Ordering::Relaxed);
                let _ = stream.write_all(&opening).await;
                held_until_closed(&mut stream, &counts).await;
            }
            Err(_) => {
                counts.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
}

/// Reads (and ignores) what plegd sends until it closes the connection.
async fn held_until_closed(stream: &mut (impl tokio::io::AsyncRead + Unpin), counts: &Counts) {
    let mut buffer = [0u8; 1024];
    while let Ok(n) = stream.read(&mut buffer).await {
        if n == 0 {
            break;
        }
    }
    counts.closed.fetch_add(1, Ordering::Relaxed);
}

/// Samples plegd every [`SAMPLE_EVERY`] until told to stop.
async fn monitor(
    target: Target,
    began: Instant,
    health: PlegClient<Channel>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    loop {
        samples.push(sample(&target, began, &health).await);
        tokio::select! {
            _ = stopped.changed() => return samples,
            () = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
}

async fn sample(target: &Target, began: Instant, health: &PlegClient<Channel>) -> Sample {
    let mut request = tonic::Request::new(pb::GetHealthRequest {});
    request.set_timeout(CALL_TIMEOUT);
    let health = match health.clone().get_health(request).await {
        Ok(h) if h.get_ref().healthy => Ok(()),
        Ok(h) => Err(format!("unhealthy: {}", h.get_ref().message)),
        Err(status) => Err(format!("GetHealth: {status}")),
    };
    Sample {
        at: began.elapsed(),
        fds: open_fds(target.pid),
        rss: rss_bytes(target.pid),
        cpu: cpu_time(target.pid),
        health,
    }
}

/// A new watcher during the abuse, then the requests no client should send; what they met.
async fn probe(socket: PathBuf) -> (Result<Joined, String>, Vec<String>) {
    tokio::time::sleep(NEW_WATCHER_AFTER).await;
    let joined = new_watcher(&socket).await;
    let wrong = match health_client(&socket).await {
        Ok(client) => wrong_statuses(client).await,
        Err(e) => vec![format!("bad requests: no channel: {e:#}")],
    };
    (joined, wrong)
}

/// Dials the unix socket, watches, and waits for the first event (the churn makes them).
async fn new_watcher(socket: &Path) -> Result<Joined, String> {
    let dialed = Instant::now();
    let endpoint = Endpoint::from_static("http://[::]:50051").connect_timeout(CALL_TIMEOUT);
    let channel = crate::unix_channel_with(socket, endpoint)
        .await
        .map_err(|e| format!("dial: {e}"))?;
    let mut request = tonic::Request::new(pb::WatchRequest::default());
    request.set_timeout(Duration::from_secs(120));
    let mut events = tokio::time::timeout(CALL_TIMEOUT, PlegClient::new(channel).watch(request))
        .await
        .map_err(|_| "Watch did not answer within 5 s".to_owned())?
        .map_err(|status| format!("Watch: {status}"))?
        .into_inner();
    let connected = dialed.elapsed();
    match tokio::time::timeout(Duration::from_secs(60), events.message()).await {
        Ok(Ok(Some(_))) => Ok(Joined {
            connected,
            first_event: dialed.elapsed(),
        }),
        Ok(Ok(None)) => Err("the stream ended before an event".to_owned()),
        Ok(Err(status)) => Err(format!("stream: {status}")),
        Err(_) => Err("no event within 60 s".to_owned()),
    }
}

/// Requests no client should send, each with the status it must get; those that did not.
async fn wrong_statuses(client: PlegClient<Channel>) -> Vec<String> {
    let mut request = tonic::Request::new(pb::ListPodsRequest {});
    request.set_timeout(CALL_TIMEOUT);
    let run_id = match client.clone().list_pods(request).await {
        Ok(listing) => listing.into_inner().run_id,
        Err(status) => return vec![format!("ListPods: {status}")],
    };
    let watches = [
        (
            "a 5 MiB pod name",
            pb::WatchRequest {
                pod_name: "n".repeat(5 << 20),
                ..Default::default()
            },
            Code::ResourceExhausted,
        ),
        (
            "sequence 2^64-1",
            pb::WatchRequest {
                from_sequence: u64::MAX,
                ..Default::default()
            },
            Code::OutOfRange,
        ),
        (
            "a foreign run id",
            pb::WatchRequest {
                from_sequence: 1,
                run_id: run_id.wrapping_add(1),
                ..Default::default()
            },
            Code::OutOfRange,
        ),
        (
            "event type 999",
            pb::WatchRequest {
                types: vec![999],
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
    ];
    let mut wrong = Vec::new();
    for (what, request, expected) in watches {
        let mut request = tonic::Request::new(request);
        request.set_timeout(CALL_TIMEOUT);
        let code = match client.clone().watch(request).await {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        if code != expected {
            wrong.push(format!("Watch with {what}: {code:?}, not {expected:?}"));
        }
    }
    let mut request = tonic::Request::new(pb::GetPodStatusRequest {
        pod_uid: "../../etc/passwd\0x".to_owned(),
    });
    request.set_timeout(CALL_TIMEOUT);
    match client.clone().get_pod_status(request).await {
        Err(status) if status.code() == Code::NotFound => {}
        Err(status) => wrong.push(format!("GetPodStatus of ../ and NUL: {status}")),
        Ok(_) => wrong.push("GetPodStatus of ../ and NUL: a pod".to_owned()),
    }
    wrong
}

/// A client on the unix socket whose calls each end within [`CALL_TIMEOUT`] (a plegd out of
/// descriptors accepts nothing: a call must not wait forever).
async fn health_client(socket: &Path) -> anyhow::Result<PlegClient<Channel>> {
    let endpoint = Endpoint::from_static("http://[::]:50051")
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT);
    Ok(PlegClient::new(
        crate::unix_channel_with(socket, endpoint)
            .await
            .with_context(|| format!("dialing {}", socket.display()))?,
    ))
}

async fn tls_channel(target: &Target) -> anyhow::Result<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&target.ca_pem))
        .identity(Identity::from_pem(&target.client.0, &target.client.1))
        .domain_name("localhost");
    Endpoint::from_shared(format!("https://127.0.0.1:{}", target.tls.port()))?
        .connect_timeout(CALL_TIMEOUT)
        .tls_config(tls)?
        .connect()
        .await
        .context("an mTLS channel to plegd")
}

/// Descriptors `pid` holds open.
pub fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// The flood holds well over a thousand sockets: this process's soft limit goes to its hard
/// one.
fn raise_own_nofile() -> anyhow::Result<()> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).context("raising RLIMIT_NOFILE")?;
    Ok(())
}
