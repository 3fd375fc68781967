//! `cargo xtask demo`: set up, build plegd, start a private containerd, run plegd against it
//! and start, kill, restart and remove real containers while plegd prints what it sees.

use std::process::Command;

use anyhow::Result;
use clap::Args;

use crate::{
    setup,
    tools::{cmd::stream, harness, workspace::target_dir},
};

#[derive(Debug, Clone, Args)]
pub struct Options {
    /// How long to let plegd catch up between steps, in seconds.
    #[arg(long, default_value = "2s")]
    pub pause: String,
    #[command(flatten)]
    pub containerd: harness::Release,
}

pub fn run(opts: &Options) -> Result<()> {
    setup::install(setup::Extras::releases_for(&opts.containerd))?;
    stream(Command::new(env!("CARGO")).args(["build", "--quiet", "--package", "plegd"]))?;
    let plegd = target_dir().join("debug").join("plegd");
    harness::run(
        &[
            "demo",
            "--plegd",
            &plegd.to_string_lossy(),
            "--pause",
            &opts.pause,
        ],
        &opts.containerd,
    )
}
