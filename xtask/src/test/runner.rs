//! Jobs run side by side, a few at a time: cargo runs test binaries one after another, but most
//! of an end-to-end binary's time is spent waiting on containers and deadlines, so several fit
//! on two cores. Each job's output goes to its own log and is printed whole when it ends (with
//! how long it took and the CPU it used), so the outputs never interleave; libtest's own
//! summary lines are read for the counts and the names of the tests that failed.

use std::{
    collections::VecDeque,
    fs::{self, File},
    os::unix::process::ExitStatusExt as _,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::tools::{cmd::render, workspace::format_duration};

/// One process of the suite: a test binary (with its arguments and environment), or a cargo
/// command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Its name in the output and the table: `soak`, `event_sources on containerd 2.1`.
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(&'static str, String)>,
    /// Where it runs (cargo runs a test binary in its package's directory).
    pub dir: PathBuf,
}

impl Job {
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.dir);
        cmd
    }
}

/// Tests counted from libtest's `test result:` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, other: Self) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
    }
}

/// How a job ended.
#[derive(Debug)]
pub struct Outcome {
    pub name: String,
    pub took: Duration,
    /// CPU of the job and of the children it waited for.
    pub cpu: Duration,
    /// `Err` when it could not run or exited non-zero.
    pub result: Result<()>,
    pub counts: Counts,
    /// The tests libtest reported failed.
    pub failed: Vec<String>,
}

/// Runs `jobs`, `slots` at a time, taking them in order; each one's output goes to a log under
/// `logs` and is printed whole when it ends. Returns every outcome, in the order they ended.
pub fn run(jobs: Vec<Job>, slots: usize, logs: &Path) -> Result<Vec<Outcome>> {
    fs::create_dir_all(logs).with_context(|| format!("creating {}", logs.display()))?;
    let queue = Mutex::new(VecDeque::from(jobs));
    let outcomes = Mutex::new(Vec::new());
    thread::scope(|s| {
        for _ in 0..slots.max(1) {
            s.spawn(|| {
                while let Some(job) = queue.lock().map_or(None, |mut q| q.pop_front()) {
                    let outcome = run_one(&job, logs);
                    if let Ok(mut all) = outcomes.lock() {
                        all.push(outcome);
                    }
                }
            });
        }
    });
    Ok(outcomes
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner))
}

fn run_one(job: &Job, logs: &Path) -> Outcome {
    let log = logs.join(log_name(&job.name));
    let start = Instant::now();
    eprintln!("xtask test: {} started", job.name);
    let ran = spawn_and_wait(job, &log);
    let took = start.elapsed();
    let text = fs::read_to_string(&log).unwrap_or_default();
    let (counts, failed) = read_output(&text);
    let (result, cpu) = match ran {
        Ok((status, cpu)) if status.success() => (Ok(()), cpu),
        Ok((status, cpu)) => (
            Err(anyhow::anyhow!(
                "`{}` failed ({status}); its output is above and in {}",
                render(&job.command()),
                log.display()
            )),
            cpu,
        ),
        Err(e) => (Err(e), Duration::ZERO),
    };
    let verdict = if result.is_ok() { "ok" } else { "FAILED" };
    let head = format!(
        "==== {}: {verdict} after {} (CPU {}) ====\n",
        job.name,
        format_duration(took),
        format_duration(cpu)
    );
    // One print: whole, between the other jobs' outputs.
    print!("\n{head}{text}");
    Outcome {
        name: job.name.clone(),
        took,
        cpu,
        result,
        counts,
        failed,
    }
}

/// `name` as a file name.
fn log_name(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.log")
}

/// Runs `job` with stdout and stderr into `log`; its exit status and the CPU it (and the
/// children it waited for) used.
fn spawn_and_wait(job: &Job, log: &Path) -> Result<(ExitStatus, Duration)> {
    let file = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = job.command();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("could not run `{}`", render(&cmd)))?;
    let pid = libc::pid_t::try_from(child.id()).context("a pid beyond pid_t")?;
    let mut status = 0;
    // SAFETY: rusage is a plain C struct; all zeroes is valid before wait4 fills it in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is our own child, not yet reaped (`child` is never waited on: wait4
        // reaps it here, for the rusage std's wait does not give), and both out-pointers are
        // valid for the call.
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if reaped == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            bail!("waiting for `{}`: {e}", render(&cmd));
        }
    }
    let cpu = timeval(usage.ru_utime) + timeval(usage.ru_stime);
    Ok((ExitStatus::from_raw(status), cpu))
}

