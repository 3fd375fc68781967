//! `plegd run` configuration: flags, `PLEGD_*` environment variables and an optional TOML file,
//! in that order of precedence, over built-in defaults.
//!
//! Each setting is defined once, as a field of [`RunArgs`]: its flag and environment variable
//! (clap), its file key (serde, the flag's name) and its default (clap's `default_value`, which
//! `plegd run --help` shows). The layers are merged without a config crate: clap already does
//! flag over environment over default and reports where each value came from
//! ([`ArgMatches::value_source`]), so [`RunArgs::given`] keeps only what a flag or variable gave,
//! the file deserializes into the same struct (toml reports line and column), and
//! [`Config::load`] takes each setting from the first layer that has it. A layered config crate
//! (figment) would add a dependency and a second toml version, and would report a file's type
//! errors without their line and column.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

pub mod fit;

use clap::{
    ArgMatches, Args, FromArgMatches as _, ValueEnum, builder::TypedValueParser as _,
    parser::ValueSource,
};
use serde::{Deserialize, Deserializer};

pub use crate::output::OutputFormat;
use crate::{
    pleg::{
        DEFAULT_EVENT_CHANNEL_CAPACITY, DEFAULT_INSPECT_CONCURRENCY, DEFAULT_RELIST_PERIOD,
        DEFAULT_RELIST_THRESHOLD, DEFAULT_RESYNC_INTERVAL, Store,
    },
    runtime::{
        DEFAULT_CALL_TIMEOUT, DEFAULT_POD_METADATA_MAX_BYTES, Keys, MAX_POD_METADATA_MAX_BYTES,
        PodMetadata, RuntimeKind,
    },
};

/// The values of `--confirm`: each store, and what confirming there means.
fn stores() -> [clap::builder::PossibleValue; 2] {
    [
        clap::builder::PossibleValue::new("task").help(
            "The runtime's task service where it has one (containerd: its `/tasks/start` and \
         `/tasks/exit` events, or the task's status on a kernel hint), about 30 ms before its \
         CRI store shows the change; the CRI store elsewhere (CRI-O)",
        ),
        clap::builder::PossibleValue::new("cri")
            .help("The CRI store only: every event announces a state that CRI already shows"),
    ]
}

/// Default directory of the run saved at a clean shutdown.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/plegd";

/// Default path of the API socket.
pub const DEFAULT_SOCKET: &str = "/run/plegd/plegd.sock";

/// Full relist period while a push source is connected.
pub const DEFAULT_SLOW_RELIST_PERIOD: Duration = Duration::from_secs(30);

/// `--api-max-connections`: each listener's connections, far more than a node's agents use.
pub const DEFAULT_API_MAX_CONNECTIONS: usize = 512;
/// `--api-max-connections-per-peer`: a peer's share of a listener's connections.
pub const DEFAULT_API_MAX_CONNECTIONS_PER_PEER: usize = 128;
/// `--api-max-streams-per-peer`: a peer's RPCs in flight (each never-reading watcher holds up
/// to `--watch-queue` events: this bounds what one peer can pin).
pub const DEFAULT_API_MAX_STREAMS_PER_PEER: usize = 256;

/// Whether plegd uses its kernel probes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Load the eBPF probes; if this kernel cannot (no BTF, no privilege, verifier), say why
    /// once and run without them.
    #[default]
    Auto,
    /// The eBPF probes are required: fail at start with the reason if they cannot load.
    Ebpf,
    /// No push source at all: the periodic full relist only, as kubelet does.
    Polling,
}

/// A trigger source, as `--sources` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceName {
    /// Kernel tracepoints.
    Ebpf,
    /// containerd's event stream (Events.Subscribe).
    Containerd,
    /// CRI GetContainerEvents.
    CriEvents,
    /// The periodic full relist: always on, accepted so `--sources relist` says "polling only".
    Relist,
}

impl SourceName {
    /// The sources that can be turned off. Which run by default depends on the runtime
    /// ([`fit::choose`]): on containerd, not `cri-events`.
    pub const PUSH: [Self; 3] = [Self::Ebpf, Self::Containerd, Self::CriEvents];
}

impl Config {
    /// Whether `source` is enabled (the relist always is).
    pub fn source_enabled(&self, source: SourceName) -> bool {
        source == SourceName::Relist || self.sources.contains(&source)
    }

    /// What `--sources` and `--allow-shared-cri-events` ask for, for [`fit::choose`].
    pub fn source_request(&self) -> fit::Request {
        fit::Request {
            sources: self.sources.iter().copied().collect(),
            given: self.sources_given,
            allow_shared_cri_events: self.allow_shared_cri_events,
        }
    }

    /// These settings with the push sources `plan` chose for the runtime: only those run.
    #[must_use]
    pub fn with_plan(mut self, plan: &fit::Plan) -> Self {
        self.sources = plan.on.iter().copied().collect();
        self
    }
}

