//! Waiting for another apt or dpkg instead of failing at once. On a freshly booted machine
//! unattended-upgrades (or cloud-init, or another install) often holds apt's locks for a
//! minute or two, and apt-get then exits 100 at once: `DPkg::Lock::Timeout` makes `apt-get
//! install` wait for dpkg's lock, but nothing makes `apt-get update` wait for the lists' lock.
//! So setup looks at the locks first, waits (up to [`LOCK_WAIT`], saying who holds them), and
//! runs apt again if it failed while another process had taken a lock meanwhile.

use std::{
    fs::File,
    io,
    os::fd::AsRawFd as _,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

use super::summary::say;
use crate::tools::workspace::format_duration;

/// How long setup waits for locks another process holds before it fails.
pub(super) const LOCK_WAIT: Duration = Duration::from_secs(5 * 60);

/// How often it looks again.
const POLL: Duration = Duration::from_secs(1);

/// The locks `apt-get update` takes.
pub(super) const UPDATE_LOCKS: &[&str] = &["/var/lib/apt/lists/lock"];

/// The locks `apt-get install` takes: dpkg's (front end first) and the download cache's.
pub(super) const INSTALL_LOCKS: &[&str] = &[
    "/var/lib/dpkg/lock-frontend",
    "/var/lib/dpkg/lock",
    "/var/cache/apt/archives/lock",
];

/// A process holding one of the locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Holder {
    pub(super) lock: String,
    /// `None` for an open file description's lock, which has no owning process.
    pub(super) pid: Option<i32>,
}

impl Holder {
    fn describe(&self) -> String {
        match self.pid {
            Some(pid) => {
                let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|comm| format!(" ({})", comm.trim()))
                    .unwrap_or_default();
                format!("{}, held by pid {pid}{name}", self.lock)
            }
            None => format!("{}, held by another process", self.lock),
        }
    }
}

/// What to do next, from whether a lock is held and the time left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Go,
    Wait,
    GiveUp,
}

fn next(held: bool, now: Instant, deadline: Instant) -> Next {
    match (held, now < deadline) {
        (false, _) => Next::Go,
        (true, true) => Next::Wait,
        (true, false) => Next::GiveUp,
    }
}

/// Runs `attempt` (an apt command that takes `locks`) once no other process holds them,
/// waiting at most [`LOCK_WAIT`] in all; runs it again if it failed because another process
/// took a lock in between.
pub(super) fn with_locks(
    step: &str,
    locks: &[&str],
    mut attempt: impl FnMut(Duration) -> Result<()>,
) -> Result<()> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        wait_for(step, locks, deadline)?;
        let left = deadline.saturating_duration_since(Instant::now());
        match attempt(left) {
            Ok(()) => return Ok(()),
            Err(e) => match holder(locks) {
                Some(holder) if next(true, Instant::now(), deadline) == Next::Wait => {
                    say(
                        step,
                        format!("failed while {}: {e:#}; trying again", holder.describe()),
                    );
                }
                _ => return Err(e),
            },
        }
    }
}

/// Returns once none of `locks` is held, or fails at `deadline`.
fn wait_for(step: &str, locks: &[&str], deadline: Instant) -> Result<()> {
    let mut told = false;
    let start = Instant::now();
    loop {
        let held = holder(locks);
        match next(held.is_some(), Instant::now(), deadline) {
            Next::Go => {
                if told {
                    say(
                        step,
                        format!(
                            "the lock is free after {}",
                            format_duration(start.elapsed())
                        ),
                    );
                }
                return Ok(());
            }
            Next::Wait => {
                if !told {
                    let holder = held.as_ref().map(Holder::describe).unwrap_or_default();
                    say(
                        step,
                        format!(
                            "waiting up to {} for {holder}",
                            format_duration(deadline.saturating_duration_since(start))
                        ),
                    );
                    told = true;
                }
                thread::sleep(POLL);
            }
            Next::GiveUp => {
                let holder = held.as_ref().map(Holder::describe).unwrap_or_default();
                bail!(
                    "another apt or dpkg still holds {holder} after {}; try again when it is done",
                    format_duration(start.elapsed())
                );
            }
        }
    }
}

/// The first of `locks` another process holds. A lock file that cannot be read counts as free:
/// apt then says what is wrong with it.
fn holder(locks: &[&str]) -> Option<Holder> {
    locks.iter().find_map(|lock| {
        let pid = lock_holder(Path::new(lock)).ok()??;
        Some(Holder {
            lock: (*lock).to_owned(),
            pid,
        })
    })
}

/// Whether another process holds an fcntl lock on `path`, as apt and dpkg take them
/// (`Some(pid)`), or an open file description does (`Some(None)`). Asked with `F_OFD_GETLK`,
/// which sees both kinds.
fn lock_holder(path: &Path) -> io::Result<Option<Option<i32>>> {
    let file = File::open(path)?;
    // SAFETY: flock is a plain C struct; all zeroes is a valid value before the fields are set.
    let mut query: libc::flock = unsafe { std::mem::zeroed() };
    query.l_type = libc::F_WRLCK as libc::c_short;
    query.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: the descriptor is open for the duration of the call, and `query` is a valid flock
    // that fcntl fills in.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut query) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(match i32::from(query.l_type) {
        libc::F_UNLCK => None,
        _ => Some((query.l_pid > 0).then_some(query.l_pid)),
    })
}

#[cfg(test)]
mod tests {
    use std::{
        io::{BufRead as _, BufReader},
        process::{Command, Stdio},
    };

    use super::*;

    #[test]
    fn go_when_free_wait_while_time_is_left_else_give_up() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        for (held, at, deadline, wanted) in [
            (false, now, later, Next::Go),
            (false, later, now, Next::Go),
            (true, now, later, Next::Wait),
            (true, later, now, Next::GiveUp),
            (true, now, now, Next::GiveUp),
        ] {
            assert_eq!(
                next(held, at, deadline),
                wanted,
                "{held} {at:?} {deadline:?}"
            );
        }
    }

    #[test]
    fn another_process_lock_is_seen_with_its_pid_and_gone_once_released() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path().to_str().unwrap().to_owned();
        assert_eq!(lock_holder(file.path()).unwrap(), None);
        // As apt takes it: a process's write lock on the whole file (Python's lockf is fcntl's
        // F_SETLKW), held until its stdin closes.
        let mut child = Command::new("python3")
            .args([
                "-c",
                "import fcntl, sys; f = open(sys.argv[1], 'r+'); fcntl.lockf(f, fcntl.LOCK_EX); \
                 print('locked', flush=True); sys.stdin.read()",
                &path,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "locked\n");
        let pid = i32::try_from(child.id()).unwrap();
        assert_eq!(lock_holder(file.path()).unwrap(), Some(Some(pid)));
        let held = holder(&["/nonexistent/plegd-xtask-lock", &path]).unwrap();
        assert_eq!(
            held,
            Holder {
                lock: path.clone(),
                pid: Some(pid)
            }
        );
        assert!(
            held.describe()
                .ends_with(&format!("held by pid {pid} (python3)")),
            "{}",
            held.describe()
        );
        drop(child.stdin.take());
        child.wait().unwrap();
        assert_eq!(holder(&[&path]), None);
    }
}
