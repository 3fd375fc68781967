//! Processes, mounts and cgroups as seen through /proc and cgroupfs: what cleanup and the
//! test-support API need, without shelling out.

use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// Whether a process exists and is not a zombie.
pub fn is_alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised command name, which may contain spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Sends SIGTERM, waits up to `timeout` for the process to go, then SIGKILLs it.
pub fn terminate(pid: i32, timeout: Duration) {
    if !is_alive(pid) {
        return;
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    if !wait_gone(&[pid], timeout) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        wait_gone(&[pid], Duration::from_secs(5));
    }
}

/// A child process stopped with SIGTERM (as a service manager would) when dropped, however
/// the test or the demo ends.
#[derive(Debug)]
pub struct Terminating(pub Child);

impl Terminating {
    /// SIGTERM, then how it exited (SIGKILLed if still there after `timeout`).
    pub fn stop(mut self, timeout: Duration) -> std::io::Result<ExitStatus> {
        let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.0.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.0.kill()?;
        self.0.wait()
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.0.id()).unwrap_or_default()
    }
}

impl Drop for Terminating {
    fn drop(&mut self) {
        // Only a child not yet waited for: a reaped pid may already name another process.
        if let Ok(None) = self.0.try_wait() {
            terminate(self.pid(), Duration::from_secs(5));
            let _ = self.0.wait();
        }
    }
}

