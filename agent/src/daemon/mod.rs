//! `plegd run` and `plegd check`: the PLEG wired to a runtime, its push sources, the event
//! output and the API, owned by one [`Daemon`] until shutdown.
//!
//! - `boot`: `plegd run` from start to exit: the privileged start, the async runtime, the
//!   runtime reached, the [`Daemon`] run until a signal.
//! - `connect`: reaching the runtime at start, with backoff.
//! - `push`: the push sources (the kernel probes, the runtime's event streams).
//! - `state`: the run saved at a clean shutdown and continued at the next start.
//! - `notify`: systemd's readiness protocol.
//! - `check`: `plegd check`, what the node offers.

pub mod boot;
pub mod check;
mod connect;
mod notify;
mod push;
pub(crate) mod state;

use std::time::Duration;

use tokio::{io::AsyncWrite, task::JoinSet};
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};
use tracing::{error, info, warn};

pub use self::{
    connect::{Connected, StartError, connect},
    push::{EbpfStart, PushSources, load_ebpf},
};
use crate::{
    api::{Listeners, Shared, listen::ServeError},
    base::metrics::Metrics,
    config::Config,
    export::{ExportError, Exporter, Origin, Receiver},
    output,
    pleg::{
        DEFAULT_KERNEL_GRACE, Options, Pleg, RelistConfig, Running, Runtime, Source, Store,
        SyncConfig, SyncHandler,
    },
    sources::status::SourceRegistry,
};

/// How often the per-container series of gone pods are dropped, beside each scrape: on a
/// node nobody scrapes they stay bounded too.
const SERIES_HOUSEKEEPING: Duration = Duration::from_secs(60);

/// How long stdout may take, at shutdown, to take the events not yet written; a reader that
/// stopped reading is abandoned after it (like a watcher that stopped reading).
const STDOUT_DRAIN_GRACE: Duration = Duration::from_secs(2);

/// How long the OTLP receiver may take, at shutdown, to acknowledge the events not sent yet;
/// what it has not by then is sent by the next start that continues the run.
const OTLP_DRAIN_GRACE: Duration = Duration::from_secs(2);

/// The longest a stop may take from SIGTERM (or a fault) to the exit: the PLEG's last relist
/// (2 s at most), the consumers' graces (together) and saving the run fit in it, and the API's
/// drain grace, which runs from the same start; `plegd run` exits when it has passed, whatever
/// is left.
pub const STOP_DEADLINE: Duration = Duration::from_millis(4500);

