//! `cargo xtask bench`: plegd measured side by side in one run, written up as a report.
//!
//! Two child `cargo bench` runs do the measuring (they need the harness and the daemon's
//! crates, which xtask keeps out of its own build): `relist` (criterion, the pure core at 100,
//! 1,000 and 10,000 pods on the fake runtime) and `node` (the release `plegd` binary as a
//! process against the harness's private containerd: kill and start latency per mode with
//! containerd's and CRI's anchors, idle and churn cost, in-kernel cost during an exec storm).
//! This module then writes `report.md` and PNG plots into `target/bench/<timestamp>/` (and
//! `target/bench/latest`), and the summary table into docs/benchmarks.md between its markers.
//! Numbers are reported, with the goals they are read against; nothing is asserted.

mod plot;
mod report;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};
use clap::Args;

use crate::{
    setup,
    tools::{
        cmd::{capture, stream},
        workspace::{self, target_dir},
    },
};

#[derive(Debug, Clone, Args)]
pub struct Options {
    /// A smoke run: few kills, 10 idle containers, short windows, churn in the default mode
    /// only, criterion with tiny samples.
    #[arg(long)]
    pub quick: bool,
    /// kill -9s per mode (default 200; 8 with --quick).
    #[arg(long, value_name = "N")]
    pub kills: Option<usize>,
    /// Seconds of each idle CPU window (default 60; 4 with --quick).
    #[arg(long, value_name = "SECS")]
    pub window: Option<u64>,
    /// Measure nothing: write the report again from the results.json of an earlier run's
    /// folder (e.g. target/bench/latest).
    #[arg(long, value_name = "DIR")]
    pub from: Option<PathBuf>,
    /// Only these sections (default: all): `core` (criterion, the pure core), and the node
    /// bench's latency, idle, churn, kernel, cost, throughput, overload, density. A run of
    /// some sections writes its report but leaves docs/benchmarks.md's summary as it is.
    #[arg(long, value_name = "SECTION,...", value_delimiter = ',')]
    pub sections: Vec<String>,
    /// Lifecycles in flight (K) of the cost, throughput and overload sections (default: 2,16,64
    /// for cost, 16,64 for throughput, 16 for overload, which takes the first).
    #[arg(long, value_name = "K,...", value_delimiter = ',')]
    pub in_flight: Vec<usize>,
    /// Lifecycles per cost run (default 64; 16 with --quick).
    #[arg(long, value_name = "N")]
    pub lifecycles: Option<usize>,
    /// plegd's backends in the cost and throughput sections (default: cri,containerd).
    #[arg(long, value_name = "cri|containerd,...", value_delimiter = ',')]
    pub runtimes: Vec<String>,
    /// Alternated rounds per throughput configuration (default 5; 2 with --quick).
    #[arg(long, value_name = "N")]
    pub rounds: Option<usize>,
    /// Pods of the density section (default: 250,500,1000; 50,100 with --quick).
    #[arg(long, value_name = "N,...", value_delimiter = ',')]
    pub pods: Vec<usize>,
}

