//! `plegd run` configuration: flags, `PLEGD_*` environment variables and an optional TOML file,
//! in that order of precedence, over built-in defaults.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::{Args, ValueEnum};
use serde::Deserialize;

pub use crate::output::OutputFormat;
use crate::{
    pleg::{
        event::{DEFAULT_EVENT_CHANNEL_CAPACITY, DEFAULT_RELIST_PERIOD, DEFAULT_RELIST_THRESHOLD},
        relist::DEFAULT_INSPECT_CONCURRENCY,
    },
    runtime::{DEFAULT_CALL_TIMEOUT, RuntimeKind},
};

/// Default path of the API socket.
pub const DEFAULT_SOCKET: &str = "/run/plegd/plegd.sock";

/// Full relist period while a push source is connected.
pub const DEFAULT_SLOW_RELIST_PERIOD: Duration = Duration::from_secs(30);

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
    /// The sources that can be turned off, all on by default.
    pub const PUSH: [Self; 3] = [Self::Ebpf, Self::Containerd, Self::CriEvents];
}

impl Config {
    /// Whether `source` is enabled (the relist always is).
    pub fn source_enabled(&self, source: SourceName) -> bool {
        source == SourceName::Relist || self.sources.contains(&source)
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

/// Flags of `plegd run`; every one also reads a `PLEGD_*` variable and a key of the file.
#[derive(Clone, Debug, Default, Args)]
pub struct RunArgs {
    /// TOML file with any of the settings below (keys are the flag names, e.g.
    /// `relist-period = "1s"`). Flags and environment variables override it.
    #[arg(long, env = "PLEGD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Runtime API to read state from: `cri` (any CRI runtime: containerd, CRI-O) or
    /// `containerd` (containerd's own API, also sees containers not made through CRI).
    /// [default: cri]
    #[arg(long, env = "PLEGD_RUNTIME", value_name = "cri|containerd")]
    pub runtime: Option<RuntimeKind>,

    /// Runtime socket (`unix:///run/containerd/containerd.sock` or a plain path). [default:
    /// the first that exists of /run/containerd/containerd.sock, /run/crio/crio.sock, ...]
    #[arg(long, env = "PLEGD_RUNTIME_ENDPOINT", value_name = "SOCKET")]
    pub runtime_endpoint: Option<String>,

    /// containerd namespaces to watch with `--runtime containerd`, comma separated.
    /// [default: k8s.io]
    #[arg(
        long,
        env = "PLEGD_NAMESPACES",
        value_delimiter = ',',
        value_name = "NS,..."
    )]
    pub namespaces: Option<Vec<String>>,

    /// Period of the full relist. [default: 1s]
    #[arg(long, env = "PLEGD_RELIST_PERIOD", value_parser = parse_duration, value_name = "DURATION")]
    pub relist_period: Option<Duration>,

    /// Period of the full relist while at least one push source (eBPF, containerd events, CRI
    /// events) is connected: the safety net, slowed. [default: 30s]
    #[arg(long, env = "PLEGD_SLOW_RELIST_PERIOD", value_parser = parse_duration, value_name = "DURATION")]
    pub slow_relist_period: Option<Duration>,