/// A fault inside plegd: it stops, with this error, rather than run on without the part that
/// failed (the service manager restarts it; `Restart=always` in the unit).
#[derive(Debug, thiserror::Error)]
pub enum Fault {
    #[error("a push source's task panicked: {message}")]
    SourcePanicked { message: String },
    #[error("the PLEG's generator loop ended while plegd ran (it panicked)")]
    GeneratorEnded,
    #[error("the OTLP exporter ended while plegd ran (it panicked)")]
    ExporterEnded,
    #[error("the API failed: {0}")]
    ApiFailed(#[source] ServeError),
    #[error("the API's task panicked: {message}")]
    ApiPanicked { message: String },
    #[error("the API stopped serving while plegd ran")]
    ApiEnded,
}

/// A running daemon: it owns everything it started, the API's servers included.
/// [`Daemon::run`] ends it in order ([`Daemon::stop`]); dropping it aborts what is left.
pub struct Daemon {
    pleg: Pleg,
    running: Running,
    shared: Shared,
    /// The push sources and the tasks that tune the PLEG from their states.
    sources: JoinSet<()>,
    /// Cancels the push sources.
    stop_sources: CancellationToken,
    stdout: AbortOnDropHandle<std::io::Result<()>>,
    /// Tells systemd once the first full relist filled the cache.
    ready: AbortOnDropHandle<()>,
    /// Feeds systemd's watchdog while the generator loop turns.
    watchdog: AbortOnDropHandle<()>,
    /// Drops the metric series of pods gone ([`SERIES_HOUSEKEEPING`]).
    series: AbortOnDropHandle<()>,
    /// Sends the events to an OTLP receiver, if one is configured.
    exporter: Option<Exporter>,
    /// The API's servers, when it was given listeners; taken once they end.
    api: Option<AbortOnDropHandle<Result<(), ServeError>>>,
    /// Cancelled as the stop begins: the API's servers then cut the connections of watchers
    /// that stopped reading after their grace.
    stopping: CancellationToken,
    config: Config,
    /// What the saved records are read from.
    runtime_id: String,
}

impl Daemon {
    /// Starts the daemon on `runtime`, writing one line per event to `out`, and serving its
    /// API on `listeners` if given (tests and benchmarks may go without); continues the run
    /// saved in `config.state_dir` if there is one for this runtime. The sync loop hands each
    /// pod sync to the API's sync watchers and then to `handler` (`()`: none of one's own).
    pub fn start<R, W, H>(
        runtime: R,
        push: PushSources,
        listeners: Option<Listeners>,
        config: &Config,
        out: W,
        handler: H,
    ) -> Result<Self, ExportError>
    where
        R: Runtime,
        W: AsyncWrite + Unpin + Send + 'static,
        H: SyncHandler,
    {
        // Checked before anything starts: its TLS files must be readable.
        let receiver = config.otlp.as_ref().map(Receiver::new).transpose()?;
        let metrics = Metrics::counting(runtime.calls());
        let runtime_id = state::runtime_identity(config, push.runtime_socket.as_deref());
        let (saved, exported) = state::restore(config, &runtime_id).unzip();
        let (pleg, running) = Pleg::start(
            runtime,
            handler,
            options(config, &push),
            saved,
            new_run_id(),
            &metrics,
        );
        let exporter = receiver
            .map(|receiver| start_export(receiver, &pleg, exported.flatten(), config, &metrics));
        // From the start's first event: stdout misses none, however late it subscribes.
        let events = pleg
            .events()
            .follow(pleg.first_sequence(), config.event_channel_capacity);
        let stdout = tokio::spawn(output::write_events(events, out, config.output));
        let registry = SourceRegistry::with_metrics(metrics.clone());
        let (sources, stop_sources) = start_sources(&pleg, push, &registry, config, &metrics);
        info!(
            period = ?config.relist_period,
            slow_period = ?config.slow_relist_period,
            threshold = ?config.relist_threshold,
            sources = ?config.sources,
            "plegd running"
        );
        // systemd (`Type=notify`) starts the units ordered after plegd once the cache holds
        // the node's pods; a no-op without $NOTIFY_SOCKET.
        let ready = tokio::spawn(notify::ready_after_first_relist(pleg.health().clone()));
        let watchdog = tokio::spawn(notify::watchdog(pleg.turns()));
        let shared = Shared {
            pleg: pleg.clone(),
            sources: registry,
            metrics,
        };
        let series = tokio::spawn(forget_gone_pods(shared.clone()));
        let stopping = CancellationToken::new();
        let api = listeners.map(|listeners| {
            AbortOnDropHandle::new(tokio::spawn(
                listeners.serve(shared.clone(), stopping.clone()),
            ))
        });
        Ok(Self {
            shared,
            pleg,
            running,
            sources,
            stop_sources,
            stdout: AbortOnDropHandle::new(stdout),
            ready: AbortOnDropHandle::new(ready),
            watchdog: AbortOnDropHandle::new(watchdog),
            series: AbortOnDropHandle::new(series),
            exporter,
            api,
            stopping,
            config: config.clone(),
            runtime_id,
        })
    }

    /// What the API serves.
    pub fn shared(&self) -> Shared {
        self.shared.clone()
    }

