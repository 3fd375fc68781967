//! The init of a container that was running before the probes attached: the probes learn a
//! container's init when it execs (see the `INITS` map in the programs), so for containers
//! already running userspace finds it in the cgroup's processes and seeds the map.

use std::path::Path;

/// What the choice needs of one process of the cgroup (from `/proc/<pid>/stat`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: u32,
    /// Start time in clock ticks since boot.
    pub start_time: u64,
    pub comm: String,
}

/// The init among a cgroup's processes: the oldest whose parent is outside the cgroup (the
/// runtime's shim, the pod's pause or the host's init adopted it; every process the init made
/// has its parent inside). `0` when there is none yet, or when it is still the runtime's
/// bootstrap (runc's `runc:[2:INIT]` before the container starts): the probes then take the
/// first process that execs.
pub fn choose_init(processes: &[ProcessInfo]) -> u32 {
    processes
        .iter()
        .filter(|p| !processes.iter().any(|q| q.pid == p.ppid))
        .min_by_key(|p| (p.start_time, p.pid))
        .filter(|p| !p.comm.starts_with("runc:["))
        .map_or(0, |p| p.pid)
}

/// [`choose_init`] over the processes of the cgroup directory `dir` (a process that exits while
/// it is read is skipped).
pub fn find_init(dir: &Path) -> u32 {
    let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
        return 0;
    };
    let processes: Vec<ProcessInfo> = procs
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .filter_map(|pid: u32| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            parse_stat(pid, &stat)
        })
        .collect();
    choose_init(&processes)
}

/// Parses `/proc/<pid>/stat`: `pid (comm) state ppid ... starttime(22) ...`; comm may hold
/// spaces and parentheses, so fields are counted from the last `)`.
fn parse_stat(pid: u32, stat: &str) -> Option<ProcessInfo> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After comm: state(3) ppid(4) ... starttime(22), i.e. indexes 0, 1 and 19 here.
    Some(ProcessInfo {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
        comm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: u32, ppid: u32, start_time: u64, comm: &str) -> ProcessInfo {
        ProcessInfo {
            pid,
            ppid,
            start_time,
            comm: comm.into(),
        }
    }

    #[test]
    fn the_init_is_the_oldest_process_adopted_from_outside() {
        // Shared pid namespace: the init (pid 900, parent the pause 50) forked 901; an exec'd
        // process (950, parent the shim 40) came later.
        let processes = [
            process(901, 900, 120, "sleep"),
            process(950, 40, 300, "sh"),
            process(900, 50, 100, "sh"),
        ];
        assert_eq!(choose_init(&processes), 900);
    }

    #[test]
    fn no_init_before_the_container_starts_or_in_an_empty_cgroup() {
        assert_eq!(choose_init(&[process(77, 40, 1, "runc:[2:INIT]")]), 0);
        assert_eq!(choose_init(&[]), 0);
    }

    #[test]
    fn stat_lines_with_odd_comms_parse() {
        let stat = "4242 (a) b (c)) S 17 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 98765 1000 10 18446744073709551615";
        let info = parse_stat(4242, stat).unwrap();
        assert_eq!(info.comm, "a) b (c)");
        assert_eq!(info.ppid, 17);
        assert_eq!(info.start_time, 98765);
        assert_eq!(parse_stat(1, "garbage"), None);
    }

    #[test]
    fn this_process_is_found_in_its_own_cgroup() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let me = parse_stat(std::process::id(), &stat).unwrap();
        assert_eq!(me.ppid, std::os::unix::process::parent_id());
    }
}
