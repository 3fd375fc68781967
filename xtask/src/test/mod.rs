//! `cargo xtask test`: set the machine up, check format, lints and the API's compatibility
//! (buf), run every test, unit and end-to-end (the latter against a private containerd, runc
//! and the real kernel; root), the event-source and eBPF suites again on containerd 1.7 and
//! 2.1, then `cargo xtask kernels --kernel 6.1 --quick`: the eBPF probes on Debian 12's own
//! kernel, in a VM, and `cargo xtask node --quick`: plegd installed as README says on a real
//! node (systemd, pure cgroup2, containerd 1.7 on the systemd driver), in a VM. The fuzz
//! targets' properties run within `cargo test` (`plegd::fuzz`); real fuzzing is `cargo xtask
//! fuzz`. Prints a table of the steps, when each began and how long it took, at the end.
//!
//! What overlaps, on a 2-core machine, and why:
//! - setup installs the build's tools first (apt, rust-src, bpf-linker); the rest (the tests'
//!   and the VMs' packages, kernel, venvs and npm prefixes, the other containerds, cargo-deny)
//!   is mostly downloads, installed beside the build;
//! - one build, `cargo test --workspace --no-run`, makes every binary a later step runs: the
//!   test binaries, plegd (which the tests run instead of building their own) and the
//!   harness, so no step builds plegd again for a feature set of its own;
//! - the test binaries run [`Options::jobs`] at a time ([`runner`]), the longest first: an
//!   end-to-end binary mostly waits on containers and deadlines, which leaves CPU to the
//!   others; the matrix's runs on 1.7 and 2.1 are more jobs of the same binaries. Those whose
//!   tests count the runtime's calls or hold lifecycles to tight windows run first, one at a
//!   time, with no other test binary beside them (`jobs::ALONE`);
//! - clippy, then the doc tests, run beside them at a lower priority (nice 10): they have no
//!   deadline to miss, and take the CPU the tests leave;
//! - the VM steps (QEMU TCG, CPU-bound) run one after the other beside the test binaries.

mod jobs;
mod runner;

use std::{process::Command, thread};

use anyhow::{Result, anyhow};
use clap::Args;

use self::{
    jobs::{MATRIX_RELEASES, Selection},
    runner::{Counts, Job, Outcome},
};
use crate::{
    audit, kernels, node,
    setup::{self, KernelSeries, VmTools},
    tools::{
        buf,
        cargo::TestBuild,
        cmd::stream,
        harness,
        steps::Steps,
        workspace::{self, format_duration},
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
    /// How many test binaries run at once.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub jobs: usize,
    /// Only run tests whose name contains this (passed to each test binary).
    pub filter: Option<String>,
    #[command(flatten)]
    pub containerd: harness::Release,
}

/// What a run does, from its options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    lint: bool,
    matrix: bool,
    kernels: bool,
    node: bool,
}

impl Plan {
    fn of(opts: &Options) -> Self {
        let whole = opts.filter.is_none();
        Self {
            lint: !opts.no_lint,
            matrix: !opts.no_matrix && whole && opts.containerd.containerd.is_none(),
            kernels: !opts.no_kernels && whole,
            node: !opts.no_node && whole,
        }
    }

    /// What setup installs besides the build's tools.
    fn extras(self, opts: &Options) -> setup::Extras {
        setup::Extras {
            cargo_deny: self.lint,
            buf: self.lint,
            releases: self.matrix || self.node || opts.containerd.containerd.is_some(),
            ..setup::Extras::TEST
        }
    }

    /// The kernels the VM steps boot.
    fn series(self) -> &'static [KernelSeries] {
        if self.kernels || self.node {
            &[KernelSeries::V6_1]
        } else {
            &[]
        }
    }
}

pub fn run(opts: &Options) -> Result<()> {
    let steps = Steps::new("xtask test");
    let result = run_steps(opts, &steps);
    steps.print();
    result
}

