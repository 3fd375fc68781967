//! Kernel events to triggers: which container an event is about (through the cgroup index),
//! what it observed, and which cgroups the probes should stop tracking. Pure: no
//! maps, no ring buffer, so it is tested with plain values.

use std::{
    collections::HashSet,
    time::{Duration, SystemTime},
};

use plegd_common::{EVENT_HAS_EXIT_STATUS, KernelEvent, KernelEventKind};

use crate::{
    pleg::{
        event::{Observation, ObservationKind, Scope, Trigger, TriggerSource},
        record::ContainerId,
    },
    sources::ebpf::{cgroup_path, index::CgroupIndex},
};

/// What one kernel event asks of the source.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decoded {
    /// Relist this container.
    pub trigger: Option<Trigger>,
    /// Stop tracking inits in this cgroup id: it is not a container's.
    pub untrack: Option<u64>,
}

/// Turns kernel events into triggers, keeping the cgroup index current.
#[derive(Debug)]
pub struct Decoder {
    pub index: CgroupIndex,
    namespaces: Vec<String>,
    /// Processes whose exec was a runtime's bootstrap (see [`is_bootstrap_exec`]): the probes
    /// took them for their container's init, so their exit comes too, and means nothing.
    bootstraps: HashSet<u32>,
}

/// Bootstraps whose exit was never seen (lost to a full ring) are forgotten past this many.
const MAX_BOOTSTRAPS: usize = 4096;

/// Whether an exec is a container runtime re-executing its own binary through a file
/// descriptor (runc's cloned binary, `/dev/fd/N` or `/proc/self/fd/N`), which runc's init may
/// do inside the container's cgroup before the container's command execs. It is not the
/// container starting; its exit is not the container dying.
fn is_bootstrap_exec(path: &str) -> bool {
    path.starts_with("/dev/fd/") || path.starts_with("/proc/self/fd/")
}

impl Decoder {
    pub fn new(index: CgroupIndex, namespaces: Vec<String>) -> Self {
        Self {
            index,
            namespaces,
            bootstraps: HashSet::new(),
        }
    }

    /// Decodes one event; `observed_at` is its wall-clock time. `victim_cgroup` resolves an OOM
    /// victim's pid to its cgroup2 path (from /proc), when it can.
    pub fn decode(
        &mut self,
        event: &KernelEvent,
        observed_at: SystemTime,
        victim_cgroup: impl FnOnce(u32) -> Option<String>,
    ) -> Decoded {
        let trigger = |id: &str, observations: Vec<ObservationKind>| Trigger {
            scope: Scope::Container(ContainerId(id.to_owned())),
            source: TriggerSource::Ebpf,
            observed_at,
            observations: observations
                .into_iter()
                .map(|kind| Observation {
                    source: TriggerSource::Ebpf,
                    kind,
                })
                .collect(),
        };
        match KernelEventKind::from_raw(event.kind) {
            Some(KernelEventKind::CgroupMkdir) => {
                let path = text(&event.path);
                match self.index.insert(event.cgroup_id, &path, &self.namespaces) {
                    Some(owner) => Decoded {
                        trigger: Some(trigger(&owner.container_id, vec![ObservationKind::Present])),
                        untrack: None,
                    },
                    // The probes track every cgroup at container depth until told otherwise.
                    None => Decoded {
                        trigger: None,
                        untrack: Some(event.cgroup_id),
                    },
                }
            }
            // The probes forgot the cgroup themselves.
            Some(KernelEventKind::CgroupRmdir) => Decoded {
                trigger: self.index.remove(event.cgroup_id).map(|owner| {
                    trigger(&owner.container_id, vec![ObservationKind::CgroupRemoved])
                }),
                untrack: None,
            },
            Some(KernelEventKind::Exec) => {
                let path = text(&event.path);
                if is_bootstrap_exec(&path) {
                    if self.bootstraps.len() >= MAX_BOOTSTRAPS {
                        self.bootstraps.clear();
                    }
                    self.bootstraps.insert(event.pid);
                    return Decoded::default();
                }
                self.about_cgroup(event.cgroup_id, |id| {
                    trigger(id, vec![ObservationKind::Exec(path)])
                })
            }
            Some(KernelEventKind::Exit) if self.bootstraps.remove(&event.pid) => Decoded::default(),
            Some(KernelEventKind::Exit) => {
                let observation = if event.flags & EVENT_HAS_EXIT_STATUS != 0 {
                    exit_observation(event.exit_status)
                } else {
                    ObservationKind::Exited
                };
                self.about_cgroup(event.cgroup_id, |id| trigger(id, vec![observation]))
            }
            Some(KernelEventKind::Oom) => {
                let owner = victim_cgroup(event.pid)
                    .and_then(|path| cgroup_path::parse(&path, &self.namespaces))
                    .map(|owner| owner.container_id)
                    .or_else(|| {
                        self.index
                            .get(event.cgroup_id)
                            .map(|o| o.container_id.clone())
                    });
                Decoded {
                    trigger: owner.map(|id| trigger(&id, vec![ObservationKind::OomKilled])),
                    ..Decoded::default()
                }
            }
            None => Decoded::default(),
        }
    }