    /// Push sources to use, comma separated: `ebpf`, `containerd` (containerd's event stream),
    /// `cri-events` (CRI GetContainerEvents). The periodic full relist always runs; `relist`
    /// alone means polling only. [default: ebpf,containerd,cri-events]
    #[arg(
        long,
        env = "PLEGD_SOURCES",
        value_enum,
        value_delimiter = ',',
        value_name = "SOURCE,..."
    )]
    pub sources: Option<Vec<SourceName>>,

    /// `auto` uses the eBPF probes when this kernel can load them, `ebpf` requires them,
    /// `polling` turns every push source off (relist only). [default: auto]
    #[arg(long, env = "PLEGD_MODE", value_enum)]
    pub mode: Option<Mode>,

    /// The PLEG is unhealthy when no full relist succeeded for this long. [default: 3m]
    #[arg(long, env = "PLEGD_RELIST_THRESHOLD", value_parser = parse_duration, value_name = "DURATION")]
    pub relist_threshold: Option<Duration>,

    /// Deadline of each runtime call. [default: 10s]
    #[arg(long, env = "PLEGD_RUNTIME_TIMEOUT", value_parser = parse_duration, value_name = "DURATION")]
    pub runtime_timeout: Option<Duration>,

    /// Events stdout and the sync loop may fall behind before their lag policy applies
    /// (stdout catches up from the event history; the sync loop resyncs every pod and counts
    /// the skipped events as discarded). The relist never waits or drops. [default: 1000]
    #[arg(long, env = "PLEGD_EVENT_CHANNEL_CAPACITY", value_name = "N")]
    pub event_channel_capacity: Option<usize>,

    /// Pod inspections in flight at once during a relist. [default: 8]
    #[arg(long, env = "PLEGD_INSPECT_CONCURRENCY", value_name = "N")]
    pub inspect_concurrency: Option<usize>,

    /// Also emit ContainerChanged (a container became unknown or created), which kubelet
    /// computes but does not send. [default: false]
    #[arg(long, env = "PLEGD_EMIT_CHANGED", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub emit_changed: Option<bool>,

    /// Event output on stdout. [default: text]
    #[arg(long, env = "PLEGD_OUTPUT", value_enum)]
    pub output: Option<OutputFormat>,

    /// Log format on stderr (level from RUST_LOG, default info). [default: text]
    #[arg(long, env = "PLEGD_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,

    /// Unix socket of the plegd.v1 gRPC API (and grpc.health.v1); its directory is created
    /// 0700, the socket is 0600. [default: /run/plegd/plegd.sock]
    #[arg(long, env = "PLEGD_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,

    /// Also serve the API on this TCP address, with TLS (needs --tls-cert and --tls-key).
    /// [default: off]
    #[arg(long, env = "PLEGD_LISTEN", value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,

    /// PEM certificate (chain) of the TLS listener.
    #[arg(long, env = "PLEGD_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of the TLS listener.
    #[arg(long, env = "PLEGD_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificate(s): when given, TLS clients must present a certificate it signed
    /// (mutual TLS).
    #[arg(long, env = "PLEGD_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,

    /// Serve Prometheus /metrics, /healthz and /readyz over HTTP on this address, e.g.
    /// 127.0.0.1:9809. [default: off]
    #[arg(long, env = "PLEGD_METRICS_ADDRESS", value_name = "ADDR:PORT")]
    pub metrics_address: Option<SocketAddr>,

    /// Directory where a clean shutdown saves the last reading of the runtime and the event
    /// history, so the next start continues the same run: only what changed meanwhile becomes
    /// events, and watchers resume where they were. `none`: off. [default: /var/lib/plegd]
    #[arg(long, env = "PLEGD_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Events kept for watchers that reconnect and resume. [default: 10000]
    #[arg(long, env = "PLEGD_EVENT_HISTORY", value_name = "N")]
    pub event_history: Option<usize>,

    /// Events queued per watcher; a watcher that falls further behind is ended as lagged.
    /// [default: 1024]
    #[arg(long, env = "PLEGD_WATCH_QUEUE", value_name = "N")]
    pub watch_queue: Option<usize>,
}

/// The file form of [`RunArgs`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileConfig {
    runtime: Option<String>,
    runtime_endpoint: Option<String>,
    namespaces: Option<Vec<String>>,
    relist_period: Option<String>,
    slow_relist_period: Option<String>,
    sources: Option<Vec<SourceName>>,
    mode: Option<Mode>,
    relist_threshold: Option<String>,
    runtime_timeout: Option<String>,
    event_channel_capacity: Option<usize>,
    inspect_concurrency: Option<usize>,
    emit_changed: Option<bool>,
    output: Option<OutputFormat>,
    log_format: Option<LogFormat>,
    socket: Option<PathBuf>,
    listen: Option<SocketAddr>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    metrics_address: Option<SocketAddr>,
    state_dir: Option<PathBuf>,
    event_history: Option<usize>,
    watch_queue: Option<usize>,
}

/// Resolved settings of `plegd run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub runtime: RuntimeKind,
    /// `None`: detect from the well-known sockets.
    pub runtime_endpoint: Option<String>,
    pub namespaces: Vec<String>,
    pub relist_period: Duration,
    pub slow_relist_period: Duration,
    /// Enabled push sources (never [`SourceName::Relist`], which always runs).
    pub sources: BTreeSet<SourceName>,
    pub mode: Mode,
    pub relist_threshold: Duration,
    pub runtime_timeout: Duration,
    pub event_channel_capacity: usize,
    pub inspect_concurrency: usize,
    pub emit_changed: bool,
    pub output: OutputFormat,
    pub log_format: LogFormat,
    /// Unix socket of the API.
    pub socket: PathBuf,
    /// TCP address of the TLS API listener, if any.
    pub listen: Option<SocketAddr>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Client CA for mutual TLS.
    pub tls_client_ca: Option<PathBuf>,
    /// HTTP address of /metrics, /healthz and /readyz, if any.
    pub metrics_address: Option<SocketAddr>,
    /// Where a clean shutdown saves the run for the next start (`None`: nowhere).
    pub state_dir: Option<PathBuf>,
    /// Events kept for resuming watchers.
    pub event_history: usize,
    /// Events queued per watcher.
    pub watch_queue: usize,
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
    #[error("config file {path}: {key}: {message}")]
    Value {
        path: PathBuf,
        key: &'static str,
        message: String,
    },
    #[error("{key} must be greater than zero")]
    Zero { key: &'static str },
    #[error("mode ebpf needs ebpf among the sources")]
    EbpfModeWithoutEbpf,
    #[error("listen needs tls-cert and tls-key: the TCP API is served over TLS only")]
    ListenWithoutTls,
}

