//! Which test binaries the suite runs, with which containerd, in which order: every test
//! binary of the workspace's test build on the harness's containerd (1.6 unless
//! `--containerd`), and the event-source and eBPF suites again on 1.7 and 2.1. The longest go
//! first, so the shorter ones fill the other slots around them.

use std::path::Path;

use super::runner::Job;
use crate::tools::{cargo::TestBuild, harness};

/// The containerd releases besides the system's 1.6 that every `cargo xtask test` checks.
pub const MATRIX_RELEASES: &[&str] = &["1.7", "2.1"];

/// The suites run on them: the runtime's event streams (containerd's and CRI's), the eBPF
/// path, the parts that differ between releases (the reasons their CRI stores show), and plegd
/// beside other subscribers of those streams (whose sharing differs between releases too).
pub const MATRIX_SUITES: &[&str] = &[
    "cri_events",
    "event_sources",
    "ebpf_events",
    "event_json",
    "exit_reasons",
    "good_neighbour",
];

/// The binaries that take longest, longest first (each alone, on a 2-core machine: soak and
/// api about 4 minutes, hostile_input 1.5, good_neighbour half a minute, the next ones 15-25
/// s): started first. The others follow in cargo's order.
const LONGEST_FIRST: &[&str] = &[
    "soak",
    "api",
    "hostile_input",
    "good_neighbour",
    "go_client",
    "event_sources",
    "memory_limit",
    "otlp_export",
];

/// The binaries that run with no other test binary beside them, one after the other, before
/// the rest: the eBPF probes of a plegd see every container on the machine, so another
/// binary's churn is hints to it and calls on its runtime. `exit_reasons` counts the runtime
/// calls a kill costs; the soak holds every lifecycle to windows of half a second, which three
/// binaries' churn on two cores made it miss (lifecycles lost in eBPF-only mode, a
/// containerd-restart soak's lives before the outage).
const ALONE: &[&str] = &["soak", "exit_reasons"];

/// The suite's jobs in two runs: those that run [`ALONE`], then the others.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Runs {
    pub alone: Vec<Job>,
    pub beside: Vec<Job>,
}

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    /// Only the tests whose name contains this (libtest's filter).
    pub filter: Option<&'a str>,
    /// The containerd of the main run (`--containerd`); the harness's default without it.
    pub release: Option<&'a str>,
    /// The matrix's suites on [`MATRIX_RELEASES`] too.
    pub matrix: bool,
}

