//! `cargo xtask test`: set the machine up, check format, lints and the API's compatibility
//! (buf), run every test, unit and end-to-end (the latter against a private containerd, runc
//! and the real kernel; root), then the event-source and eBPF suites on containerd 1.7 and 2.1,
//! then `cargo xtask kernels --kernel 6.1 --quick`: the eBPF probes on Debian 12's own kernel,
//! in a VM, and each fuzz target for a few seconds.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Args;

use crate::{
    audit, buf,
    cmd::{render, stream},
    fuzz, harness, kernels,
    setup::{self, KernelSeries},
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
    /// Skip the event-source and eBPF suites on the other containerd releases (1.7, 2.1).
    /// Also skipped when a filter or `--containerd` is given.
    #[arg(long)]
    pub no_matrix: bool,
    /// Skip fuzzing each target for a few seconds. Also skipped when a filter is given.
    #[arg(long)]
    pub no_fuzz: bool,
    /// Only run tests whose name contains this (passed to `cargo test`).
    pub filter: Option<String>,
    #[command(flatten)]
    pub containerd: harness::Release,
}

pub fn run(opts: &Options) -> Result<()> {
    let vm = if opts.no_kernels || opts.filter.is_some() {
        setup::run(&setup::Options::default())?;
        None
    } else {
        Some(setup::run_for_kernels(&[KernelSeries::V6_1])?)
    };
    let cargo = env!("CARGO");
    if !opts.no_lint {
        step("format");
        // The shared rustfmt.toml uses nightly-only import options.
        stream(
            Command::new("rustup").args(["run", "nightly", "cargo", "fmt", "--all", "--check"]),
        )?;
        step("lints");
        stream(Command::new(cargo).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
        step(
            "dependencies (cargo deny: licenses, bans, sources; `cargo xtask audit` adds advisories)",
        );
        audit::offline()?;
        step(&format!(
            "API compatibility (buf lint; buf breaking against the proto at {})",
            &buf::BASELINE[..7]
        ));
        buf::check()?;
    }
    step("tests");
    let mut test = Command::new(cargo);
    test.args(["test", "--workspace", "--no-fail-fast"]);
    opts.containerd.apply(&mut test);
    if let Some(filter) = &opts.filter {
        test.arg(filter);
    }
    // The later checks run even when a test failed here: CI then tells everything at once.
    let mut failures = Vec::new();
    if let Err(e) = stream_tests(&mut test) {
        failures.push(e);
    }
    let matrix = !opts.no_matrix && opts.filter.is_none() && opts.containerd.containerd.is_none();
    for release in MATRIX_RELEASES.iter().filter(|_| matrix) {
        step(&format!(
            "event sources and eBPF on containerd {release} ({})",
            MATRIX_SUITES.join(", ")
        ));
        let mut suites = Command::new(cargo);
        // `--workspace` as above, not `--package plegd-tests`: features unify over the same
        // packages (by package, CI rebuilt for 3 min 11 s). Selecting three test targets still
        // leaves the other packages' dev-dependency features out, and CI rebuilds for 2 min.
        suites.args(["test", "--workspace", "--no-fail-fast"]);
        for suite in MATRIX_SUITES {
            suites.args(["--test", suite]);
        }
        suites.env(harness::RELEASE_ENV, release);
        if let Err(e) = stream_tests(&mut suites) {
            failures.push(e.context(format!("containerd {release}")));
        }
    }
    if !opts.no_fuzz && opts.filter.is_none() {
        step(&format!("fuzz targets, {FUZZ_SECONDS} s each"));
        let started = std::time::Instant::now();
        if let Err(e) = fuzz::run_targets(FUZZ_SECONDS, fuzz::Build::Quick) {
            failures.push(e);
        }
        step(&format!(
            "fuzzing took {:.0} s",
            started.elapsed().as_secs_f64()
        ));
    }
    if let Some(vm) = vm {
        step("eBPF on Linux 6.1 in a VM (cargo xtask kernels --kernel 6.1 --quick)");
        let started = std::time::Instant::now();
        let kernels = kernels::run_with(
            &kernels::Options {
                kernel: kernels::Choice::V6_1,
                quick: true,
                filter: None,
            },
            &vm,
        );
        step(&format!(
            "kernels took {:.0} s",
            started.elapsed().as_secs_f64()
        ));
        if let Err(e) = kernels {
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

/// Seconds each fuzz target runs in a full `cargo xtask test`: enough to catch a parser that
/// panics on common shapes; `cargo xtask fuzz` runs longer.
const FUZZ_SECONDS: u32 = 5;

/// The containerd releases besides the system's 1.6 that every `cargo xtask test` checks.
const MATRIX_RELEASES: &[&str] = &["1.7", "2.1"];

/// The suites run on them: the runtime's event streams (containerd's and CRI's), the eBPF
/// path, the parts that differ between releases, and plegd beside other subscribers of those
/// streams (whose sharing differs between releases too).
const MATRIX_SUITES: &[&str] = &[
    "cri_events",
    "event_sources",
    "ebpf_events",
    "good_neighbour",
];

fn step(name: &str) {
    eprintln!("xtask test: {name}");
}

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
