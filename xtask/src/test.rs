//! `cargo xtask test`: set the machine up, check format and lints, run every test, unit and
//! end-to-end (the latter against a private containerd, runc and the real kernel; root).

use std::process::Command;

use anyhow::Result;
use clap::Args;

use crate::{cmd::stream, harness, setup};

#[derive(Debug, Clone, Args)]
pub struct Options {
    /// Skip `cargo fmt --check` and `cargo clippy`.
    #[arg(long)]
    pub no_lint: bool,
    /// Only run tests whose name contains this (passed to `cargo test`).
    pub filter: Option<String>,
    #[command(flatten)]
    pub containerd: harness::Release,
}

pub fn run(opts: &Options) -> Result<()> {
    setup::run(&setup::Options::default())?;
    let cargo = env!("CARGO");
    if !opts.no_lint {
        step("format");
        // The shared rustfmt.toml uses nightly-only import options.
        stream(
            Command::new("rustup").args(["run", "nightly", "cargo", "fmt", "--all", "--check"]),
        )?;
        step("lints");
        stream(Command::new(cargo).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
    }
    step("tests");
    let mut test = Command::new(cargo);
    test.args(["test", "--workspace", "--no-fail-fast"]);
    opts.containerd.apply(&mut test);
    if let Some(filter) = &opts.filter {
        test.arg(filter);
    }
    stream(&mut test)
}

fn step(name: &str) {
    eprintln!("xtask test: {name}");
}