/// How logs are written to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Settings of `plegd run`: each is a flag, a `PLEGD_*` variable and a key of the file. `None`:
/// not given at this layer (flags and environment, or the file); clap's defaults are the last
/// layer, see [`Config::load`].
#[derive(Clone, Debug, Default, Args, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct RunArgs {
    /// TOML file with any of the settings below (keys are the flag names, e.g.
    /// `relist-period = "1s"`). Flags and environment variables override it.
    #[arg(long, env = "PLEGD_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Runtime API to read state from: `cri` (any CRI runtime: containerd, CRI-O) or
    /// `containerd` (containerd's own API, also sees containers not made through CRI).
    #[arg(
        long,
        env = "PLEGD_RUNTIME",
        value_name = "cri|containerd",
        default_value = "cri"
    )]
    #[serde(deserialize_with = "from_str")]
    pub runtime: Option<RuntimeKind>,

    /// Runtime socket (`unix:///run/containerd/containerd.sock` or a plain path). [default:
    /// the first that exists of /run/containerd/containerd.sock, /run/crio/crio.sock, ...]
    #[arg(long, env = "PLEGD_RUNTIME_ENDPOINT", value_name = "SOCKET")]
    pub runtime_endpoint: Option<String>,

    /// containerd namespaces to watch with `--runtime containerd`, comma separated.
    #[arg(
        long,
        env = "PLEGD_NAMESPACES",
        value_delimiter = ',',
        value_name = "NS,...",
        default_value = "k8s.io"
    )]
    pub namespaces: Option<Vec<String>>,

    /// Pod labels to carry on events and pod statuses, comma separated; `*` for all. They
    /// come with the runtime's listing of the pod's sandbox (no call more per event).
    /// [default: none]
    #[arg(
        long,
        env = "PLEGD_POD_LABELS",
        value_delimiter = ',',
        value_name = "KEY,..."
    )]
    pub pod_labels: Option<Vec<String>>,

    /// Pod annotations to carry on events and pod statuses, comma separated; `*` for all
    /// (`--runtime cri` only: containerd's own API does not show them). [default: none]
    #[arg(
        long,
        env = "PLEGD_POD_ANNOTATIONS",
        value_delimiter = ',',
        value_name = "KEY,..."
    )]
    pub pod_annotations: Option<Vec<String>>,

    /// Bytes (keys and values) the labels and annotations kept of one pod carry together at
    /// most: every event and pod status carries a copy. Labels first, then annotations, each in
    /// key order, are kept whole while they fit; those that do not are left out, and the map
    /// that lost some gets the entry `plegd.io/truncated` saying how many
    /// (plegd_pod_metadata_truncated_total counts it).
    #[arg(
        long,
        env = "PLEGD_POD_METADATA_MAX_BYTES",
        value_name = "BYTES",
        default_value = DEFAULT_POD_METADATA_MAX_BYTES.to_string()
    )]
    pub pod_metadata_max_bytes: Option<usize>,

    /// Period of the full relist.
    #[arg(
        long,
        env = "PLEGD_RELIST_PERIOD",
        value_parser = parse_duration,
        value_name = "DURATION",
        default_value = human(DEFAULT_RELIST_PERIOD)
    )]
    #[serde(deserialize_with = "duration")]
    pub relist_period: Option<Duration>,

    /// Period of the full relist while at least one push source (eBPF, containerd events, CRI
    /// events) is connected: the safety net, slowed.
    #[arg(
        long,
        env = "PLEGD_SLOW_RELIST_PERIOD",
        value_parser = parse_duration,
        value_name = "DURATION",
        default_value = human(DEFAULT_SLOW_RELIST_PERIOD)
    )]
    #[serde(deserialize_with = "duration")]
    pub slow_relist_period: Option<Duration>,

    /// Push sources to use, comma separated: `ebpf`, `containerd` (containerd's event stream),
    /// `cri-events` (CRI GetContainerEvents). The periodic full relist always runs; `relist`
    /// alone means polling only. The default fits the runtime: on containerd `ebpf,containerd`
    /// (its own event stream serves; CRI events would only duplicate it), elsewhere (CRI-O)
    /// `ebpf,cri-events`. `cri-events` on containerd before 2.0 is refused: there every
    /// GetContainerEvents subscriber takes events from the others (containerd #7318); see
    /// --allow-shared-cri-events. [default: ebpf,containerd,cri-events, fitted to the runtime]
    #[arg(
        long,
        env = "PLEGD_SOURCES",
        value_enum,
        value_delimiter = ',',
        value_name = "SOURCE,...",
        default_value = "ebpf,containerd,cri-events",
        hide_default_value = true
    )]
    pub sources: Option<Vec<SourceName>>,

    /// Subscribe to CRI GetContainerEvents (`--sources ...,cri-events`) even on containerd
    /// before 2.0, which serves it from one channel shared by every subscriber: plegd then
    /// takes events from kubelet's evented PLEG, Falco and any other subscriber there
    /// (containerd #7318, fixed in 2.0). Only for a node where plegd is the only subscriber.
    #[arg(
        long,
        env = "PLEGD_ALLOW_SHARED_CRI_EVENTS",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL",
        default_value = "false"
    )]
    pub allow_shared_cri_events: Option<bool>,

    /// `auto` uses the eBPF probes when this kernel can load them, `ebpf` requires them,
    /// `polling` turns every push source off (relist only).
    #[arg(long, env = "PLEGD_MODE", value_enum, default_value = "auto")]
    pub mode: Option<Mode>,

    /// The PLEG is unhealthy when no full relist succeeded for this long.
    #[arg(
        long,
        env = "PLEGD_RELIST_THRESHOLD",
        value_parser = parse_duration,
        value_name = "DURATION",
        default_value = human(DEFAULT_RELIST_THRESHOLD)
    )]
    #[serde(deserialize_with = "duration")]
    pub relist_threshold: Option<Duration>,

    /// Deadline of each runtime call.
    #[arg(
        long,
        env = "PLEGD_RUNTIME_TIMEOUT",
        value_parser = parse_duration,
        value_name = "DURATION",
        default_value = human(DEFAULT_CALL_TIMEOUT)
    )]
    #[serde(deserialize_with = "duration")]
    pub runtime_timeout: Option<Duration>,

    /// Every pod is synced to the API's sync watchers at least this often (a `resync`), even
    /// without events: kubelet's --sync-frequency.
    #[arg(
        long,
        env = "PLEGD_SYNC_FREQUENCY",
        value_parser = parse_duration,
        value_name = "DURATION",
        default_value = human(DEFAULT_RESYNC_INTERVAL)
    )]
    #[serde(deserialize_with = "duration")]
    pub sync_frequency: Option<Duration>,

    /// Events stdout, the sync loop and the OTLP exporter may fall behind before their lag
    /// policy applies (stdout and the exporter catch up from the event history; the sync loop
    /// resyncs every pod and counts the skipped events as discarded). The relist never waits
    /// or drops.
    #[arg(
        long,
        env = "PLEGD_EVENT_CHANNEL_CAPACITY",
        value_name = "N",
        default_value = DEFAULT_EVENT_CHANNEL_CAPACITY.to_string()
    )]
    pub event_channel_capacity: Option<usize>,

    /// Pod inspections in flight at once during a relist.
    #[arg(
        long,
        env = "PLEGD_INSPECT_CONCURRENCY",
        value_name = "N",
        default_value = DEFAULT_INSPECT_CONCURRENCY.to_string()
    )]
    pub inspect_concurrency: Option<usize>,

    /// Also emit ContainerChanged (a container became unknown or created), which kubelet
    /// computes but does not send. A death's reason corrected by the CRI store is sent as a
    /// ContainerChanged either way.
    #[arg(
        long,
        env = "PLEGD_EMIT_CHANGED",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL",
        default_value = "false"
    )]
    pub emit_changed: Option<bool>,

    /// Which of the runtime's stores confirms a start or an exit: `task` sends ContainerDied
    /// as soon as containerd's task service recorded the exit, with its code, time and the
    /// reason CRI will show (by containerd's rule; should CRI show another, a
    /// ContainerChanged says so); `cri` waits until the CRI store shows it, for consumers
    /// that read CRI right after each event.
    #[arg(
        long,
        env = "PLEGD_CONFIRM",
        value_name = "STORE",
        value_parser = clap::builder::PossibleValuesParser::new(stores())
            .map(|name| name.parse::<Store>().expect("a possible value names a store")),
        default_value = "task"
    )]
    pub confirm: Option<Store>,

    /// Event output on stdout.
    #[arg(long, env = "PLEGD_OUTPUT", value_enum, default_value = "text")]
    pub output: Option<OutputFormat>,

    /// Log format on stderr (level from RUST_LOG, default info).
    #[arg(long, env = "PLEGD_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: Option<LogFormat>,

    /// Unix socket of the plegd.v1 gRPC API (and grpc.health.v1). Its mode follows
    /// --api-allow-uids and --api-allow-gids: 0600 in a 0700 directory for plegd's own user
    /// only, 0660 (and 0710) owned by the group when one gid is allowed, 0666 (and 0711) when
    /// other uids or several gids are, each connection being checked anyway.
    #[arg(long, env = "PLEGD_SOCKET", value_name = "PATH", default_value = DEFAULT_SOCKET)]
    pub socket: Option<PathBuf>,

    /// Uids allowed to use the API socket (SO_PEERCRED), comma separated.
    #[arg(
        long,
        env = "PLEGD_API_ALLOW_UIDS",
        value_delimiter = ',',
        value_name = "UID,...",
        default_value = "0"
    )]
    pub api_allow_uids: Option<Vec<u32>>,

    /// Gids allowed to use the API socket, comma separated: a client whose effective
    /// (primary) gid is one of them; supplementary groups do not count. [default: none]
    #[arg(
        long,
        env = "PLEGD_API_ALLOW_GIDS",
        value_delimiter = ',',
        value_name = "GID,..."
    )]
    pub api_allow_gids: Option<Vec<u32>>,

    /// Also serve the API on this TCP address, with TLS (needs --tls-cert and --tls-key, and
    /// --tls-client-ca or --tls-allow-unauthenticated-clients). [default: off]
    #[arg(long, env = "PLEGD_LISTEN", value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,

    /// PEM certificate (chain) of the TLS listener.
    #[arg(long, env = "PLEGD_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of the TLS listener.
    #[arg(long, env = "PLEGD_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificate(s): TLS clients must present a certificate it signed (mutual TLS).
    /// --listen needs it, unless --tls-allow-unauthenticated-clients.
    #[arg(long, env = "PLEGD_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,

    /// Serve the TLS listener (--listen) without --tls-client-ca: every client that reaches
    /// the port, with no certificate, may then watch every pod's events and read every pod's
    /// status. plegd says so at start (a warning) and in `plegd check`. Without this, --listen
    /// without --tls-client-ca is refused. No effect with --tls-client-ca.
    #[arg(
        long,
        env = "PLEGD_TLS_ALLOW_UNAUTHENTICATED_CLIENTS",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL",
        default_value = "false"
    )]
    pub tls_allow_unauthenticated_clients: Option<bool>,

    /// Serve Prometheus /metrics, /healthz and /readyz over HTTP on this address, e.g.
    /// 127.0.0.1:9809. [default: off]
    #[arg(long, env = "PLEGD_METRICS_ADDRESS", value_name = "ADDR:PORT")]
    pub metrics_address: Option<SocketAddr>,

    /// Also send every event as an OpenTelemetry log record to this OTLP/gRPC receiver (an
    /// OpenTelemetry Collector): `http://HOST:PORT`, or `https://HOST:PORT` with
    /// --otlp-tls-ca. A receiver out of reach costs plegd nothing but the events that fall
    /// out of --event-history meanwhile, oldest first (plegd_otlp_dropped_total). [default:
    /// off]
    #[arg(long, env = "PLEGD_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// PEM CA certificate(s) that signed the OTLP receiver's certificate (https endpoints).
    #[arg(long, env = "PLEGD_OTLP_TLS_CA", value_name = "FILE")]
    pub otlp_tls_ca: Option<PathBuf>,

    /// PEM client certificate (chain) plegd presents to an https OTLP receiver that asks for
    /// one (with --otlp-tls-key).
    #[arg(long, env = "PLEGD_OTLP_TLS_CERT", value_name = "FILE")]
    pub otlp_tls_cert: Option<PathBuf>,

    /// PEM private key of --otlp-tls-cert.
    #[arg(long, env = "PLEGD_OTLP_TLS_KEY", value_name = "FILE")]
    pub otlp_tls_key: Option<PathBuf>,

    /// Directory where a clean shutdown saves the last reading of the runtime and the event
    /// history, so the next start continues the same run: only what changed meanwhile becomes
    /// events, and watchers resume where they were. `none`: off.
    #[arg(
        long,
        env = "PLEGD_STATE_DIR",
        value_name = "DIR",
        default_value = DEFAULT_STATE_DIR
    )]
    pub state_dir: Option<PathBuf>,

    /// Events kept for watchers that reconnect and resume.
    #[arg(
        long,
        env = "PLEGD_EVENT_HISTORY",
        value_name = "N",
        default_value = crate::base::bus::DEFAULT_EVENT_HISTORY.to_string()
    )]
    pub event_history: Option<usize>,

    /// Bytes the events kept for resuming may hold together, about (the oldest go first): a
    /// history of the largest events (--pod-metadata-max-bytes of labels and annotations
    /// each) stays this small, at fewer than --event-history events
    /// (plegd_event_history_byte_evictions_total counts them).
    #[arg(
        long,
        env = "PLEGD_EVENT_HISTORY_BYTES",
        value_name = "BYTES",
        default_value = crate::base::bus::DEFAULT_EVENT_HISTORY_BYTES.to_string()
    )]
    pub event_history_bytes: Option<usize>,

    /// Events queued per watcher; a watcher that falls further behind is ended as lagged.
    #[arg(
        long,
        env = "PLEGD_WATCH_QUEUE",
        value_name = "N",
        default_value = crate::base::bus::DEFAULT_WATCH_QUEUE.to_string()
    )]
    pub watch_queue: Option<usize>,

    /// Connections each API listener (the unix socket, the TLS port) holds at once; later ones
    /// are closed at accept, counted in plegd_api_refused_total. All listeners together hold
    /// no more than the open-file limit less the 256 descriptors plegd keeps for itself.
    #[arg(
        long,
        env = "PLEGD_API_MAX_CONNECTIONS",
        value_name = "N",
        default_value = DEFAULT_API_MAX_CONNECTIONS.to_string()
    )]
    pub api_max_connections: Option<usize>,

    /// Connections one peer (a uid on the unix socket, an address on the TLS port) holds at
    /// once on a listener.
    #[arg(
        long,
        env = "PLEGD_API_MAX_CONNECTIONS_PER_PEER",
        value_name = "N",
        default_value = DEFAULT_API_MAX_CONNECTIONS_PER_PEER.to_string()
    )]
    pub api_max_connections_per_peer: Option<usize>,

    /// RPCs (watches, syncs, calls) one peer has in flight at once on a listener; more are
    /// answered RESOURCE_EXHAUSTED.
    #[arg(
        long,
        env = "PLEGD_API_MAX_STREAMS_PER_PEER",
        value_name = "N",
        default_value = DEFAULT_API_MAX_STREAMS_PER_PEER.to_string()
    )]
    pub api_max_streams_per_peer: Option<usize>,

    /// Size in bytes of the eBPF ring buffer that carries kernel events to plegd: a power of
    /// two and a multiple of the page size. Events that find it full are counted
    /// (plegd_ringbuf_drops_total) and followed by a full relist.
    #[arg(
        long,
        env = "PLEGD_EBPF_RING_BYTES",
        value_name = "BYTES",
        default_value = crate::sources::ebpf::DEFAULT_RING_BYTES.to_string()
    )]
    pub ebpf_ring_bytes: Option<u32>,

    /// How often plegd publishes a heartbeat of its own on containerd's event service (topic
    /// `/plegd/heartbeat`, namespace `plegd`: every other subscriber of containerd's events
    /// sees it) and expects to read it back on its subscription: a heartbeat not back before
    /// the next one is due declares the stream silent (it is reconnected, and full relists run
    /// at the fast period meanwhile). `0` turns it off: plegd publishes nothing, and a stream
    /// that falls silent while connected is found only by the full relists.
    #[arg(
        long,
        env = "PLEGD_EVENT_HEARTBEAT",
        value_parser = parse_duration,
        value_name = "DURATION",
        default_value = human(crate::sources::containerd_events::DEFAULT_HEARTBEAT)
    )]
    #[serde(deserialize_with = "duration")]
    pub event_heartbeat: Option<Duration>,
}

