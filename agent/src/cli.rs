//! The `plegd` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// plegd: pod lifecycle events for a Linux node, driven by kernel and runtime events.
#[derive(Debug, Parser)]
#[command(name = "plegd", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load and attach the eBPF probes, report what loaded, and exit.
    ProbeCheck,
}

/// Entry point of the `plegd` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let result = match cli.command {
        Command::ProbeCheck => probe_check(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plegd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn probe_check() -> anyhow::Result<()> {
    let probes = crate::sources::ebpf::Probes::load()?;
    for name in probes.program_names() {
        println!("attached {name}");
    }
    Ok(())
}
