//! A VM as a child process: booted, its guest's lines shown and handed over as they come, and
//! killed past its deadline. `cargo xtask kernels` runs virtme-ng this way, `cargo xtask node`
//! QEMU itself.

use std::{
    io::{BufRead as _, BufReader, Read},
    os::unix::process::CommandExt as _,
    process::{Command, ExitStatus, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{cmd::render, workspace::format_duration};

/// Say that the VM is still running after this long without output.
const QUIET_NOTICE: Duration = Duration::from_secs(60);

/// How a VM run ended.
#[derive(Debug)]
pub struct Ended {
    /// From the start to the end (or the kill).
    pub total: Duration,
    /// Killed at its deadline (its timeout).
    pub timed_out: Option<Duration>,
    pub status: ExitStatus,
}

impl Ended {
    /// What went wrong with the VM itself, if anything: killed at its deadline, or `program`
    /// failed.
    pub fn problem(&self, program: &str) -> Option<String> {
        match self.timed_out {
            Some(timeout) => Some(format!(
                "timed out after {} (killed the VM)",
                format_duration(timeout)
            )),
            None if !self.status.success() => {
                Some(format!("{program} exited with {}", self.status))
            }
            None => None,
        }
    }
}

/// What to run and how long it may take.
pub struct Run<'a> {
    /// Prefixes the notices: the xtask command (`kernels`, `node`).
    pub tool: &'a str,
    /// Prefixes each line of the guest's: the run's name.
    pub name: &'a str,
    pub timeout: Duration,
    /// Once the guest said it is done, how long it has left to power off.
    pub poweroff: Duration,
}

impl Run<'_> {
    /// Runs `cmd` (its own process group, so a timeout kills whatever it started); each line
    /// it prints goes to `line` with the time since the start, which returns whether the guest
    /// is done. Fails only when `cmd` cannot be started or waited for.
    pub fn watch(
        &self,
        cmd: &mut Command,
        mut line: impl FnMut(&str, Duration) -> bool,
    ) -> Result<Ended> {
        // QEMU reopens its stdout and stderr itself: pipes survive that, files get truncated.
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let start = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("could not run `{}`", render(cmd)))?;
        let (tx, lines) = mpsc::channel();
        let readers = [
            child.stdout.take().map(|out| read_lines(out, tx.clone())),
            child.stderr.take().map(|err| read_lines(err, tx)),
        ];
        let mut deadline = start + self.timeout;
        let mut last_output = Instant::now();
        let mut timed_out = None;
        loop {
            let now = Instant::now();
            if now >= deadline {
                // SAFETY: kill has no memory-safety preconditions; the group is the child's own.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                timed_out = Some(self.timeout);
                break;
            }
            match lines.recv_timeout(QUIET_NOTICE.min(deadline - now)) {
                Ok(text) => {
                    last_output = Instant::now();
                    eprintln!("[{}] {text}", self.name);
                    if line(&text, start.elapsed()) {
                        deadline = deadline.min(Instant::now() + self.poweroff);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if last_output.elapsed() >= QUIET_NOTICE {
                        eprintln!(
                            "{}: [{}] still running ({} so far)",
                            self.tool,
                            self.name,
                            format_duration(start.elapsed())
                        );
                        last_output = Instant::now();
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let status = child
            .wait()
            .with_context(|| format!("waiting for `{}`", render(cmd)))?;
        for reader in readers.into_iter().flatten() {
            let _ = reader.join();
        }
        Ok(Ended {
            total: start.elapsed(),
            timed_out,
            status,
        })
    }
}

/// Sends each line `from` prints (lossily decoded, without the guest console's `\r`).
fn read_lines(
    from: impl Read + Send + 'static,
    to: mpsc::Sender<String>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        for line in BufReader::new(from).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line)
                .trim_end_matches('\r')
                .to_owned();
            if to.send(line).is_err() {
                break;
            }
        }
    })
}
