//! Finding the programs setup installed: in `PATH`, cargo's bin directories or the system's,
//! and whether they run.

use std::{
    env, fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::tools::cmd::capture;

/// Directories searched after `PATH`: root's `PATH` may lack the sbin ones.
pub(super) const SYSTEM_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// Cargo's bin directories (`cargo install` targets), which may not be in `PATH`.
pub(super) fn cargo_bin_dirs() -> Vec<PathBuf> {
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
pub(super) fn find_program(name: &str, extra: &[PathBuf]) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(extra.iter().cloned())
        .chain(SYSTEM_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

pub(super) fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn in_path(dir: &Path) -> bool {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path).any(|d| d == dir)
}

pub(super) fn warn_if_not_in_path(program: &Path) {
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

pub(super) fn prepend_path(dir: &Path) -> Result<std::ffi::OsString> {
    let current = env::var_os("PATH").unwrap_or_default();
    env::join_paths(std::iter::once(dir.to_owned()).chain(env::split_paths(&current)))
        .context("building PATH")
}

pub(super) fn join_paths(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// First line of `program --version`.
pub(super) fn program_version(program: &Path) -> Result<String> {
    let stdout = capture(Command::new(program).arg("--version"))?;
    Ok(stdout.lines().next().unwrap_or_default().trim().to_owned())
}
