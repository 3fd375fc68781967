//! `cargo xtask demo`: set up, build plegd, start a private containerd, run plegd against it
//! and start, kill, restart and remove real containers while plegd prints what it sees.

use std::{path::PathBuf, process::Command};

use anyhow::Result;
use clap::Args;

use crate::{cmd::stream, harness, setup};

#[derive(Debug, Clone, Args)]
pub struct Options {
    /// How long to let plegd catch up between steps, in seconds.
    #[arg(long, default_value = "2s")]
    pub pause: String,
    #[command(flatten)]
    pub containerd: harness::Release,
}

pub fn run(opts: &Options) -> Result<()> {
    setup::run(&setup::Options::default())?;
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

/// Cargo's target directory for this workspace.
pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || {
            // xtask's manifest dir is <workspace>/xtask.
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        },
        PathBuf::from,
    )
}
