//! `plegd run`: the PLEG core wired to a runtime, a trigger channel, the sync loop and the
//! event output, until shutdown.

mod notify;

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::{io::AsyncWrite, sync::watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

pub use crate::api::Shared;
use crate::{
    api::{self, ApiBus, BusSink, ObservationBus},
    backoff::{Backoff, Exponential},
    config::{
        Config, Confirm, Mode, SourceName,
        fit::{self, RuntimeInfo},
    },
    metrics::Metrics,
    output,
    pleg::{
        cache::PodCache,
        event::TriggerSource,
        generator::{self, TriggerSender},
        health::Health,
        hints::Hints,
        relist::{RelistConfig, Relister, STOP_CONFIRM},
        scheduler::{DEFAULT_KERNEL_GRACE, RelistScheduler, SchedulerConfig},
    },
    runtime::{
        AnyRuntime, CRI_NAMESPACE, ConnectError, EndpointError, Runtime, RuntimeKind,
        RuntimeOptions,
        choice::{WELL_KNOWN_SOCKETS, detect, parse_endpoint},
        transport::{endpoint_name, with_causes},
    },
    sources::{
        containerd_events::{self, ContainerdEventsConfig},
        cri_events::{self, CriEventsConfig},
        ebpf::{self, Probes},
        status::{SourceRegistry, SourceState},
    },
    state::{self, SavedRun},
    sync_loop::{self, SyncConfig, SyncFeed, SyncHandler},
};

/// How long stdout may take, at shutdown, to take the events not yet written; a reader that
/// stopped reading is abandoned after it (like a watcher that stopped reading).
const STDOUT_DRAIN_GRACE: Duration = Duration::from_secs(3);

/// How long the relist before saving may take at shutdown.
const LAST_RELIST_GRACE: Duration = Duration::from_secs(5);

/// First wait between two attempts to reach the runtime at start, doubling after each.
const CONNECT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Longest wait between two attempts to reach the runtime at start.
const CONNECT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A start-up problem that retrying cannot fix.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error(transparent)]
    Namespace(#[from] crate::runtime::InvalidNamespace),
}

/// A runtime reached by [`connect`], the socket it answers on (where the event sources
/// subscribe) and what it said it is.
#[derive(Clone, Debug)]
pub struct Connected {
    pub runtime: AnyRuntime,
    pub socket: PathBuf,
    pub info: RuntimeInfo,
}

impl Connected {
    /// The push sources that fit this runtime ([`fit::choose`]): `config` with only those,
    /// and why each push source runs or not. An error when `config` asks for one that would
    /// take events from other agents (`cri-events` on containerd before 2.0).
    pub fn fit_sources(&self, config: &Config) -> Result<(Config, fit::Plan), fit::Refused> {
        let plan = fit::choose(&self.info, &config.source_request())?;
        for (source, why) in &plan.why {
            info!(source = ?source, on = plan.runs(*source), "{why}");
        }
        Ok((config.clone().with_plan(&plan), plan))
    }
}