    /// Runs until `shutdown`, until stdout cannot be written, or until a fault (a task that
    /// panicked, the API failing: [`Fault`]); cancels `shutdown` then, and stops in order
    /// ([`Daemon::stop`]), within [`STOP_DEADLINE`]: past it, it returns without waiting for
    /// the rest (a stdout nobody reads, a watcher that stopped reading, an OTLP receiver gone
    /// cannot hold plegd). Returns stdout's error, if it failed, or the fault.
    pub async fn run(mut self, shutdown: CancellationToken) -> std::io::Result<()> {
        let ending = tokio::select! {
            () = shutdown.cancelled() => Ending::Asked,
            written = &mut self.stdout => Ending::Stdout(written),
            fault = fault(
                &mut self.sources,
                self.pleg.turns(),
                self.exporter.as_ref(),
                &mut self.api,
            ) => {
                error!("{fault}; stopping plegd");
                Ending::Fault(fault)
            }
        };
        shutdown.cancel();
        if let Ok(stopped) = tokio::time::timeout(STOP_DEADLINE, self.stop(ending)).await {
            return stopped;
        }
        warn!(
            deadline = ?STOP_DEADLINE,
            "stopping took too long; exiting without waiting for the rest"
        );
        Ok(())
    }

    /// Stops everything, in this order: the PLEG (its last relist, then its events: each
    /// consumer ends after what it has queued, the API's watch streams too), stdout and the
    /// OTLP export (each given a grace to take what is left), the push sources; then the run
    /// is saved for the next start, and the API's servers are waited for (they cut the
    /// connections of watchers that stopped reading
    /// [`DRAIN_GRACE`](crate::api::listen::DRAIN_GRACE) after the stop began, and remove the
    /// socket).
    async fn stop(mut self, ending: Ending) -> std::io::Result<()> {
        self.stopping.cancel();
        self.ready.abort();
        self.watchdog.abort();
        self.series.abort();
        notify::send(notify::STOPPING);
        let saved = self.running.stop().await;
        let (stdout_ended, fault) = match ending {
            Ending::Asked => (None, None),
            Ending::Stdout(written) => (Some(written), None),
            Ending::Fault(fault) => (None, Some(fault)),
        };
        let stdout = self.stdout;
        let (written, exported) = tokio::join!(
            async {
                match stdout_ended {
                    Some(written) => written,
                    None => drain(stdout).await,
                }
            },
            async {
                match self.exporter {
                    Some(exporter) => Some(exporter.finish(OTLP_DRAIN_GRACE).await),
                    None => None,
                }
            }
        );
        self.stop_sources.cancel();
        self.sources.shutdown().await;
        // Every event is in the bus's history, which is saved with the reading: the next start
        // continues the run whatever stdout and the OTLP receiver managed to take.
        if let Some(saved) = saved {
            state::keep(&self.config, &self.runtime_id, &saved, exported);
        }
        let served = match self.api {
            Some(api) => api.await,
            None => Ok(Ok(())),
        };
        drop(self.pleg);
        info!("plegd stopped");
        if let Some(fault) = fault {
            return Err(std::io::Error::other(fault));
        }
        match served {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(std::io::Error::other(Fault::ApiFailed(e))),
            Err(e) => return Err(std::io::Error::other(e)),
        }
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                warn!(error = %e, "writing events failed; stopping");
                Err(std::io::Error::new(
                    e.kind(),
                    format!("writing events to stdout: {e}"),
                ))
            }
            Err(e) => Err(std::io::Error::other(e)),
        }
    }
}

/// Why [`Daemon::run`] stops.
enum Ending {
    /// `shutdown` was cancelled.
    Asked,
    /// stdout's writer ended: it failed (or its task did).
    Stdout(Result<std::io::Result<()>, tokio::task::JoinError>),
    Fault(Fault),
}

