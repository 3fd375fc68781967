//! Runs the `plegd-harness` binary of the tests crate (private containerd, demo). It lives there
//! because it needs the gRPC crates, which need protoc: xtask must build before setup ran.

use std::process::Command;

use anyhow::Result;
use clap::Args;

use super::cmd::stream;

/// The environment variable the harness reads to choose its containerd.
pub const RELEASE_ENV: &str = "PLEGD_TEST_CONTAINERD";

/// The environment variable naming the plegd binary the tests run
/// (`plegd_tests::process::plegd_binary`), when it is built already: they then build none
/// (their own `cargo build -p plegd` would build plegd and its eBPF programs again, for
/// plegd's features alone).
pub const BINARY_ENV: &str = "PLEGD_TEST_BINARY";

/// Which containerd the harness runs.
#[derive(Debug, Clone, Default, Args)]
pub struct Release {
    /// The containerd to run: 1.6 (the system's), 1.7 or 2.1 (unpacked by `cargo xtask setup`
    /// under /opt/plegd/containerd), or a directory holding containerd, ctr and
    /// containerd-shim-runc-v2. Sets PLEGD_TEST_CONTAINERD; without it, that variable's value
    /// or 1.6.
    #[arg(long = "containerd", value_name = "VERSION|DIR")]
    pub containerd: Option<String>,
}

impl Release {
    /// Passes the choice on to `cmd` (a `cargo test` or the harness binary).
    pub fn apply(&self, cmd: &mut Command) {
        if let Some(release) = &self.containerd {
            cmd.env(RELEASE_ENV, release);
        }
    }
}

/// `cargo run -p plegd-tests --bin plegd-harness -- ARGS`, output shown as it goes, with the
/// chosen containerd.
pub fn run(args: &[&str], release: &Release) -> Result<()> {
    let mut cmd = Command::new(env!("CARGO"));
    release.apply(&mut cmd);
    stream(
        cmd.args([
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
