//! The capabilities `plegd run` gives up once its privileged start is over.
//!
//! Only the start needs privilege: loading and attaching the eBPF programs (CAP_BPF,
//! CAP_PERFMON). Binding the API socket and the TCP ports above 1023, reaching the runtime's
//! socket (root's, 0660), reading /proc/<pid>/{stat,cgroup}, the cgroup tree and the state
//! directory need none: plegd is uid 0 and the owner of what it opens, or the files are
//! world-readable. What stays is [`needed`]: CAP_BPF while the probes run, because on kernels
//! before 6.5 with `kernel.unprivileged_bpf_disabled` set (the default of most distributions)
//! every bpf() command is refused without it, and the eBPF source keeps updating and reading
//! its maps (the init map, the loss counters); nothing at all without the probes.
//!
//! Capabilities belong to each thread, not to the process: [`drop_all_but`] refuses to run
//! once the process has a second thread, so it runs before the async runtime starts its
//! workers, which then inherit the reduced sets.

use std::collections::HashSet;

use caps::{CapSet, Capability, CapsHashSet};

/// Capabilities could not be dropped; `plegd run` stops rather than run with more than it
/// needs.
#[derive(Debug, thiserror::Error)]
pub enum DropError {
    #[error(
        "the process already has {threads} threads; capabilities are per thread, so they must \
         be dropped before any other thread starts"
    )]
    Threads { threads: usize },
    #[error("reading /proc/self/task: {0}")]
    Tasks(#[source] std::io::Error),
    #[error("{what}: {source}")]
    Caps {
        what: &'static str,
        #[source]
        source: caps::errors::CapsError,
    },
}

/// What is left after [`drop_all_but`].
#[derive(Debug, PartialEq, Eq)]
pub struct Dropped {
    /// The permitted (and effective) set now.
    pub kept: Vec<Capability>,
    /// Capabilities left in the bounding set because plegd lacked CAP_SETPCAP to drop them
    /// (unused: plegd executes nothing, and the unit and the DaemonSet set no_new_privs).
    pub bounding_left: Vec<Capability>,
}

/// The capabilities `plegd run` keeps: CAP_BPF while its eBPF probes are loaded, else none.
pub fn needed(ebpf_loaded: bool) -> CapsHashSet {
    if ebpf_loaded {
        HashSet::from([Capability::CAP_BPF])
    } else {
        HashSet::new()
    }
}

/// Drops every capability but `keep` from the calling thread's effective, permitted,
/// inheritable, ambient and bounding sets; capabilities in `keep` that the thread does not
/// have stay absent. The bounding set shrinks only when the thread holds CAP_SETPCAP (the
/// kernel's rule); what remains of it is reported.
pub fn drop_all_but(keep: &CapsHashSet) -> Result<Dropped, DropError> {
    let threads = std::fs::read_dir("/proc/self/task")
        .map_err(DropError::Tasks)?
        .count();
    if threads > 1 {
        return Err(DropError::Threads { threads });
    }
    let failed = |what| move |source| DropError::Caps { what, source };
    let supported = caps::runtime::thread_all_supported();
    // The bounding set first: dropping from it takes CAP_SETPCAP, which goes below.
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP)
        .map_err(failed("reading the effective set"))?
    {
        for &cap in supported.difference(keep) {
            if caps::has_cap(None, CapSet::Bounding, cap)
                .map_err(failed("reading the bounding set"))?
            {
                caps::drop(None, CapSet::Bounding, cap)
                    .map_err(failed("dropping from the bounding set"))?;
            }
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(failed("clearing the ambient set"))?;
    caps::clear(None, CapSet::Inheritable).map_err(failed("clearing the inheritable set"))?;
    let permitted =
        caps::read(None, CapSet::Permitted).map_err(failed("reading the permitted set"))?;
    let kept: CapsHashSet = permitted.intersection(keep).copied().collect();
    // Effective before permitted: the kernel refuses an effective set larger than permitted.
    caps::set(None, CapSet::Effective, &kept).map_err(failed("setting the effective set"))?;
    caps::set(None, CapSet::Permitted, &kept).map_err(failed("setting the permitted set"))?;
    let mut bounding_left = Vec::new();
    for &cap in supported.difference(keep) {
        if caps::has_cap(None, CapSet::Bounding, cap).map_err(failed("reading the bounding set"))? {
            bounding_left.push(cap);
        }
    }
    Ok(Dropped {
        kept: sorted(kept),
        bounding_left: sorted(bounding_left),
    })
}

fn sorted(set: impl IntoIterator<Item = Capability>) -> Vec<Capability> {
    let mut caps: Vec<_> = set.into_iter().collect();
    caps.sort_by_key(|c| c.index());
    caps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cap_bpf_stays_and_only_while_the_probes_run() {
        assert_eq!(needed(true), HashSet::from([Capability::CAP_BPF]));
        assert!(needed(false).is_empty());
    }

    #[test]
    fn a_process_with_threads_is_refused_before_anything_changes() {
        // A second thread, alive while the drop is tried, whatever the test harness runs on.
        let (keep_alive, parked) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || parked.recv());
        let before = caps::read(None, CapSet::Permitted).unwrap();
        let error = drop_all_but(&needed(false)).unwrap_err();
        assert!(
            matches!(error, DropError::Threads { threads } if threads > 1),
            "{error}"
        );
        assert_eq!(caps::read(None, CapSet::Permitted).unwrap(), before);
        drop(keep_alive);
        let _ = other.join();
    }
}
