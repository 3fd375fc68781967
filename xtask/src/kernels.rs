//! `cargo xtask kernels`: boot Debian's other kernels (11's 5.10, 12's 6.1 and 6.12) in VMs and run `plegd
//! check` and the eBPF end-to-end tests inside each, against the private containerd the tests'
//! harness starts inside the VM.
//!
//! The binaries are built on the host (the guest sees the host's root filesystem, read-only);
//! virtme-ng boots each kernel under QEMU with TCG only (KVM here is a nested hypervisor under
//! which stock kernels hang) and runs a shell script written next to the build output. The
//! script prints `@@xtask` marker lines around each step, which this module reads as they come
//! to report per kernel: `plegd check`'s lines, tests passed and failed, time taken.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{
    setup::{self, Kernel, KernelSeries, VmTools},
    tools::{
        cargo::TestBuild,
        cmd::{quote, render},
        vm,
        workspace::{self, format_duration},
    },
};

/// The eBPF end-to-end test binaries of the tests crate.
const TEST_BINARIES: &[&str] = &["ebpf_probes", "ebpf_events"];

/// `--quick`'s test binary, one test: the probes load and attach, and a container's start and
/// its kill -9 reach plegd through eBPF.
const QUICK_TEST: &str = "ebpf_smoke";

/// `plegd check` lines that must say `ok` in the VM (run with the unit's capabilities), besides
/// every `probe ...` line (what each probe needs, and how it attached). Others may say NO: "runtime socket" (the harness starts its containerd later,
/// inside the tests) and optional kernel features ("exit group_dead" is new in 6.16).
const REQUIRED_CHECKS: &[&str] = &["kernel", "cgroups", "eBPF probes"];

const MEMORY: &str = "2G";

/// Bounds on one VM, boot included (TCG is slow: a boot plus a short command takes 20-30 s
/// on an idle machine, several times that on a busy one).
const QUICK_TIMEOUT: Duration = Duration::from_secs(15 * 60);
const FULL_TIMEOUT: Duration = Duration::from_secs(40 * 60);

const MARK: &str = "@@xtask";

/// Options of `cargo xtask kernels`.
#[derive(Debug, Clone, Args)]
pub struct Options {
    /// Which kernel to boot.
    #[arg(long, value_enum, default_value_t = Choice::All)]
    pub kernel: Choice,
    /// Only `plegd check` and one test: the probes load and attach, and a container's start
    /// and kill -9 are seen through eBPF (tests/tests/ebpf_smoke.rs).
    #[arg(long, conflicts_with = "filter")]
    pub quick: bool,
    /// Only run the eBPF tests whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
}

/// `--kernel`: one series or all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Choice {
    #[value(name = "5.10")]
    V5_10,
    #[value(name = "6.1")]
    V6_1,
    #[value(name = "6.12")]
    V6_12,
    All,
}

impl Choice {
    pub fn series(self) -> &'static [KernelSeries] {
        match self {
            Self::V5_10 => &[KernelSeries::V5_10],
            Self::V6_1 => &[KernelSeries::V6_1],
            Self::V6_12 => &[KernelSeries::V6_12],
            Self::All => KernelSeries::ALL,
        }
    }
}

/// Sets up (installing the kernels asked for), builds, and boots each kernel.
pub fn run(opts: &Options) -> Result<()> {
    let tools = setup::install_for_kernels(setup::Extras::NONE, opts.kernel.series())?;
    eprintln!("kernels: building plegd and the tests (`cargo test --workspace --no-run`)");
    run_with(opts, &tools, &TestBuild::build()?)
}

