//! Precedence: each setting from the first origin that has it (flags and environment, the
//! file, clap's defaults), then the checks that span settings.

use std::path::Path;

use super::{
    ApiLimits, Config, ConfigError, Mode, OtlpConfig, RunArgs,
    args::human,
    file::{parse_file, read_file},
    limits::check_ring_size,
};
use crate::{
    base::host::page_size,
    pleg::Source,
    runtime::{Keys, PodMetadata},
};

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
        let mut l = Origins {
            flags: args.clone(),
            file,
            defaults: RunArgs::defaults(),
        };
        let mode = l.first(|r| r.mode.take());
        let sources_given = l.flags.sources.is_some() || l.file.sources.is_some();
        let config = Self {
            runtime: l.first(|r| r.runtime.take()),
            runtime_endpoint: l.given(|r| r.runtime_endpoint.take()),
            namespaces: l.first(|r| r.namespaces.take()),
            pod_metadata: l.pod_metadata(),
            relist_period: l.first(|r| r.relist_period.take()),
            slow_relist_period: l.first(|r| r.slow_relist_period.take()),
            sources: l
                .first(|r| r.sources.take())
                .into_iter()
                .filter(|s| *s != Source::Relist && mode != Mode::Polling)
                .collect(),
            sources_given,
            allow_shared_cri_events: l.first(|r| r.allow_shared_cri_events.take()),
            mode,
            relist_threshold: l.first(|r| r.relist_threshold.take()),
            runtime_timeout: l.first(|r| r.runtime_timeout.take()),
            sync_frequency: l.first(|r| r.sync_frequency.take()),
            event_channel_capacity: l.first(|r| r.event_channel_capacity.take()),
            inspect_concurrency: l.first(|r| r.inspect_concurrency.take()),
            emit_changed: l.first(|r| r.emit_changed.take()),
            confirm: l.first(|r| r.confirm.take()),
            output: l.first(|r| r.output.take()),
            log_format: l.first(|r| r.log_format.take()),
            socket: l.first(|r| r.socket.take()),
            api_allow_uids: l.first(|r| r.api_allow_uids.take()),
            api_allow_gids: l.given(|r| r.api_allow_gids.take()).unwrap_or_default(),
            listen: l.given(|r| r.listen.take()),
            tls_cert: l.given(|r| r.tls_cert.take()),
            tls_key: l.given(|r| r.tls_key.take()),
            tls_client_ca: l.given(|r| r.tls_client_ca.take()),
            tls_allow_unauthenticated_clients: l
                .first(|r| r.tls_allow_unauthenticated_clients.take()),
            metrics_address: l.given(|r| r.metrics_address.take()),
            otlp: l.otlp()?,
            state_dir: Some(l.first(|r| r.state_dir.take()))
                .filter(|dir| !dir.as_os_str().is_empty() && dir.as_os_str() != "none"),
            event_history: l.first(|r| r.event_history.take()),
            event_history_bytes: l.first(|r| r.event_history_bytes.take()),
            watch_queue: l.first(|r| r.watch_queue.take()),
            api_limits: l.api_limits(),
            ebpf_ring_bytes: l.first(|r| r.ebpf_ring_bytes.take()),
            event_heartbeat: l.first(|r| r.event_heartbeat.take()),
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        check_ring_size(self.ebpf_ring_bytes, page_size())?;
        if self.mode == Mode::Ebpf && !self.source_enabled(Source::Ebpf) {
            return Err(ConfigError::EbpfModeWithoutEbpf);
        }
        self.validate_api()?;
        self.validate_nonzero()?;
        self.validate_bounds()?;
        self.validate_periods()
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

/// The origins of `plegd run`'s settings; each setting is taken out of them once.
struct Origins {
    /// Flags and environment.
    flags: RunArgs,
    file: RunArgs,
    /// clap's defaults.
    defaults: RunArgs,
}

impl Origins {
    /// A setting from the first origin that has it: flags and environment, the file, the
    /// defaults.
    fn first<T>(&mut self, take: impl Fn(&mut RunArgs) -> Option<T>) -> T {
        // Every setting that reaches here has a clap default (checked by the defaults test).
        self.given(&take)
            .or_else(|| take(&mut self.defaults))
            .expect("plegd run has a default for this setting")
    }

    /// A setting without a default: from flags and environment, else the file.
    fn given<T>(&mut self, take: impl Fn(&mut RunArgs) -> Option<T>) -> Option<T> {
        take(&mut self.flags).or_else(|| take(&mut self.file))
    }

    fn pod_metadata(&mut self) -> PodMetadata {
        PodMetadata {
            labels: Keys::from_list(&self.given(|r| r.pod_labels.take()).unwrap_or_default()),
            annotations: Keys::from_list(
                &self.given(|r| r.pod_annotations.take()).unwrap_or_default(),
            ),
            max_bytes: self.first(|r| r.pod_metadata_max_bytes.take()),
        }
    }

    fn otlp(&mut self) -> Result<Option<OtlpConfig>, ConfigError> {
        OtlpConfig::resolve(
            self.given(|r| r.otlp_endpoint.take()),
            self.given(|r| r.otlp_tls_ca.take()),
            self.given(|r| r.otlp_tls_cert.take()),
            self.given(|r| r.otlp_tls_key.take()),
        )
    }

    fn api_limits(&mut self) -> ApiLimits {
        ApiLimits {
            connections: self.first(|r| r.api_max_connections.take()),
            connections_per_peer: self.first(|r| r.api_max_connections_per_peer.take()),
            streams_per_peer: self.first(|r| r.api_max_streams_per_peer.take()),
        }
    }
}

#[cfg(test)]
pub(super) fn load_given(flags: &[&str]) -> Result<Config, ConfigError> {
    let argv: Vec<&str> = ["run"].iter().chain(flags).copied().collect();
    Config::load(&super::args::given(&argv))
}

#[cfg(test)]
mod tests {
    use std::{io::Write as _, path::PathBuf, time::Duration};

    use super::*;
    use crate::{
        config::{
            args::{given, human},
            *,
        },
        runtime::RuntimeKind,
    };

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

    /// The environment origin is the process's: the table runs in a child process (this test
    /// binary again) with the variables set, so no test here changes its own environment.
    #[test]
    fn flags_beat_the_environment_which_beats_the_file_which_beats_defaults() {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child.args([
            "--exact",
            "config::resolve::tests::precedence_child",
            "--ignored",
        ]);
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
}
