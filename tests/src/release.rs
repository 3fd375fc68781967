//! Which containerd the harness runs, chosen per run by [`ENV`] (`PLEGD_TEST_CONTAINERD`):
//! `1.6` (the default) is the system's (Debian 12's 1.6.20, in `PATH`); `1.7` and `2.1` are the
//! releases `cargo xtask setup` unpacks under [`UNPACKED_ROOT`] without installing them (Debian
//! trixie's 1.7.24 and sid's 2.1.9); an absolute path names any directory holding `containerd`,
//! `ctr` and `containerd-shim-runc-v2`. runc is always the system's: newer Debian runc builds
//! need a newer glibc than Debian 12's.

use std::{
    ffi::OsString,
    fmt,
    path::{Path, PathBuf},
    process::Command,
};

use crate::containerd::HarnessError;

/// The environment variable choosing the containerd of a run.
pub const ENV: &str = "PLEGD_TEST_CONTAINERD";
/// What a run without [`ENV`] uses: the system's containerd.
pub const DEFAULT: &str = "1.6";
/// Where `cargo xtask setup` unpacks the other releases, one directory per `MAJOR.MINOR`
/// (`/opt/plegd/containerd/2.1/usr/bin/containerd`). Outside any worktree and target directory
/// so every checkout and `CARGO_TARGET_DIR` shares one copy. xtask's setup has the same path.
pub const UNPACKED_ROOT: &str = "/opt/plegd/containerd";

/// A containerd release to run: where its binaries are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// What was asked for: `1.6`, `1.7`, `2.1` or a directory.
    pub label: String,
    /// The directory of `containerd`, `ctr` and its shim; `None` for the system's, from `PATH`.
    pub bin_dir: Option<PathBuf>,
}

/// `MAJOR.MINOR.PATCH` of a containerd binary, from `containerd --version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Whether the CRI plugin implements `GetContainerEvents` (1.7 and later).
    pub fn has_cri_container_events(self) -> bool {
        self >= Self::new(1, 7, 0)
    }

    /// Whether the daemon wants the `version = 3` configuration (2.x).
    pub fn wants_config_v3(self) -> bool {
        self.major >= 2
    }

    /// Parses the version word of `containerd --version`, e.g. `containerd
    /// github.com/containerd/containerd/v2 2.1.9+unknown` or `... 1.6.20~ds1 1.6.20~ds1-1+deb12u3`.
    pub fn parse_version_output(text: &str) -> Option<Self> {
        let word = text.split_whitespace().nth(2)?;
        let numeric: String = word
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let mut parts = numeric.split('.').map(str::parse::<u32>);
        let major = parts.next()?.ok()?;
        let minor = parts.next()?.ok()?;
        let patch = parts.next().and_then(Result::ok).unwrap_or(0);
        Some(Self::new(major, minor, patch))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl Default for Release {
    fn default() -> Self {
        Self::parse(DEFAULT).expect("the default release parses")
    }
}

impl Release {
    /// The release [`ENV`] asks for, or the default.
    pub fn from_env() -> Result<Self, HarnessError> {
        match std::env::var(ENV) {
            Ok(text) if !text.trim().is_empty() => Self::parse(text.trim()),
            _ => Ok(Self::default()),
        }
    }

    /// `1.6` (the system's), another `MAJOR.MINOR` (unpacked under [`UNPACKED_ROOT`]), or an
    /// absolute directory.
    pub fn parse(text: &str) -> Result<Self, HarnessError> {
        if text == DEFAULT {
            return Ok(Self {
                label: text.to_owned(),
                bin_dir: None,
            });
        }
        if text.starts_with('/') {
            return Ok(Self {
                label: text.to_owned(),
                bin_dir: Some(PathBuf::from(text)),
            });
        }
        if major_minor(text).is_none() {
            return Err(HarnessError::UnknownRelease {
                asked: text.to_owned(),
            });
        }
        Ok(Self {
            label: text.to_owned(),
            bin_dir: Some(Path::new(UNPACKED_ROOT).join(text).join("usr/bin")),
        })
    }

    /// The program `name` of this release (`containerd`, `ctr`): a path in its directory, or
    /// the bare name for `PATH` to resolve.
    pub fn program(&self, name: &str) -> PathBuf {
        match &self.bin_dir {
            Some(dir) => dir.join(name),
            None => PathBuf::from(name),
        }
    }

    /// The daemon's `PATH`: this release's directory first, so containerd starts its own
    /// `containerd-shim-runc-v2`, not the system's.
    pub fn daemon_path(&self) -> OsString {
        let current = std::env::var_os("PATH").unwrap_or_default();
        match &self.bin_dir {
            Some(dir) => std::env::join_paths(
                std::iter::once(dir.clone()).chain(std::env::split_paths(&current)),
            )
            .unwrap_or(current),
            None => current,
        }
    }

    /// Checks the binaries are there and asks `containerd --version`; a `MAJOR.MINOR` label
    /// must match what the binary says.
    pub fn detect_version(&self) -> Result<Version, HarnessError> {
        if let Some(dir) = &self.bin_dir {
            for name in ["containerd", "ctr", "containerd-shim-runc-v2"] {
                if !dir.join(name).is_file() {
                    return Err(HarnessError::ReleaseNotUnpacked {
                        release: self.label.clone(),
                        missing: dir.join(name),
                    });
                }
            }
        }
        let containerd = self.program("containerd");
        let output = crate::containerd::run_command(Command::new(&containerd).arg("--version"))
            .map_err(|e| match e {
                HarnessError::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    HarnessError::MissingBinary {
                        binary: "containerd",
                    }
                }
                other => other,
            })?;
        let version =
            Version::parse_version_output(&output).ok_or_else(|| HarnessError::Command {
                command: format!("{} --version", containerd.display()),
                status: "exit status: 0".into(),
                stderr: format!("unrecognised version output {:?}", output.trim()),
            })?;
        if let Some((major, minor)) = major_minor(&self.label)
            && (major, minor) != (version.major, version.minor)
        {
            return Err(HarnessError::ReleaseMismatch {
                asked: self.label.clone(),
                found: version,
                binary: containerd,
            });
        }
        Ok(version)
    }
}

