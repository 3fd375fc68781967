//! File descriptors: plegd's own work keeps [`RESERVED`] of them whatever its API's peers hold.
//!
//! The soft `RLIMIT_NOFILE` systemd gives a unit is 1,024, for programs that still use
//! `select(2)`; plegd does not, and raises it to the hard limit at start (as the Go runtime
//! does for every Go program). The API's connections then share what is left beyond the
//! reserve ([`api_budget`]), so a flood of connections can never take the descriptors plegd
//! reaches its runtime with.

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use tracing::{info, warn};

/// Descriptors kept for plegd's own work: the runtime's connections (a channel per endpoint
/// and per event stream, more while one reconnects), the eBPF objects (the programs, their
/// links, the maps and the ring buffer: about 20), the state directory's files, the cgroup
/// tree and `/proc` reads (a scan holds a directory or two open), the async runtime's epoll
/// and wakeups, stdout and the log. About 60 are open on a quiet node; the rest is headroom.
pub const RESERVED: u64 = 256;

/// Raises the soft open-file limit to the hard one; the soft limit now in force.
pub fn raise_nofile_limit() -> u64 {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            info!(
                from = soft,
                to = hard,
                "open-file limit raised to its hard limit"
            );
            hard
        }
        Err(error) => {
            warn!(%error, soft, hard, "cannot raise the open-file limit; keeping it");
            soft
        }
    }
}

/// The descriptors the API's connections may hold together, under a soft limit of `soft`:
/// what the reserve leaves, at least a handful so the API still answers.
pub fn api_budget(soft: u64) -> usize {
    usize::try_from(soft.saturating_sub(RESERVED).max(16)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_gets_what_the_reserve_leaves_and_never_nothing() {
        assert_eq!(api_budget(1024), 768);
        assert_eq!(api_budget(65_536), 65_280);
        assert_eq!(api_budget(100), 16);
    }
}
