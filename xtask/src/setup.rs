//! `cargo xtask setup`: make this machine able to build and test plegd (Debian 12, as root).
//!
//! Steps, each checked first and acted on only when something is missing, so a second run
//! changes nothing and takes a few seconds:
//! 1. refuse to run unless root;
//! 2. apt packages ([`APT_PACKAGES`]), then check the programs the build and the harness run;
//! 3. the nightly toolchain with `rust-src` (aya-build uses `-Z build-std=core`);
//! 4. `bpf-linker` built against the system LLVM 22;
//! 5. tracefs mounted at `/sys/kernel/tracing` (the agent attaches to tracepoints).
//!
//! Other tasks (`test`, `demo`) call [`run`] first. `--check` only reports what is missing.

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

use crate::cmd::{capture, failure, output, stream};

/// Debian packages the build (LLVM for bpf-linker, protoc for the proto crates) and the test
/// harness (a private containerd, runc, a busybox image) need.
pub const APT_PACKAGES: &[&str] = &[
    "containerd",
    "runc",
    "busybox-static",
    "protobuf-compiler",
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
];

/// Programs that must be runnable once the apt packages are in.
const REQUIRED_PROGRAMS: &[&str] = &["containerd", "ctr", "runc", "protoc", "busybox"];

/// Where Debian's llvm-22 lives; bpf-linker must be built against it (without `LLVM_PREFIX`
/// its build finds LLVM 14's llvm-config and fails with "unable to find library -lLLVM").
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const LLVM_MAJOR: &str = "22";

const TRACEFS: &str = "/sys/kernel/tracing";
/// A tracepoint the agent attaches to: proves tracefs is mounted and the kernel has it.
const PROBE_TRACEPOINT: &str = "/sys/kernel/tracing/events/sched/sched_process_exec";

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
}

/// Installs (or, with `check`, only checks) everything the build and the tests need.
///
/// Idempotent: whatever is already present is left alone.
pub fn run(opts: &Options) -> Result<()> {
    let start = Instant::now();
    if !opts.check {
        require_root()?;
    }
    let mut summary = Summary::default();
    apt_packages(opts, &mut summary)?;
    rust_src(opts, &mut summary)?;
    bpf_linker(opts, &mut summary)?;
    tracefs(opts, &mut summary)?;
    summary.print(start.elapsed());
    let missing = summary.missing();
    if !missing.is_empty() {
        bail!(
            "setup --check: missing: {}; run `cargo xtask setup` as root",
            missing.join(", ")
        );
    }
    Ok(())
}

fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        bail!(
            "cargo xtask setup must run as root (it installs packages and mounts tracefs); \
             effective uid is {euid}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Steps

fn apt_packages(opts: &Options, summary: &mut Summary) -> Result<()> {
    const STEP: &str = "apt packages";
    let missing = missing_packages(APT_PACKAGES)?;
    if missing.is_empty() {
        say(STEP, "already installed");
        summary.add(STEP, State::Present, APT_PACKAGES.join(" "));
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
    for name in REQUIRED_PROGRAMS {
        match find_program(name, &[]) {
            Some(path) => found.push(path.display().to_string()),
            None => absent.push(*name),
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
            APT_PACKAGES.join(" "),
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
    const STEP: &str = "bpf-linker";
    let bin_dirs = cargo_bin_dirs();
    let existing = find_program("bpf-linker", &bin_dirs);
    let broken = match &existing {
        Some(path) => match program_version(path) {
            Ok(version) => {
                let detail = format!("{version} ({})", path.display());
                say(STEP, format!("already installed: {detail}"));
                warn_if_not_in_path(path);
                summary.add(STEP, State::Present, detail);
                return Ok(());
            }
            Err(e) => {
                say(STEP, format!("{} does not run: {e:#}", path.display()));
                true
            }
        },
        None => false,
    };
    if opts.check {
        say(STEP, "missing");
        summary.add(STEP, State::Missing, "not found or does not run");
        return Ok(());
    }

    let cargo = env::var_os("CARGO")
        .map(PathBuf::from)
        .or_else(|| find_program("cargo", &bin_dirs))
        .context("cargo not found in PATH or the cargo bin directory")?;
    let mut cmd = Command::new(cargo);
    cmd.args([
        "install",
        "bpf-linker",
        "--no-default-features",
        "--features",
        "llvm-22",
        // bpf-linker ships its Cargo.lock; newer dependency releases may need a newer Rust.
        "--locked",
    ]);
    if broken {
        cmd.arg("--force");
    }
    cmd.env("LLVM_PREFIX", LLVM_PREFIX)
        .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX)
        .env("PATH", prepend_path(&Path::new(LLVM_PREFIX).join("bin"))?)
        // Out of the workspace, so its .cargo/config.toml does not apply.
        .current_dir(env::temp_dir());
    say(
        STEP,
        "installing with cargo install against LLVM 22 (takes a few minutes)",
    );
    stream(&mut cmd).context("building bpf-linker failed")?;

    let path = find_program("bpf-linker", &bin_dirs).with_context(|| {
        format!(
            "cargo install bpf-linker succeeded but bpf-linker is not in PATH or {}",
            join_paths(&bin_dirs)
        )
    })?;
    let version =
        program_version(&path).context("the freshly installed bpf-linker does not run")?;
    let detail = format!("{version} ({})", path.display());
    say(STEP, format!("installed {detail}"));
    warn_if_not_in_path(&path);
    summary.add(STEP, State::Installed, detail);
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
    // Wait for a dpkg or apt that holds the dpkg lock (unattended-upgrades on a freshly booted
    // machine, another install) instead of failing at once.
    const LOCK_TIMEOUT: &str = "DPkg::Lock::Timeout=600";
    stream(
        Command::new("apt-get")
            .args(["-q", "update"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("installing apt packages {names}: apt-get update failed"))?;
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
            "setup: warning: {} is not in PATH; add it, the eBPF build runs bpf-linker from PATH",
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
    fn summary_reports_missing_steps() {
        let mut summary = Summary::default();
        summary.add("a", State::Present, "");
        summary.add("b", State::Missing, "");
        summary.add("c", State::Installed, "");
        assert_eq!(summary.missing(), ["b"]);
    }
}
