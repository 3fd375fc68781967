//! The containerd releases the harness can run besides the system's ([`CONTAINERD_RELEASES`]):
//! downloaded from Debian's archive with the private apt and unpacked under
//! [`CONTAINERD_ROOT`], never installed over the system's.

use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, Result};

use super::{
    Options,
    apt::{PRIVATE_APT, PrivateApt},
    programs::{is_executable, program_version},
    summary::{State, Summary, say},
};
use crate::tools::cmd::capture;

/// A containerd release the test harness can run instead of the system's (chosen per run with
/// `PLEGD_TEST_CONTAINERD=<label>`), taken from a Debian suite.
pub(super) struct ContainerdRelease {
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
pub(super) const CONTAINERD_RELEASES: &[ContainerdRelease] = &[
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

/// Written beside each unpacked release: the Debian version and suite it came from.
const RELEASE_MARKER: &str = "debian-version";

/// The binaries the harness needs from each release.
const RELEASE_BINARIES: &[&str] = &["containerd", "ctr", "containerd-shim-runc-v2"];

pub(super) fn containerd_releases(opts: &Options, summary: &mut Summary) -> Result<()> {
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
    let deb = apt.download(&format!("containerd={version}"), release.label)?;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
