//! `cargo xtask audit`: every `cargo deny` check of `deny.toml`, the RustSec advisories
//! included (their database is fetched from GitHub, so this needs that network).
//! `cargo xtask test` runs [`offline`]: the checks that need no network (licenses, bans,
//! sources).

use std::process::Command;

use anyhow::{Context as _, Result};
use clap::Args;

use crate::{
    setup,
    tools::{cmd::stream, workspace},
};

#[derive(Debug, Clone, Args)]
pub struct Options {}

/// The checks that read only `Cargo.lock`, the crates' manifests and `deny.toml`.
const OFFLINE_CHECKS: [&str; 3] = ["licenses", "bans", "sources"];

pub fn run(_opts: &Options) -> Result<()> {
    setup::install(setup::Extras {
        cargo_deny: true,
        ..setup::Extras::NONE
    })?;
    stream(deny().arg("check")).context("cargo deny (advisories need the RustSec database)")
}

/// `cargo deny` on the dependency graph, without the advisories (no GitHub needed). The
/// crates are fetched first: cargo deny reads the manifests of every platform's dependencies
/// (`web-sys`, `anstyle-wincon`, ...), and a build on this host downloaded only its own, so on a
/// fresh machine the offline check failed for want of them.
pub fn offline() -> Result<()> {
    let mut fetch = Command::new(env!("CARGO"));
    fetch
        .args(["fetch", "--locked", "--manifest-path"])
        .arg(workspace::root().join("Cargo.toml"));
    stream(&mut fetch).context("cargo fetch (the crates cargo deny reads)")?;
    stream(deny().args(["--offline", "check"]).args(OFFLINE_CHECKS))
        .context("cargo deny: licenses, bans or sources (deny.toml says what is allowed)")
}

/// `cargo deny` as cargo runs it: setup's cargo-deny, its subcommand first, with this cargo.
fn deny() -> Command {
    let root = workspace::root();
    let mut cmd = Command::new(root.join(setup::CARGO_DENY));
    cmd.args(["deny", "--locked", "--manifest-path"])
        .arg(root.join("Cargo.toml"))
        .env("CARGO", env!("CARGO"));
    cmd
}