fn run_steps(opts: &Options, steps: &Steps) -> Result<()> {
    let plan = Plan::of(opts);
    steps.time("setup: the build's tools", setup::install_build_tools)?;
    let (build, vm) = thread::scope(|s| {
        let extras = s.spawn(|| {
            steps.time(
                "setup: the tests' tools (beside the format check and build)",
                || setup::install_extras(plan.extras(opts), plan.series()),
            )
        });
        let build = format_and_build(plan, steps);
        let vm = extras
            .join()
            .unwrap_or_else(|_| Err(anyhow!("setup's thread panicked")));
        (build, vm)
    });
    let (build, vm) = (build?, vm?);
    if plan.lint {
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
    // The later checks run even when a test failed: CI then tells everything at once.
    let (outcomes, mut failures) = thread::scope(|s| {
        let vms = s.spawn(|| vm_steps(plan, vm.as_ref(), &build, steps));
        let cargo = s.spawn(|| cargo_steps(opts, plan, steps));
        let tests = test_steps(opts, plan, &build, steps);
        let cargo = cargo
            .join()
            .unwrap_or_else(|_| Err(anyhow!("the cargo steps' thread panicked")));
        let vms = vms
            .join()
            .unwrap_or_else(|_| vec![anyhow!("the VM steps' thread panicked")]);
        let mut outcomes = Vec::new();
        let mut failures = Vec::new();
        for ran in [tests, cargo] {
            match ran {
                Ok(ran) => outcomes.extend(ran),
                Err(e) => failures.push(e),
            }
        }
        failures.extend(vms);
        (outcomes, failures)
    });
    report(&outcomes);
    failures.extend(outcomes.into_iter().filter_map(|outcome| {
        let e = outcome.result.err()?;
        Some(match outcome.failed.as_slice() {
            [] => e.context(outcome.name),
            names => e.context(format!("{}: failed: {}", outcome.name, names.join(", "))),
        })
    }));
    match failures
        .into_iter()
        .reduce(|all, e| anyhow!("{all:#}; and {e:#}"))
    {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `cargo fmt --check` (with the lints), then the one build every later step uses.
fn format_and_build(plan: Plan, steps: &Steps) -> Result<TestBuild> {
    if plan.lint {
        // The shared rustfmt.toml uses nightly-only import options.
        steps.time("format", || {
            stream(
                Command::new("rustup").args(["run", "nightly", "cargo", "fmt", "--all", "--check"]),
            )
        })?;
    }
    steps.time("build (cargo test --workspace --no-run)", TestBuild::build)
}

/// The test binaries, [`Options::jobs`] at a time.
fn test_steps(
    opts: &Options,
    plan: Plan,
    build: &TestBuild,
    steps: &Steps,
) -> Result<Vec<Outcome>> {
    let selection = Selection {
        filter: opts.filter.as_deref(),
        release: opts.containerd.containerd.as_deref(),
        matrix: plan.matrix,
    };
    let runs = jobs::jobs(build, selection, build.bin("plegd")?);
    let name = format!(
        "tests ({} runs of test binaries: {} alone, then {} at a time{})",
        runs.alone.len() + runs.beside.len(),
        runs.alone
            .iter()
            .map(|job| job.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        opts.jobs,
        if plan.matrix {
            format!("; the matrix on containerd {}", MATRIX_RELEASES.join(", "))
        } else {
            String::new()
        },
    );
    steps.time(&name, || {
        let mut outcomes = runner::run(runs.alone, 1, &logs())?;
        outcomes.extend(runner::run(runs.beside, opts.jobs, &logs())?);
        Ok(outcomes)
    })
}

/// Where each job's output is kept.
fn logs() -> std::path::PathBuf {
    workspace::target_dir().join("xtask/test")
}

/// The cargo commands beside the test binaries, one after the other, at a lower priority:
/// they have no deadline to miss, the tests have. clippy (with the lints), then the doc tests.
fn cargo_steps(opts: &Options, plan: Plan, steps: &Steps) -> Result<Vec<Outcome>> {
    let mut jobs = Vec::new();
    if plan.lint {
        jobs.push(niced_cargo(
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        ));
    }
    let mut doc = niced_cargo("doc tests", &["test", "--workspace", "--doc"]);
    if let Some(filter) = &opts.filter {
        doc.args.extend(["--".to_owned(), filter.clone()]);
    }
    jobs.push(doc);
    let names: Vec<&str> = jobs.iter().map(|job| job.name.as_str()).collect();
    let name = format!("{} (beside the tests, at nice 10)", names.join(", then "));
    steps.time(&name, || runner::run(jobs, 1, &logs()))
}

/// `cargo ARGS` at nice 10, in the workspace.
fn niced_cargo(name: &str, args: &[&str]) -> Job {
    Job {
        name: name.to_owned(),
        program: "nice".into(),
        args: ["-n", "10", env!("CARGO")]
            .iter()
            .chain(args)
            .map(|arg| (*arg).to_owned())
            .collect(),
        env: Vec::new(),
        dir: workspace::root(),
    }
}

/// Each job's time and CPU, longest first, and the tests counted over all of them.
fn report(outcomes: &[Outcome]) {
    let mut sorted: Vec<&Outcome> = outcomes.iter().collect();
    sorted.sort_by_key(|o| std::cmp::Reverse(o.took));
    let width = sorted.iter().map(|o| o.name.len()).max().unwrap_or(0);
    let mut total = Counts::default();
    eprintln!("xtask test: jobs, longest first");
    for outcome in sorted {
        total += outcome.counts;
        eprintln!(
            "  {:<width$} {:<7} {:>6} CPU {:>6}",
            outcome.name,
            if outcome.result.is_ok() {
                "ok"
            } else {
                "FAILED"
            },
            format_duration(outcome.took),
            format_duration(outcome.cpu)
        );
    }
    // CI reads a run's closing counts.
    println!(
        "tests: {} passed, {} failed, {} skipped",
        total.passed, total.failed, total.ignored
    );
}

/// The VM steps, one after the other; what failed.
fn vm_steps(
    plan: Plan,
    vm: Option<&VmTools>,
    build: &TestBuild,
    steps: &Steps,
) -> Vec<anyhow::Error> {
    let Some(vm) = vm else {
        return Vec::new();
    };
    let mut failures = Vec::new();
    if plan.kernels {
        let check = kernels::Options {
            kernel: kernels::Choice::V6_1,
            quick: true,
            filter: None,
        };
        let name = "eBPF on Linux 6.1 in a VM (cargo xtask kernels --kernel 6.1 --quick)";
        if let Err(e) = steps.time(name, || kernels::run_with(&check, vm, build)) {
            failures.push(e);
        }
    }
    if plan.node {
        let check = node::Options {
            kernel: kernels::Choice::V6_1,
            containerd: node::Containerd::V1_7,
            all: false,
            quick: true,
            churn: NODE_CHURN,
            oci_runtime: node::OciRuntime::Runc,
        };
        let name = format!(
            "a real node in a VM (cargo xtask node --kernel 6.1 --containerd 1.7 --quick --churn {NODE_CHURN})"
        );
        if let Err(e) = steps.time(&name, || node::run_with(&check, vm, build)) {
            failures.push(e);
        }
    }
    failures
}

/// Lifecycles of the short node check's churn audit.
const NODE_CHURN: usize = 12;

#[cfg(test)]
mod tests {
    use super::*;

    fn options(args: &[&str]) -> Options {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            opts: Options,
        }
        Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied()))
            .unwrap()
            .opts
    }

    #[test]
    fn a_filter_or_another_containerd_narrows_the_plan() {
        let all = Plan {
            lint: true,
            matrix: true,
            kernels: true,
            node: true,
        };
        for (args, plan, series) in [
            (&[][..], all, &[KernelSeries::V6_1][..]),
            (
                &["cri"][..],
                Plan {
                    matrix: false,
                    kernels: false,
                    node: false,
                    ..all
                },
                &[][..],
            ),
            (
                &["--containerd", "2.1"][..],
                Plan {
                    matrix: false,
                    ..all
                },
                &[KernelSeries::V6_1][..],
            ),
            (
                &["--no-lint", "--no-kernels"][..],
                Plan {
                    lint: false,
                    kernels: false,
                    ..all
                },
                &[KernelSeries::V6_1][..],
            ),
            (
                &["--no-node", "--no-kernels", "--no-matrix"][..],
                Plan {
                    lint: true,
                    matrix: false,
                    kernels: false,
                    node: false,
                },
                &[][..],
            ),
        ] {
            let opts = options(args);
            assert_eq!(Plan::of(&opts), plan, "{args:?}");
            assert_eq!(Plan::of(&opts).series(), series, "{args:?}");
        }
        let extras = all.extras(&options(&["--no-lint"]));
        assert!(extras.test_packages && extras.releases);
        let narrow = Plan::of(&options(&["--no-lint", "cri"]));
        assert!(!narrow.extras(&options(&["cri"])).releases);
        assert!(!Plan { lint: false, ..all }.extras(&options(&[])).cargo_deny);
    }

    #[test]
    fn cargo_runs_in_the_workspace_at_a_lower_priority() {
        let job = niced_cargo("clippy", &["clippy", "--workspace"]);
        assert_eq!(job.program, std::path::Path::new("nice"));
        assert_eq!(
            job.args,
            ["-n", "10", env!("CARGO"), "clippy", "--workspace"]
        );
        assert_eq!(job.dir, workspace::root());
    }
}
