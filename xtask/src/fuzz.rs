//! `cargo xtask fuzz`: runs the fuzz targets (libFuzzer through cargo-fuzz, nightly) for a
//! while each; `cargo xtask test` runs them briefly through [`run_targets`].

use std::process::Command;

use anyhow::{Context as _, Result};
use clap::Args;

use crate::{cmd::stream, setup, workspace};

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
    run_targets(opts.seconds, Build::Optimized)
}

/// How the targets are built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// cargo-fuzz's default: release with one codegen unit and AddressSanitizer, for the most
    /// inputs a second. Its first build instruments and optimises every dependency (tokio,
    /// tonic, aya): 12 min 42 s in a clean clone on a 2-core machine.
    Optimized,
    /// Unoptimised, without AddressSanitizer or debug info: 4 min 42 s there. A panic is
    /// what a short run looks for, and 5 s of it still run some 65,000 inputs a target.
    Quick,
}

/// Fuzzes each target for `seconds` (setup has installed cargo-fuzz). A crash stops here with
/// the input libFuzzer saved under agent/fuzz/artifacts/.
pub fn run_targets(seconds: u32, build: Build) -> Result<()> {
    let fuzz_dir = workspace::root().join("agent/fuzz");
    for target in TARGETS {
        eprintln!("fuzz: {target} for {seconds} s");
        stream(
            Command::new("rustup")
                .args(["run", "nightly", "cargo", "fuzz", "run", "--fuzz-dir"])
                .arg(&fuzz_dir)
                .arg(target)
                .args(match build {
                    Build::Optimized => &[][..],
                    Build::Quick => &["--dev", "--sanitizer", "none"][..],
                })
                .envs((build == Build::Quick).then_some(("CARGO_PROFILE_DEV_DEBUG", "0")))
                .arg("--")
                .arg(format!("-max_total_time={seconds}")),
        )
        .with_context(|| format!("fuzz target {target}"))?;
    }
    Ok(())
}
