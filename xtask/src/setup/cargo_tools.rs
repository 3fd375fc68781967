//! The Rust side: the nightly toolchain with `rust-src` (rustup), and the programs `cargo
//! install` builds (bpf-linker against the system's LLVM, cargo-fuzz).

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::{
    Options,
    apt::LLVM_PREFIX,
    programs::{
        cargo_bin_dirs, find_program, join_paths, prepend_path, program_version,
        warn_if_not_in_path,
    },
    summary::{State, Summary, say},
};
use crate::tools::cmd::{capture, stream};

pub(super) fn rust_src(opts: &Options, summary: &mut Summary) -> Result<()> {
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

pub(super) fn bpf_linker(opts: &Options, summary: &mut Summary) -> Result<()> {
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

/// cargo-fuzz, which `cargo xtask fuzz` runs (with nightly).
pub(super) fn cargo_fuzz(opts: &Options, summary: &mut Summary) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
