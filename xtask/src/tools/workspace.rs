//! What every command needs of its surroundings: where the workspace and its target directory
//! are, that it runs as root, and how it prints a duration.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Result, bail};

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_owned()
}

/// Cargo's target directory for this workspace: `CARGO_TARGET_DIR`, or `<root>/target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from)
}

/// Fails unless the effective user is root; `command` names the caller (`cargo xtask setup`)
/// and `why` what it does that needs root.
pub fn require_root(command: &str, why: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        bail!("{command} must run as root ({why}); effective uid is {euid}");
    }
    Ok(())
}

/// `4.2s` under a minute, `3m07s` from one on.
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_seconds_then_minutes() {
        for (d, text) in [
            (Duration::from_millis(4_240), "4.2s"),
            (Duration::from_millis(59_940), "59.9s"),
            (Duration::from_secs(60), "1m00s"),
            (Duration::from_secs(187), "3m07s"),
        ] {
            assert_eq!(format_duration(d), text);
        }
    }

    #[test]
    fn the_root_holds_the_workspace_manifest() {
        assert!(root().join("Cargo.toml").is_file());
        assert!(root().join("xtask").is_dir());
    }
}
