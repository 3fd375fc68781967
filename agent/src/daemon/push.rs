//! The push sources: the kernel probes, loaded before the privileges are dropped, and the
//! runtime's event streams, started once the runtime is reached.

use std::{path::PathBuf, sync::Arc};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::{
    base::metrics::Metrics,
    config::{Config, Mode, fit},
    pleg::{OomWitness, PodCache, Source, TriggerSender},
    runtime::{CRI_NAMESPACE, RuntimeKind},
    sources::{
        containerd_events::{self, ContainerdEventsConfig},
        cri_events::{self, CriEventsConfig},
        ebpf::{self, Probes},
        status::{SourceRegistry, SourceState},
    },
};

/// What the push sources start from.
pub struct PushSources {
    /// Where the runtime's event streams are (none: no stream sources).
    pub runtime_socket: Option<PathBuf>,
    pub ebpf: EbpfStart,
    /// Why each push source runs or not, for health (none: as the config says).
    pub plan: Option<fit::Plan>,
}

impl PushSources {
    /// Whose word on an OOM kill decides a death's reason: containerd's, where its event
    /// stream (`/tasks/oom`) will reach plegd, as its CRI store takes no other.
    pub fn oom_witness(&self, config: &Config) -> OomWitness {
        if self.runtime_socket.is_some() && config.source_enabled(Source::Containerd) {
            OomWitness::Runtime
        } else {
            OomWitness::Any
        }
    }

    /// No push source: the periodic relist alone (a fake runtime, or an embedding of plegd's
    /// core that has no runtime socket).
    pub fn none() -> Self {
        Self {
            runtime_socket: None,
            ebpf: EbpfStart::Off,
            plan: None,
        }
    }
}

/// The eBPF source's start: loaded probes, or why there are none.
pub enum EbpfStart {
    Loaded(Probes),
    /// `--mode auto` on a node that cannot load them: the reason, for health.
    Unavailable(ebpf::LoadError),
    /// Turned off by `--mode polling` or `--sources`.
    Off,
}

/// Loads the kernel probes as `config` asks: an error only in `--mode ebpf`; in auto mode a
/// failure is logged once and the daemon runs without them.
pub fn load_ebpf(config: &Config) -> Result<EbpfStart, ebpf::LoadError> {
    if !config.source_enabled(Source::Ebpf) {
        return Ok(EbpfStart::Off);
    }
    match Probes::load(config.ebpf_ring_bytes) {
        Ok(probes) => {
            // Said once: what this kernel lacks, and what that costs (`plegd check` lists all),
            // and how each probe attached.
            for (subject, available, detail) in probes.features().describe() {
                if !available {
                    info!("eBPF {subject}: {detail}");
                }
            }
            for (subject, attached, detail) in probes.describe_attachment() {
                if attached {
                    debug!("eBPF {subject}: {detail}");
                }
            }
            Ok(EbpfStart::Loaded(probes))
        }
        Err(error) if config.mode == Mode::Auto => {
            warn!("eBPF probes unavailable, running without them: {error}");
            Ok(EbpfStart::Unavailable(error))
        }
        Err(error) => Err(error),
    }
}

/// Where the push sources start, and what they report to.
pub struct Starter<'a> {
    pub config: &'a Config,
    pub triggers: &'a TriggerSender,
    pub registry: &'a SourceRegistry,
    pub metrics: &'a Metrics,
    /// The pods as last read (the eBPF source names an OOM kill's pod from it).
    pub cache: &'a Arc<PodCache>,
    pub shutdown: &'a CancellationToken,
}

impl Starter<'_> {
    /// Starts the push sources the config enables into `tasks`: the kernel probes, and the
    /// runtime's event streams on its socket. Marks those that do not run so health shows
    /// why, and every one with why it was chosen or not.
    pub fn start(&self, push: PushSources, tasks: &mut JoinSet<()>) {
        let plan = push.plan;
        if let Some(plan) = &plan {
            // The relist always runs: health does not list it.
            for (&source, why) in plan.why.iter().filter(|(s, _)| **s != Source::Relist) {
                self.registry.chose(source, why.clone());
            }
        }
        let why_off = |name: Source, otherwise: &str| {
            plan.as_ref()
                .and_then(|plan| plan.why.get(&name))
                .cloned()
                .unwrap_or_else(|| otherwise.to_owned())
        };
        let off = why_off(Source::Ebpf, "turned off by --mode or --sources");
        self.start_ebpf(push.ebpf, off, tasks);
        for name in [Source::Containerd, Source::CriEvents] {
            let enabled = self.config.source_enabled(name);
            match push.runtime_socket.clone().filter(|_| enabled) {
                Some(socket) => self.start_stream(name, socket, tasks),
                None => {
                    let why = if enabled {
                        "no runtime socket".to_owned()
                    } else {
                        why_off(name, "turned off by --sources")
                    };
                    self.registry.set(name, SourceState::Disabled, why);
                }
            }
        }
    }

    /// The kernel probes' source, or why it does not run (`off`: as the plan or config says).
    fn start_ebpf(&self, probes: EbpfStart, off: String, tasks: &mut JoinSet<()>) {
        let probes = match probes {
            EbpfStart::Loaded(probes) => probes,
            EbpfStart::Unavailable(reason) => {
                self.registry
                    .set(Source::Ebpf, SourceState::Unsupported, reason.to_string());
                return;
            }
            EbpfStart::Off => {
                self.registry.set(Source::Ebpf, SourceState::Disabled, off);
                return;
            }
        };
        self.registry.set(Source::Ebpf, SourceState::Connecting, "");
        let run = ebpf::run(
            probes,
            self.config.namespaces.clone(),
            self.triggers.clone(),
            self.registry.clone(),
            self.metrics.clone(),
            Arc::clone(self.cache),
            self.shutdown.clone(),
        );
        let registry = self.registry.clone();
        tasks.spawn(async move {
            if let Err(error) = run.await {
                // The relist's fast period comes back with the state change.
                error!("the eBPF source stopped: {error}");
                registry.set(Source::Ebpf, SourceState::Unsupported, error.to_string());
            }
        });
    }

    /// One of the runtime's event streams, on `socket`.
    fn start_stream(&self, name: Source, socket: PathBuf, tasks: &mut JoinSet<()>) {
        let (triggers, registry) = (self.triggers.clone(), self.registry.clone());
        let shutdown = self.shutdown.clone();
        if name == Source::Containerd {
            let config = containerd_events_config(self.config, socket);
            tasks.spawn(containerd_events::run(config, triggers, registry, shutdown));
        } else {
            let config = CriEventsConfig {
                socket,
                timeout: self.config.runtime_timeout,
            };
            tasks.spawn(cri_events::run(config, triggers, registry, shutdown));
        }
    }
}

/// The containerd event stream's settings: CRI keeps its containers in one namespace; the
/// containerd backend reads those configured.
fn containerd_events_config(config: &Config, socket: PathBuf) -> ContainerdEventsConfig {
    let namespaces = match config.runtime {
        RuntimeKind::Cri => vec![CRI_NAMESPACE.to_owned()],
        RuntimeKind::Containerd => config.namespaces.clone(),
    };
    ContainerdEventsConfig {
        socket,
        namespaces,
        timeout: config.runtime_timeout,
        heartbeat: config.event_heartbeat,
        presence: config.emit_changed,
    }
}