/// `(major, minor)` of a label like `2.1`.
fn major_minor(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_output_of_each_release_parses() {
        assert_eq!(
            Version::parse_version_output(
                "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n"
            ),
            Some(Version::new(1, 6, 20))
        );
        assert_eq!(
            Version::parse_version_output(
                "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1"
            ),
            Some(Version::new(1, 7, 24))
        );
        let v2 = Version::parse_version_output(
            "containerd github.com/containerd/containerd/v2 2.1.9+unknown ",
        )
        .unwrap();
        assert_eq!(v2, Version::new(2, 1, 9));
        assert!(v2.wants_config_v3() && v2.has_cri_container_events());
        assert!(!Version::new(1, 6, 20).has_cri_container_events());
        assert!(!Version::new(1, 7, 24).wants_config_v3());
        assert_eq!(Version::parse_version_output("containerd"), None);
        assert_eq!(Version::parse_version_output("a b c.d"), None);
    }

    #[test]
    fn labels_name_the_system_an_unpacked_release_or_a_directory() {
        assert_eq!(Release::parse("1.6").unwrap().bin_dir, None);
        assert_eq!(Release::default().label, "1.6");
        let v21 = Release::parse("2.1").unwrap();
        assert_eq!(
            v21.bin_dir.as_deref(),
            Some(Path::new("/opt/plegd/containerd/2.1/usr/bin"))
        );
        assert_eq!(
            v21.program("ctr"),
            Path::new("/opt/plegd/containerd/2.1/usr/bin/ctr")
        );
        assert_eq!(
            Release::parse("1.6").unwrap().program("ctr"),
            Path::new("ctr")
        );
        let custom = Release::parse("/srv/containerd/bin").unwrap();
        assert_eq!(
            custom.bin_dir.as_deref(),
            Some(Path::new("/srv/containerd/bin"))
        );
        assert!(Release::parse("latest").is_err());
        assert!(Release::parse("2").is_err());
    }

    #[test]
    fn the_daemon_path_puts_the_release_first() {
        let v17 = Release::parse("1.7").unwrap();
        let path = v17.daemon_path();
        assert_eq!(
            std::env::split_paths(&path).next().as_deref(),
            Some(Path::new("/opt/plegd/containerd/1.7/usr/bin"))
        );
    }
}
