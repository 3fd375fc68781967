//! The settings of `plegd run` as the command line, the environment and the file give them:
//! [`RunArgs`], where each setting's flag, `PLEGD_*` variable, file key, default and help are
//! written, and the syntax of their values.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{
    ArgMatches, Args, FromArgMatches as _, ValueEnum, builder::TypedValueParser as _,
    parser::ValueSource,
};
use serde::Deserialize;

use super::{
    Mode, OutputFormat,
    api::{
        DEFAULT_API_MAX_CONNECTIONS, DEFAULT_API_MAX_CONNECTIONS_PER_PEER,
        DEFAULT_API_MAX_STREAMS_PER_PEER, DEFAULT_SOCKET,
    },
    file::{duration, from_str},
    sources::DEFAULT_SLOW_RELIST_PERIOD,
};
use crate::{
    pleg::{
        DEFAULT_EVENT_CHANNEL_CAPACITY, DEFAULT_INSPECT_CONCURRENCY, DEFAULT_RELIST_PERIOD,
        DEFAULT_RELIST_THRESHOLD, DEFAULT_RESYNC_INTERVAL, Source, Store,
    },
    runtime::{DEFAULT_CALL_TIMEOUT, DEFAULT_POD_METADATA_MAX_BYTES, RuntimeKind},
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

/// How logs are written to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Settings of `plegd run`: each is a flag, a `PLEGD_*` variable and a key of the file. `None`:
/// not given at this origin (flags and environment, or the file); clap's defaults are the last
/// origin, see [`Config::load`](super::Config::load).
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
    pub sources: Option<Vec<Source>>,

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
    pub(super) fn defaults() -> Self {
        let command = Self::augment_args(clap::Command::new("plegd-run"))
            .mut_args(|arg| arg.env(None::<&'static str>));
        command
            .try_get_matches_from(["plegd-run"])
            .and_then(|matches| Self::from_arg_matches(&matches))
            .expect("the defaults of plegd run parse")
    }
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
pub(super) fn human(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// `plegd run`'s settings from a command line, as `plegd run` reads them.
#[cfg(test)]
pub(super) fn given(argv: &[&str]) -> RunArgs {
    let command = RunArgs::augment_args(clap::Command::new("run"));
    RunArgs::given(&command.try_get_matches_from(argv).unwrap()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
