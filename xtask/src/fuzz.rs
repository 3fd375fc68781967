//! `cargo xtask fuzz`: runs the fuzz targets (libFuzzer through cargo-fuzz, nightly) for a
//! while each; `cargo xtask test` runs them briefly through [`run_targets`].

use std::process::Command;

use anyhow::{Context as _, Result};
use clap::Args;

use crate::{cmd::stream, setup};

/// The targets under agent/fuzz/fuzz_targets.
const TARGETS: &[&str] = &[
    "cgroup_path",
    "config_file",
    "kernel_events",
    "containerd_event",
];

#[derive(Debug, Clone, Args)]
pub struct Options {
    /// Seconds to fuzz each target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u32,
}

pub fn run(opts: &Options) -> Result<()> {
    setup::run(&setup::Options::default())?;
    run_targets(opts.seconds)
}

/// Fuzzes each target for `seconds` (setup has installed cargo-fuzz). A crash stops here with
/// the input libFuzzer saved under agent/fuzz/artifacts/.
pub fn run_targets(seconds: u32) -> Result<()> {
    let fuzz_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../agent/fuzz");
    for target in TARGETS {
        eprintln!("fuzz: {target} for {seconds} s");
        stream(
            Command::new("rustup")
                .args([
                    "run",
                    "nightly",
                    "cargo",
                    "fuzz",
                    "run",
                    "--fuzz-dir",
                    fuzz_dir,
                    target,
                    "--",
                ])
                .arg(format!("-max_total_time={seconds}")),
        )
        .with_context(|| format!("fuzz target {target}"))?;
    }
    Ok(())
}
