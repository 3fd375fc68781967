//! `cargo xtask image`: plegd's OCI image tarball, built locally (no registry, no container
//! engine) with the harness's image code (tests/src/image.rs): the release `plegd` and the
//! shared libraries it loads (glibc's), nothing else. Import it on a node with
//! `ctr -n k8s.io images import target/plegd-image.oci.tar`.

use std::{path::PathBuf, process::Command};

use anyhow::Result;
use clap::Args;

use crate::{
    setup,
    tools::{cmd::stream, harness, workspace::target_dir},
};

#[derive(Debug, Clone, Args)]
pub struct Options {
    /// The tarball to write. [default: <target dir>/plegd-image.oci.tar]
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

pub fn run(opts: &Options) -> Result<()> {
    setup::install(setup::Extras::NONE)?;
    stream(Command::new(env!("CARGO")).args(["build", "--release", "--package", "plegd"]))?;
    let plegd = target_dir().join("release").join("plegd");
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| target_dir().join("plegd-image.oci.tar"));
    harness::run(
        &[
            "image",
            "--plegd",
            &plegd.to_string_lossy(),
            "--out",
            &out.to_string_lossy(),
        ],
        &harness::Release::default(),
    )
}
