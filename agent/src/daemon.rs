//! `plegd run`: the PLEG core wired to a runtime, a trigger channel, the sync loop and the
//! event output, until shutdown.

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncWrite, AsyncWriteExt as _},
    sync::{mpsc, watch},
};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::{
    api::{self, ApiBus, Metrics},
    config::{Config, Mode, SourceName},
    output::EventLine,
    pleg::{
        cache::PodCache,
        clock::{Clock, SystemClock},
        event::TriggerSource,
        generator::{self, TriggerSender},
        health::Health,
        relist::{RelistConfig, Relister},
        scheduler::{RelistScheduler, SchedulerConfig},
    },
    runtime::{
        AnyRuntime, ConnectError, EndpointError, Runtime, RuntimeKind, RuntimeOptions,
        containerd::CRI_NAMESPACE, endpoint,
    },
    sources::{
        containerd_events::{self, ContainerdEventsConfig},
        cri_events::{self, CriEventsConfig},
        ebpf::{self, Probes},
        status::{SourceRegistry, SourceState},
    },
    state::{self, SavedRun},
    sync_loop::{self, RecordingSyncHandler, SyncConfig},
};

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

/// A runtime reached by [`connect`], and the socket it answers on (where the event sources
/// subscribe).
#[derive(Clone, Debug)]
pub struct Connected {
    pub runtime: AnyRuntime,
    pub socket: PathBuf,
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
    };
    let mut delay = Duration::from_secs(1);
    loop {
        match try_connect(config, &options).await {
            Ok((runtime, socket)) => {
                match runtime.version().await {
                    Ok(version) => info!(
                        endpoint = %socket.display(),
                        runtime = %version,
                        "connected to the runtime"
                    ),
                    // Connected but not answering (yet): relists retry, and health reports an
                    // outage once it lasts past the threshold.
                    Err(error) => warn!(%error, "runtime not answering yet; relists will retry"),
                }
                return Ok(Some(Connected { runtime, socket }));
            }
            Err(Retry::Never(e)) => return Err(e),
            Err(Retry::After(reason)) => {
                error!("cannot reach the runtime: {reason}; retrying in {delay:?}");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(CONNECT_BACKOFF_MAX);
    }
}

enum Retry {
    Never(StartError),
    After(String),
}

async fn try_connect(
    config: &Config,
    options: &RuntimeOptions,
) -> Result<(AnyRuntime, PathBuf), Retry> {
    let socket = match &config.runtime_endpoint {
        Some(given) => endpoint::parse_endpoint(given).map_err(|e| Retry::Never(e.into()))?,
        None => endpoint::detect(&endpoint::WELL_KNOWN_SOCKETS)
            .map_err(|e| Retry::After(e.to_string()))?,
    };
    match AnyRuntime::connect(config.runtime, &socket, options.clone()).await {
        Ok(runtime) => Ok((runtime, socket)),
        Err(ConnectError::Namespace(e)) => Err(Retry::Never(e.into())),
        Err(ConnectError::Runtime(e)) => {
            Err(Retry::After(endpoint::with_causes(e.to_string(), &e)))
        }
    }
}

/// What a running daemon shares with its surroundings (API servers, sources, tests).
#[derive(Clone, Debug)]
pub struct Shared {
    pub cache: Arc<PodCache>,
    pub health: Arc<Health>,
    pub triggers: TriggerSender,
    pub sources: SourceRegistry,
    /// Every published event, for the API's watchers.
    pub bus: ApiBus,
    pub metrics: Metrics,
}

/// What the push sources start from.
pub struct PushSources {
    /// Where the runtime's event streams are (none: no stream sources).
    pub runtime_socket: Option<PathBuf>,
    pub ebpf: EbpfStart,
}

/// The eBPF source's start: loaded probes, or why there are none.
pub enum EbpfStart {
    Loaded(Probes),
    /// `--mode auto` on a node that cannot load them: the reason, for health.
    Unavailable(String),
    /// Turned off by `--mode polling` or `--sources`.
    Off,
}

/// Loads the kernel probes as `config` asks: an error only in `--mode ebpf`; in auto mode a
/// failure is logged once and the daemon runs without them.
pub fn load_ebpf(config: &Config) -> Result<EbpfStart, ebpf::LoadError> {
    if !config.source_enabled(SourceName::Ebpf) {
        return Ok(EbpfStart::Off);
    }
    match Probes::load() {
        Ok(probes) => Ok(EbpfStart::Loaded(probes)),
        Err(error) if config.mode == Mode::Auto => {
            warn!("eBPF probes unavailable, running without them: {error}");
            Ok(EbpfStart::Unavailable(error.to_string()))
        }
        Err(error) => Err(error),
    }
}

/// Runs the daemon on `runtime` until `shutdown`, writing one line per event to `out`;
/// continues the run saved in `config.state_dir` if there is one for this runtime, and saves
/// the run there when it stops cleanly. `started` receives the shared handles once everything
/// is wired.
pub async fn serve<R, W>(
    runtime: R,
    push: PushSources,
    config: &Config,
    out: W,
    shutdown: CancellationToken,
    started: Option<tokio::sync::oneshot::Sender<Shared>>,
) -> std::io::Result<()>
where
    R: Runtime,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let cache = Arc::new(PodCache::new());
    let health = Arc::new(Health::new(Arc::clone(&clock), config.relist_threshold));
    let metrics = Metrics::new();
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
    let (events_tx, events_rx) = mpsc::channel(config.event_channel_capacity);
    let mut relister = Relister::new(
        runtime,
        Arc::clone(&clock),
        Arc::clone(&cache),
        Arc::clone(&health),
        events_tx,
        RelistConfig {
            inspect_concurrency: config.inspect_concurrency,
            emit_changed: config.emit_changed,
        },
    )
    .with_metrics(metrics.clone());
    if let Some((records, sequence)) = reading {
        relister.restore(records, sequence);
    }
    let scheduler = RelistScheduler::new(
        SchedulerConfig {
            full_relist_period: config.relist_period,
            ..SchedulerConfig::default()
        },
        clock.now(),
    );
    let (triggers, trigger_rx) = generator::trigger_channel();
    let sources = SourceRegistry::with_metrics(metrics.clone());
    let (period_tx, period_rx) = watch::channel(config.relist_period);
    let adaptive_period = tokio::spawn(sources.clone().drive_relist_period(
        period_tx,
        config.relist_period,
        config.slow_relist_period,
    ));

    let stream_sources =
        start_stream_sources(config, push, &triggers, &sources, &metrics, &shutdown);

    // The relister's reading is taken when it stops; dropping it lets the sync loop drain.
    let generator = tokio::spawn({
        let run = generator::run(
            relister,
            scheduler,
            Arc::clone(&clock),
            trigger_rx,
            period_rx,
            shutdown.clone(),
        );
        async move { run.await.into_saved() }
    });
    let (forward_tx, mut forward_rx) = mpsc::channel(config.event_channel_capacity);
    let sync = tokio::spawn(sync_loop::run(
        events_rx,
        forward_tx,
        Arc::clone(&cache),
        Arc::clone(&health),
        Arc::clone(&clock),
        Arc::new(RecordingSyncHandler::default()),
        SyncConfig::default(),
        shutdown.clone(),
    ));
    if let Some(started) = started {
        // The receiver may have stopped caring; the daemon runs regardless.
        let _ = started.send(Shared {
            cache: Arc::clone(&cache),
            health: Arc::clone(&health),
            triggers,
            sources: sources.clone(),
            bus: bus.clone(),
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

    let mut out = out;
    let mut result = Ok(());
    while let Some(event) = forward_rx.recv().await {
        // The API's watchers get it through the bus, which never blocks; stdout below.
        api::publish(&bus, &metrics, &event, &cache);
        let mut line = EventLine::new(&event, &cache).render(config.output);
        line.push('\n');
        if let Err(e) = write_line(&mut out, &line).await {
            warn!(error = %e, "writing events failed; stopping");
            shutdown.cancel();
            result = Err(e);
            break;
        }
    }
    adaptive_period.abort();
    for source in &stream_sources {
        source.abort();
    }
    if let Err(e) = sync.await {
        warn!(error = %e, "the sync loop ended abnormally");
    }
    match generator.await {
        // Saved only when every event generated was published (not after an output failure).
        Ok((records, sequence)) if result.is_ok() => save(
            config,
            SavedRun {
                runtime: runtime_id,
                run_id: bus.run_id(),
                sequence,
                records,
            },
            &bus,
        ),
        Ok(_) => {}
        Err(e) => warn!(error = %e, "the generator ended abnormally"),
    }
    info!("plegd stopped");
    result
}

/// What the saved records were read from: a state saved for anything else is not used.
fn runtime_identity(config: &Config, socket: Option<&std::path::Path>) -> String {
    let endpoint = socket.map_or_else(|| "-".to_owned(), endpoint::endpoint_name);
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
    if run.sequence != bus.last_sequence() {
        warn!(
            generated = run.sequence,
            published = bus.last_sequence(),
            "not every event was published; the next start is a new run"
        );
        return;
    }
    match state::save(dir, &run, &bus.history()) {
        Ok(()) => info!(
            dir = %dir.display(),
            sequence = run.sequence,
            "saved the run for the next start"
        ),
        Err(e) => warn!("cannot save the run: {e}; the next start is a new run"),
    }
}

/// Starts the runtime event stream sources `config` enables, on `socket`; marks the disabled
/// ones so health shows why they are off.
fn start_stream_sources(
    config: &Config,
    push: PushSources,
    triggers: &TriggerSender,
    registry: &SourceRegistry,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
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
            registry.set(TriggerSource::Ebpf, SourceState::Unsupported, reason);
        }
        EbpfStart::Off => {
            registry.set(
                TriggerSource::Ebpf,
                SourceState::Disabled,
                "turned off by --mode or --sources",
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
                "no runtime socket"
            } else {
                "turned off by --sources"
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

async fn write_line<W: AsyncWrite + Unpin>(out: &mut W, line: &str) -> std::io::Result<()> {
    out.write_all(line.as_bytes()).await?;
    // One line at a time: a consumer piping stdout must see each event as it happens.
    out.flush().await
}