impl RunArgs {
    /// The settings a flag or an environment variable gave in `matches` (`plegd run`'s), the
    /// others `None`: clap fills in its defaults, which must not hide the file's values.
    pub fn given(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut given = matches.clone();
        for id in matches.ids() {
            if matches.value_source(id.as_str()) == Some(ValueSource::DefaultValue) {
                // Cannot fail: the id is one of these matches'.
                let _ = given.try_clear_id(id.as_str());
            }
        }
        Self::from_arg_matches_mut(&mut given)
    }

    /// clap's defaults, as `plegd run --help` shows them, and nothing else.
    fn defaults() -> Self {
        let command = Self::augment_args(clap::Command::new("plegd-run"))
            .mut_args(|arg| arg.env(None::<&'static str>));
        command
            .try_get_matches_from(["plegd-run"])
            .and_then(|matches| Self::from_arg_matches(&matches))
            .expect("the defaults of plegd run parse")
    }
}

/// The limits of one API listener (`--api-max-*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiLimits {
    /// Connections held at once.
    pub connections: usize,
    /// Connections held at once by one peer.
    pub connections_per_peer: usize,
    /// RPCs in flight at once for one peer, over all its connections.
    pub streams_per_peer: usize,
}

/// Where and how events are exported over OTLP (`--otlp-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpConfig {
    /// `http://HOST:PORT` or `https://HOST:PORT`, checked.
    pub endpoint: String,
    /// With https: the CA that signed the receiver's certificate.
    pub ca: Option<PathBuf>,
    /// A client certificate and its key, for receivers that ask for one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl OtlpConfig {
    /// Whether the endpoint is reached over TLS.
    pub fn tls(&self) -> bool {
        self.endpoint.starts_with("https://")
    }

