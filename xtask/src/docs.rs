//! `cargo xtask docs`: regenerates the reference pages under docs/ from the code (the CLI's
//! clap definition, the metrics registry, the .proto's comments) by running the `docs` test
//! of the tests crate in write mode; without it that test fails when docs/ differs.

use std::process::Command;

use anyhow::Result;
use clap::Args;

use crate::tools::cmd::stream;

/// Set, the `docs` test writes docs/ instead of comparing it (tests/tests/docs/main.rs).
pub const WRITE_ENV: &str = "PLEGD_WRITE_DOCS";

#[derive(Debug, Clone, Default, Args)]
pub struct Options {}

pub fn run(_opts: &Options) -> Result<()> {
    stream(
        Command::new(env!("CARGO"))
            .args([
                "test",
                "-p",
                "plegd-tests",
                "--test",
                "docs",
                "--",
                "--nocapture",
            ])
            .env(WRITE_ENV, "1"),
    )?;
    eprintln!("docs: docs/ regenerated; review and commit the changes");
    Ok(())
}
