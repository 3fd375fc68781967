//! `cargo xtask soak`: the churn audit, long. A child `cargo test` runs the soak tests' ignored
//! `soak_as_configured` (it needs the harness and the daemon's crates, which xtask keeps out of
//! its own build) with this command's settings in `PLEGD_SOAK_*`; it prints one report per mode,
//! fault, backend and K, and fails when any transition was lost, duplicated, reordered or
//! wrong, or fewer than 95 % of the lifecycles attempted were audited.

use std::process::Command;

use anyhow::Result;
use clap::{Args, ValueEnum};

use crate::{
    setup,
    tools::{cmd::stream, harness},
};

/// How plegd runs during a soak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// eBPF hints only, full relists 300 s apart.
    Ebpf,
    /// containerd's event stream only, full relists 300 s apart.
    Events,
    /// Every source, default settings.
    Default,
    /// A full relist every second, nothing else.
    Polling,
}

/// The runtime API plegd reads during a soak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Runtime {
    /// CRI.
    Cri,
    /// containerd's own API.
    Containerd,
}

/// What goes wrong halfway through each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Fault {
    /// Nothing.
    None,
    /// containerd SIGKILLed and started again.
    ContainerdRestart,
    /// plegd SIGKILLed and started again (a new run: the watcher resyncs).
    PlegdKill,
    /// plegd SIGTERMed and started again on its saved state (the run continues).
    PlegdTerm,
    /// A one-page eBPF ring buffer and an exec storm: kernel events lost (eBPF and default
    /// modes only).
    RingOverflow,
    /// containerd SIGSTOPped for 4 s, then SIGCONTed.
    ContainerdHang,
    /// plegd's containerd event stream silent while connected, until plegd's heartbeat found
    /// it and two fast full relists ran (events and default modes only).
    SilentStream,
}

#[derive(Debug, Clone, Args)]
pub struct Options {
    /// Keep starting lifecycles for this many minutes per mode (beyond --lifecycles).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub minutes: u64,
    /// Lifecycles per mode (at least).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub lifecycles: usize,
    /// Modes to run, each in turn (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub mode: Vec<Mode>,
    /// Faults to inject, each in turn with every mode (default: none).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub fault: Vec<Fault>,
    /// Lifecycles in flight: each K in turn with every mode and fault, K started at once and a
    /// new one as each ends (default: bursts of 20 after random pauses, 40 in flight at most).
    #[arg(long, value_name = "K,...", value_delimiter = ',')]
    pub in_flight: Vec<usize>,
    /// plegd's runtime backends (`plegd run --runtime`), each in turn with every mode, fault
    /// and K (default: cri).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub runtime: Vec<Runtime>,
    /// The random timing's seed (default: the clock's; every report prints it).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Hostile and careless clients on plegd's API all through each run (handshakes never
    /// finished, garbage on the socket, streams never read, absurd requests), plegd with 1,024
    /// descriptors and its TLS listener on; each report adds descriptors, RSS, health and a new
    /// watcher's time to get in.
    #[arg(long)]
    pub abuse: bool,
    #[command(flatten)]
    pub containerd: harness::Release,
}

/// The names the soak runner reads (clap's value names).
fn keys<T: ValueEnum>(values: &[T], all_by_default: bool) -> String {
    let values: Vec<&T> = if values.is_empty() && all_by_default {
        T::value_variants().iter().collect()
    } else {
        values.iter().collect()
    };
    values
        .iter()
        .filter_map(|v| v.to_possible_value())
        .map(|v| v.get_name().to_owned())
        .collect::<Vec<_>>()
        .join(",")
}

/// [`keys`] of `values`, or `default` when there are none.
fn keys_or<T: ValueEnum>(values: &[T], default: &str) -> String {
    if values.is_empty() {
        default.to_owned()
    } else {
        keys(values, false)
    }
}

