//! `cargo xtask bench`: benchmarks, measured side by side in one run (release build): full
//! relist time on the real runtime (both backends) and on a fake runtime at node scale, and
//! kill-to-event latency by event source with the eBPF programs' in-kernel cost, and what
//! watchers that stop reading cost the others.

use std::process::Command;

use anyhow::Result;
use clap::Args;

use crate::{cmd::stream, setup};

#[derive(Debug, Clone, Args)]
pub struct Options {}

pub fn run(_opts: &Options) -> Result<()> {
    setup::run(&setup::Options::default())?;
    stream(Command::new(env!("CARGO")).args([
        "bench",
        "--package",
        "plegd-tests",
        "--bench",
        "relist",
        "--bench",
        "kill_latency",
        "--bench",
        "watchers",
    ]))
}