/// Finds and connects to the runtime, retrying with backoff while it is not there (a node's
/// runtime may start after plegd). Each failed attempt logs why. `Ok(None)`: shut down while
/// waiting.
pub async fn connect(
    config: &Config,
    shutdown: &CancellationToken,
) -> Result<Option<Connected>, StartError> {
    let options = RuntimeOptions {
        call_timeout: config.runtime_timeout,
        namespaces: config.namespaces.clone(),
        ..RuntimeOptions::default()
    };
    let mut backoff = Backoff::new(Exponential::doubling(
        CONNECT_BACKOFF_BASE,
        CONNECT_BACKOFF_MAX,
    ));
    loop {
        match try_connect(config, &options).await {
            Ok((runtime, socket)) => {
                let info = match runtime.version().await {
                    Ok(version) => {
                        info!(
                            endpoint = %socket.display(),
                            runtime = %version,
                            "connected to the runtime"
                        );
                        RuntimeInfo::from_version(&version.name, &version.version)
                    }
                    // Connected but not answering (yet): relists retry, and health reports an
                    // outage once it lasts past the threshold. A socket that is not a runtime's
                    // (an HTTP/1 server, a proxy) fails here with an HTTP/2 error that does not
                    // say so by itself.
                    Err(error) => {
                        warn!(
                            %error,
                            "the runtime socket accepted a connection but did not answer \
                             Version; if it is not a container runtime's (CRI or containerd) \
                             socket, fix --runtime-endpoint; relists will retry"
                        );
                        RuntimeInfo::Unknown {
                            why: format!("Version failed: {error}"),
                        }
                    }
                };
                return Ok(Some(Connected {
                    runtime,
                    socket,
                    info,
                }));
            }
            Err(Retry::Never(e)) => return Err(e),
            Err(Retry::After(unreachable)) => {
                let delay = backoff.next_delay();
                error!("cannot reach the runtime: {unreachable}; retrying in {delay:?}");
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(None),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

enum Retry {
    Never(StartError),
    After(Unreachable),
}

/// Why the runtime cannot be reached yet; retried.
#[derive(Debug, thiserror::Error)]
enum Unreachable {
    #[error(transparent)]
    NoSocket(EndpointError),
    /// Shown with every cause: tonic's own text is often just "transport error".
    #[error("{}", with_causes(.0.to_string(), .0))]
    Runtime(crate::runtime::RuntimeError),
}

async fn try_connect(
    config: &Config,
    options: &RuntimeOptions,
) -> Result<(AnyRuntime, PathBuf), Retry> {
    let socket = match &config.runtime_endpoint {
        Some(given) => parse_endpoint(given).map_err(|e| Retry::Never(e.into()))?,
        None => detect(&WELL_KNOWN_SOCKETS).map_err(|e| Retry::After(Unreachable::NoSocket(e)))?,
    };
    match AnyRuntime::connect(config.runtime, &socket, options.clone()).await {
        Ok(runtime) => Ok((runtime, socket)),
        Err(ConnectError::Namespace(e)) => Err(Retry::Never(e.into())),
        Err(ConnectError::Runtime(e)) => Err(Retry::After(Unreachable::Runtime(e))),
    }
}

/// What the push sources start from.
pub struct PushSources {
    /// Where the runtime's event streams are (none: no stream sources).
    pub runtime_socket: Option<PathBuf>,
    pub ebpf: EbpfStart,
    /// Why each push source runs or not, for health (none: as the config says).
    pub plan: Option<fit::Plan>,
}

impl PushSources {
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
    if !config.source_enabled(SourceName::Ebpf) {
        return Ok(EbpfStart::Off);
    }
    match Probes::load(config.ebpf_ring_bytes) {
        Ok(probes) => {
            // Said once: what this kernel lacks, and what that costs (`plegd check` lists all).
            for (subject, available, detail) in probes.features().describe() {
                if !available {
                    info!("eBPF {subject}: {detail}");
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

/// Runs the daemon on `runtime` until `shutdown`, writing one line per event to `out`;
/// continues the run saved in `config.state_dir` if there is one for this runtime, and saves
/// the run there when it stops cleanly. The sync loop hands each pod sync to the API's sync
/// watchers ([`Shared::syncs`]) and then to `handler` (`()`: none of one's own). `started`
/// receives the shared handles once everything is wired.
pub async fn serve<R, W, H>(
    runtime: R,
    push: PushSources,
    config: &Config,
    out: W,
    handler: H,
    shutdown: CancellationToken,
    started: Option<tokio::sync::oneshot::Sender<Shared>>,
) -> std::io::Result<()>
where
    R: Runtime,
    W: AsyncWrite + Unpin + Send + 'static,
    H: SyncHandler,
{
    let cache = Arc::new(PodCache::new());
    let health = Arc::new(Health::new(config.relist_threshold));
    let metrics = Metrics::counting(runtime.calls());
    let runtime_id = runtime_identity(config, push.runtime_socket.as_deref());
    let (bus, reading) = match restore(config, &runtime_id) {
        Some(state::Restored { run, history }) => (
            ApiBus::resumed(
                run.run_id,
                config.event_history,
                config.watch_queue,
                run.sequence,
                history,
            ),
            Some((run.records, run.sequence)),
        ),
        None => (
            ApiBus::new(api::new_run_id(), config.event_history, config.watch_queue),
            None,
        ),
    };
    // Closed however serve ends: watchers and the API's graceful shutdown wait for it.
    let _close = CloseOnDrop(bus.clone());
    let sink = BusSink {
        bus: bus.clone(),
        metrics: metrics.clone(),
    };
    let mut relister = Relister::new(
        runtime,
        Arc::clone(&cache),
        Arc::clone(&health),
        Arc::new(sink),
        RelistConfig {
            inspect_concurrency: config.inspect_concurrency,
            emit_changed: config.emit_changed,
            confirm: config.confirm.into(),
        },
    );
    if let Some((records, sequence)) = reading {
        relister.restore(records, sequence);
    }
    let scheduler = RelistScheduler::new(
        SchedulerConfig {
            full_relist_period: config.relist_period,
            ..SchedulerConfig::default()
        },
        tokio::time::Instant::now(),
    );
    let observations = ObservationBus::new(Arc::clone(&cache), bus.run_id());
    let (triggers, trigger_rx) = generator::observed_trigger_channel(
        Some(Arc::new(observations.clone())),
        config.emit_changed,
    );
    let sources = SourceRegistry::with_metrics(metrics.clone());
    let (period_tx, period_rx) = watch::channel(config.relist_period);
    let adaptive_period = tokio::spawn(sources.clone().drive_relist_period(
        period_tx,
        config.relist_period,
        config.slow_relist_period,
    ));

    // Kernel triggers wait for containerd's own task events only where those confirm.
    let (grace_tx, grace_rx) = watch::channel(Duration::ZERO);
    let kernel_grace = (config.confirm == Confirm::Task).then(|| {
        tokio::spawn(sources.clone().drive_kernel_grace(
            grace_tx,
            TriggerSource::Containerd,
            DEFAULT_KERNEL_GRACE,
        ))
    });

    let stream_sources =
        start_stream_sources(config, push, &triggers, &sources, &metrics, &shutdown);

    // The consumers subscribe before the first relist: they see every event of the run.
    let live = || {
        bus.consume(0, config.event_channel_capacity)
            .expect("a live-only subscription always starts")
    };
    let syncs = SyncFeed::new();
    let sync = tokio::spawn(sync_loop::run(
        bus.clone(),
        live(),
        Arc::clone(&cache),
        Arc::clone(&health),
        Arc::new((syncs.clone(), handler)),
        metrics.clone(),
        SyncConfig {
            resync_interval: config.sync_frequency,
            ..SyncConfig::default()
        },
        shutdown.clone(),
    ));
    let mut stdout = tokio::spawn(output::write_events(
        bus.clone(),
        live(),
        out,
        config.output,
    ));
    // The relister's reading is taken when it stops, to be saved.
    let generator = tokio::spawn({
        let run = generator::run(
            relister,
            scheduler,
            trigger_rx,
            period_rx,
            grace_rx,
            metrics.clone(),
            shutdown.clone(),
        );
        let saving = config.state_dir.is_some();
        async move {
            let generator::Stopped {
                mut relister,
                pending,
            } = run.await;
            if saving {
                last_relist(&mut relister, &pending).await;
            }
            relister.into_saved()
        }
    });
    if let Some(started) = started {
        // The receiver may have stopped caring; the daemon runs regardless.
        let _ = started.send(Shared {
            cache: Arc::clone(&cache),
            health: Arc::clone(&health),
            triggers,
            sources: sources.clone(),
            bus: bus.clone(),
            observations,
            syncs: syncs.clone(),
            metrics: metrics.clone(),
        });
    }
    info!(
        period = ?config.relist_period,
        slow_period = ?config.slow_relist_period,
        threshold = ?config.relist_threshold,
        sources = ?config.sources,
        "plegd running"
    );
    // systemd (`Type=notify`) starts the units ordered after plegd once the cache holds the
    // node's pods; a no-op without $NOTIFY_SOCKET.
    let ready = tokio::spawn(notify::ready_after_first_relist(Arc::clone(&health)));

    // Runs until shutdown, or until stdout cannot be written.
    let stdout_failed = tokio::select! {
        () = shutdown.cancelled() => None,
        written = &mut stdout => Some(written),
    };
    if stdout_failed.is_some() {
        shutdown.cancel();
    }
    ready.abort();
    notify::send(notify::STOPPING);
    // Every event the generator made is on the bus once it stops; then the bus closes and
    // each consumer ends after what it has queued.
    let generated = generator.await;
    bus.close();
    let written = match stdout_failed {
        Some(written) => written,
        None => match tokio::time::timeout(STDOUT_DRAIN_GRACE, &mut stdout).await {
            Ok(written) => written,
            Err(_) => {
                stdout.abort();
                warn!(
                    grace = ?STDOUT_DRAIN_GRACE,
                    "stdout is not being read; abandoning the events not written yet"
                );
                Ok(Ok(()))
            }
        },
    };
    let result = match written {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            warn!(error = %e, "writing events failed; stopping");
            Err(e)
        }
        Err(e) => Err(std::io::Error::other(e)),
    };
    adaptive_period.abort();
    if let Some(task) = kernel_grace {
        task.abort();
    }
    for source in &stream_sources {
        source.abort();
    }
    if let Err(e) = sync.await {
        warn!(error = %e, "the sync loop ended abnormally");
    }
    syncs.close();
    match generated {
        // Every event is in the bus's history, which is saved with the reading: the next
        // start continues the run whatever stdout managed to write.
        Ok((records, sequence)) => save(
            config,
            SavedRun {
                runtime: runtime_id,
                run_id: bus.run_id(),
                sequence,
                records,
            },
            &bus,
        ),
        Err(e) => warn!(error = %e, "the generator ended abnormally"),
    }
    info!("plegd stopped");
    result
}

/// Relists everything once more before the reading is saved, on the hints of the triggers
/// still `pending`: a start or an exit whose trigger was still queued at the signal is
/// published now, with its exit code, rather than diffed by the next start from a runtime that
/// may have removed the container meanwhile (then its start is never told, and its death has
/// no code). The hints matter: containerd's `/tasks/exit` confirms an exit some 30 ms before
/// its CRI store shows it, and a plain listing then shows the container still running; what
/// no reading reflects yet is read again for up to [`STOP_CONFIRM`]. Bounded: a runtime that
/// does not answer costs the save nothing but [`LAST_RELIST_GRACE`].
async fn last_relist<R: Runtime>(relister: &mut Relister<R>, pending: &Hints) {
    match tokio::time::timeout(
        LAST_RELIST_GRACE,
        relister.relist_before_stop(pending, STOP_CONFIRM),
    )
    .await
    {
        Ok(Ok(left)) if left.is_empty() => debug!("relisted before saving"),
        Ok(Ok(left)) => info!(
            unreflected = left.targets().count(),
            "relisted before saving; the runtime did not reflect every last trigger in time"
        ),
        Ok(Err(error)) => warn!(%error, "the last relist failed; saving the reading before it"),
        Err(_) => warn!(
            grace = ?LAST_RELIST_GRACE,
            "the last relist did not finish; saving the reading before it"
        ),
    }
}

/// Closes the bus when dropped.
struct CloseOnDrop(ApiBus);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// What the saved records were read from: a state saved for anything else is not used.
fn runtime_identity(config: &Config, socket: Option<&std::path::Path>) -> String {
    let endpoint = socket.map_or_else(|| "-".to_owned(), endpoint_name);
    match config.runtime {
        RuntimeKind::Cri => format!("cri {endpoint}"),
        RuntimeKind::Containerd => {
            format!("containerd {endpoint} {}", config.namespaces.join(","))
        }
    }
}

/// The run a clean shutdown saved, if any: a damaged state is reported and started over.
fn restore(config: &Config, runtime: &str) -> Option<state::Restored> {
    let dir = config.state_dir.as_deref()?;
    match state::take(dir, runtime) {
        Ok(Some(restored)) => {
            info!(
                run_id = format!("{:x}", restored.run.run_id),
                sequence = restored.run.sequence,
                pods = restored.run.records.len(),
                history = restored.history.len(),
                "continuing the run saved at the last shutdown"
            );
            Some(restored)
        }
        Ok(None) => None,
        Err(e) => {
            warn!("not using the saved state: {e}; starting a new run");
            None
        }
    }
}

/// Saves the run for the next start; a failure only costs that start its continuity.
fn save(config: &Config, run: SavedRun, bus: &ApiBus) {
    let Some(dir) = config.state_dir.as_deref() else {
        return;
    };
    match state::save(dir, &run, &bus.history()) {
        Ok(()) => info!(
            dir = %dir.display(),
            sequence = run.sequence,
            "saved the run for the next start"
        ),
        Err(e) => warn!("cannot save the run: {e}; the next start is a new run"),
    }
}

/// The trigger source a `--sources` name stands for (`None`: the relist).
fn trigger_source(name: SourceName) -> Option<TriggerSource> {
    match name {
        SourceName::Ebpf => Some(TriggerSource::Ebpf),
        SourceName::Containerd => Some(TriggerSource::Containerd),
        SourceName::CriEvents => Some(TriggerSource::CriEvents),
        SourceName::Relist => None,
    }
}

/// Starts the runtime event stream sources `config` enables, on `socket`; marks the disabled
/// ones so health shows why they are off, and every one with why it was chosen or not.
fn start_stream_sources(
    config: &Config,
    push: PushSources,
    triggers: &TriggerSender,
    registry: &SourceRegistry,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let plan = push.plan;
    if let Some(plan) = &plan {
        for (name, why) in &plan.why {
            if let Some(source) = trigger_source(*name) {
                registry.chose(source, why.clone());
            }
        }
    }
    let why_off = |name: SourceName, otherwise: &str| {
        plan.as_ref()
            .and_then(|plan| plan.why.get(&name))
            .cloned()
            .unwrap_or_else(|| otherwise.to_owned())
    };
    match push.ebpf {
        EbpfStart::Loaded(probes) => {
            registry.set(TriggerSource::Ebpf, SourceState::Connecting, "");
            let run = ebpf::run(
                probes,
                config.namespaces.clone(),
                triggers.clone(),
                registry.clone(),
                metrics.clone(),
                shutdown.clone(),
            );
            let registry = registry.clone();
            tasks.push(tokio::spawn(async move {
                if let Err(error) = run.await {
                    // The relist's fast period comes back with the state change.
                    error!("the eBPF source stopped: {error}");
                    registry.set(
                        TriggerSource::Ebpf,
                        SourceState::Unsupported,
                        error.to_string(),
                    );
                }
            }));
        }
        EbpfStart::Unavailable(reason) => {
            registry.set(
                TriggerSource::Ebpf,
                SourceState::Unsupported,
                reason.to_string(),
            );
        }
        EbpfStart::Off => {
            registry.set(
                TriggerSource::Ebpf,
                SourceState::Disabled,
                why_off(SourceName::Ebpf, "turned off by --mode or --sources"),
            );
        }
    }
    let socket = push.runtime_socket;
    for (name, source) in [
        (SourceName::Containerd, TriggerSource::Containerd),
        (SourceName::CriEvents, TriggerSource::CriEvents),
    ] {
        let Some(socket) = socket.clone().filter(|_| config.source_enabled(name)) else {
            let why = if config.source_enabled(name) {
                "no runtime socket".to_owned()
            } else {
                why_off(name, "turned off by --sources")
            };
            registry.set(source, SourceState::Disabled, why);
            continue;
        };
        let (triggers, registry, shutdown) = (triggers.clone(), registry.clone(), shutdown.clone());
        tasks.push(match name {
            SourceName::Containerd => {
                // CRI keeps its containers in one namespace; the containerd backend reads those
                // configured.
                let namespaces = match config.runtime {
                    RuntimeKind::Cri => vec![CRI_NAMESPACE.to_owned()],
                    RuntimeKind::Containerd => config.namespaces.clone(),
                };
                tokio::spawn(containerd_events::run(
                    ContainerdEventsConfig {
                        socket,
                        namespaces,
                        timeout: config.runtime_timeout,
                        heartbeat: config.event_heartbeat,
                        presence: config.emit_changed,
                    },
                    triggers,
                    registry,
                    shutdown,
                ))
            }
            _ => tokio::spawn(cri_events::run(
                CriEventsConfig {
                    socket,
                    timeout: config.runtime_timeout,
                },
                triggers,
                registry,
                shutdown,
            )),
        });
    }
    tasks
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::{
        config::{OutputFormat, RunArgs},
        pleg::record::ContainerState,
        runtime::testing::{FakeRuntime, container},
    };

    /// A container that exits with no trigger before a clean stop (its hint still queued, or
    /// none yet): the relist before saving publishes its death with the code, and the saved
    /// reading has it exited, so the next start owes it nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clean_stop_relists_before_saving() {
        let state = tempfile::tempdir().unwrap();
        let config = Config::load(&RunArgs {
            sources: Some(vec![SourceName::Relist]),
            // No periodic relist while the test runs: only the first one and the last.
            relist_period: Some(Duration::from_secs(600)),
            slow_relist_period: Some(Duration::from_secs(600)),
            relist_threshold: Some(Duration::from_secs(1200)),
            state_dir: Some(state.path().to_owned()),
            ..RunArgs::default()
        })
        .unwrap();
        let runtime = FakeRuntime::new();
        runtime.add_pod("p", "ns", "p");
        runtime.set_container("p", container("c", "app", ContainerState::Running));
        let shutdown = CancellationToken::new();
        let (started, shared) = tokio::sync::oneshot::channel();
        let daemon = tokio::spawn({
            let (runtime, shutdown, config) = (runtime.clone(), shutdown.clone(), config.clone());
            async move {
                let push = PushSources::none();
                serve(
                    runtime,
                    push,
                    &config,
                    tokio::io::sink(),
                    (),
                    shutdown,
                    Some(started),
                )
                .await
            }
        });
        let shared = shared.await.unwrap();
        let mut watcher = shared.bus.consume(1, 16).unwrap();
        let first = tokio::time::timeout(Duration::from_secs(20), watcher.next())
            .await
            .expect("the first relist's event")
            .unwrap();
        assert_eq!(first.container_id, "c");

        runtime.set_state("p", "c", ContainerState::Exited, Some(3));
        shutdown.cancel();
        daemon.await.unwrap().unwrap();

        let saved = state::take(state.path(), &runtime_identity(&config, None))
            .unwrap()
            .expect("a saved run");
        let died = saved.history.last().expect("the death in the history");
        assert_eq!(
            (died.container_id.as_str(), died.r#type, died.exit_code),
            (
                "c",
                plegd_proto::v1::EventType::ContainerDied as i32,
                Some(3)
            )
        );
        let pod = &saved.run.records[&crate::pleg::record::PodUid("p".to_owned())];
        assert_eq!(
            pod.containers[&crate::pleg::record::ContainerId("c".to_owned())].state,
            ContainerState::Exited
        );
    }

    /// stdout is a pipe nobody reads: the relist neither waits on it nor spins, a watcher
    /// still gets every event, and shutdown abandons stdout after its grace.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_stdout_delays_nobody_and_is_abandoned_at_shutdown() {
        const PODS: usize = 300;
        let period = Duration::from_millis(10);
        let config = Config::load(&RunArgs {
            sources: Some(vec![SourceName::Relist]),
            relist_period: Some(period),
            output: Some(OutputFormat::Json),
            state_dir: Some("none".into()),
            ..RunArgs::default()
        })
        .unwrap();
        let runtime = FakeRuntime::new();
        // Holds a few lines: the writer blocks for good after them.
        let (stdout, _never_read) = tokio::io::duplex(1024);
        let shutdown = CancellationToken::new();
        let (started, shared) = tokio::sync::oneshot::channel();
        let daemon = tokio::spawn({
            let (runtime, shutdown) = (runtime.clone(), shutdown.clone());
            async move {
                let push = PushSources::none();
                serve(runtime, push, &config, stdout, (), shutdown, Some(started)).await
            }
        });
        let shared = shared.await.unwrap();
        let mut watcher = shared.bus.consume(0, 10 * PODS).unwrap();

        for i in 0..PODS {
            let pod = format!("p{i}");
            runtime.add_pod(&pod, "ns", &pod);
            runtime.set_container(
                &pod,
                container(&format!("c{i}"), "app", ContainerState::Running),
            );
        }
        let deadline = Duration::from_secs(20);
        let mut started_containers = 0;
        while started_containers < PODS {
            let event = tokio::time::timeout(deadline, watcher.next())
                .await
                .expect("the watcher gets every event while stdout is stalled")
                .expect("subscription alive");
            started_containers += usize::from(!event.container_id.is_empty());
        }

        // Idle relists at the period, not a loop: about 50 in half a second.
        let before = runtime.list_calls().len();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let lists = runtime.list_calls().len() - before;
        assert!(lists <= 60, "{lists} lists in 500 ms at a 10 ms period");

        let stopping = Instant::now();
        shutdown.cancel();
        tokio::time::timeout(STDOUT_DRAIN_GRACE + Duration::from_secs(5), daemon)
            .await
            .expect("shutdown does not wait for stdout beyond its grace")
            .unwrap()
            .unwrap();
        assert!(
            stopping.elapsed() >= STDOUT_DRAIN_GRACE,
            "stdout was given its grace"
        );
    }
}
