//! Runs the `plegd-harness` binary of the tests crate (private containerd, demo). It lives there
//! because it needs the gRPC crates, which need protoc: xtask must build before setup ran.

use std::process::Command;

use anyhow::Result;

use crate::cmd::stream;

/// `cargo run -p plegd-tests --bin plegd-harness -- ARGS`, output shown as it goes.
pub fn run(args: &[&str]) -> Result<()> {
    stream(
        Command::new(env!("CARGO"))
            .args([
                "run",
                "--quiet",
                "--package",
                "plegd-tests",
                "--bin",
                "plegd-harness",
                "--",
            ])
            .args(args),
    )
}