/// The child `cargo test` that runs the soak.
fn command(opts: &Options) -> Command {
    let mut cmd = Command::new(env!("CARGO"));
    opts.containerd.apply(&mut cmd);
    cmd.args([
        "test",
        "--package",
        "plegd-tests",
        "--test",
        "soak",
        "--",
        "--ignored",
        "--exact",
        "soak_as_configured",
        "--nocapture",
    ])
    .env("PLEGD_SOAK_MODES", keys(&opts.mode, true))
    .env("PLEGD_SOAK_FAULTS", keys_or(&opts.fault, "none"))
    .env("PLEGD_SOAK_RUNTIMES", keys_or(&opts.runtime, "cri"))
    .env(
        "PLEGD_SOAK_IN_FLIGHT",
        if opts.in_flight.is_empty() {
            "bursts".to_owned()
        } else {
            opts.in_flight
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        },
    )
    .env("PLEGD_SOAK_LIFECYCLES", opts.lifecycles.to_string())
    .env("PLEGD_SOAK_MINUTES", opts.minutes.to_string());
    if let Some(seed) = opts.seed {
        cmd.env("PLEGD_SOAK_SEED", seed.to_string());
    }
    if opts.abuse {
        cmd.env("PLEGD_SOAK_ABUSE", "1");
    }
    cmd
}

pub fn run(opts: &Options) -> Result<()> {
    setup::install(setup::Extras::releases_for(&opts.containerd))?;
    stream(&mut command(opts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(cmd: &Command, key: &str) -> Option<String> {
        cmd.get_envs()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| Some(v?.to_string_lossy().into_owned()))
    }

    #[test]
    fn settings_reach_the_runner_by_name() {
        let opts = Options {
            minutes: 3,
            lifecycles: 50,
            mode: vec![Mode::Events, Mode::Polling],
            fault: vec![Fault::PlegdKill, Fault::None],
            seed: Some(7),
            abuse: true,
            in_flight: vec![2, 16, 64],
            runtime: vec![Runtime::Cri, Runtime::Containerd],
            containerd: harness::Release::default(),
        };
        let cmd = command(&opts);
        assert_eq!(env(&cmd, "PLEGD_SOAK_MODES").unwrap(), "events,polling");
        assert_eq!(env(&cmd, "PLEGD_SOAK_FAULTS").unwrap(), "plegd-kill,none");
        assert_eq!(env(&cmd, "PLEGD_SOAK_LIFECYCLES").unwrap(), "50");
        assert_eq!(env(&cmd, "PLEGD_SOAK_MINUTES").unwrap(), "3");
        assert_eq!(env(&cmd, "PLEGD_SOAK_SEED").unwrap(), "7");
        assert_eq!(env(&cmd, "PLEGD_SOAK_ABUSE").unwrap(), "1");
        assert_eq!(env(&cmd, "PLEGD_SOAK_IN_FLIGHT").unwrap(), "2,16,64");
        assert_eq!(env(&cmd, "PLEGD_SOAK_RUNTIMES").unwrap(), "cri,containerd");
        let defaults = command(&Options {
            mode: Vec::new(),
            fault: Vec::new(),
            seed: None,
            abuse: false,
            in_flight: Vec::new(),
            runtime: Vec::new(),
            ..opts
        });
        assert_eq!(
            env(&defaults, "PLEGD_SOAK_MODES").unwrap(),
            "ebpf,events,default,polling"
        );
        assert_eq!(env(&defaults, "PLEGD_SOAK_FAULTS").unwrap(), "none");
        assert_eq!(env(&defaults, "PLEGD_SOAK_SEED"), None);
        assert_eq!(env(&defaults, "PLEGD_SOAK_ABUSE"), None);
        assert_eq!(env(&defaults, "PLEGD_SOAK_IN_FLIGHT").unwrap(), "bursts");
        assert_eq!(env(&defaults, "PLEGD_SOAK_RUNTIMES").unwrap(), "cri");
    }
}
