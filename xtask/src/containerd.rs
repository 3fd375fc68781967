//! `cargo xtask containerd start|stop|status`: a private containerd for trying plegd by hand.

use anyhow::Result;
use clap::{Args, ValueEnum};

use crate::{setup, tools::harness};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Action {
    /// Start it in the background (idempotent) and print its socket.
    Start,
    /// Stop it and remove every process, mount, cgroup and socket it left.
    Stop,
    /// Say whether it runs.
    Status,
}

#[derive(Debug, Clone, Args)]
pub struct Options {
    pub action: Action,
    /// Instance name: its files live in $TMPDIR/plegd-harness/NAME.
    #[arg(long, default_value = "dev")]
    pub name: String,
    #[command(flatten)]
    pub containerd: harness::Release,
}

pub fn run(opts: &Options) -> Result<()> {
    if opts.action == Action::Start {
        setup::install(setup::Extras::releases_for(&opts.containerd))?;
    }
    let action = match opts.action {
        Action::Start => "start",
        Action::Stop => "stop",
        Action::Status => "status",
    };
    harness::run(
        &["containerd", action, "--name", &opts.name],
        &opts.containerd,
    )
}
