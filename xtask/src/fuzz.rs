//! `cargo xtask fuzz`: runs the fuzz targets (libFuzzer through cargo-fuzz, nightly) for a
//! while each, installing cargo-fuzz first if it is missing.

use std::process::Command;

use anyhow::Result;
use clap::Args;

use crate::{cmd::stream, setup};

/// The targets under agent/fuzz/fuzz_targets.
const TARGETS: &[&str] = &["cgroup_path"];

#[derive(Debug, Clone, Args)]
pub struct Options {
    /// Seconds to fuzz each target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u32,
}

pub fn run(opts: &Options) -> Result<()> {
    setup::run(&setup::Options::default())?;
    let has_cargo_fuzz = Command::new("rustup")
        .args(["run", "nightly", "cargo", "fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_cargo_fuzz {
        eprintln!("fuzz: installing cargo-fuzz (a few minutes, once)");
        stream(Command::new(env!("CARGO")).args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let fuzz_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../agent/fuzz");
    for target in TARGETS {
        eprintln!("fuzz: {target} for {} s", opts.seconds);
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
                .arg(format!("-max_total_time={}", opts.seconds)),
        )?;
    }
    Ok(())
}