    fn resolve(
        endpoint: Option<String>,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> Result<Option<Self>, ConfigError> {
        let Some(endpoint) = endpoint.filter(|e| !e.is_empty()) else {
            return match (&ca, &cert, &key) {
                (None, None, None) => Ok(None),
                _ => Err(ConfigError::Otlp(
                    "otlp-tls-ca, otlp-tls-cert and otlp-tls-key need otlp-endpoint".into(),
                )),
            };
        };
        let invalid = |why: &str| ConfigError::Otlp(format!("otlp-endpoint {endpoint:?}: {why}"));
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(invalid("give http://HOST:PORT or https://HOST:PORT")),
        };
        if uri.host().is_none_or(str::is_empty) {
            return Err(invalid("no host"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(invalid(
                "OTLP/gRPC takes no path: give http://HOST:PORT or https://HOST:PORT",
            ));
        }
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(ConfigError::Otlp(
                    "otlp-tls-cert and otlp-tls-key go together".into(),
                ));
            }
        };
        if tls && ca.is_none() {
            return Err(invalid(
                "an https endpoint needs otlp-tls-ca (the system's bundle, \
                 /etc/ssl/certs/ca-certificates.crt, for a public CA)",
            ));
        }
        if !tls && (ca.is_some() || identity.is_some()) {
            return Err(invalid(
                "otlp-tls-* settings need an https endpoint: this one is plain http",
            ));
        }
        Ok(Some(Self {
            endpoint: uri.to_string().trim_end_matches('/').to_owned(),
            ca,
            identity,
        }))
    }
}

/// Resolved settings of `plegd run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub runtime: RuntimeKind,
    /// `None`: detect from the well-known sockets.
    pub runtime_endpoint: Option<String>,
    pub namespaces: Vec<String>,
    /// Which of a pod's labels and annotations its records and events carry.
    pub pod_metadata: PodMetadata,
    pub relist_period: Duration,
    pub slow_relist_period: Duration,
    /// Enabled push sources (never [`SourceName::Relist`], which always runs): what was asked
    /// for until [`Config::with_plan`] fits them to the runtime.
    pub sources: BTreeSet<SourceName>,
    /// Whether `--sources` was given (flag, variable or file) rather than defaulted.
    pub sources_given: bool,
    /// `--allow-shared-cri-events`.
    pub allow_shared_cri_events: bool,
    pub mode: Mode,
    pub relist_threshold: Duration,
    pub runtime_timeout: Duration,
    /// How often every pod is resynced.
    pub sync_frequency: Duration,
    pub event_channel_capacity: usize,
    pub inspect_concurrency: usize,
    pub emit_changed: bool,
    pub confirm: Store,
    pub output: OutputFormat,
    pub log_format: LogFormat,
    /// Unix socket of the API.
    pub socket: PathBuf,
    /// Uids and gids of the clients allowed on the unix socket.
    pub api_allow_uids: Vec<u32>,
    pub api_allow_gids: Vec<u32>,
    /// TCP address of the TLS API listener, if any.
    pub listen: Option<SocketAddr>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Client CA for mutual TLS.
    pub tls_client_ca: Option<PathBuf>,
    /// `--tls-allow-unauthenticated-clients`: the TLS listener may serve clients without a
    /// certificate.
    pub tls_allow_unauthenticated_clients: bool,
    /// HTTP address of /metrics, /healthz and /readyz, if any.
    pub metrics_address: Option<SocketAddr>,
    /// Where events are exported over OTLP, if anywhere.
    pub otlp: Option<OtlpConfig>,
    /// Where a clean shutdown saves the run for the next start (`None`: nowhere).
    pub state_dir: Option<PathBuf>,
    /// Events kept for resuming watchers, and the bytes they may hold.
    pub event_history: usize,
    pub event_history_bytes: usize,
    /// Events queued per watcher.
    pub watch_queue: usize,
    /// What each API listener's peers may hold ([`crate::api::admission`]).
    pub api_limits: ApiLimits,
    /// Size of the eBPF ring buffer in bytes.
    pub ebpf_ring_bytes: u32,
    /// Period of the heartbeat on containerd's event stream; zero: no heartbeat.
    pub event_heartbeat: Duration,
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("{key} must be greater than zero")]
    Zero { key: &'static str },
    #[error("{key} must be at most {max}")]
    TooLarge { key: &'static str, max: String },
    #[error(
        "relist-threshold ({threshold}) must be at least twice {period_key} ({period}): \
         full relists that far apart would report the PLEG unhealthy while it works"
    )]
    ThresholdBelowPeriod {
        threshold: String,
        period_key: &'static str,
        period: String,
    },
    #[error(
        "slow-relist-period ({slow}) must not be shorter than relist-period ({period}): \
         it is the period used while a push source is connected, the slower one"
    )]
    SlowPeriodShorter { slow: String, period: String },
    #[error("mode ebpf needs ebpf among the sources")]
    EbpfModeWithoutEbpf,
    #[error("listen needs tls-cert and tls-key: the TCP API is served over TLS only")]
    ListenWithoutTls,
    #[error(
        "listen without tls-client-ca would serve every call (every pod's events and statuses) \
         to any client that reaches the port: give tls-client-ca (clients then need a \
         certificate it signed), or tls-allow-unauthenticated-clients to serve them all"
    )]
    ListenWithoutClientAuth,
    #[error("{0}")]
    Otlp(String),
    #[error("api-allow-uids and api-allow-gids are both empty: no client could use the API")]
    NobodyAllowed,
    #[error(
        "ebpf-ring-bytes must be a power of two and a multiple of the page size ({page} bytes): {bytes} is not"
    )]
    RingSize { bytes: u32, page: u64 },
}