/// SIGKILLs every process and waits up to `timeout` for all of them to go.
pub fn kill_all(pids: &[i32], timeout: Duration) {
    for &pid in pids {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    wait_gone(pids, timeout);
}

fn wait_gone(pids: &[i32], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        reap(pids);
        if !pids.iter().any(|&pid| is_alive(pid)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reaps those of `pids` that are exited children of this process (the harness's own
/// containerd), so they do not linger as zombies; other pids are ignored (ECHILD).
fn reap(pids: &[i32]) {
    for &pid in pids {
        let _ = nix::sys::wait::waitpid(
            Pid::from_raw(pid),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
    }
}

/// Makes the child start a new session (and process group).
pub fn new_session(command: &mut Command) {
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
}

/// Makes the child join `cgroup` (a cgroupfs directory, v1 or v2) before it runs anything, so
/// all it allocates is charged there.
pub fn born_in_cgroup(command: &mut Command, cgroup: &Path) -> std::io::Result<()> {
    let procs = fs::OpenOptions::new()
        .write(true)
        .open(cgroup.join("cgroup.procs"))?;
    // SAFETY: write(2) is async-signal-safe; the file was opened before the fork and the
    // closure allocates nothing. "0" is the writing process itself.
    unsafe {
        command.pre_exec(move || {
            nix::unistd::write(&procs, b"0").map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    Ok(())
}

/// Whether `binary` is an executable file in one of PATH's directories.
pub fn in_path(binary: &str) -> bool {
    which(binary).is_some()
}

/// The first executable file `binary` in PATH's directories.
pub fn which(binary: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|candidate| {
            fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// `path` (relative to the repository's `.xtask/`), a tool `cargo xtask setup` installs there;
/// panics naming it and the fix when it is missing.
pub fn setup_tool(path: &str) -> std::path::PathBuf {
    let tool = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.xtask")
        .join(path);
    assert!(
        tool.exists(),
        "{} missing: run `cargo xtask setup`",
        tool.display()
    );
    tool
}

/// `promtool`: the one `cargo xtask setup` unpacks under `.xtask/prometheus` (xtask's
/// `PROMTOOL`), else one in PATH.
pub fn promtool() -> Option<std::path::PathBuf> {
    let unpacked = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.xtask/prometheus/usr/bin/promtool");
    if unpacked.is_file() {
        return Some(unpacked);
    }
    which("promtool")
}

/// Processes whose argument list contains `needle` as consecutive arguments.
pub fn find_by_args(needle: &[&str]) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            args.windows(needle.len())
                .any(|w| w.iter().zip(needle).all(|(a, n)| *a == n.as_bytes()))
        })
        .collect()
}

/// The pids in a cgroup (either hierarchy version), empty if it does not exist.
pub fn cgroup_pids(cgroup: &Path) -> Vec<i32> {
    fs::read_to_string(cgroup.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Mount points at or below `dir`, deepest first (the order to unmount them in).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts = parse_mount_points(&mountinfo, dir);
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    mounts.dedup();
    mounts
}

/// Mount points of every cgroup hierarchy (v1 controllers and the cgroup2 tree).
pub fn cgroup_mounts() -> Vec<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    parse_cgroup_mounts(&mountinfo)
}

fn parse_cgroup_mounts(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            // The filesystem type follows the " - " separator.
            let (fields, tail) = line.split_once(" - ")?;
            let fstype = tail.split(' ').next()?;
            let point = fields.split(' ').nth(4)?;
            matches!(fstype, "cgroup" | "cgroup2")
                .then(|| PathBuf::from(unescape_mount_path(point)))
        })
        .collect()
}

fn parse_mount_points(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(unescape_mount_path(point)))
        .filter(|point| point.starts_with(dir))
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mount_path(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(octal) = s.get(i + 1..i + 4)
            && let Ok(code) = u8::from_str_radix(octal, 8)
        {
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The environment variable naming a plegd binary built already: `cargo xtask test` passes the
/// one its `cargo test --workspace --no-run` made (the workspace's features: `testing` adds
/// only the fake runtime, which the binary never uses), so no test builds plegd again.
pub const BINARY_ENV: &str = "PLEGD_TEST_BINARY";

/// The plegd binary [`BINARY_ENV`] names, else the debug one beside the running test, built now
/// if needed (`cargo test` built the test in that target dir, not necessarily the binary).
pub fn plegd_binary() -> anyhow::Result<PathBuf> {
    use anyhow::Context as _;
    if let Some(binary) = std::env::var_os(BINARY_ENV) {
        return Ok(binary.into());
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "--package", "plegd", "--bin", "plegd"])
        .status()
        .context("running cargo build")?;
    anyhow::ensure!(status.success(), "cargo build -p plegd failed");
    // The test is <target>/<profile>/deps/<test>-<hash>.
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("the test binary is not in <target>/<profile>/deps")?;
    Ok(profile_dir.join("plegd"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_bogus_pid_is_not() {
        assert!(is_alive(std::process::id() as i32));
        assert!(!is_alive(i32::MAX));
    }

    #[test]
    fn mount_points_below_a_dir_are_found_and_unescaped() {
        let mountinfo = "\
36 35 98:0 /mnt1 /mnt/parent rw - ext3 /dev/root rw
37 35 0:44 / /tmp/h/x/root/a\\040b rw - overlay overlay rw
38 35 0:45 / /tmp/h/xy rw - tmpfs tmpfs rw
39 35 0:46 / /tmp/h/x rw - tmpfs tmpfs rw";
        let found = parse_mount_points(mountinfo, Path::new("/tmp/h/x"));
        assert_eq!(
            found,
            vec![
                PathBuf::from("/tmp/h/x/root/a b"),
                PathBuf::from("/tmp/h/x")
            ]
        );
    }

    #[test]
    fn cgroup_hierarchies_are_found_by_filesystem_type() {
        let mountinfo = "\
25 24 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw
26 25 0:23 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
27 25 0:24 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw";
        assert_eq!(
            parse_cgroup_mounts(mountinfo),
            vec![
                PathBuf::from("/sys/fs/cgroup/memory"),
                PathBuf::from("/sys/fs/cgroup/unified")
            ]
        );
    }

    #[test]
    fn find_by_args_finds_a_child_by_its_arguments() {
        let marker = format!("plegd-marker-{}", std::process::id());
        // `sh -c SCRIPT NAME` keeps NAME in the argument list as $0 (two commands, so sh cannot
        // exec sleep in its place).
        let mut child = Command::new("sh")
            .args(["-c", "sleep 30; true", &marker])
            .spawn()
            .expect("spawn sh");
        // Until the child has exec'd, its cmdline is still this test binary's.
        let deadline = Instant::now() + Duration::from_secs(10);
        let found = loop {
            let found = find_by_args(&["sleep 30; true", &marker]);
            if !found.is_empty() || Instant::now() >= deadline {
                break found;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        child.kill().unwrap();
        child.wait().unwrap();
        // A fork of sh for `sleep` may show the same arguments until it execs.
        assert!(found.contains(&(child.id() as i32)), "{found:?}");
    }
}
