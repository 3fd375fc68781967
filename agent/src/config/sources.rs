//! Which push sources run beside the relist (`--sources`, `--mode`, `--allow-shared-cri-events`),
//! as asked; [`fit`] fits them to the runtime.

use std::time::Duration;

use clap::{ValueEnum, builder::PossibleValue};
use serde::Deserialize;

use super::{Config, fit};
use crate::pleg::Source;

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

/// `--sources` takes the PLEG's own [`Source`] names.
impl ValueEnum for Source {
    fn value_variants<'a>() -> &'a [Self] {
        &[Self::Ebpf, Self::Containerd, Self::CriEvents, Self::Relist]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self {
            Self::Ebpf => "Kernel tracepoints",
            Self::Containerd => "containerd's event stream (Events.Subscribe)",
            Self::CriEvents => "CRI GetContainerEvents",
            Self::Relist => {
                "The periodic full relist: always on, accepted so `--sources relist` says \"polling only\""
            }
        };
        Some(PossibleValue::new(self.name()).help(help))
    }
}

impl Config {
    /// Whether `source` is enabled (the relist always is).
    pub fn source_enabled(&self, source: Source) -> bool {
        source == Source::Relist || self.sources.contains(&source)
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

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;
    use crate::config::*;

    #[test]
    fn sources_default_to_every_push_source_and_relist_alone_means_polling() {
        let all = Config::load(&RunArgs::default()).unwrap();
        assert_eq!(all.sources, Source::PUSH.into_iter().collect());
        let polling = Config::load(&RunArgs {
            sources: Some(vec![Source::Relist]),
            ..RunArgs::default()
        })
        .unwrap();
        assert!(polling.sources.is_empty());
        assert!(polling.source_enabled(Source::Relist));
        assert!(!polling.source_enabled(Source::Containerd));

        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "sources = [\"containerd\", \"cri-events\"]").unwrap();
        let from_file = Config::load(&RunArgs {
            config: Some(file.path().to_owned()),
            ..RunArgs::default()
        })
        .unwrap();
        assert_eq!(
            from_file.sources,
            [Source::Containerd, Source::CriEvents].into()
        );
        assert_eq!(Source::from_str("cri-events", false), Ok(Source::CriEvents));
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
            sources: Some(vec![Source::Containerd]),
            ..RunArgs::default()
        };
        assert!(matches!(
            Config::load(&ebpf_without_ebpf),
            Err(ConfigError::EbpfModeWithoutEbpf)
        ));
    }
}
