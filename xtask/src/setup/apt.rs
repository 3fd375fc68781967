//! The system's apt: the packages the build needs, the tests' own ([`TEST_PACKAGES`]), the
//! check that their programs run, and promtool unpacked from Debian's `prometheus`; and a
//! private apt ([`PrivateApt`]) for what the system's sources do not carry (other containerd
//! releases, Debian 11's kernel), whose lists never touch the system's.

use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::{
    Options,
    apt_lock::{INSTALL_LOCKS, UPDATE_LOCKS, with_locks},
    programs::{SYSTEM_DIRS, find_program, is_executable, program_version},
    summary::{State, Summary, say},
};
use crate::tools::{
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

/// Where Debian's llvm-22 lives; bpf-linker must be built against it (without `LLVM_PREFIX`
/// its build finds LLVM 14's llvm-config and fails with "unable to find library -lLLVM").
pub(super) const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

const LLVM_MAJOR: &str = "22";

/// The private apt configuration's sources, lists and package cache: the system's apt lists
/// stay as they are.
pub(super) const PRIVATE_APT: &str = "/opt/plegd/apt";

/// Debian's archive, as the system's sources name it.
const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";

/// Debian's hook asking maintainer scripts not to start services (exit 101 = "forbidden").
const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

/// Step 2: the build's packages, its programs, and LLVM 22's `llvm-config`.
pub(super) fn build_packages(opts: &Options, summary: &mut Summary) -> Result<()> {
    if !packages(opts, "apt packages", BUILD_PACKAGES, summary)? {
        // The programs come from these packages: no point checking them.
        return Ok(());
    }
    let llvm_config = Path::new(LLVM_PREFIX).join("bin/llvm-config");
    let llvm = if is_executable(&llvm_config) {
        let version = capture(Command::new(&llvm_config).arg("--version"))?;
        let version = version.trim();
        if version.split('.').next() != Some(LLVM_MAJOR) {
            bail!(
                "{} reports LLVM {version}, expected {LLVM_MAJOR}.x",
                llvm_config.display()
            );
        }
        Ok(format!("{} ({version})", llvm_config.display()))
    } else {
        Err("llvm-config (/usr/lib/llvm-22/bin/llvm-config)")
    };
    programs(
        opts,
        "programs",
        BUILD_PACKAGES,
        BUILD_PROGRAMS,
        llvm,
        summary,
    )
}

/// Steps 6 and 10 in one apt run: the tests' packages (with `test`) and the VM's (with `vm`),
/// then the tests' programs.
pub(super) fn extra_packages(
    opts: &Options,
    test: bool,
    vm: bool,
    summary: &mut Summary,
) -> Result<()> {
    let wanted: Vec<&str> = [(test, TEST_PACKAGES), (vm, VM_APT_PACKAGES)]
        .into_iter()
        .filter(|(wanted, _)| *wanted)
        .flat_map(|(_, packages)| packages.iter().copied())
        .collect();
    if wanted.is_empty() || !packages(opts, "apt packages: tests, VMs", &wanted, summary)? {
        return Ok(());
    }
    if !test {
        return Ok(());
    }
    programs(
        opts,
        "programs: tests",
        TEST_PACKAGES,
        TEST_PROGRAMS,
        Ok(String::new()),
        summary,
    )
}

/// `packages` installed unless they are; whether they are there now (not in check mode when
/// some are missing).
fn packages(
    opts: &Options,
    step: &'static str,
    packages: &[&str],
    summary: &mut Summary,
) -> Result<bool> {
    let missing = missing_packages(packages)?;
    if missing.is_empty() {
        say(step, "already installed");
        summary.add(step, State::Present, packages.join(" "));
    } else if opts.check {
        say(step, format!("missing: {}", missing.join(" ")));
        summary.add(step, State::Missing, missing.join(" "));
        return Ok(false);
    } else {
        say(step, format!("installing {}", missing.join(" ")));
        install_packages(&missing)?;
        let still = missing_packages(&missing)?;
        if !still.is_empty() {
            bail!(
                "apt-get reported success but these packages are still not installed: {}",
                still.join(" ")
            );
        }
        summary.add(step, State::Installed, missing.join(" "));
    }
    Ok(true)
}

/// Checks that `programs` (from `packages`) run, and `other`: one more found (`Ok`, its
/// detail; empty for none) or missing (`Err`, its name).
fn programs(
    opts: &Options,
    step: &'static str,
    packages: &[&str],
    programs: &[&str],
    other: Result<String, &str>,
    summary: &mut Summary,
) -> Result<()> {
    let mut found = Vec::new();
    let mut absent = Vec::new();
    for name in programs {
        match find_program(name, &[]) {
            Some(path) => found.push(path.display().to_string()),
            None => absent.push(*name),
        }
    }
    match other {
        Ok(detail) if detail.is_empty() => {}
        Ok(detail) => found.push(detail),
        Err(name) => absent.push(name),
    }
    if absent.is_empty() {
        say(step, format!("found {}", found.join(" ")));
        summary.add(step, State::Present, found.join(" "));
    } else if opts.check {
        say(step, format!("missing: {}", absent.join(" ")));
        summary.add(step, State::Missing, absent.join(" "));
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

/// Where Debian's `prometheus` package is unpacked, relative to the workspace root (ignored by
/// git), for its `promtool` (`promtool test rules` of deploy/kubernetes/alerts.yaml, `promtool
/// check metrics`): nothing of it is installed or runs as a service.
pub const PROMETHEUS_DIR: &str = ".xtask/prometheus";

/// The unpacked `promtool`, relative to the workspace root.
pub const PROMTOOL: &str = ".xtask/prometheus/usr/bin/promtool";

/// `promtool`, unpacked from Debian's `prometheus` package (the system's apt sources) under
/// [`PROMETHEUS_DIR`].
pub(super) fn promtool(opts: &Options, summary: &mut Summary) -> Result<()> {
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
pub(super) fn installed_packages(dpkg_query: &str) -> BTreeSet<&str> {
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
    with_locks("apt-get install", INSTALL_LOCKS, |left| {
        stream(
            Command::new("apt-get")
                .arg("-q")
                // dpkg's own wait, should another apt take its lock after ours looked.
                .arg("-o")
                .arg(format!("DPkg::Lock::Timeout={}", left.as_secs()))
                .args(["install", "-y", "--no-install-recommends"])
                .args(packages)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    })
    .with_context(|| format!("installing apt packages {names} failed"))
}

pub(super) fn apt_update() -> Result<()> {
    with_locks("apt-get update", UPDATE_LOCKS, |_| {
        stream(
            Command::new("apt-get")
                .args(["-q", "update"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    })
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

/// apt with its own sources, lists and cache under [`PRIVATE_APT`]; the system's are never
/// read or written.
pub(super) struct PrivateApt {
    options: Vec<String>,
}

impl PrivateApt {
    /// Writes the sources for `suites` and runs `apt-get update` on them.
    pub(super) fn update<'a>(suites: impl Iterator<Item = &'a str>) -> Result<Self> {
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
        let lock = lists.join("lock");
        let lock = lock
            .to_str()
            .context("the private lists' path is not UTF-8")?;
        with_locks("apt-get update (private)", &[lock], |_| {
            stream(apt.command("apt-get").args(["-q", "update"]))
        })
        .context("apt-get update with the private sources failed")?;
        Ok(apt)
    }

    /// `program` (apt-get, apt-cache) with the private configuration.
    pub(super) fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        for option in &self.options {
            cmd.arg("-o").arg(option);
        }
        cmd.env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    }

    /// Downloads `package` (`name` or `name=version`) into a fresh `debs/<folder>` of the
    /// private apt; the `.deb` it left.
    pub(super) fn download(&self, package: &str, folder: &str) -> Result<PathBuf> {
        let debs = Path::new(PRIVATE_APT).join("debs").join(folder);
        if debs.exists() {
            fs::remove_dir_all(&debs).with_context(|| format!("removing {}", debs.display()))?;
        }
        fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
        stream(
            self.command("apt-get")
                .args(["-q", "download"])
                .arg(package)
                .current_dir(&debs),
        )
        .with_context(|| format!("downloading {package}"))?;
        fs::read_dir(&debs)
            .with_context(|| format!("reading {}", debs.display()))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .with_context(|| format!("apt-get download left no .deb in {}", debs.display()))
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
}
