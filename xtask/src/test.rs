//! `cargo xtask test`: set the machine up, check format, lints and the API's compatibility
//! (buf), run every test, unit and end-to-end (the latter against a private containerd, runc
//! and the real kernel; root), then the event-source and eBPF suites on containerd 1.7 and 2.1,
//! then `cargo xtask kernels --kernel 6.1 --quick`: the eBPF probes on Debian 12's own kernel,
//! in a VM, and `cargo xtask node --quick`: plegd installed as README says on a real node
//! (systemd, pure cgroup2, containerd 1.7 on the systemd driver), in a VM. The fuzz targets'
//! properties run within `cargo test` (`plegd::fuzz`); real fuzzing is `cargo xtask fuzz`.
//! Prints a table of the steps and their times at the end.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Args;

use crate::{
    audit, kernels, node,
    setup::{self, KernelSeries},
    tools::{
        buf,
        cmd::{render, stream},
        harness,
        steps::Steps,
    },
};

#[derive(Debug, Clone, Args)]
pub struct Options {
    /// Skip `cargo fmt --check`, `cargo clippy`, `cargo deny` (licenses, bans, sources) and
    /// the API checks (`buf lint`, `buf breaking`).
    #[arg(long)]
    pub no_lint: bool,
    /// Skip the quick eBPF check on Linux 6.1 in a VM (`cargo xtask kernels --kernel 6.1
    /// --quick`, a few minutes). Also skipped when a filter is given.
    #[arg(long)]
    pub no_kernels: bool,
    /// Skip the short node check in a VM (`cargo xtask node --kernel 6.1 --containerd 1.7
    /// --quick`, about five minutes). Also skipped when a filter is given.
    #[arg(long)]
    pub no_node: bool,
    /// Skip the event-source and eBPF suites on the other containerd releases (1.7, 2.1).
    /// Also skipped when a filter or `--containerd` is given.
    #[arg(long)]
    pub no_matrix: bool,
    /// Only run tests whose name contains this (passed to `cargo test`).
    pub filter: Option<String>,
    #[command(flatten)]
    pub containerd: harness::Release,
}

pub fn run(opts: &Options) -> Result<()> {
    let mut steps = Steps::new("xtask test");
    let result = run_steps(opts, &mut steps);
    steps.print();
    result
}