/// `values` comma separated, as the node bench's list flags take them.
fn list<T: ToString>(values: &[T]) -> String {
    values
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether `opts` asks for `section` (all are, unless `--sections` names some).
fn wants(opts: &Options, section: &str) -> bool {
    opts.sections.is_empty() || opts.sections.iter().any(|s| s == section)
}

/// What the `node` bench is asked to do.
struct Plan {
    kills: usize,
    window: u64,
    idle: &'static str,
    rates: &'static str,
    churn: u64,
    /// Modes of the churn section; empty for all.
    churn_modes: &'static str,
    execs: usize,
    /// Lifecycles per cost run, per throughput round, per overload mode.
    lifecycles: usize,
    throughput_lifecycles: usize,
    overload_lifecycles: usize,
    rounds: usize,
    pods: String,
}

impl Plan {
    fn of(opts: &Options) -> Self {
        let mut plan = if opts.quick {
            Self {
                kills: 8,
                window: 4,
                idle: "10",
                rates: "10,50",
                churn: 2,
                churn_modes: "default",
                execs: 2_000,
                lifecycles: 16,
                throughput_lifecycles: 24,
                overload_lifecycles: 24,
                rounds: 2,
                pods: "50,100".into(),
            }
        } else {
            Self {
                kills: 200,
                window: 60,
                idle: "10,100,300",
                rates: "10,50",
                churn: 20,
                churn_modes: "",
                execs: 10_000,
                lifecycles: 64,
                throughput_lifecycles: 96,
                overload_lifecycles: 96,
                rounds: 5,
                pods: "250,500,1000".into(),
            }
        };
        plan.kills = opts.kills.unwrap_or(plan.kills);
        plan.window = opts.window.unwrap_or(plan.window);
        plan.lifecycles = opts.lifecycles.unwrap_or(plan.lifecycles);
        plan.rounds = opts.rounds.unwrap_or(plan.rounds);
        if !opts.pods.is_empty() {
            plan.pods = list(&opts.pods);
        }
        plan
    }
}

pub fn run(opts: &Options) -> Result<()> {
    let command_line = std::iter::once("cargo xtask bench".to_owned())
        .chain(std::env::args().skip_while(|a| a != "bench").skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let root = workspace::root();
    let bench_dir = target_dir().join("bench");
    if let Some(from) = &opts.from {
        let from = from.canonicalize()?;
        let stamp = from.file_name().map(|n| n.to_string_lossy().into_owned());
        return write_report(
            opts,
            &root,
            &from,
            &stamp.unwrap_or_default(),
            &command_line,
        );
    }
    setup::install(setup::Extras::NONE)?;
    let stamp = capture(Command::new("date").args(["-u", "+%Y%m%dT%H%M%SZ"]))?;
    let stamp = stamp.trim();
    let out = bench_dir.join(stamp);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    // The report names the revision measured, even when written again later (`--from`).
    std::fs::write(out.join(REVISION_FILE), git_revision(&root))?;

    stream(Command::new(env!("CARGO")).current_dir(&root).args([
        "build",
        "--release",
        "--package",
        "plegd",
        "--bin",
        "plegd",
        // Built with the benches: one feature set, so `cargo bench` rebuilds nothing.
        "--package",
        "plegd-tests",
        "--benches",
    ]))?;
    let criterion_home = out.join("criterion");
    if wants(opts, "core") {
        relist_core(opts, &root, &criterion_home)?;
    }

    let plan = Plan::of(opts);
    let results = out.join("results.json");
    let node_sections: Vec<&String> = opts.sections.iter().filter(|s| *s != "core").collect();
    if opts.sections.is_empty() || !node_sections.is_empty() {
        stream(&mut node_command(opts, &plan, &root, &results))?;
    } else {
        // Only the pure core: the report still reads a results.json.
        std::fs::write(&results, "{}")?;
    }

    write_report(opts, &root, &out, stamp, &command_line)?;
    let latest = bench_dir.join("latest");
    let _ = std::fs::remove_file(&latest);
    std::os::unix::fs::symlink(stamp, &latest)?;
    println!("bench: {} points at it", latest.display());
    Ok(())
}

/// criterion's `relist` bench (the pure core on the fake runtime) into `criterion_home`.
fn relist_core(opts: &Options, root: &Path, criterion_home: &Path) -> Result<()> {
    let mut relist = Command::new(env!("CARGO"));
    relist
        .current_dir(root)
        .args([
            "bench",
            "--package",
            "plegd-tests",
            "--bench",
            "relist",
            "--",
        ])
        .env("CRITERION_HOME", criterion_home)
        .env("PLEGD_BENCH_FAKE_ONLY", "1");
    if opts.quick {
        relist.args([
            "--sample-size",
            "10",
            "--warm-up-time",
            "0.3",
            "--measurement-time",
            "0.5",
        ]);
    }
    stream(&mut relist)
}

/// The `node` bench's command line for `plan`, its results into `results`.
fn node_command(opts: &Options, plan: &Plan, root: &Path, results: &Path) -> Command {
    let mut node = Command::new(env!("CARGO"));
    node.current_dir(root)
        .args(["bench", "--package", "plegd-tests", "--bench", "node", "--"])
        .arg("--bin")
        .arg(target_dir().join("release/plegd"))
        .arg("--out")
        .arg(results)
        .args(["--kills", &plan.kills.to_string()])
        .args(["--window", &plan.window.to_string()])
        .args(["--idle", plan.idle, "--rates", plan.rates])
        .args(["--churn", &plan.churn.to_string()])
        .args(
            (!plan.churn_modes.is_empty())
                .then_some(["--churn-modes", plan.churn_modes])
                .into_iter()
                .flatten(),
        )
        .args(["--execs", &plan.execs.to_string()])
        .args(["--lifecycles", &plan.lifecycles.to_string()])
        .args([
            "--throughput-lifecycles",
            &plan.throughput_lifecycles.to_string(),
        ])
        .args([
            "--overload-lifecycles",
            &plan.overload_lifecycles.to_string(),
        ])
        .args(["--rounds", &plan.rounds.to_string()])
        .args(["--pods", &plan.pods]);
    let sections: Vec<&String> = opts.sections.iter().filter(|s| *s != "core").collect();
    if !sections.is_empty() {
        node.args(["--sections", &list(&sections)]);
    }
    if !opts.in_flight.is_empty() {
        node.args(["--in-flight", &list(&opts.in_flight)]);
    }
    if !opts.runtimes.is_empty() {
        node.args(["--runtimes", &list(&opts.runtimes)]);
    }
    node
}

/// The file of a run's directory that names the revision it measured.
const REVISION_FILE: &str = "revision";

/// `git describe` of the checkout at `root` ("-dirty" with uncommitted changes); empty if git
/// cannot tell.
fn git_revision(root: &Path) -> String {
    capture(
        Command::new("git")
            .current_dir(root)
            .args(["describe", "--always", "--dirty"]),
    )
    .map(|r| r.trim().to_owned())
    .unwrap_or_default()
}

/// `report.md` and the plots in `out` from its results.json and criterion's estimates; the
/// summary into docs/benchmarks.md.
fn write_report(
    opts: &Options,
    root: &Path,
    out: &Path,
    stamp: &str,
    command_line: &str,
) -> Result<()> {
    let results = out.join("results.json");
    let criterion_home = out.join("criterion");
    let measured: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&results)
            .with_context(|| format!("reading {}", results.display()))?,
    )?;
    // Runs from before the file was written name the revision that writes the report.
    let revision =
        std::fs::read_to_string(out.join(REVISION_FILE)).unwrap_or_else(|_| git_revision(root));
    let run = report::Run {
        measured: &measured,
        criterion: &criterion_home,
        revision: revision.trim(),
        command_line,
        quick: opts.quick,
        date: stamp,
    };
    plot::latency_cdf(&measured, &out.join("latency_cdf.png"))?;
    plot::idle_cpu(&measured, &out.join("idle_cpu.png"))?;
    let (full, summary) = report::write(&run)?;
    std::fs::write(out.join("report.md"), full)?;
    if !opts.sections.is_empty() {
        println!(
            "bench: report in {}; {}'s summary left as it is (some sections only)",
            out.join("report.md").display(),
            report::SUMMARY_PAGE
        );
        return Ok(());
    }
    let page = root.join(report::SUMMARY_PAGE);
    let text = std::fs::read_to_string(&page)?;
    std::fs::write(&page, report::splice_summary(&text, &summary)?)?;
    println!(
        "bench: report in {}; {}'s summary table updated",
        out.join("report.md").display(),
        report::SUMMARY_PAGE
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options {
            quick: true,
            kills: None,
            window: None,
            from: None,
            sections: Vec::new(),
            in_flight: Vec::new(),
            lifecycles: None,
            runtimes: Vec::new(),
            rounds: None,
            pods: Vec::new(),
        }
    }

    /// The node bench's arguments after `--`.
    fn node_args(opts: &Options) -> Vec<String> {
        node_command(opts, &Plan::of(opts), Path::new("/"), Path::new("r.json"))
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .skip_while(|a| a != "--")
            .collect()
    }

    fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
        let at = args.iter().position(|a| a == flag)?;
        args.get(at + 1).map(String::as_str)
    }

    #[test]
    fn section_flags_reach_the_node_bench_and_core_stays_with_criterion() {
        let opts = Options {
            sections: vec!["core".into(), "cost".into(), "density".into()],
            in_flight: vec![16],
            lifecycles: Some(32),
            runtimes: vec!["containerd".into()],
            pods: vec![250, 1000],
            ..options()
        };
        let args = node_args(&opts);
        assert_eq!(value(&args, "--sections"), Some("cost,density"));
        assert_eq!(value(&args, "--in-flight"), Some("16"));
        assert_eq!(value(&args, "--lifecycles"), Some("32"));
        assert_eq!(value(&args, "--runtimes"), Some("containerd"));
        assert_eq!(value(&args, "--pods"), Some("250,1000"));
        assert_eq!(value(&args, "--rounds"), Some("2"));
        assert!(wants(&opts, "core") && !wants(&opts, "latency"));
    }

    #[test]
    fn without_sections_everything_runs_with_the_sections_own_defaults() {
        let opts = Options {
            quick: false,
            ..options()
        };
        let args = node_args(&opts);
        for flag in ["--sections", "--in-flight", "--runtimes"] {
            assert_eq!(value(&args, flag), None, "{flag}");
        }
        assert_eq!(value(&args, "--lifecycles"), Some("64"));
        assert_eq!(value(&args, "--rounds"), Some("5"));
        assert_eq!(value(&args, "--pods"), Some("250,500,1000"));
        assert!(wants(&opts, "core") && wants(&opts, "density"));
    }
}