/// Resolves at the first fault: a push source's task (or a tuning task) that panics, the
/// generator loop that ends (its pulse, `turns`, stops), the exporter that ends, the API's
/// servers failing (their task is then taken out of `api`). Tasks of `sources` that end
/// without a panic are reaped (a source that gave up says so in health).
async fn fault(
    sources: &mut JoinSet<()>,
    mut turns: tokio::sync::watch::Receiver<tokio::time::Instant>,
    exporter: Option<&Exporter>,
    api: &mut Option<AbortOnDropHandle<Result<(), ServeError>>>,
) -> Fault {
    let source = async {
        loop {
            match sources.join_next().await {
                None => std::future::pending::<()>().await,
                Some(Err(error)) if error.is_panic() => {
                    return Fault::SourcePanicked {
                        message: panic_message(error.into_panic()),
                    };
                }
                Some(_) => {}
            }
        }
    };
    let generator = async {
        while turns.changed().await.is_ok() {}
        Fault::GeneratorEnded
    };
    let exporter = async {
        match exporter {
            Some(exporter) => exporter.ended().await,
            None => std::future::pending().await,
        }
        Fault::ExporterEnded
    };
    let api = async {
        let Some(serving) = api.as_mut() else {
            return std::future::pending().await;
        };
        let served = serving.await;
        *api = None;
        match served {
            Ok(Err(error)) => Fault::ApiFailed(error),
            Err(error) if error.is_panic() => Fault::ApiPanicked {
                message: panic_message(error.into_panic()),
            },
            // The servers end cleanly only once the events close, at the stop.
            Ok(Ok(())) | Err(_) => Fault::ApiEnded,
        }
    };
    tokio::select! {
        fault = source => fault,
        fault = generator => fault,
        fault = exporter => fault,
        fault = api => fault,
    }
}

/// What a panic said, when it said it with a string (as `panic!` and `expect` do).
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => payload
            .downcast_ref::<&str>()
            .map_or_else(|| "(no message)".to_owned(), |m| (*m).to_owned()),
    }
}

/// Starts the OTLP export of `pleg`'s events: after the last one the receiver acknowledged if
/// this start continues a run that exported (`exported`), else from this start's first.
fn start_export(
    receiver: Receiver,
    pleg: &Pleg,
    exported: Option<u64>,
    config: &Config,
    metrics: &Metrics,
) -> Exporter {
    let from = exported.map_or(pleg.first_sequence(), |acknowledged| acknowledged + 1);
    let events = pleg.events().follow(from, config.event_channel_capacity);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    Exporter::start(
        receiver,
        events,
        pleg.events().run_id(),
        Origin::new(host.trim()),
        metrics.clone(),
    )
}

/// Drops the metric series of gone pods every [`SERIES_HOUSEKEEPING`], until aborted.
async fn forget_gone_pods(shared: Shared) {
    let mut tick = tokio::time::interval(SERIES_HOUSEKEEPING);
    loop {
        tick.tick().await;
        shared.forget_gone_pods();
    }
}

/// Waits for stdout to take the events not written yet, for [`STDOUT_DRAIN_GRACE`] at most.
async fn drain(
    mut stdout: AbortOnDropHandle<std::io::Result<()>>,
) -> Result<std::io::Result<()>, tokio::task::JoinError> {
    match tokio::time::timeout(STDOUT_DRAIN_GRACE, &mut stdout).await {
        Ok(written) => written,
        Err(_) => {
            warn!(
                grace = ?STDOUT_DRAIN_GRACE,
                "stdout is not being read; abandoning the events not written yet"
            );
            Ok(Ok(()))
        }
    }
}

/// The PLEG's settings in `config`, with `push` the push sources it will have.
fn options(config: &Config, push: &PushSources) -> Options {
    Options {
        relist: RelistConfig {
            inspect_concurrency: config.inspect_concurrency,
            emit_changed: config.emit_changed,
            confirm: config.confirm,
            oom_witness: push.oom_witness(config),
        },
        relist_period: config.relist_period,
        relist_threshold: config.relist_threshold,
        event_history: config.event_history,
        event_history_bytes: config.event_history_bytes,
        watch_queue: config.watch_queue,
        event_channel_capacity: config.event_channel_capacity,
        sync: SyncConfig {
            resync_interval: config.sync_frequency,
            ..SyncConfig::default()
        },
        last_relist: config.state_dir.is_some(),
    }
}

