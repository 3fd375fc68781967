//! The `plegd` command line.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{Config, LogFormat, RunArgs};

/// plegd: pod lifecycle events for a Linux node, with kubelet's PLEG semantics.
///
/// plegd lists the containers of a CRI runtime (or containerd's own API), diffs each listing
/// against the previous one and prints ContainerStarted / ContainerDied / ContainerRemoved
/// events per pod, as kubelet's Pod Lifecycle Event Generator does.
#[derive(Debug, Parser)]
#[command(name = "plegd", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon: relist the runtime, print lifecycle events on stdout, logs on stderr.
    /// Stops cleanly on SIGTERM or SIGINT.
    Run(RunArgs),
    /// Load and attach the eBPF probes, report what loaded, and exit.
    ProbeCheck,
}

/// Entry point of the `plegd` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(&args),
        Command::ProbeCheck => {
            init_logging(LogFormat::Text);
            probe_check()
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plegd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn run(args: &RunArgs) -> anyhow::Result<()> {
    let config = Config::load(args)?;
    init_logging(config.log_format);
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(run_daemon(config))
}

async fn run_daemon(config: Config) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let Some(runtime) = crate::daemon::connect(&config, &shutdown).await? else {
        return Ok(());
    };
    crate::daemon::serve(runtime, &config, tokio::io::stdout(), shutdown, None)
        .await
        .context("writing events to stdout")
}

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

fn probe_check() -> anyhow::Result<()> {
    let probes = crate::sources::ebpf::Probes::load()?;
    for name in probes.program_names() {
        println!("attached {name}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }
}