fn timeval(t: libc::timeval) -> Duration {
    Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
        + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
}

/// The counts of every `test result:` line of libtest's output, and the tests it reported
/// failed (`test NAME ... FAILED`).
pub fn read_output(text: &str) -> (Counts, Vec<String>) {
    let mut counts = Counts::default();
    let mut failed = Vec::new();
    for line in text.lines() {
        if let Some(name) = failed_test(line) {
            failed.push(name.to_owned());
        } else if let Some(result) = line.strip_prefix("test result: ") {
            counts += result_counts(result);
        }
    }
    (counts, failed)
}

/// The name of the test a line of libtest's output reports failed.
fn failed_test(line: &str) -> Option<&str> {
    line.strip_prefix("test ")?.strip_suffix(" ... FAILED")
}

/// `ok. 4 passed; 1 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.04s`.
fn result_counts(result: &str) -> Counts {
    let mut counts = Counts::default();
    let fields = result.split_once(". ").map_or("", |(_, rest)| rest);
    for field in fields.split("; ") {
        let Some((n, what)) = field.split_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else {
            continue;
        };
        match what {
            "passed" => counts.passed += n,
            "failed" => counts.failed += n,
            "ignored" => counts.ignored += n,
            _ => {}
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn counts_add_up_over_every_result_line() {
        let text = "running 5 tests\n\
                    test a ... ok\n\
                    test b ... FAILED\n\
                    test c ... ignored\n\
                    test result: FAILED. 3 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.04s\n\
                    \n\
                    test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 4 filtered out; finished in 1.00s\n\
                    test result: garbage\n";
        assert_eq!(
            read_output(text),
            (
                Counts {
                    passed: 5,
                    failed: 1,
                    ignored: 1
                },
                vec!["b".to_owned()]
            )
        );
    }

    #[test]
    fn jobs_run_side_by_side_each_output_whole_with_its_cpu_and_status() {
        let logs = tempfile::tempdir().unwrap();
        let sh = |name: &str, script: &str| Job {
            name: name.to_owned(),
            program: PathBuf::from("sh"),
            args: vec!["-c".to_owned(), script.to_owned()],
            env: vec![("PLEGD_XTASK_TEST", "set".to_owned())],
            dir: logs.path().to_owned(),
        };
        // The first two only end once both run: one slot each.
        let jobs = vec![
            sh(
                "a/1",
                "touch a; while [ ! -e b ]; do sleep 0.01; done; \
                 echo 'test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured'",
            ),
            sh(
                "b",
                "touch b; while [ ! -e a ]; do sleep 0.01; done; echo \"$PLEGD_XTASK_TEST\" >&2; \
                 echo 'test x ... FAILED'; exit 3",
            ),
            sh("c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"),
        ];
        let mut outcomes = run(jobs, 2, &logs.path().join("logs")).unwrap();
        outcomes.sort_by(|x, y| x.name.cmp(&y.name));
        let names: Vec<_> = outcomes.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["a/1", "b", "c"]);
        assert!(outcomes[0].result.is_ok());
        assert_eq!(outcomes[0].counts.passed, 2);
        let err = format!("{:#}", outcomes[1].result.as_ref().unwrap_err());
        assert!(err.contains("exit status: 3"), "{err}");
        assert_eq!(outcomes[1].failed, ["x"]);
        let log = fs::read_to_string(logs.path().join("logs/b.log")).unwrap();
        assert_eq!(log, "set\ntest x ... FAILED\n");
        assert!(logs.path().join("logs/a_1.log").exists());
        assert!(outcomes[2].cpu > Duration::ZERO, "{:?}", outcomes[2]);
    }
}