/// Starts the push sources and the tasks that tune the PLEG from their states; returns them
/// with what cancels the push sources.
fn start_sources(
    pleg: &Pleg,
    push: PushSources,
    registry: &SourceRegistry,
    config: &Config,
    metrics: &Metrics,
) -> (JoinSet<()>, CancellationToken) {
    let stop_sources = CancellationToken::new();
    let mut sources = JoinSet::new();
    tune(pleg, registry, config, &mut sources);
    push::Starter {
        config,
        triggers: pleg.triggers(),
        registry,
        metrics,
        cache: pleg.cache(),
        shutdown: &stop_sources,
    }
    .start(push, &mut sources);
    (sources, stop_sources)
}

/// Tunes the PLEG from the push sources' states: the full relist period (slow while one is
/// connected), and, where containerd's task events confirm, the kernel triggers' grace.
fn tune(pleg: &Pleg, registry: &SourceRegistry, config: &Config, tasks: &mut JoinSet<()>) {
    let tuning = pleg.tuning();
    tasks.spawn(registry.clone().drive_relist_period(
        tuning.period.clone(),
        config.relist_period,
        config.slow_relist_period,
    ));
    if config.confirm == Store::Task {
        tasks.spawn(registry.clone().drive_kernel_grace(
            tuning.kernel_grace.clone(),
            Source::Containerd,
            DEFAULT_KERNEL_GRACE,
        ));
    }
}

