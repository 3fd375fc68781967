//! `plegd run` configuration: flags, `PLEGD_*` environment variables and an optional TOML file,
//! in that order of precedence, over built-in defaults.
//!
//! A setting's flag, environment variable, file key (serde, the flag's name), default (clap's
//! `default_value`, which `plegd run --help` shows) and help are written once, as a field of
//! [`RunArgs`]; `cargo xtask docs` makes docs/configuration.md from them. Its resolved value is
//! a field of [`Config`], taken from its origins by one line of `resolve.rs`, and checked beside
//! its group. The origins are merged without a config crate: clap already does flag over
//! environment over default and reports where each value came from
//! ([`ArgMatches::value_source`](clap::ArgMatches::value_source)), so [`RunArgs::given`] keeps
//! only what a flag or variable gave, the file deserializes into the same struct (toml reports
//! line and column), and [`Config::load`] takes each setting from the first origin that has it.
//! A config crate that merges them (figment) would add a dependency and a second toml version, and would
//! report a file's type errors without their line and column.
//!
//! # Layout
//! - `args`: [`RunArgs`], every setting as given, and the syntax of values ([`parse_duration`]).
//! - `file`: the TOML file, read with the flags' syntax.
//! - `resolve`: precedence ([`Config::load`]) and the checks that span groups.
//! - `sources`, `api`, `otlp`, `limits`: each group's types, defaults and checks.
//! - [`fit`]: which push sources run on the runtime plegd connected to.

use std::{collections::BTreeSet, net::SocketAddr, path::PathBuf, time::Duration};

use crate::pleg::Source;

mod api;
mod args;
mod file;
pub mod fit;
mod limits;
mod otlp;
mod resolve;
mod sources;

pub use self::{
    api::{
        ApiLimits, DEFAULT_API_MAX_CONNECTIONS, DEFAULT_API_MAX_CONNECTIONS_PER_PEER,
        DEFAULT_API_MAX_STREAMS_PER_PEER, DEFAULT_SOCKET,
    },
    args::{DEFAULT_STATE_DIR, InvalidDuration, LogFormat, RunArgs, parse_duration},
    otlp::OtlpConfig,
    sources::{DEFAULT_SLOW_RELIST_PERIOD, Mode},
};
pub use crate::output::OutputFormat;
use crate::{
    pleg::Store,
    runtime::{PodMetadata, RuntimeKind},
};

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
    /// Enabled push sources (never [`Source::Relist`], which always runs): what was asked
    /// for until [`Config::with_plan`] fits them to the runtime.
    pub sources: BTreeSet<Source>,
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