fn run_steps(opts: &Options, steps: &mut Steps) -> Result<()> {
    let matrix = !opts.no_matrix && opts.filter.is_none() && opts.containerd.containerd.is_none();
    let kernels = !opts.no_kernels && opts.filter.is_none();
    let node = !opts.no_node && opts.filter.is_none();
    let extras = setup::Extras {
        cargo_deny: !opts.no_lint,
        buf: !opts.no_lint,
        releases: matrix || node || opts.containerd.containerd.is_some(),
        ..setup::Extras::TEST
    };
    let vm = if !kernels && !node {
        steps.time("setup", || setup::install(extras))?;
        None
    } else {
        Some(steps.time("setup", || {
            setup::install_for_kernels(extras, &[KernelSeries::V6_1])
        })?)
    };
    let cargo = env!("CARGO");
    if !opts.no_lint {
        // The shared rustfmt.toml uses nightly-only import options.
        steps.time("format", || {
            stream(
                Command::new("rustup").args(["run", "nightly", "cargo", "fmt", "--all", "--check"]),
            )
        })?;
        steps.time("lints", || {
            stream(Command::new(cargo).args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))
        })?;
        steps.time(
            "dependencies (cargo deny: licenses, bans, sources; `cargo xtask audit` adds advisories)",
            audit::offline,
        )?;
        steps.time(
            &format!(
                "API compatibility (buf lint; buf breaking against the proto at {})",
                &buf::BASELINE[..7]
            ),
            buf::check,
        )?;
    }
    // The later checks run even when a test failed here: CI then tells everything at once.
    let mut failures = Vec::new();
    let mut test = Command::new(cargo);
    test.args(["test", "--workspace", "--no-fail-fast"]);
    opts.containerd.apply(&mut test);
    if let Some(filter) = &opts.filter {
        test.arg(filter);
    }
    if let Err(e) = steps.time("tests", || stream_tests(&mut test)) {
        failures.push(e);
    }
    for release in MATRIX_RELEASES.iter().filter(|_| matrix) {
        let mut suites = Command::new(cargo);
        // `--workspace` as above, not `--package plegd-tests`: features unify over the same
        // packages (by package, CI rebuilt for 3 min 11 s). Selecting three test targets still
        // leaves the other packages' dev-dependency features out, and CI rebuilds for 2 min.
        suites.args(["test", "--workspace", "--no-fail-fast"]);
        for suite in MATRIX_SUITES {
            suites.args(["--test", suite]);
        }
        suites.env(harness::RELEASE_ENV, release);
        let name = format!(
            "event sources and eBPF on containerd {release} ({})",
            MATRIX_SUITES.join(", ")
        );
        if let Err(e) = steps.time(&name, || stream_tests(&mut suites)) {
            failures.push(e.context(format!("containerd {release}")));
        }
    }
    if let Some(vm) = vm.as_ref().filter(|_| kernels) {
        let check = steps.time(
            "eBPF on Linux 6.1 in a VM (cargo xtask kernels --kernel 6.1 --quick)",
            || {
                kernels::run_with(
                    &kernels::Options {
                        kernel: kernels::Choice::V6_1,
                        quick: true,
                        filter: None,
                    },
                    vm,
                )
            },
        );
        if let Err(e) = check {
            failures.push(e);
        }
    }
    if let Some(vm) = vm.as_ref().filter(|_| node) {
        let check = node::Options {
            kernel: kernels::Choice::V6_1,
            containerd: node::Containerd::V1_7,
            all: false,
            quick: true,
            churn: NODE_CHURN,
        };
        let name = format!(
            "a real node in a VM (cargo xtask node --kernel 6.1 --containerd 1.7 --quick --churn {NODE_CHURN})"
        );
        if let Err(e) = steps.time(&name, || node::run_with(&check, vm)) {
            failures.push(e);
        }
    }
    match failures
        .into_iter()
        .reduce(|all, e| anyhow!("{all:#}; and {e:#}"))
    {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Lifecycles of the short node check's churn audit.
const NODE_CHURN: usize = 12;

/// The containerd releases besides the system's 1.6 that every `cargo xtask test` checks.
const MATRIX_RELEASES: &[&str] = &["1.7", "2.1"];

/// The suites run on them: the runtime's event streams (containerd's and CRI's), the eBPF
/// path, the parts that differ between releases (the reasons their CRI stores show), and plegd
/// beside other subscribers of those streams (whose sharing differs between releases too).
const MATRIX_SUITES: &[&str] = &[
    "cri_events",
    "event_sources",
    "ebpf_events",
    "event_json",
    "exit_reasons",
    "good_neighbour",
];

/// Runs `cargo test` with its output shown as it goes; a failure names the tests that failed,
/// so the last lines of a long run (all CI shows of it) say which.
fn stream_tests(cmd: &mut Command) -> Result<()> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not run `{}`", render(cmd)))?;
    let mut failed = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line.context("reading cargo test's output")?;
            println!("{line}");
            failed.extend(failed_test(&line).map(str::to_owned));
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{}`", render(cmd)))?;
    if status.success() {
        return Ok(());
    }
    let which = match failed.as_slice() {
        [] => String::new(),
        names => format!("; failed: {}", names.join(", ")),
    };
    bail!(
        "`{}` failed ({status}){which}; its output is above",
        render(cmd)
    )
}

/// The name of the test a line of libtest's output reports failed.
fn failed_test(line: &str) -> Option<&str> {
    line.strip_prefix("test ")?.strip_suffix(" ... FAILED")
}

#[cfg(test)]
mod tests {
    use super::failed_test;

    #[test]
    fn only_libtests_failure_lines_name_a_failed_test() {
        let lines = [
            (
                "test soak::short_default ... FAILED",
                Some("soak::short_default"),
            ),
            ("test soak::short_default ... ok", None),
            ("test result: FAILED. 4 passed; 1 failed", None),
            ("    soak::short_default", None),
        ];
        for (line, name) in lines {
            assert_eq!(failed_test(line), name, "{line}");
        }
    }
}