    fn about_cgroup(&self, cgroup_id: u64, make: impl FnOnce(&str) -> Trigger) -> Decoded {
        Decoded {
            trigger: self.index.get(cgroup_id).map(|o| make(&o.container_id)),
            ..Decoded::default()
        }
    }
}

/// A wait status as an observation: killed by a signal, or exited with a code.
fn exit_observation(status: i32) -> ObservationKind {
    match status & 0x7f {
        0 => ObservationKind::ExitCode((status >> 8) & 0xff),
        signal => ObservationKind::Signal(signal),
    }
}

/// A NUL-terminated kernel string.
pub(super) fn text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// The wall-clock time of a `bpf_ktime_get_ns()` stamp.
pub fn wall_time_of(ktime_ns: u64) -> SystemTime {
    // CLOCK_MONOTONIC cannot fail on Linux; a zero "now" would only make the age zero.
    let mono_now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(Duration::from)
        .unwrap_or_default();
    let age = mono_now.saturating_sub(Duration::from_nanos(ktime_ns));
    SystemTime::now() - age
}

/// The cgroup2 path of a process, from /proc (`0::<path>`).
pub fn proc_cgroup2_path(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_owned)
}

/// A kernel event as the probes write it, for tests: pid 42, no status.
#[cfg(test)]
pub(super) fn test_event(kind: KernelEventKind, cgroup_id: u64, path: &str) -> KernelEvent {
    let mut bytes = [0u8; plegd_common::EVENT_PATH_BYTES];
    bytes[..path.len()].copy_from_slice(path.as_bytes());
    KernelEvent {
        kind: kind as u32,
        pid: 42,
        cgroup_id,
        ktime_ns: 0,
        exit_status: 0,
        flags: 0,
        path: bytes,
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    const ID: &str = "0c47cae53a77d0c47cae53a77d0c47cae53a77d0c47cae53a77d0c47cae53a77";

    fn decoder() -> Decoder {
        Decoder::new(CgroupIndex::default(), vec!["k8s.io".into()])
    }

    fn no_proc(_: u32) -> Option<String> {
        None
    }

    #[test]
    fn mkdir_of_a_container_triggers_a_relist_and_other_cgroups_are_untracked() {
        let mut d = decoder();
        let path = format!("/kubepods/besteffort/pod12345678-aaaa/{ID}");
        let decoded = d.decode(
            &test_event(KernelEventKind::CgroupMkdir, 7, &path),
            SystemTime::UNIX_EPOCH,
            no_proc,
        );
        assert_eq!(decoded.untrack, None);
        let trigger = decoded.trigger.unwrap();
        assert_eq!(trigger.scope, Scope::Container(ContainerId(ID.into())));
        assert_eq!(trigger.source, TriggerSource::Ebpf);

        // A non-container cgroup: no trigger, and the probes stop tracking it.
        let other = d.decode(
            &test_event(KernelEventKind::CgroupMkdir, 8, "/system.slice/x.service"),
            SystemTime::UNIX_EPOCH,
            no_proc,
        );
        assert_eq!(
            other,
            Decoded {
                trigger: None,
                untrack: Some(8)
            }
        );

        // rmdir forgets, and says the cgroup went (the container cannot still run).
        let gone = d.decode(
            &test_event(KernelEventKind::CgroupRmdir, 7, ""),
            SystemTime::UNIX_EPOCH,
            no_proc,
        );
        assert_eq!(
            gone.trigger.unwrap().observations[0].kind,
            ObservationKind::CgroupRemoved
        );
        assert!(d.index.get(7).is_none());
        // An rmdir of anything else: nothing.
        assert_eq!(
            d.decode(
                &test_event(KernelEventKind::CgroupRmdir, 8, ""),
                SystemTime::UNIX_EPOCH,
                no_proc
            ),
            Decoded::default()
        );
    }

    #[test]
    fn exits_carry_the_signal_or_the_code() {
        let mut d = decoder();
        d.decode(
            &test_event(KernelEventKind::CgroupMkdir, 7, &format!("/k8s.io/{ID}")),
            SystemTime::UNIX_EPOCH,
            no_proc,
        );
        for (status, expected) in [
            (9, ObservationKind::Signal(9)),
            (3 << 8, ObservationKind::ExitCode(3)),
            (0, ObservationKind::ExitCode(0)),
        ] {
            let mut exit = test_event(KernelEventKind::Exit, 7, "");
            exit.exit_status = status;
            exit.flags = EVENT_HAS_EXIT_STATUS;
            let trigger = d
                .decode(&exit, SystemTime::UNIX_EPOCH, no_proc)
                .trigger
                .unwrap();
            assert_eq!(trigger.observations[0].kind, expected);
        }
        // Without exit details: an exit all the same, so the relist retries until the runtime
        // no longer shows the container running.
        let trigger = d
            .decode(
                &test_event(KernelEventKind::Exit, 7, ""),
                SystemTime::UNIX_EPOCH,
                no_proc,
            )
            .trigger
            .unwrap();
        assert_eq!(trigger.observations[0].kind, ObservationKind::Exited);
        // An unknown cgroup: nothing.
        assert_eq!(
            d.decode(
                &test_event(KernelEventKind::Exit, 99, ""),
                SystemTime::UNIX_EPOCH,
                no_proc
            ),
            Decoded::default()
        );
    }

    /// runc's init may re-exec its own binary inside the cgroup before the container's
    /// command: neither that exec nor that process's exit is a hint.
    #[test]
    fn a_runtime_bootstrap_exec_and_its_exit_are_no_hints() {
        let mut d = decoder();
        d.decode(
            &test_event(KernelEventKind::CgroupMkdir, 7, &format!("/k8s.io/{ID}")),
            SystemTime::UNIX_EPOCH,
            no_proc,
        );
        let mut bootstrap = test_event(KernelEventKind::Exec, 7, "/dev/fd/6");
        bootstrap.pid = 100;
        assert_eq!(
            d.decode(&bootstrap, SystemTime::UNIX_EPOCH, no_proc),
            Decoded::default()
        );
        let mut exit = test_event(KernelEventKind::Exit, 7, "");
        exit.pid = 100;
        assert_eq!(
            d.decode(&exit, SystemTime::UNIX_EPOCH, no_proc),
            Decoded::default()
        );
        // The container's command, and its exit, are.
        let mut command = test_event(KernelEventKind::Exec, 7, "/bin/sh");
        command.pid = 101;
        let trigger = d
            .decode(&command, SystemTime::UNIX_EPOCH, no_proc)
            .trigger
            .unwrap();
        assert_eq!(
            trigger.observations[0].kind,
            ObservationKind::Exec("/bin/sh".into())
        );
        exit.pid = 101;
        assert!(
            d.decode(&exit, SystemTime::UNIX_EPOCH, no_proc)
                .trigger
                .is_some()
        );
    }

    #[test]
    fn oom_victims_are_found_through_proc_then_the_index() {
        let mut d = decoder();
        let via_proc = d.decode(
            &test_event(KernelEventKind::Oom, 1, ""),
            SystemTime::UNIX_EPOCH,
            |_| Some(format!("/k8s.io/{ID}")),
        );
        assert_eq!(
            via_proc.trigger.unwrap().observations[0].kind,
            ObservationKind::OomKilled
        );
        d.decode(
            &test_event(KernelEventKind::CgroupMkdir, 7, &format!("/k8s.io/{ID}")),
            SystemTime::UNIX_EPOCH,
            no_proc,
        );
        let via_index = d.decode(
            &test_event(KernelEventKind::Oom, 7, ""),
            SystemTime::UNIX_EPOCH,
            no_proc,
        );
        assert!(via_index.trigger.is_some());
    }

    #[test]
    fn exec_names_the_binary_and_unknown_kinds_are_ignored() {
        let mut d = decoder();
        d.decode(
            &test_event(KernelEventKind::CgroupMkdir, 7, &format!("/k8s.io/{ID}")),
            SystemTime::UNIX_EPOCH,
            no_proc,
        );
        let trigger = d
            .decode(
                &test_event(KernelEventKind::Exec, 7, "/bin/sleep"),
                SystemTime::UNIX_EPOCH,
                no_proc,
            )
            .trigger
            .unwrap();
        assert_eq!(
            trigger.observations[0].kind,
            ObservationKind::Exec("/bin/sleep".into())
        );
        let mut unknown = test_event(KernelEventKind::Exec, 7, "");
        unknown.kind = 99;
        assert_eq!(
            d.decode(&unknown, SystemTime::UNIX_EPOCH, no_proc),
            Decoded::default()
        );
    }
}