impl Config {
    /// Resolves flags and environment (already merged by clap) over the file over defaults.
    pub fn load(args: &RunArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let path = args.config.clone().unwrap_or_default();
        let file_duration =
            |key: &'static str, value: &Option<String>| -> Result<Option<Duration>, ConfigError> {
                value
                    .as_deref()
                    .map(|v| {
                        parse_duration(v).map_err(|message| ConfigError::Value {
                            path: path.clone(),
                            key,
                            message,
                        })
                    })
                    .transpose()
            };
        let file_runtime = file
            .runtime
            .as_deref()
            .map(|v| {
                v.parse::<RuntimeKind>().map_err(|e| ConfigError::Value {
                    path: path.clone(),
                    key: "runtime",
                    message: e.to_string(),
                })
            })
            .transpose()?;
        let mode = args.mode.or(file.mode).unwrap_or_default();
        let config = Self {
            runtime: args.runtime.or(file_runtime).unwrap_or(RuntimeKind::Cri),
            runtime_endpoint: args.runtime_endpoint.clone().or(file.runtime_endpoint),
            namespaces: args
                .namespaces
                .clone()
                .or(file.namespaces)
                .unwrap_or_else(|| vec!["k8s.io".to_owned()]),
            relist_period: args
                .relist_period
                .or(file_duration("relist-period", &file.relist_period)?)
                .unwrap_or(DEFAULT_RELIST_PERIOD),
            slow_relist_period: args
                .slow_relist_period
                .or(file_duration(
                    "slow-relist-period",
                    &file.slow_relist_period,
                )?)
                .unwrap_or(DEFAULT_SLOW_RELIST_PERIOD),
            sources: args
                .sources
                .clone()
                .or(file.sources)
                .unwrap_or_else(|| SourceName::PUSH.to_vec())
                .into_iter()
                .filter(|s| *s != SourceName::Relist && mode != Mode::Polling)
                .collect(),
            mode,
            relist_threshold: args
                .relist_threshold
                .or(file_duration("relist-threshold", &file.relist_threshold)?)
                .unwrap_or(DEFAULT_RELIST_THRESHOLD),
            runtime_timeout: args
                .runtime_timeout
                .or(file_duration("runtime-timeout", &file.runtime_timeout)?)
                .unwrap_or(DEFAULT_CALL_TIMEOUT),
            event_channel_capacity: args
                .event_channel_capacity
                .or(file.event_channel_capacity)
                .unwrap_or(DEFAULT_EVENT_CHANNEL_CAPACITY),
            inspect_concurrency: args
                .inspect_concurrency
                .or(file.inspect_concurrency)
                .unwrap_or(DEFAULT_INSPECT_CONCURRENCY),
            emit_changed: args.emit_changed.or(file.emit_changed).unwrap_or(false),
            output: args.output.or(file.output).unwrap_or_default(),
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            socket: args
                .socket
                .clone()
                .or(file.socket)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET)),
            listen: args.listen.or(file.listen),
            tls_cert: args.tls_cert.clone().or(file.tls_cert),
            tls_key: args.tls_key.clone().or(file.tls_key),
            tls_client_ca: args.tls_client_ca.clone().or(file.tls_client_ca),
            metrics_address: args.metrics_address.or(file.metrics_address),
            state_dir: Some(
                args.state_dir
                    .clone()
                    .or(file.state_dir)
                    .unwrap_or_else(|| PathBuf::from(crate::state::DEFAULT_STATE_DIR)),
            )
            .filter(|dir| !dir.as_os_str().is_empty() && dir.as_os_str() != "none"),
            event_history: args
                .event_history
                .or(file.event_history)
                .unwrap_or(crate::bus::DEFAULT_EVENT_HISTORY),
            watch_queue: args
                .watch_queue
                .or(file.watch_queue)
                .unwrap_or(crate::bus::DEFAULT_WATCH_QUEUE),
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
            ("event-channel-capacity", self.event_channel_capacity == 0),
            ("inspect-concurrency", self.inspect_concurrency == 0),
            ("event-history", self.event_history == 0),
            ("watch-queue", self.watch_queue == 0),
        ];
        if self.mode == Mode::Ebpf && !self.source_enabled(SourceName::Ebpf) {
            return Err(ConfigError::EbpfModeWithoutEbpf);
        }
        if self.listen.is_some() && (self.tls_cert.is_none() || self.tls_key.is_none()) {
            return Err(ConfigError::ListenWithoutTls);
        }
        match zero.into_iter().find(|(_, is_zero)| *is_zero) {
            Some((key, _)) => Err(ConfigError::Zero { key }),
            None => Ok(()),
        }
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source: Box::new(source),
    })
}

/// Parses `1s`, `500ms`, `3m`, `1h 30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("invalid duration {text:?}: {e}"))
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
        let plain_tcp = RunArgs {
            listen: Some("127.0.0.1:9810".parse().unwrap()),
            ..RunArgs::default()
        };
        assert!(matches!(
            Config::load(&plain_tcp),
            Err(ConfigError::ListenWithoutTls)
        ));
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "socket = \"/tmp/p.sock\"\nmetrics-address = \"127.0.0.1:9809\"\nevent-history = 5"
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
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert!(parse_duration("3 parsecs").is_err());
    }
}