/// A new run id: random, so a client can tell a restarted daemon (whose sequences start
/// again at 1) from the one it watched.
pub fn new_run_id() -> u64 {
    let id = getrandom::u64().unwrap_or_else(|error| {
        // The kernel's generator does not fail on Linux; if it ever did, the clock still
        // tells two runs apart.
        warn!(%error, "no random run id; using the clock");
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64
    });
    // 0 means "any run" in WatchRequest.
    id.max(1)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::{
        config::{OutputFormat, RunArgs},
        pleg::ContainerState,
        runtime::testing::{FakeRuntime, container},
    };

    /// A container that exits with no trigger before a clean stop (its hint still queued, or
    /// none yet): the relist before saving publishes its death with the code, and the saved
    /// reading has it exited, so the next start owes it nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clean_stop_relists_before_saving() {
        let state = tempfile::tempdir().unwrap();
        let config = Config::load(&RunArgs {
            sources: Some(vec![Source::Relist]),
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
        let daemon = Daemon::start(
            runtime.clone(),
            PushSources::none(),
            None,
            &config,
            tokio::io::sink(),
            (),
        )
        .unwrap();
        let shared = daemon.shared();
        let daemon = tokio::spawn(daemon.run(shutdown.clone()));
        let mut watcher = shared.pleg.events().consume(1, 16).unwrap();
        let first = tokio::time::timeout(Duration::from_secs(20), watcher.next())
            .await
            .expect("the first relist's event")
            .unwrap();
        assert_eq!(first.container_id.0, "c");

        runtime.set_state("p", "c", ContainerState::Exited, Some(3));
        shutdown.cancel();
        daemon.await.unwrap().unwrap();

        let (saved, _) = state::take(state.path(), &state::runtime_identity(&config, None))
            .unwrap()
            .expect("a saved run");
        let died = saved.history.last().expect("the death in the history");
        assert_eq!(
            (
                died.container_id.0.as_str(),
                died.event_type,
                died.exit_code
            ),
            (
                "c",
                crate::pleg::PodLifecycleEventType::ContainerDied,
                Some(3)
            )
        );
        let pod = &saved.records[&crate::pleg::PodUid("p".to_owned())];
        assert_eq!(
            pod.containers[&crate::pleg::ContainerId("c".to_owned())].state,
            ContainerState::Exited
        );
    }

    /// A push source's task that panics stops the daemon with an error saying so, at once:
    /// it does not run on without the source, unnoticed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_task_that_panics_stops_the_daemon_with_the_panic() {
        let config = Config::load(&RunArgs {
            sources: Some(vec![Source::Relist]),
            state_dir: Some("none".into()),
            ..RunArgs::default()
        })
        .unwrap();
        let runtime = FakeRuntime::new();
        let mut daemon = Daemon::start(
            runtime,
            PushSources::none(),
            None,
            &config,
            tokio::io::sink(),
            (),
        )
        .unwrap();
        let (go, went) = tokio::sync::oneshot::channel::<()>();
        daemon.sources.spawn(async move {
            let _ = went.await;
            panic!("the probe's ring buffer is gone");
        });
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(daemon.run(shutdown.clone()));
        go.send(()).unwrap();
        let error = tokio::time::timeout(STOP_DEADLINE, running)
            .await
            .expect("stopped within its deadline, unasked")
            .unwrap()
            .expect_err("a fault is an error");
        assert_eq!(
            error.to_string(),
            "a push source's task panicked: the probe's ring buffer is gone"
        );
        assert!(shutdown.is_cancelled(), "the rest of plegd is told to stop");
    }

    /// The API is served on the listeners the daemon is given and stopped with it, in order:
    /// a watcher gets the events, then the end of its stream, and the socket is gone once
    /// `run` returns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_daemon_serves_its_api_and_stops_it_in_order() {
        use plegd_proto::v1 as pb;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("plegd.sock");
        let config = Config::load(&RunArgs {
            sources: Some(vec![Source::Relist]),
            state_dir: Some("none".into()),
            socket: Some(socket.clone()),
            ..RunArgs::default()
        })
        .unwrap();
        let runtime = FakeRuntime::new();
        runtime.add_pod("p", "ns", "p");
        runtime.set_container("p", container("c", "app", ContainerState::Running));
        let listeners = Listeners::bind(&config).unwrap();
        let daemon = Daemon::start(
            runtime,
            PushSources::none(),
            Some(listeners),
            &config,
            tokio::io::sink(),
            (),
        )
        .unwrap();
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(daemon.run(shutdown.clone()));
        let mut client = crate::api::client::connect(&socket).await.unwrap();
        let request = pb::WatchRequest {
            from_sequence: 1,
            ..pb::WatchRequest::default()
        };
        let mut stream = client.watch(request).await.unwrap().into_inner();
        let deadline = Duration::from_secs(20);
        let first = tokio::time::timeout(deadline, stream.message())
            .await
            .expect("the first relist's event")
            .unwrap()
            .unwrap();
        assert_eq!(first.container_id, "c");

        shutdown.cancel();
        tokio::time::timeout(STOP_DEADLINE + Duration::from_secs(1), running)
            .await
            .expect("stopped within its deadline")
            .unwrap()
            .unwrap();
        let end = loop {
            match tokio::time::timeout(deadline, stream.message())
                .await
                .unwrap()
            {
                Ok(Some(_)) => {}
                end => break end,
            }
        };
        assert!(
            matches!(&end, Err(s) if s.code() == tonic::Code::Unavailable)
                || matches!(end, Ok(None)),
            "{end:?}"
        );
        assert!(
            !socket.exists(),
            "the socket is removed as the daemon stops"
        );
    }

    #[test]
    fn a_panics_message_is_told_whichever_string_it_was() {
        assert_eq!(panic_message(Box::new("static")), "static");
        assert_eq!(panic_message(Box::new(String::from("owned"))), "owned");
        assert_eq!(panic_message(Box::new(7)), "(no message)");
    }

    /// stdout is a pipe nobody reads: the relist neither waits on it nor spins, a watcher
    /// still gets every event, and shutdown abandons stdout after its grace.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_stdout_delays_nobody_and_is_abandoned_at_shutdown() {
        const PODS: usize = 300;
        let period = Duration::from_millis(10);
        let config = Config::load(&RunArgs {
            sources: Some(vec![Source::Relist]),
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
        let daemon = Daemon::start(
            runtime.clone(),
            PushSources::none(),
            None,
            &config,
            stdout,
            (),
        )
        .unwrap();
        let shared = daemon.shared();
        let daemon = tokio::spawn(daemon.run(shutdown.clone()));
        let mut watcher = shared.pleg.events().consume(0, 10 * PODS).unwrap();

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
            started_containers += usize::from(!event.container_id.0.is_empty());
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
