//! `cargo xtask fuzz`: runs the fuzz targets (libFuzzer through cargo-fuzz, nightly) for a
//! while each. Their properties live in the agent (`plegd::fuzz`), where `cargo test` also runs
//! them on a few thousand generated inputs each: that is the suite's share, without this
//! separate nightly build (4 min 42 s on 2 cores, even unoptimised).

use std::process::Command;

use anyhow::{Context as _, Result};
use clap::Args;

use crate::{
    setup,
    tools::{cmd::stream, workspace},
};

/// The targets under agent/fuzz/fuzz_targets.
const TARGETS: &[&str] = &[
    "cgroup_path",
    "config_file",
    "kernel_events",
    "containerd_event",
    "header_blocks",
];

#[derive(Debug, Clone, Args)]
pub struct Options {
    /// Seconds to fuzz each target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u32,
}

pub fn run(opts: &Options) -> Result<()> {
    setup::install(setup::Extras {
        cargo_fuzz: true,
        ..setup::Extras::NONE
    })?;
    run_targets(opts.seconds)
}

/// Fuzzes each target for `seconds`, built as cargo-fuzz builds by default: release with
/// AddressSanitizer, for the most inputs a second (its first build instruments and optimises
/// every dependency: 12 min 42 s in a clean clone on a 2-core machine). A crash stops here with
/// the input libFuzzer saved under agent/fuzz/artifacts/.
fn run_targets(seconds: u32) -> Result<()> {
    let fuzz_dir = workspace::root().join("agent/fuzz");
    for target in TARGETS {
        eprintln!("fuzz: {target} for {seconds} s");
        stream(
            Command::new("rustup")
                .args(["run", "nightly", "cargo", "fuzz", "run", "--fuzz-dir"])
                .arg(&fuzz_dir)
                .arg(target)
                .arg("--")
                .arg(format!("-max_total_time={seconds}")),
        )
        .with_context(|| format!("fuzz target {target}"))?;
    }
    Ok(())
}