/// [`run`] once setup is done and the tests are built: `tools` holds the kernels to boot.
pub fn run_with(opts: &Options, tools: &VmTools, build: &TestBuild) -> Result<()> {
    let start = Instant::now();
    let binaries: Vec<&str> = if opts.quick {
        vec![QUICK_TEST]
    } else {
        TEST_BINARIES.to_vec()
    };
    let built = built(build, &binaries)?;
    let script = write_guest_script(&built, opts)?;
    let timeout = if opts.quick {
        QUICK_TIMEOUT
    } else {
        FULL_TIMEOUT
    };
    let mut reports = Vec::new();
    for kernel in &tools.kernels {
        let report = boot(&tools.vng, kernel, &script, timeout)?;
        reports.push((kernel, report));
    }

    eprintln!("kernels: summary ({})", format_duration(start.elapsed()));
    let mut failed = Vec::new();
    for (kernel, report) in &reports {
        let verdict = report.verdict(binaries.len(), opts.filter.is_none());
        eprintln!(
            "  {:<24} {:<6} {}",
            kernel.release,
            if verdict.is_empty() { "ok" } else { "FAILED" },
            report.one_line()
        );
        for line in &report.check {
            eprintln!("      {line}");
        }
        if !verdict.is_empty() {
            eprintln!("      failed: {}", verdict.join("; "));
            failed.push(kernel.release.as_str());
        }
    }
    if !failed.is_empty() {
        bail!("kernels: failed on {}", failed.join(", "));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Host build

/// What the guest runs, built on the host.
struct Built {
    plegd: PathBuf,
    /// Test binaries by target name.
    tests: Vec<(String, PathBuf)>,
    /// Cargo's target directory (the guest script is written there).
    target_dir: PathBuf,
}

/// Picks plegd and `test_binaries` from the workspace's test build.
fn built(build: &TestBuild, test_binaries: &[&str]) -> Result<Built> {
    let tests = test_binaries
        .iter()
        .map(|name| Ok(((*name).to_owned(), build.test(name)?.to_owned())))
        .collect::<Result<_>>()?;
    Ok(Built {
        plegd: build.bin("plegd")?.to_owned(),
        tests,
        target_dir: build
            .profile_dir()?
            .parent()
            .context("the profile directory has no parent")?
            .to_owned(),
    })
}

// ---------------------------------------------------------------------------------------------
// Guest

/// Writes the script the guest runs and returns its path (in the target directory, which the
/// guest sees read-only at the same path).
fn write_guest_script(built: &Built, opts: &Options) -> Result<PathBuf> {
    let dir = built.target_dir.join("xtask");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("kernels-guest.sh");
    let tests_dir = workspace::root().join("tests");
    let script = guest_script(built, opts, &tests_dir);
    fs::write(&path, script).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn guest_script(built: &Built, opts: &Options, tests_dir: &Path) -> String {
    let q = |p: &Path| quote(p.as_os_str());
    let mut s = String::from(
        "# Written by `cargo xtask kernels`; runs as root inside a virtme-ng VM.\n\
         exec 2>&1\n\
         export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         mark() { echo \"@@xtask $*\"; }\n\
         mark boot \"$(uname -r)\"\n\
         [ -d /sys/kernel/tracing/events ] || mount -t tracefs tracefs /sys/kernel/tracing\n\
         # The guest's /tmp is an overlay, on which containerd's overlayfs snapshotter cannot\n\
         # stack its own: the harness gets a fresh tmpfs.\n\
         mkdir -p /run/xtask-tmp && mount -t tmpfs -o mode=1777 tmpfs /run/xtask-tmp || exit 1\n\
         export TMPDIR=/run/xtask-tmp\n",
    );
    let _ = writeln!(s, "cd {} || exit 1", q(tests_dir));
    // Under the unit's (and the DaemonSet's) capabilities alone, as root: what root's exec
    // gets is its bounding set. Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK, which
    // the unit raises with LimitMEMLOCK and the DaemonSet with SYS_RESOURCE.
    let _ = writeln!(
        s,
        "case \"$(uname -r)\" in 5.10.*) memlock=,+sys_resource;; *) memlock=;; esac\n\
         mark begin check\n\
         setpriv --inh-caps -all --bounding-set \"-all,+bpf,+perfmon,+setpcap$memlock\" {} check\n\
         mark end check $?",
        q(&built.plegd)
    );
    for (name, path) in &built.tests {
        // Streamed as it comes (`--nocapture`): a test that stalls in the VM shows how far it
        // got before the VM's time runs out.
        let mut args = vec!["--test-threads=1".to_owned(), "--nocapture".to_owned()];
        if let Some(filter) = &opts.filter {
            args.push(quote(filter.as_ref()));
        }
        let _ = writeln!(
            s,
            "mark begin {name}\n{} {}\nmark end {name} $?",
            q(path),
            args.join(" ")
        );
    }
    s.push_str("mark done\n");
    s
}

/// Boots `kernel` and runs `script` in it, showing the guest's output as it comes. Fails only
/// when the VM cannot be started; what happened inside is in the report.
fn boot(vng: &Path, kernel: &Kernel, script: &Path, timeout: Duration) -> Result<Report> {
    let name = kernel.series.name();
    let mut cmd = Command::new(vng);
    cmd.arg("--disable-kvm")
        .arg("--run")
        .arg(&kernel.vmlinuz)
        .args(["--user", "root", "--memory", MEMORY, "--exec"])
        .arg(format!("sh {}", quote(script.as_os_str())))
        // vng runs virtme-run, beside it in the venv.
        .env("PATH", path_with(vng.parent().unwrap_or(Path::new("/")))?)
        .current_dir(workspace::root());
    eprintln!(
        "kernels: [{name}] booting {} under QEMU TCG (timeout {}): {}",
        kernel.release,
        format_duration(timeout),
        render(&cmd)
    );
    let mut report = Report::default();
    let run = vm::Run {
        tool: "kernels",
        name,
        timeout,
        poweroff: timeout,
    };
    let ended = run.watch(&mut cmd, |line, at| {
        report.line(line, at);
        false
    })?;
    report.total = ended.total;
    report.problem = ended.problem("vng");
    Ok(report)
}

fn path_with(dir: &Path) -> Result<std::ffi::OsString> {
    let current = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir.to_owned()).chain(std::env::split_paths(&current)))
        .context("building PATH")
}

// ---------------------------------------------------------------------------------------------
// Reading the guest's output

/// What one VM run showed.
#[derive(Debug, Default)]
struct Report {
    /// `uname -r` in the guest.
    release: Option<String>,
    /// From the VM's start to the script's first line.
    boot: Option<Duration>,
    total: Duration,
    /// `plegd check`'s lines.
    check: Vec<String>,
    /// The test binaries, in the order they ran.
    tests: Vec<TestRun>,
    /// The step running now: its name and when it began.
    current: Option<(String, Duration)>,
    /// The script got to its end.
    done: bool,
    /// The VM timed out or vng failed.
    problem: Option<String>,
}

#[derive(Debug, Default, PartialEq, Eq)]
struct TestRun {
    name: String,
    /// The binary's exit status (`None` if the step never ended).
    status: Option<i32>,
    passed: u32,
    failed: u32,
    ignored: u32,
    /// Names of the tests that failed.
    failures: Vec<String>,
    elapsed: Duration,
}

impl Report {
    /// Takes one line of the guest's output, seen `at` after the VM started.
    fn line(&mut self, line: &str, at: Duration) {
        if let Some(mark) = line.strip_prefix(MARK) {
            let mut words = mark.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("boot"), release, _) => {
                    self.release = release.map(str::to_owned);
                    self.boot = Some(at);
                }
                (Some("begin"), Some(step), _) => {
                    self.current = Some((step.to_owned(), at));
                    if step != "check" {
                        self.tests.push(TestRun {
                            name: step.to_owned(),
                            ..TestRun::default()
                        });
                    }
                }
                (Some("end"), Some(step), status) => {
                    let began = self.current.take().map_or(at, |(_, began)| began);
                    if step == "check" {
                        if status != Some("0") {
                            self.check
                                .push(format!("NO  plegd check exited {status:?}"));
                        }
                    } else if let Some(test) = self.tests.last_mut() {
                        test.status = status.and_then(|s| s.parse().ok());
                        test.elapsed = at.saturating_sub(began);
                    }
                }
                (Some("done"), _, _) => self.done = true,
                _ => {}
            }
            return;
        }
        let Some((step, _)) = &self.current else {
            return;
        };
        if step == "check" {
            if line.starts_with("ok ") || line.starts_with("NO ") {
                self.check.push(line.to_owned());
            }
        } else if let Some(test) = self.tests.last_mut() {
            if let Some(counts) = line.strip_prefix("test result: ") {
                let count = |what: &str| {
                    counts
                        .split(['.', ';'])
                        .filter_map(|part| part.trim().strip_suffix(what))
                        .find_map(|n| n.trim().parse::<u32>().ok())
                        .unwrap_or(0)
                };
                test.passed += count(" passed");
                test.failed += count(" failed");
                test.ignored += count(" ignored");
            } else if let Some(name) = line
                .strip_prefix("test ")
                .and_then(|rest| rest.strip_suffix(" ... FAILED"))
            {
                test.failures.push(name.to_owned());
            }
        }
    }

    /// Why this run failed (empty when it did not), given how many test binaries should have
    /// run and whether each must have run a test (not so with a filter).
    fn verdict(&self, expected_tests: usize, each_runs_a_test: bool) -> Vec<String> {
        let mut why = Vec::new();
        if let Some(problem) = &self.problem {
            why.push(problem.clone());
        }
        if self.boot.is_none() {
            why.push("the guest never ran the script".into());
        } else if !self.done {
            why.push("the script did not get to its end".into());
        }
        if self.boot.is_some() {
            why.extend(self.check_failures());
        }
        if self.tests.len() < expected_tests && self.boot.is_some() {
            why.push(format!(
                "{} of {expected_tests} test binaries ran",
                self.tests.len()
            ));
        }
        for test in &self.tests {
            match test.status {
                Some(0) if test.passed > 0 || !each_runs_a_test => {}
                Some(0) => why.push(format!("{}: no test ran", test.name)),
                Some(status) => why.push(format!(
                    "{} exited {status} ({} failed{})",
                    test.name,
                    test.failed,
                    if test.failures.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", test.failures.join(", "))
                    }
                )),
                None => why.push(format!("{}: did not finish", test.name)),
            }
        }
        why
    }

    /// The required `plegd check` lines that are missing or not ok.
    fn check_failures(&self) -> Vec<String> {
        let parsed: Vec<(bool, &str)> = self
            .check
            .iter()
            .filter_map(|line| {
                let (mark, rest) = line.split_once(' ')?;
                Some((mark == "ok", rest.trim_start()))
            })
            .collect();
        let mut why = Vec::new();
        for subject in REQUIRED_CHECKS {
            if !parsed
                .iter()
                .any(|(ok, rest)| *ok && rest.starts_with(subject))
            {
                why.push(format!("plegd check: {subject} not ok"));
            }
        }
        for (ok, rest) in &parsed {
            if !ok && rest.starts_with("probe ") {
                let subject = rest.split("  ").next().unwrap_or(rest);
                why.push(format!("plegd check: {subject} not ok"));
            }
        }
        why
    }

    /// Boot time, each test binary's counts and time, the total.
    fn one_line(&self) -> String {
        let mut parts = Vec::new();
        if let Some(boot) = self.boot {
            parts.push(format!("boot {}", format_duration(boot)));
        }
        for test in &self.tests {
            let mut counts = format!("{} passed, {} failed", test.passed, test.failed);
            if test.ignored > 0 {
                let _ = write!(counts, ", {} ignored", test.ignored);
            }
            parts.push(format!(
                "{}: {counts} ({})",
                test.name,
                format_duration(test.elapsed)
            ));
        }
        parts.push(format!("total {}", format_duration(self.total)));
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(report: &mut Report, lines: &str) {
        for (i, line) in lines.lines().enumerate() {
            report.line(line, Duration::from_secs(10 * (i as u64 + 1)));
        }
    }

    const CHECK_OK: &str = "\
@@xtask boot 6.1.0-57-amd64
@@xtask begin check
ok  kernel                   6.1.0-57-amd64
ok  probe cgroup_mkdir       cgroup/cgroup_mkdir
ok  probe mark_victim        oom/mark_victim
NO  exit group_dead          sched_process_exit has no group_dead (kernels before ~6.16)
ok  exit status              task_struct.exit_code at 2312 (BTF): exits carry their status
ok  cgroups                  cgroup2 at /sys/fs/cgroup
NO  runtime socket           no container runtime socket found
ok  eBPF probes              2 programs load and attach: cgroup_mkdir, mark_victim
ok  --mode auto              ebpf
@@xtask end check 0
";

    #[test]
    fn a_clean_run_has_no_verdict() {
        let mut report = Report::default();
        feed(
            &mut report,
            &format!(
                "{CHECK_OK}@@xtask begin ebpf_events\n\
                 running 1 test\n\
                 test deaths ... ok\n\
                 test result: ok. 1 passed; 0 failed; 4 ignored; 0 measured; 0 filtered out; finished in 41.20s\n\
                 @@xtask end ebpf_events 0\n\
                 @@xtask done\n"
            ),
        );
        assert_eq!(report.release.as_deref(), Some("6.1.0-57-amd64"));
        assert_eq!(report.boot, Some(Duration::from_secs(10)));
        assert_eq!(report.check.len(), 9);
        assert_eq!(
            report.tests,
            [TestRun {
                name: "ebpf_events".into(),
                status: Some(0),
                passed: 1,
                failed: 0,
                ignored: 4,
                failures: vec![],
                elapsed: Duration::from_secs(40),
            }]
        );
        assert!(
            report.verdict(1, true).is_empty(),
            "{:?}",
            report.verdict(1, true)
        );
        assert!(
            report
                .verdict(2, true)
                .iter()
                .any(|w| w == "1 of 2 test binaries ran")
        );
    }

    #[test]
    fn failures_and_a_missing_probe_line_are_reported() {
        let mut report = Report::default();
        let check = CHECK_OK
            .replace(
                "ok  probe mark_victim        oom/mark_victim",
                "NO  probe mark_victim        oom/mark_victim: not in tracefs",
            )
            .replace(
                "ok  eBPF probes              2 programs load and attach: cgroup_mkdir, mark_victim",
                "NO  eBPF probes              1 program loads and attaches: cgroup_mkdir",
            );
        feed(
            &mut report,
            &format!(
                "{check}@@xtask begin ebpf_probes\n\
                 test lifecycle ... FAILED\n\
                 test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n\
                 @@xtask end ebpf_probes 101\n\
                 @@xtask done\n"
            ),
        );
        let verdict = report.verdict(1, true);
        assert_eq!(
            verdict,
            [
                "plegd check: eBPF probes not ok",
                "plegd check: probe mark_victim not ok",
                "ebpf_probes exited 101 (1 failed: lifecycle)"
            ]
        );
    }

    #[test]
    fn a_filter_may_leave_a_binary_without_tests() {
        let mut report = Report::default();
        feed(
            &mut report,
            &format!(
                "{CHECK_OK}@@xtask begin ebpf_probes\n\
                 test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out\n\
                 @@xtask end ebpf_probes 0\n\
                 @@xtask done\n"
            ),
        );
        assert!(report.verdict(1, false).is_empty());
        assert_eq!(report.verdict(1, true), ["ebpf_probes: no test ran"]);
    }

    #[test]
    fn a_vm_that_never_ran_the_script_says_so() {
        let mut report = Report {
            problem: Some("vng exited with exit status: 1".into()),
            ..Report::default()
        };
        report.line("qemu-system-x86_64: some error", Duration::from_secs(1));
        assert_eq!(
            report.verdict(2, true),
            [
                "vng exited with exit status: 1",
                "the guest never ran the script"
            ]
        );
    }

    #[test]
    fn the_guest_script_marks_each_step_and_quotes_paths() {
        let built = Built {
            plegd: PathBuf::from("/t/debug/plegd"),
            tests: vec![(
                "ebpf_events".into(),
                PathBuf::from("/t/my dir/ebpf_events-1"),
            )],
            target_dir: PathBuf::from("/t"),
        };
        let opts = Options {
            kernel: Choice::V6_1,
            quick: false,
            filter: Some("a b".into()),
        };
        let script = guest_script(&built, &opts, Path::new("/w/tests"));
        assert!(script.contains(
            "mark begin check\nsetpriv --inh-caps -all --bounding-set \"-all,+bpf,+perfmon,+setpcap$memlock\" /t/debug/plegd check\nmark end check $?\n"
        ));
        assert!(script.contains("'/t/my dir/ebpf_events-1' --test-threads=1 --nocapture 'a b'\n"));
        assert!(script.ends_with("mark done\n"));
    }
}
