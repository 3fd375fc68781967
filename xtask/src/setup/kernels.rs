//! What the VM steps (`cargo xtask kernels`, `node`) boot: QEMU and the other apt packages
//! they use, one Debian kernel per [`KernelSeries`], and virtme-ng.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail};

use super::{
    Options,
    apt::{PRIVATE_APT, PrivateApt, apt_update, install_packages, installed_packages},
    pip::{PipTool, pip_tool},
    programs::find_program,
    summary::{State, Summary, say},
};
use crate::tools::cmd::{capture, failure, output};

/// The virtme-ng release installed from PyPI (pinned: its command line changes between releases).
pub const VIRTME_NG_VERSION: &str = "1.42";

/// The venv holding virtme-ng, relative to the workspace root (ignored by git).
pub(super) const VIRTME_NG_VENV: &str = ".xtask/virtme-ng";

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

/// Steps 11 and 12 (QEMU came with the tests' apt packages, step 10): the kernels of `series`,
/// virtme-ng. `None` when something is missing (only in check mode: otherwise it is installed
/// or this fails).
pub(super) fn vm_tools(
    opts: &Options,
    series: &[KernelSeries],
    summary: &mut Summary,
) -> Result<Option<VmTools>> {
    let mut complete = true;
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
    let deb = apt.download(&package, series.name())?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