impl Config {
    /// Resolves `args` (flags and environment, already merged by clap, or set by a test) over
    /// the file they name over clap's defaults.
    pub fn load(args: &RunArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => RunArgs::default(),
        };
        Self::resolve(args, file)
    }

    /// A config file's text through the path [`Config::load`] takes (parse, resolve over
    /// the defaults, validate): the fuzz target's entry point, not an API.
    #[doc(hidden)]
    pub fn fuzz_file(text: &str) -> Result<Self, ConfigError> {
        Self::resolve(
            &RunArgs::default(),
            parse_file(Path::new("fuzz.toml"), text)?,
        )
    }

    fn resolve(args: &RunArgs, file: RunArgs) -> Result<Self, ConfigError> {
        let (a, f, d) = (args.clone(), file, RunArgs::defaults());
        let mode = first(a.mode, f.mode, d.mode);
        let sources_given = a.sources.is_some() || f.sources.is_some();
        let config = Self {
            runtime: first(a.runtime, f.runtime, d.runtime),
            runtime_endpoint: a.runtime_endpoint.or(f.runtime_endpoint),
            namespaces: first(a.namespaces, f.namespaces, d.namespaces),
            pod_metadata: PodMetadata {
                labels: Keys::from_list(&a.pod_labels.or(f.pod_labels).unwrap_or_default()),
                annotations: Keys::from_list(
                    &a.pod_annotations.or(f.pod_annotations).unwrap_or_default(),
                ),
                max_bytes: first(
                    a.pod_metadata_max_bytes,
                    f.pod_metadata_max_bytes,
                    d.pod_metadata_max_bytes,
                ),
            },
            relist_period: first(a.relist_period, f.relist_period, d.relist_period),
            slow_relist_period: first(
                a.slow_relist_period,
                f.slow_relist_period,
                d.slow_relist_period,
            ),
            sources: first(a.sources, f.sources, d.sources)
                .into_iter()
                .filter(|s| *s != SourceName::Relist && mode != Mode::Polling)
                .collect(),
            sources_given,
            allow_shared_cri_events: first(
                a.allow_shared_cri_events,
                f.allow_shared_cri_events,
                d.allow_shared_cri_events,
            ),
            mode,
            relist_threshold: first(a.relist_threshold, f.relist_threshold, d.relist_threshold),
            runtime_timeout: first(a.runtime_timeout, f.runtime_timeout, d.runtime_timeout),
            sync_frequency: first(a.sync_frequency, f.sync_frequency, d.sync_frequency),
            event_channel_capacity: first(
                a.event_channel_capacity,
                f.event_channel_capacity,
                d.event_channel_capacity,
            ),
            inspect_concurrency: first(
                a.inspect_concurrency,
                f.inspect_concurrency,
                d.inspect_concurrency,
            ),
            emit_changed: first(a.emit_changed, f.emit_changed, d.emit_changed),
            confirm: first(a.confirm, f.confirm, d.confirm),
            output: first(a.output, f.output, d.output),
            log_format: first(a.log_format, f.log_format, d.log_format),
            socket: first(a.socket, f.socket, d.socket),
            api_allow_uids: first(a.api_allow_uids, f.api_allow_uids, d.api_allow_uids),
            api_allow_gids: a.api_allow_gids.or(f.api_allow_gids).unwrap_or_default(),
            listen: a.listen.or(f.listen),
            tls_cert: a.tls_cert.or(f.tls_cert),
            tls_key: a.tls_key.or(f.tls_key),
            tls_client_ca: a.tls_client_ca.or(f.tls_client_ca),
            tls_allow_unauthenticated_clients: first(
                a.tls_allow_unauthenticated_clients,
                f.tls_allow_unauthenticated_clients,
                d.tls_allow_unauthenticated_clients,
            ),
            metrics_address: a.metrics_address.or(f.metrics_address),
            otlp: OtlpConfig::resolve(
                a.otlp_endpoint.or(f.otlp_endpoint),
                a.otlp_tls_ca.or(f.otlp_tls_ca),
                a.otlp_tls_cert.or(f.otlp_tls_cert),
                a.otlp_tls_key.or(f.otlp_tls_key),
            )?,
            state_dir: Some(first(a.state_dir, f.state_dir, d.state_dir))
                .filter(|dir| !dir.as_os_str().is_empty() && dir.as_os_str() != "none"),
            event_history: first(a.event_history, f.event_history, d.event_history),
            event_history_bytes: first(
                a.event_history_bytes,
                f.event_history_bytes,
                d.event_history_bytes,
            ),
            watch_queue: first(a.watch_queue, f.watch_queue, d.watch_queue),
            api_limits: ApiLimits {
                connections: first(
                    a.api_max_connections,
                    f.api_max_connections,
                    d.api_max_connections,
                ),
                connections_per_peer: first(
                    a.api_max_connections_per_peer,
                    f.api_max_connections_per_peer,
                    d.api_max_connections_per_peer,
                ),
                streams_per_peer: first(
                    a.api_max_streams_per_peer,
                    f.api_max_streams_per_peer,
                    d.api_max_streams_per_peer,
                ),
            },
            ebpf_ring_bytes: first(a.ebpf_ring_bytes, f.ebpf_ring_bytes, d.ebpf_ring_bytes),
            event_heartbeat: first(a.event_heartbeat, f.event_heartbeat, d.event_heartbeat),
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let zero = [
            ("relist-period", self.relist_period.is_zero()),
            ("slow-relist-period", self.slow_relist_period.is_zero()),
            ("relist-threshold", self.relist_threshold.is_zero()),
            ("runtime-timeout", self.runtime_timeout.is_zero()),
            ("sync-frequency", self.sync_frequency.is_zero()),
            ("event-channel-capacity", self.event_channel_capacity == 0),
            ("inspect-concurrency", self.inspect_concurrency == 0),
            ("event-history", self.event_history == 0),
            ("watch-queue", self.watch_queue == 0),
            ("pod-metadata-max-bytes", self.pod_metadata.max_bytes == 0),
            ("event-history-bytes", self.event_history_bytes == 0),
            ("api-max-connections", self.api_limits.connections == 0),
            (
                "api-max-connections-per-peer",
                self.api_limits.connections_per_peer == 0,
            ),
            (
                "api-max-streams-per-peer",
                self.api_limits.streams_per_peer == 0,
            ),
        ];
        check_ring_size(self.ebpf_ring_bytes, page_size())?;
        if self.mode == Mode::Ebpf && !self.source_enabled(SourceName::Ebpf) {
            return Err(ConfigError::EbpfModeWithoutEbpf);
        }
        if self.listen.is_some() && (self.tls_cert.is_none() || self.tls_key.is_none()) {
            return Err(ConfigError::ListenWithoutTls);
        }
        if self.listen.is_some()
            && self.tls_client_ca.is_none()
            && !self.tls_allow_unauthenticated_clients
        {
            return Err(ConfigError::ListenWithoutClientAuth);
        }
        if self.api_allow_uids.is_empty() && self.api_allow_gids.is_empty() {
            return Err(ConfigError::NobodyAllowed);
        }
        if let Some((key, _)) = zero.into_iter().find(|(_, is_zero)| *is_zero) {
            return Err(ConfigError::Zero { key });
        }
        self.validate_bounds()?;
        self.validate_periods()
    }

    /// Values past these bounds are typos, and some would overflow a timer or a queue's
    /// semaphore later (a panic in tokio) instead of failing here with the setting's name.
    fn validate_bounds(&self) -> Result<(), ConfigError> {
        let durations = [
            ("relist-period", self.relist_period),
            ("slow-relist-period", self.slow_relist_period),
            ("relist-threshold", self.relist_threshold),
            ("runtime-timeout", self.runtime_timeout),
            ("sync-frequency", self.sync_frequency),
            ("event-heartbeat", self.event_heartbeat),
        ];
        if let Some((key, _)) = durations.into_iter().find(|(_, d)| *d > MAX_DURATION) {
            return Err(ConfigError::TooLarge {
                key,
                max: human(MAX_DURATION),
            });
        }
        let sizes = [
            (
                "pod-metadata-max-bytes",
                self.pod_metadata.max_bytes,
                MAX_POD_METADATA_MAX_BYTES,
            ),
            (
                "event-history-bytes",
                self.event_history_bytes,
                MAX_EVENT_HISTORY_BYTES,
            ),
        ];
        if let Some((key, _, max)) = sizes.into_iter().find(|(_, bytes, max)| bytes > max) {
            return Err(ConfigError::TooLarge {
                key,
                max: max.to_string(),
            });
        }
        let counts = [
            ("event-channel-capacity", self.event_channel_capacity),
            ("inspect-concurrency", self.inspect_concurrency),
            ("event-history", self.event_history),
            ("watch-queue", self.watch_queue),
            ("api-max-connections", self.api_limits.connections),
            (
                "api-max-connections-per-peer",
                self.api_limits.connections_per_peer,
            ),
            ("api-max-streams-per-peer", self.api_limits.streams_per_peer),
        ];
        match counts.into_iter().find(|(_, n)| *n > MAX_COUNT) {
            Some((key, _)) => Err(ConfigError::TooLarge {
                key,
                max: MAX_COUNT.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Health counts the time since the last successful full relist, so the threshold must
    /// leave room for the longest period between two of them, and one more: a relist that
    /// failed once (a runtime call timed out) is retried a period later without the PLEG being
    /// unhealthy meanwhile. The longest period is the slow one whenever a push source is on
    /// (connected or not: it may connect at any time).
    fn validate_periods(&self) -> Result<(), ConfigError> {
        // Without a push source the slow period is never used.
        let (period_key, period) = if self.sources.is_empty() {
            ("relist-period", self.relist_period)
        } else if self.slow_relist_period < self.relist_period {
            return Err(ConfigError::SlowPeriodShorter {
                slow: human(self.slow_relist_period),
                period: human(self.relist_period),
            });
        } else {
            ("slow-relist-period", self.slow_relist_period)
        };
        if self.relist_threshold < period.saturating_mul(2) {
            return Err(ConfigError::ThresholdBelowPeriod {
                threshold: human(self.relist_threshold),
                period_key,
                period: human(period),
            });
        }
        Ok(())
    }
}

/// The kernel's ring buffers are a power-of-two number of pages.
fn check_ring_size(bytes: u32, page: u64) -> Result<(), ConfigError> {
    if bytes.is_power_of_two() && u64::from(bytes).is_multiple_of(page) {
        Ok(())
    } else {
        Err(ConfigError::RingSize { bytes, page })
    }
}

/// This machine's page size; 4 KiB if it cannot be read (it always can on Linux).
fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|page| u64::try_from(page).ok())
        .unwrap_or(4096)
}

/// The longest duration a setting takes: a year (humantime's, 365.25 days, so that the
/// message says `1year`).
const MAX_DURATION: Duration = Duration::from_secs(31_557_600);

/// The largest count a setting takes: far more than any node needs, far below what would
/// overflow a tokio channel.
const MAX_COUNT: usize = 1 << 24;

/// The largest `--event-history-bytes`: past this the history alone would outgrow the unit's
/// `MemoryMax` several times over.
const MAX_EVENT_HISTORY_BYTES: usize = 1 << 30;

/// A setting from the first layer that has it: flags and environment, the file, the defaults.
fn first<T>(given: Option<T>, file: Option<T>, default: Option<T>) -> T {
    // Every setting that reaches here has a clap default (checked by the defaults test).
    given
        .or(file)
        .or(default)
        .expect("plegd run has a default for this setting")
}

fn read_file(path: &Path) -> Result<RunArgs, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file(path, &text)
}

fn parse_file(path: &Path, text: &str) -> Result<RunArgs, ConfigError> {
    toml::from_str(text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source: Box::new(source),
    })
}

