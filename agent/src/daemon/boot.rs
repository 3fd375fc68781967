//! `plegd run` from start to exit. The privileged start runs on the calling thread alone,
//! before the async runtime starts its threads: capabilities belong to each thread, and those
//! threads must begin with what is left. In its order: the API's sockets bound (a socket in
//! use or a bad certificate stops plegd before anything else), the kernel probes loaded, the
//! capabilities dropped. Then, on the async runtime: the runtime reached, the push sources
//! fitted to it, and the [`Daemon`] started and run until SIGTERM or SIGINT.

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    api::{Listeners, listen::BindError},
    base::capabilities::{self, DropError},
    config::{Config, fit::Refused},
    daemon::{Daemon, EbpfStart, PushSources, StartError, connect, load_ebpf},
    export::ExportError,
    sources::ebpf::LoadError,
};

/// Why `plegd run` did not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("starting the API")]
    Api(#[source] BindError),
    #[error("loading the eBPF probes (--mode ebpf)")]
    Ebpf(#[source] LoadError),
    #[error("dropping capabilities")]
    Capabilities(#[source] DropError),
    #[error("starting the async runtime")]
    AsyncRuntime(#[source] std::io::Error),
    #[error(transparent)]
    Runtime(#[from] StartError),
    /// A push source asked for that would take events from other agents.
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error("plegd stopped")]
    Stopped(#[source] std::io::Error),
}

/// Runs `plegd run` with `config` until SIGTERM or SIGINT, a fault, or stdout failing.
pub fn run(config: &Config) -> Result<(), BootError> {
    let privileged = Privileged::start(config)?;
    // One thread: plegd's work comes in short bursts (an event, a read, a publish), and
    // handing each between worker threads costs more than the work; a node daemon also takes
    // one core at most, whatever the node's size.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(BootError::AsyncRuntime)?;
    let run = runtime.block_on(serve(config, privileged));
    // Not waited for: a write to a stdout nobody reads blocks its thread for good.
    runtime.shutdown_background();
    run
}

/// What the privileged start leaves to the rest.
struct Privileged {
    listeners: Listeners,
    ebpf: EbpfStart,
}

impl Privileged {
    /// Binds the API's sockets, loads the kernel probes, then drops every capability they do
    /// not need from here on. Must run before any other thread starts.
    fn start(config: &Config) -> Result<Self, BootError> {
        let listeners = Listeners::bind(config).map_err(BootError::Api)?;
        // `--mode ebpf` fails here, before waiting for the runtime.
        let ebpf = load_ebpf(config).map_err(BootError::Ebpf)?;
        let loaded = matches!(ebpf, EbpfStart::Loaded(_));
        let dropped = capabilities::drop_all_but(&capabilities::needed(loaded))
            .map_err(BootError::Capabilities)?;
        info!(kept = ?dropped.kept, "capabilities dropped");
        if !dropped.bounding_left.is_empty() {
            info!(
                bounding = ?dropped.bounding_left,
                "bounding set kept as given (no CAP_SETPCAP to shrink it); unused, plegd \
                 executes nothing"
            );
        }
        Ok(Self { listeners, ebpf })
    }
}

/// Reaches the runtime (waiting for it, with backoff, until a signal), fits the push sources
/// to it, and runs the daemon until a signal.
async fn serve(config: &Config, privileged: Privileged) -> Result<(), BootError> {
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let Some(connected) = connect(config, &shutdown).await? else {
        return Ok(());
    };
    // Refused here, before any subscription: a source that would take events from other agents.
    let (config, plan) = connected.fit_sources(config)?;
    let push = PushSources {
        runtime_socket: Some(connected.socket),
        ebpf: privileged.ebpf,
        plan: Some(plan),
    };
    let daemon = Daemon::start(
        connected.runtime,
        push,
        Some(privileged.listeners),
        &config,
        tokio::io::stdout(),
        (),
    )?;
    daemon.run(shutdown).await.map_err(BootError::Stopped)
}

/// Cancels `shutdown` at the first SIGTERM or SIGINT.
async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        warn!("cannot install signal handlers; stop plegd with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: shutting down"),
        _ = int.recv() => info!("SIGINT: shutting down"),
    }
    shutdown.cancel();
}