/// The jobs of `selection` from `build`, each running `plegd` (from the same build) where the
/// tests start a plegd process.
pub fn jobs(build: &TestBuild, selection: Selection<'_>, plegd: &Path) -> Runs {
    let common: Vec<(&'static str, String)> =
        vec![(harness::BINARY_ENV, plegd.display().to_string())];
    let args: Vec<String> = selection.filter.iter().map(|f| (*f).to_owned()).collect();
    let mut jobs: Vec<(usize, bool, Job)> = Vec::new();
    for artifact in build.harnesses() {
        let name = match artifact.kind.as_str() {
            "test" => artifact.name.clone(),
            "lib" => format!("{} (unit)", artifact.name),
            kind => format!("{} ({kind} unit)", artifact.name),
        };
        let mut env = common.clone();
        if let Some(release) = selection.release {
            env.push((harness::RELEASE_ENV, release.to_owned()));
        }
        let job = Job {
            name,
            program: artifact.executable.clone(),
            args: args.clone(),
            env,
            dir: artifact.package_dir.clone(),
        };
        let alone = artifact.kind == "test" && ALONE.contains(&artifact.name.as_str());
        jobs.push((rank(&artifact.name, &artifact.kind), alone, job));
        if !selection.matrix
            || artifact.kind != "test"
            || !MATRIX_SUITES.contains(&artifact.name.as_str())
        {
            continue;
        }
        for release in MATRIX_RELEASES {
            let mut env = common.clone();
            env.push((harness::RELEASE_ENV, (*release).to_owned()));
            let job = Job {
                name: format!("{} on containerd {release}", artifact.name),
                program: artifact.executable.clone(),
                args: args.clone(),
                env,
                dir: artifact.package_dir.clone(),
            };
            jobs.push((rank(&artifact.name, &artifact.kind), alone, job));
        }
    }
    // Stable: the others stay in cargo's order, each matrix run after its host run.
    jobs.sort_by_key(|(rank, ..)| *rank);
    let mut runs = Runs::default();
    for (_, alone, job) in jobs {
        if alone {
            runs.alone.push(job);
        } else {
            runs.beside.push(job);
        }
    }
    runs
}

/// Where an integration test binary stands in [`LONGEST_FIRST`]; after them for the others.
fn rank(name: &str, kind: &str) -> usize {
    LONGEST_FIRST
        .iter()
        .position(|long| kind == "test" && *long == name)
        .unwrap_or(LONGEST_FIRST.len())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::tools::cargo::Artifact;

    fn artifact(name: &str, kind: &str, harness: bool) -> Artifact {
        Artifact {
            name: name.to_owned(),
            kind: kind.to_owned(),
            harness,
            executable: PathBuf::from(format!("/t/{name}-{kind}")),
            package_dir: PathBuf::from("/w/tests"),
        }
    }

    fn build() -> TestBuild {
        TestBuild {
            artifacts: vec![
                artifact("plegd", "bin", false),
                artifact("plegd", "lib", true),
                artifact("xtask", "bin", true),
                artifact("api", "test", true),
                artifact("event_sources", "test", true),
                artifact("soak", "test", true),
                artifact("exit_reasons", "test", true),
            ],
        }
    }

    fn names(jobs: &[Job]) -> Vec<&str> {
        jobs.iter().map(|j| j.name.as_str()).collect()
    }

    #[test]
    fn every_test_binary_runs_the_longest_first_and_the_matrix_suites_on_each_release() {
        let selection = Selection {
            filter: None,
            release: None,
            matrix: true,
        };
        let Runs { alone, beside } = jobs(&build(), selection, Path::new("/t/plegd"));
        assert_eq!(
            names(&alone),
            [
                "soak",
                "exit_reasons",
                "exit_reasons on containerd 1.7",
                "exit_reasons on containerd 2.1",
            ]
        );
        let jobs = beside;
        assert_eq!(
            names(&jobs),
            [
                "api",
                "event_sources",
                "event_sources on containerd 1.7",
                "event_sources on containerd 2.1",
                "plegd (unit)",
                "xtask (bin unit)",
            ]
        );
        let soak = &alone[0];
        assert_eq!(soak.program, Path::new("/t/soak-test"));
        assert_eq!(soak.dir, Path::new("/w/tests"));
        assert!(soak.args.is_empty());
        assert_eq!(soak.env, [(harness::BINARY_ENV, "/t/plegd".to_owned())]);
        assert_eq!(
            jobs[3].env,
            [
                (harness::BINARY_ENV, "/t/plegd".to_owned()),
                (harness::RELEASE_ENV, "2.1".to_owned())
            ]
        );
    }

    #[test]
    fn a_filter_and_a_release_reach_every_binary_and_leave_the_matrix_out() {
        let selection = Selection {
            filter: Some("cri"),
            release: Some("1.7"),
            matrix: false,
        };
        let Runs { alone, beside } = jobs(&build(), selection, Path::new("/t/plegd"));
        assert_eq!(names(&alone), ["soak", "exit_reasons"]);
        assert_eq!(
            names(&beside),
            ["api", "event_sources", "plegd (unit)", "xtask (bin unit)"]
        );
        for job in alone.iter().chain(&beside) {
            assert_eq!(job.args, ["cri"], "{job:?}");
            assert!(
                job.env.contains(&(harness::RELEASE_ENV, "1.7".to_owned())),
                "{job:?}"
            );
        }
    }
}