/// A duration that is not `1s`, `500ms`, `3m`, `1h 30m`, ...
#[derive(Debug, thiserror::Error)]
#[error("invalid duration {text:?}: {source}")]
pub struct InvalidDuration {
    text: String,
    #[source]
    source: humantime::DurationError,
}

/// Parses `1s`, `500ms`, `3m`, `1h 30m`: the syntax of duration flags and file values alike.
pub fn parse_duration(text: &str) -> Result<Duration, InvalidDuration> {
    humantime::parse_duration(text).map_err(|source| InvalidDuration {
        text: text.to_owned(),
        source,
    })
}

/// A default duration as `--help` shows it and [`parse_duration`] reads it back.
fn human(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// A file's duration, with [`parse_duration`]'s syntax.
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_duration(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// A file's value of a type that parses from a string the way its flag does.
fn from_str<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let text = String::deserialize(deserializer)?;
    text.parse().map(Some).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    #[test]
    fn defaults_match_kubelet() {
        let config = Config::load(&RunArgs::default()).unwrap();
        assert_eq!(config.relist_period, Duration::from_secs(1));
        assert_eq!(config.relist_threshold, Duration::from_secs(180));
        assert_eq!(config.event_channel_capacity, 1000);
        assert_eq!(config.runtime, RuntimeKind::Cri);
        assert!(!config.emit_changed);
    }

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "relist-period = \"250ms\"\nrelist-threshold = \"1m\"\noutput = \"json\"\nnamespaces = [\"a\", \"b\"]"
        )
        .unwrap();
        let args = RunArgs {
            config: Some(file.path().to_owned()),
            relist_period: Some(Duration::from_secs(2)),
            ..RunArgs::default()
        };
        let config = Config::load(&args).unwrap();
        assert_eq!(config.relist_period, Duration::from_secs(2));
        assert_eq!(config.relist_threshold, Duration::from_secs(60));
        assert_eq!(config.output, OutputFormat::Json);
        assert_eq!(config.namespaces, ["a", "b"]);
    }

    #[test]
    fn bad_files_and_values_are_errors_naming_what_is_wrong() {
        let missing = RunArgs {
            config: Some("/nonexistent/plegd.toml".into()),
            ..RunArgs::default()
        };
        assert!(matches!(
            Config::load(&missing),
            Err(ConfigError::Read { .. })
        ));

        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "relist-perod = \"1s\"").unwrap();
        let typo = RunArgs {
            config: Some(file.path().to_owned()),
            ..RunArgs::default()
        };
        let err = Config::load(&typo).unwrap_err().to_string();
        assert!(err.contains("relist-perod"), "{err}");

        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "relist-period = \"soon\"").unwrap();
        let bad = RunArgs {
            config: Some(file.path().to_owned()),
            ..RunArgs::default()
        };
        let err = Config::load(&bad).unwrap_err().to_string();
        assert!(
            err.contains("relist-period") && err.contains("soon"),
            "{err}"
        );

        let zero = RunArgs {
            event_channel_capacity: Some(0),
            ..RunArgs::default()
        };
        assert!(matches!(
            Config::load(&zero),
            Err(ConfigError::Zero {
                key: "event-channel-capacity"
            })
        ));
    }

    #[test]
    fn sources_default_to_every_push_source_and_relist_alone_means_polling() {
        let all = Config::load(&RunArgs::default()).unwrap();
        assert_eq!(all.sources, SourceName::PUSH.into_iter().collect());
        let polling = Config::load(&RunArgs {
            sources: Some(vec![SourceName::Relist]),
            ..RunArgs::default()
        })
        .unwrap();
        assert!(polling.sources.is_empty());
        assert!(polling.source_enabled(SourceName::Relist));
        assert!(!polling.source_enabled(SourceName::Containerd));

        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "sources = [\"containerd\", \"cri-events\"]").unwrap();
        let from_file = Config::load(&RunArgs {
            config: Some(file.path().to_owned()),
            ..RunArgs::default()
        })
        .unwrap();
        assert_eq!(
            from_file.sources,
            [SourceName::Containerd, SourceName::CriEvents].into()
        );
        assert_eq!(
            SourceName::from_str("cri-events", false),
            Ok(SourceName::CriEvents)
        );
    }

    #[test]
    fn api_settings_default_to_the_socket_only_and_tls_needs_a_certificate() {
        let config = Config::load(&RunArgs::default()).unwrap();
        assert_eq!(config.socket, PathBuf::from("/run/plegd/plegd.sock"));
        assert_eq!((config.listen, config.metrics_address), (None, None));
        assert_eq!((config.event_history, config.watch_queue), (10_000, 1024));
        assert_eq!(config.pod_metadata.max_bytes, 16 * 1024);
        // Root only.
        assert_eq!(config.api_allow_uids, [0]);
        assert!(config.api_allow_gids.is_empty());
        let plain_tcp = RunArgs {
            listen: Some("127.0.0.1:9810".parse().unwrap()),
            ..RunArgs::default()
        };
        assert!(matches!(
            Config::load(&plain_tcp),
            Err(ConfigError::ListenWithoutTls)
        ));
        // A certificate and no client CA: refused unless asked for by name.
        let anyone = RunArgs {
            tls_cert: Some("server.pem".into()),
            tls_key: Some("server.key".into()),
            ..plain_tcp
        };
        assert!(matches!(
            Config::load(&anyone),
            Err(ConfigError::ListenWithoutClientAuth)
        ));
        let asked = Config::load(&RunArgs {
            tls_allow_unauthenticated_clients: Some(true),
            ..anyone.clone()
        })
        .unwrap();
        assert!(asked.tls_allow_unauthenticated_clients && asked.tls_client_ca.is_none());
        Config::load(&RunArgs {
            tls_client_ca: Some("ca.pem".into()),
            ..anyone
        })
        .unwrap();
        let nobody = RunArgs {
            api_allow_uids: Some(Vec::new()),
            ..RunArgs::default()
        };
        assert!(matches!(
            Config::load(&nobody),
            Err(ConfigError::NobodyAllowed)
        ));
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "socket = \"/tmp/p.sock\"\nmetrics-address = \"127.0.0.1:9809\"\nevent-history = 5\n\
             api-allow-uids = []\napi-allow-gids = [1000, 1001]"
        )
        .unwrap();
        let config = Config::load(&RunArgs {
            config: Some(file.path().to_owned()),
            ..RunArgs::default()
        })
        .unwrap();
        assert_eq!(config.socket, PathBuf::from("/tmp/p.sock"));
        assert_eq!(
            config.metrics_address,
            Some("127.0.0.1:9809".parse().unwrap())
        );
        assert_eq!(config.event_history, 5);
        assert!(config.api_allow_uids.is_empty());
        assert_eq!(config.api_allow_gids, [1000, 1001]);
    }

    #[test]
    fn the_state_dir_defaults_to_var_lib_and_none_turns_it_off() {
        let state_dir = |dir: Option<&str>| {
            Config::load(&RunArgs {
                state_dir: dir.map(PathBuf::from),
                ..RunArgs::default()
            })
            .unwrap()
            .state_dir
        };
        assert_eq!(state_dir(None), Some(PathBuf::from("/var/lib/plegd")));
        assert_eq!(
            state_dir(Some("/srv/plegd")),
            Some(PathBuf::from("/srv/plegd"))
        );
        assert_eq!(state_dir(Some("none")), None);
    }

    #[test]
    fn otlp_settings_are_checked_together() {
        let otlp = |endpoint: Option<&str>, ca: Option<&str>, cert: Option<&str>| {
            Config::load(&RunArgs {
                otlp_endpoint: endpoint.map(str::to_owned),
                otlp_tls_ca: ca.map(PathBuf::from),
                otlp_tls_cert: cert.map(PathBuf::from),
                otlp_tls_key: cert.map(|_| PathBuf::from("client.key")),
                ..RunArgs::default()
            })
            .map(|config| {
                config
                    .otlp
                    .map(|o| (o.tls(), o.identity.is_some(), o.endpoint))
            })
            .map_err(|e| e.to_string())
        };
        let ok = |endpoint: &str, tls, identity| Ok(Some((tls, identity, endpoint.to_owned())));
        assert_eq!(otlp(None, None, None), Ok(None));
        assert_eq!(
            otlp(Some("http://127.0.0.1:4317"), None, None),
            ok("http://127.0.0.1:4317", false, false)
        );
        assert_eq!(
            otlp(Some("http://localhost:4317/"), None, None),
            ok("http://localhost:4317", false, false)
        );
        assert_eq!(
            otlp(Some("https://otel:4317"), Some("ca.pem"), Some("c.pem")),
            ok("https://otel:4317", true, true)
        );
        let refused = [
            (None, Some("ca.pem"), None, "need otlp-endpoint"),
            (Some("localhost:4317"), None, None, "give http://HOST:PORT"),
            (
                Some("grpc://otel:4317"),
                None,
                None,
                "give http://HOST:PORT",
            ),
            (
                Some("http://otel:4317/v1/logs"),
                None,
                None,
                "takes no path",
            ),
            (Some("http://"), None, None, "otlp-endpoint"),
            (Some("https://otel:4317"), None, None, "needs otlp-tls-ca"),
            (
                Some("http://otel:4317"),
                Some("ca.pem"),
                None,
                "need an https",
            ),
        ];
        for (endpoint, ca, cert, why) in refused {
            let error = otlp(endpoint, ca, cert).expect_err(why);
            assert!(error.contains(why), "{endpoint:?}: {error}");
        }
    }

    #[test]
    fn polling_mode_turns_every_push_source_off() {
        let polling = Config::load(&RunArgs {
            mode: Some(Mode::Polling),
            ..RunArgs::default()
        })
        .unwrap();
        assert!(polling.sources.is_empty());
        let ebpf_without_ebpf = RunArgs {
            mode: Some(Mode::Ebpf),
            sources: Some(vec![SourceName::Containerd]),
            ..RunArgs::default()
        };
        assert!(matches!(
            Config::load(&ebpf_without_ebpf),
            Err(ConfigError::EbpfModeWithoutEbpf)
        ));
    }

    #[test]
    fn durations_parse_in_human_units() {
        assert_eq!(
            parse_duration("500ms").ok(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(parse_duration("3m").ok(), Some(Duration::from_secs(180)));
        let err = parse_duration("3 parsecs").unwrap_err().to_string();
        assert!(err.starts_with("invalid duration \"3 parsecs\": "), "{err}");
    }

    /// `plegd run`'s settings from a command line, as `plegd run` reads them.
    fn given(argv: &[&str]) -> RunArgs {
        let command = RunArgs::augment_args(clap::Command::new("run"));
        RunArgs::given(&command.try_get_matches_from(argv).unwrap()).unwrap()
    }

    #[test]
    fn the_file_is_read_the_way_flags_are() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "relist-period = \"1s 500ms\"\n\
             runtime = \"containerd\"\n\
             sources = [\"ebpf\"]\n\
             mode = \"ebpf\"\n\
             emit-changed = true"
        )
        .unwrap();
        let path = file.path().to_str().unwrap();
        let from_file = Config::load(&given(&["run", "--config", path])).unwrap();
        let from_flags = Config::load(&given(&[
            "run",
            "--relist-period",
            "1s 500ms",
            "--runtime",
            "containerd",
            "--sources",
            "ebpf",
            "--mode",
            "ebpf",
            "--emit-changed",
        ]))
        .unwrap();
        assert_eq!(from_file, from_flags);
        assert_eq!(from_file.relist_period, Duration::from_millis(1500));
    }

    /// A setting's key, its flag, `PLEGD_*` variable and file value (each maybe absent), and
    /// what `plegd run` resolves.
    type Row = (
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
        Option<&'static str>,
        &'static str,
    );

    /// Read by the child process of
    /// `flags_beat_the_environment_which_beats_the_file_which_beats_defaults`.
    const PRECEDENCE: [Row; 9] = [
        (
            "relist-period",
            Some("2s"),
            Some("3s"),
            Some("\"4s\""),
            "2s",
        ),
        ("slow-relist-period", None, Some("3s"), Some("\"4s\""), "3s"),
        ("relist-threshold", None, None, Some("\"9s\""), "9s"),
        ("runtime-timeout", None, None, None, "10s"),
        ("sync-frequency", None, Some("30s"), Some("\"45s\""), "30s"),
        ("event-history", Some("7"), Some("8"), Some("9"), "7"),
        ("watch-queue", None, Some("8"), Some("9"), "8"),
        ("inspect-concurrency", None, None, Some("9"), "9"),
        ("event-channel-capacity", None, None, None, "1000"),
    ];

    const PRECEDENCE_CHILD: &str = "PLEGD_TEST_PRECEDENCE_CHILD";

    /// The environment layer is the process's: the table runs in a child process (this test
    /// binary again) with the variables set, so no test here changes its own environment.
    #[test]
    fn flags_beat_the_environment_which_beats_the_file_which_beats_defaults() {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child.args(["--exact", "config::tests::precedence_child", "--ignored"]);
        child.env(PRECEDENCE_CHILD, "1");
        for (key, _, env, _, _) in PRECEDENCE {
            let name = format!("PLEGD_{}", key.to_uppercase().replace('-', "_"));
            match env {
                Some(value) => child.env(name, value),
                None => child.env_remove(name),
            };
        }
        let output = child.output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{stdout}");
        assert!(stdout.contains("1 passed"), "{stdout}");
    }

    #[test]
    #[ignore = "run by flags_beat_the_environment_which_beats_the_file_which_beats_defaults"]
    fn precedence_child() {
        if std::env::var_os(PRECEDENCE_CHILD).is_none() {
            return;
        }
        let mut file = tempfile::NamedTempFile::new().unwrap();
        let mut argv = vec!["run".to_owned(), "--config".to_owned()];
        argv.push(file.path().to_str().unwrap().to_owned());
        for (key, flag, _, in_file, _) in PRECEDENCE {
            if let Some(value) = flag {
                argv.extend([format!("--{key}"), value.to_owned()]);
            }
            if let Some(value) = in_file {
                writeln!(file, "{key} = {value}").unwrap();
            }
        }
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let config = Config::load(&given(&argv)).unwrap();
        for (key, _, _, _, expected) in PRECEDENCE {
            let resolved = match key {
                "relist-period" => human(config.relist_period),
                "slow-relist-period" => human(config.slow_relist_period),
                "relist-threshold" => human(config.relist_threshold),
                "runtime-timeout" => human(config.runtime_timeout),
                "sync-frequency" => human(config.sync_frequency),
                "event-history" => config.event_history.to_string(),
                "watch-queue" => config.watch_queue.to_string(),
                "inspect-concurrency" => config.inspect_concurrency.to_string(),
                "event-channel-capacity" => config.event_channel_capacity.to_string(),
                _ => unreachable!("{key} is not in the table"),
            };
            assert_eq!(resolved, expected, "{key}");
        }
    }

    #[test]
    fn the_ring_is_a_power_of_two_number_of_pages() {
        for bytes in [4096, 8192, 1 << 20] {
            check_ring_size(bytes, 4096).unwrap();
        }
        for (bytes, page) in [(0, 4096), (4095, 4096), (12288, 4096), (4096, 65536)] {
            let err = check_ring_size(bytes, page).unwrap_err().to_string();
            assert!(
                err.contains(&format!("({page} bytes): {bytes} is not")),
                "{err}"
            );
        }
    }

    #[test]
    fn a_bad_file_names_its_line_and_column() {
        let cases = [
            // Syntax: an unquoted duration.
            (
                "relist-period = \"1s\"\nrelist-threshold = 3m",
                "line 2, column 20",
            ),
            // Type: a string where a number goes.
            (
                "watch-queue = 5\nevent-history = \"many\"",
                "line 2, column 17",
            ),
            // Value: a duration humantime does not read.
            ("\nslow-relist-period = \"soon\"", "line 2, column 22"),
            // Value: a runtime plegd does not know.
            ("runtime = \"docker\"", "line 1, column 11"),
        ];
        for (text, at) in cases {
            let mut file = tempfile::NamedTempFile::new().unwrap();
            writeln!(file, "{text}").unwrap();
            let err = Config::load(&RunArgs {
                config: Some(file.path().to_owned()),
                ..RunArgs::default()
            })
            .unwrap_err();
            assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
            let err = err.to_string();
            assert!(err.contains(at), "{text:?}: {err}");
        }
    }

    fn load_given(flags: &[&str]) -> Result<Config, ConfigError> {
        let argv: Vec<&str> = ["run"].iter().chain(flags).copied().collect();
        Config::load(&given(&argv))
    }

    #[test]
    fn contradicting_periods_are_rejected_naming_both_settings() {
        // Seen: healthy at start, unhealthy between two slow relists while everything worked.
        let err = load_given(&["--relist-threshold", "6s"]).unwrap_err();
        assert!(matches!(err, ConfigError::ThresholdBelowPeriod { .. }));
        assert_eq!(
            err.to_string(),
            "relist-threshold (6s) must be at least twice slow-relist-period (30s): full \
             relists that far apart would report the PLEG unhealthy while it works"
        );
        // Polling only: the slow period is never used, the relist period counts.
        load_given(&["--relist-threshold", "6s", "--mode", "polling"]).unwrap();
        load_given(&["--relist-threshold", "6s", "--slow-relist-period", "3s"]).unwrap();
        load_given(&["--relist-threshold", "6s", "--sources", "relist"]).unwrap();
        let err = load_given(&[
            "--mode",
            "polling",
            "--relist-period",
            "4s",
            "--relist-threshold",
            "6s",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("relist-threshold (6s)") && err.contains("relist-period (4s)"),
            "{err}"
        );

        let err = load_given(&["--relist-period", "1m"])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "slow-relist-period (30s) must not be shorter than relist-period (1m): it is the \
             period used while a push source is connected, the slower one"
        );
        load_given(&["--relist-period", "1m", "--mode", "polling"]).unwrap();
    }

    #[test]
    fn zero_and_absurdly_large_values_are_rejected_naming_the_setting() {
        for (flag, value) in [
            ("--relist-period", "0s"),
            ("--runtime-timeout", "0ms"),
            ("--watch-queue", "0"),
            ("--inspect-concurrency", "0"),
            ("--pod-metadata-max-bytes", "0"),
            ("--event-history-bytes", "0"),
        ] {
            let err = load_given(&[flag, value]).unwrap_err().to_string();
            assert_eq!(err, format!("{} must be greater than zero", &flag[2..]));
        }
        for (flag, value, max) in [
            ("--runtime-timeout", "400years", "1year"),
            ("--relist-threshold", "366days", "1year"),
            ("--relist-period", "18446744073709551615s", "1year"),
            // tokio's channels panic past usize::MAX >> 3: never reached.
            ("--watch-queue", "18446744073709551615", "16777216"),
            ("--event-channel-capacity", "16777217", "16777216"),
            ("--event-history", "100000000", "16777216"),
            ("--pod-metadata-max-bytes", "1048577", "1048576"),
            ("--event-history-bytes", "1073741825", "1073741824"),
        ] {
            let err = load_given(&[flag, value]).unwrap_err().to_string();
            assert_eq!(err, format!("{} must be at most {max}", &flag[2..]));
        }
    }
}
