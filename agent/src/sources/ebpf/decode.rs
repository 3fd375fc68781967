//! Kernel events to triggers: which container an event is about (through the cgroup index),
//! what it observed, and which cgroups the probes should stop tracking. Pure: no
//! maps, no ring buffer, so it is tested with plain values.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::{Duration, SystemTime},
};

use plegd_common::{
    EVENT_HAS_EXIT_STATUS, KernelEvent, KernelEventKind, OOM_VICTIM_TASK, OomEvent,
};
use tracing::debug;

use crate::{
    base::host::page_size,
    pleg::{ContainerId, Identity, ObservationKind, PodUid, Source, Trigger},
    sources::ebpf::{
        cgroup_path,
        index::CgroupIndex,
        oom::{self, OomCounts},
        text::text,
    },
};

/// What /proc said of an OOM victim, read as soon as its record came (it may be gone by then).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VictimProc {
    /// Its cgroup2 path (`0::`).
    pub cgroup2: Option<String>,
    /// Its memory cgroup's path: the memory hierarchy's on cgroup v1, else cgroup2's.
    pub memory: Option<String>,
    /// Its `comm`.
    pub comm: Option<String>,
}

impl VictimProc {
    /// What `/proc/<pid>/cgroup` (`cgroup`) and `/proc/<pid>/comm` (`comm`) say.
    pub fn parse(cgroup: Option<&str>, comm: Option<&str>) -> Self {
        let lines = || cgroup.into_iter().flat_map(str::lines);
        let cgroup2 = lines()
            .find_map(|l| l.strip_prefix("0::"))
            .map(str::to_owned);
        let memory = lines()
            .find_map(|line| {
                let mut fields = line.splitn(3, ':');
                let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
                controllers
                    .split(',')
                    .any(|c| c == "memory")
                    .then(|| path.to_owned())
            })
            .or_else(|| cgroup2.clone());
        Self {
            cgroup2,
            memory,
            comm: comm
                .map(|c| c.trim_end().to_owned())
                .filter(|c| !c.is_empty()),
        }
    }

    /// Reads it for `pid`.
    pub fn read(pid: u32) -> Self {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok();
        Self::parse(cgroup.as_deref(), comm.as_deref())
    }
}

/// What one kernel event asks of the source.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decoded {
    /// Relist these containers, in order.
    pub triggers: Vec<Trigger>,
    /// Stop tracking inits in this cgroup id: it is not a container's.
    pub untrack: Option<u64>,
    /// The pod of an OOM kill's container, where its cgroup path names one: the kill is
    /// counted in its pod, whose container the cache may not hold yet (a container that runs
    /// out of memory as it starts).
    pub pod: Option<String>,
}

/// Turns kernel events into triggers, keeping the cgroup index current.
#[derive(Debug)]
pub struct Decoder {
    pub index: CgroupIndex,
    namespaces: Vec<String>,
    /// Processes whose exec was a runtime's bootstrap (see [`is_bootstrap_exec`]): the probes
    /// took them for their container's init, so their exit comes too, and means nothing.
    bootstraps: HashSet<u32>,
    /// Cgroups the probes were told to stop tracking (no container's): what their inits did
    /// before the probes forgot them still comes, and names no container.
    untracked: HashSet<u64>,
    /// Execs and exits of inits in cgroups the index does not know, oldest first, with when
    /// they were observed: the probes track a cgroup from its creation in the kernel, so a
    /// creation lost to a full ring leaves a container whose init the probes follow and whose
    /// events name no container. They wait for a scan ([`Decoder::replay`]) or the cgroup's
    /// removal, whose path names it, to say whose they are.
    unplaced: VecDeque<(KernelEvent, SystemTime)>,
    /// The memory cgroups' OOM counts seen at earlier kills ([`oom::account`]).
    oom_counts: OomCounts,
    /// Containers' inits by pid, with their cgroup2 id, from their execs: where a kernel's
    /// `mark_victim` names only the victim's pid (and the running task is another, as in a
    /// node's OOM), an init victim's container is found here.
    inits: HashMap<u32, (u64, String)>,
    /// The kernel's page size, in bytes.
    page_size: u64,
}

/// Bootstraps whose exit was never seen (lost to a full ring) are forgotten past this many.
const MAX_BOOTSTRAPS: usize = 4096;
/// Untracked cgroups remembered past this many are forgotten (their events could only be held
/// for nothing, until [`MAX_UNPLACED`] drops them).
const MAX_UNTRACKED: usize = 4096;
/// Inits remembered by pid past this many are forgotten (an exit lost to a full ring leaves
/// its entry).
const MAX_INITS: usize = 65_536;
/// Events of unknown cgroups held past this many: the oldest are dropped.
const MAX_UNPLACED: usize = 256;

/// Whether an exec is a container runtime re-executing its own binary through a file
/// descriptor (runc's cloned binary, `/dev/fd/N` or `/proc/self/fd/N`), which runc's init may
/// do inside the container's cgroup before the container's command execs. It is not the
/// container starting; its exit is not the container dying.
fn is_bootstrap_exec(path: &str) -> bool {
    path.starts_with("/dev/fd/") || path.starts_with("/proc/self/fd/")
}

/// Inserts `value` into `set`, forgetting all it held first once it holds `max`: what only a
/// later event (lost to a full ring, perhaps) would take out cannot grow without bound.
fn insert_bounded<T: Eq + std::hash::Hash>(set: &mut HashSet<T>, value: T, max: usize) {
    if set.len() >= max {
        set.clear();
    }
    set.insert(value);
}

/// Who a container is: cgroup `cgroup_id` at `path` (and the pod the path names), its init
/// `init` (when the event is its).
fn identity(cgroup_id: u64, path: Arc<str>, init: Option<u32>) -> ObservationKind {
    let pod = cgroup_path::parse(&path, &[]).and_then(|owner| owner.pod_uid);
    ObservationKind::Identity(Identity {
        cgroup_id,
        cgroup_path: path,
        init_pid: init,
        pod: pod.map(PodUid),
    })
}

/// A trigger of the eBPF source for container `id`.
fn trigger(id: &str, observed_at: SystemTime, observations: Vec<ObservationKind>) -> Trigger {
    Trigger::about(
        ContainerId(id.to_owned()),
        Source::Ebpf,
        observed_at,
        observations,
    )
}

impl Decoded {
    fn trigger(trigger: Trigger) -> Self {
        Self {
            triggers: vec![trigger],
            ..Self::default()
        }
    }
}

impl Decoder {
    pub fn new(index: CgroupIndex, namespaces: Vec<String>) -> Self {
        Self {
            index,
            namespaces,
            bootstraps: HashSet::new(),
            untracked: HashSet::new(),
            unplaced: VecDeque::new(),
            oom_counts: OomCounts::default(),
            inits: HashMap::new(),
            page_size: page_size(),
        }
    }

    /// Decodes one event; `observed_at` is its wall-clock time.
    pub fn decode(&mut self, event: &KernelEvent, observed_at: SystemTime) -> Decoded {
        match KernelEventKind::from_raw(event.kind) {
            Some(KernelEventKind::CgroupMkdir) => {
                let path = text(&event.path);
                match self.index.insert(event.cgroup_id, &path, &self.namespaces) {
                    Some(owner) => Decoded::trigger(trigger(
                        &owner.container_id,
                        observed_at,
                        vec![
                            ObservationKind::Present,
                            identity(event.cgroup_id, path.into(), None),
                        ],
                    )),
                    // The probes track every cgroup at container depth until told otherwise.
                    None => {
                        insert_bounded(&mut self.untracked, event.cgroup_id, MAX_UNTRACKED);
                        Decoded {
                            untrack: Some(event.cgroup_id),
                            ..Decoded::default()
                        }
                    }
                }
            }
            // The probes forgot the cgroup themselves.
            Some(KernelEventKind::CgroupRmdir) => self.removed(event, observed_at),
            Some(KernelEventKind::Exec) if is_bootstrap_exec(&text(&event.path)) => {
                insert_bounded(&mut self.bootstraps, event.pid, MAX_BOOTSTRAPS);
                Decoded::default()
            }
            Some(KernelEventKind::Exit) if self.bootstraps.remove(&event.pid) => Decoded::default(),
            Some(kind @ (KernelEventKind::Exec | KernelEventKind::Exit)) => {
                if kind == KernelEventKind::Exec {
                    if self.inits.len() >= MAX_INITS {
                        self.inits.clear();
                    }
                    // The exec'd file's name is what the kernel makes the process's comm of.
                    let path = text(&event.path);
                    let name = path.rsplit('/').next().unwrap_or_default();
                    let comm: String = name.chars().take(15).collect();
                    self.inits.insert(event.pid, (event.cgroup_id, comm));
                } else {
                    self.inits.remove(&event.pid);
                }
                match self.index.get(event.cgroup_id) {
                    Some(owner) => Decoded::trigger(init_trigger(
                        &owner.container_id,
                        self.index.path(event.cgroup_id),
                        event,
                        observed_at,
                    )),
                    None if self.untracked.contains(&event.cgroup_id) => Decoded::default(),
                    None => {
                        if self.unplaced.len() >= MAX_UNPLACED {
                            self.unplaced.pop_front();
                        }
                        self.unplaced.push_back((*event, observed_at));
                        Decoded::default()
                    }
                }
            }
            // OOM kills come as records of their own ([`Decoder::oom`]).
            Some(KernelEventKind::Oom) => Decoded::default(),
            None => Decoded::default(),
        }
    }

    /// Whether the container of an OOM kill's victim is known without /proc: by the victim's
    /// own cgroup, or, where the record has only its pid, by the exec that made it an init.
    /// Such a kill is decoded at once, in the ring's order (before the exit that follows it).
    pub fn knows_victim(&self, event: &OomEvent) -> bool {
        if event.flags & OOM_VICTIM_TASK != 0 {
            self.index.contains(event.cgroup_id)
        } else {
            self.inits
                .get(&event.pid)
                .is_some_and(|(id, _)| self.index.contains(*id))
        }
    }

    /// Decodes an OOM kill; `observed_at` is its wall-clock time, `victim` what /proc said of
    /// the victim. The container is the victim's (its cgroup2 id where the record has the
    /// victim's own, else its /proc path), else the running task's.
    pub fn oom(
        &mut self,
        event: &OomEvent,
        observed_at: SystemTime,
        victim: &VictimProc,
    ) -> Decoded {
        let by_id = || self.index.get(event.cgroup_id).cloned();
        let by_path = || {
            victim
                .cgroup2
                .as_deref()
                .and_then(|path| cgroup_path::parse(path, &self.namespaces))
        };
        let own = event.flags & OOM_VICTIM_TASK != 0;
        // Without the victim's task: its cgroup as its exec said, if it is an init.
        let init = (!own)
            .then(|| self.inits.get(&event.pid).cloned())
            .flatten();
        let init_cgroup = init.as_ref().map(|(id, _)| *id);
        let by_init = || init_cgroup.and_then(|id| self.index.get(id).cloned());
        let owner = if own {
            by_id().or_else(by_path)
        } else {
            by_path().or_else(by_init).or_else(by_id)
        };
        let Some(owner) = owner else {
            return Decoded::default();
        };
        // The memory cgroup's path: the one indexed for the victim's cgroup2 id (the runtimes
        // make a container's path alike in every hierarchy), else /proc's, read late (a dying
        // process's says `/`).
        let index_path = match init_cgroup {
            Some(id) => self.index.path(id),
            None => own.then(|| self.index.path(event.cgroup_id)).flatten(),
        };
        let memory: Vec<&str> = index_path
            .as_deref()
            .into_iter()
            .chain(victim.memory.as_deref())
            .chain(victim.cgroup2.as_deref())
            .collect();
        debug!(
            pid = event.pid,
            flags = event.flags,
            victim = ?&event.victim[..(event.victim_depth as usize).min(event.victim.len())],
            victim_level = event.victim_level,
            charger = ?&event.charger[..(event.charger_depth as usize).min(event.charger.len())],
            charger_level = event.charger_level,
            ?memory,
            "an OOM kill's record"
        );
        let mut kill = oom::account(
            event,
            &memory,
            victim.comm.as_deref(),
            &self.namespaces,
            self.page_size,
            &mut self.oom_counts,
        );
        if let Some((_, comm)) = init {
            kill.victim_init = true;
            if kill.victim_comm.is_empty() {
                kill.victim_comm = comm;
            }
        }
        Decoded {
            pod: owner.pod_uid,
            ..Decoded::trigger(trigger(
                &owner.container_id,
                observed_at,
                vec![
                    ObservationKind::OomKilled,
                    ObservationKind::OomKill(Arc::new(kill)),
                ],
            ))
        }
    }

    /// A cgroup removed: if it was a container's (indexed, or its path says so when its
    /// creation was lost), what its init did that waited for a name, then its removal.
    fn removed(&mut self, event: &KernelEvent, observed_at: SystemTime) -> Decoded {
        self.untracked.remove(&event.cgroup_id);
        let path: Arc<str> = self
            .index
            .path(event.cgroup_id)
            .unwrap_or_else(|| text(&event.path).into());
        let owner = self
            .index
            .remove(event.cgroup_id)
            .or_else(|| cgroup_path::parse(&path, &self.namespaces));
        let mut held = Vec::new();
        self.unplaced.retain(|(e, at)| {
            let about = e.cgroup_id == event.cgroup_id;
            if about {
                held.push((*e, *at));
            }
            !about
        });
        let Some(owner) = owner else {
            return Decoded::default();
        };
        let mut triggers: Vec<Trigger> = held
            .iter()
            .map(|(e, at)| init_trigger(&owner.container_id, Some(Arc::clone(&path)), e, *at))
            .collect();
        triggers.push(trigger(
            &owner.container_id,
            observed_at,
            vec![
                ObservationKind::CgroupRemoved,
                identity(event.cgroup_id, path, None),
            ],
        ));
        Decoded {
            triggers,
            ..Decoded::default()
        }
    }

    /// The triggers of held events whose cgroup the index knows now (after a scan), in the
    /// order they were observed; the others wait on.
    pub fn replay(&mut self) -> Vec<Trigger> {
        let mut triggers = Vec::new();
        self.unplaced
            .retain(|(event, at)| match self.index.get(event.cgroup_id) {
                Some(owner) => {
                    let path = self.index.path(event.cgroup_id);
                    triggers.push(init_trigger(&owner.container_id, path, event, *at));
                    false
                }
                None => true,
            });
        triggers
    }
}

/// The trigger of an init's exec or exit in container `id`'s cgroup (at `path`, when known).
fn init_trigger(
    id: &str,
    path: Option<Arc<str>>,
    event: &KernelEvent,
    observed_at: SystemTime,
) -> Trigger {
    let observation = if event.kind == KernelEventKind::Exec as u32 {
        ObservationKind::Exec(text(&event.path))
    } else if event.flags & EVENT_HAS_EXIT_STATUS != 0 {
        exit_observation(event.exit_status)
    } else {
        ObservationKind::Exited
    };
    let mut observations = vec![observation];
    observations.extend(path.map(|path| identity(event.cgroup_id, path, Some(event.pid))));
    trigger(id, observed_at, observations)
}

/// A wait status as an observation: killed by a signal, or exited with a code.
fn exit_observation(status: i32) -> ObservationKind {
    match status & 0x7f {
        0 => ObservationKind::ExitCode((status >> 8) & 0xff),
        signal => ObservationKind::Signal(signal),
    }
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

/// An OOM record as the probe writes it, for tests: victim pid 42, no chain; `cgroup_id` the
/// victim's own (`own`) or the running task's.
#[cfg(test)]
pub(super) fn oom_event(cgroup_id: u64, own: bool) -> OomEvent {
    OomEvent {
        kind: KernelEventKind::Oom as u32,
        pid: 42,
        cgroup_id,
        ktime_ns: 0,
        flags: if own { OOM_VICTIM_TASK } else { 0 },
        victim_depth: 0,
        charger_depth: 0,
        victim_level: 0,
        charger_level: 0,
        _pad: 0,
        comm: [0; 16],
        victim: Default::default(),
        charger: Default::default(),
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::pleg::Scope;

    const ID: &str = "0c47cae53a77d0c47cae53a77d0c47cae53a77d0c47cae53a77d0c47cae53a77";

    fn decoder() -> Decoder {
        Decoder::new(CgroupIndex::default(), vec!["k8s.io".into()])
    }

    impl Decoded {
        /// Its one trigger.
        fn only(self) -> Trigger {
            assert_eq!(self.triggers.len(), 1, "one trigger: {self:?}");
            self.triggers.into_iter().next().unwrap()
        }
    }

    #[test]
    fn mkdir_of_a_container_triggers_a_relist_and_other_cgroups_are_untracked() {
        let mut d = decoder();
        let path = format!("/kubepods/besteffort/pod12345678-aaaa/{ID}");
        let decoded = d.decode(
            &test_event(KernelEventKind::CgroupMkdir, 7, &path),
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(decoded.untrack, None);
        let trigger = decoded.only();
        assert_eq!(trigger.scope, Scope::Container(ContainerId(ID.into())));
        assert_eq!(trigger.source, Source::Ebpf);

        // A non-container cgroup: no trigger, and the probes stop tracking it.
        let other = d.decode(
            &test_event(KernelEventKind::CgroupMkdir, 8, "/system.slice/x.service"),
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(
            other,
            Decoded {
                untrack: Some(8),
                ..Decoded::default()
            }
        );

        // rmdir forgets, and says the cgroup went (the container cannot still run).
        let gone = d.decode(
            &test_event(KernelEventKind::CgroupRmdir, 7, ""),
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(
            gone.only().observations[0].kind,
            ObservationKind::CgroupRemoved
        );
        assert!(d.index.get(7).is_none());
        // An rmdir of anything else: nothing.
        assert_eq!(
            d.decode(
                &test_event(KernelEventKind::CgroupRmdir, 8, ""),
                SystemTime::UNIX_EPOCH
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
        );
        for (status, expected) in [
            (9, ObservationKind::Signal(9)),
            (3 << 8, ObservationKind::ExitCode(3)),
            (0, ObservationKind::ExitCode(0)),
        ] {
            let mut exit = test_event(KernelEventKind::Exit, 7, "");
            exit.exit_status = status;
            exit.flags = EVENT_HAS_EXIT_STATUS;
            let trigger = d.decode(&exit, SystemTime::UNIX_EPOCH).only();
            assert_eq!(trigger.observations[0].kind, expected);
        }
        // Without exit details: an exit all the same, so the relist retries until the runtime
        // no longer shows the container running.
        let trigger = d
            .decode(
                &test_event(KernelEventKind::Exit, 7, ""),
                SystemTime::UNIX_EPOCH,
            )
            .only();
        assert_eq!(trigger.observations[0].kind, ObservationKind::Exited);
        // An unknown cgroup: nothing.
        assert_eq!(
            d.decode(
                &test_event(KernelEventKind::Exit, 99, ""),
                SystemTime::UNIX_EPOCH
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
        );
        let mut bootstrap = test_event(KernelEventKind::Exec, 7, "/dev/fd/6");
        bootstrap.pid = 100;
        assert_eq!(
            d.decode(&bootstrap, SystemTime::UNIX_EPOCH),
            Decoded::default()
        );
        let mut exit = test_event(KernelEventKind::Exit, 7, "");
        exit.pid = 100;
        assert_eq!(d.decode(&exit, SystemTime::UNIX_EPOCH), Decoded::default());
        // The container's command, and its exit, are.
        let mut command = test_event(KernelEventKind::Exec, 7, "/bin/sh");
        command.pid = 101;
        let trigger = d.decode(&command, SystemTime::UNIX_EPOCH).only();
        assert_eq!(
            trigger.observations[0].kind,
            ObservationKind::Exec("/bin/sh".into())
        );
        exit.pid = 101;
        assert!(d.decode(&exit, SystemTime::UNIX_EPOCH).triggers.len() == 1);
    }

    /// A cgroup whose creation the ring had no room for: the probes follow its init, and
    /// the index does not know it. Its init's events wait for its removal, whose path names
    /// the container.
    #[test]
    fn an_init_in_a_cgroup_whose_creation_was_lost_is_named_by_its_removal() {
        let mut d = decoder();
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let mut exit = test_event(KernelEventKind::Exit, 9, "");
        (exit.exit_status, exit.flags) = (9, EVENT_HAS_EXIT_STATUS);
        for (event, ms) in [
            (test_event(KernelEventKind::Exec, 9, "/bin/sh"), 1),
            (exit, 2),
        ] {
            assert_eq!(d.decode(&event, at(ms)), Decoded::default());
        }
        let removed = d.decode(
            &test_event(KernelEventKind::CgroupRmdir, 9, &format!("/k8s.io/{ID}")),
            at(3),
        );
        let seen: Vec<_> = removed
            .triggers
            .iter()
            .map(|t| {
                (
                    t.scope.clone(),
                    t.observations[0].kind.clone(),
                    t.observed_at,
                )
            })
            .collect();
        let container = Scope::Container(ContainerId(ID.into()));
        assert_eq!(
            seen,
            [
                (
                    container.clone(),
                    ObservationKind::Exec("/bin/sh".into()),
                    at(1)
                ),
                (container.clone(), ObservationKind::Signal(9), at(2)),
                (container, ObservationKind::CgroupRemoved, at(3)),
            ]
        );
        // Named once: nothing is left to replay.
        assert!(d.replay().is_empty());

        // A cgroup told apart as no container's: its init's exec, come before the probes forgot
        // it, is no one's to hold.
        d.decode(
            &test_event(KernelEventKind::CgroupMkdir, 11, "/system.slice/y.service"),
            at(4),
        );
        d.decode(&test_event(KernelEventKind::Exec, 11, "/bin/sh"), at(4));
        assert!(d.unplaced.is_empty());
        // A cgroup whose creation was lost and that was no container's: its events go with it.
        d.decode(&test_event(KernelEventKind::Exec, 8, "/bin/sh"), at(4));
        assert_eq!(
            d.decode(
                &test_event(KernelEventKind::CgroupRmdir, 8, "/system.slice/x.service"),
                at(5)
            ),
            Decoded::default()
        );
        let mut index = CgroupIndex::default();
        index.insert(8, &format!("/k8s.io/{ID}"), &["k8s.io".to_owned()]);
        d.index.replace(index);
        assert!(d.replay().is_empty());
    }

    /// A scan that finds the cgroup names its held events, in the order they came; those of
    /// cgroups it did not find wait on.
    #[test]
    fn a_scan_names_the_held_events_of_the_containers_it_found() {
        let mut d = decoder();
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        for (cgroup, ms) in [(9, 1), (10, 2), (9, 3)] {
            let event = test_event(KernelEventKind::Exec, cgroup, &format!("/bin/{ms}"));
            assert_eq!(d.decode(&event, at(ms)), Decoded::default());
        }
        let mut index = CgroupIndex::default();
        index.insert(9, &format!("/k8s.io/{ID}"), &["k8s.io".to_owned()]);
        d.index.replace(index);
        let replayed: Vec<_> = d
            .replay()
            .into_iter()
            .map(|t| (t.observations[0].kind.clone(), t.observed_at))
            .collect();
        assert_eq!(
            replayed,
            [
                (ObservationKind::Exec("/bin/1".into()), at(1)),
                (ObservationKind::Exec("/bin/3".into()), at(3)),
            ]
        );
        assert!(d.replay().is_empty());
        let other = "1d47cae53a77d0c47cae53a77d0c47cae53a77d0c47cae53a77d0c47cae53a77";
        let removed = d.decode(
            &test_event(
                KernelEventKind::CgroupRmdir,
                10,
                &format!("/k8s.io/{other}"),
            ),
            at(4),
        );
        assert_eq!(
            removed.triggers[0].observations[0].kind,
            ObservationKind::Exec("/bin/2".into())
        );
    }

    #[test]
    fn oom_victims_are_found_by_their_own_cgroup_then_proc_then_the_running_task() {
        let mut d = decoder();
        let proc_path = VictimProc {
            cgroup2: Some(format!("/k8s.io/{ID}")),
            ..VictimProc::default()
        };
        let via_proc = d
            .oom(&oom_event(1, false), SystemTime::UNIX_EPOCH, &proc_path)
            .only();
        assert_eq!(via_proc.scope, Scope::Container(ContainerId(ID.into())));
        let kinds: Vec<_> = via_proc.observations.iter().map(|o| &o.kind).collect();
        assert!(
            matches!(
                kinds[..],
                [ObservationKind::OomKilled, ObservationKind::OomKill(_)]
            ),
            "{kinds:?}"
        );
        d.decode(
            &test_event(KernelEventKind::CgroupMkdir, 7, &format!("/k8s.io/{ID}")),
            SystemTime::UNIX_EPOCH,
        );
        let gone = VictimProc::default();
        assert_eq!(
            d.oom(&oom_event(7, false), SystemTime::UNIX_EPOCH, &gone)
                .triggers
                .len(),
            1
        );
        // The victim's own cgroup wins over a /proc path read too late (the pid reused).
        let other = "1d47cae53a77d0c47cae53a77d0c47cae53a77d0c47cae53a77d0c47cae53a77";
        let reused = VictimProc {
            cgroup2: Some(format!("/k8s.io/{other}")),
            ..VictimProc::default()
        };
        let own = d
            .oom(&oom_event(7, true), SystemTime::UNIX_EPOCH, &reused)
            .only();
        assert_eq!(own.scope, Scope::Container(ContainerId(ID.into())));
        assert_eq!(
            d.oom(&oom_event(99, true), SystemTime::UNIX_EPOCH, &gone),
            Decoded::default()
        );
    }

    /// A kernel whose `mark_victim` names only the pid, the node out of memory: the running
    /// task is another (systemd), the victim's /proc already says `/`; its exec said whose init
    /// it is.
    #[test]
    fn a_pid_only_victim_is_found_by_the_init_its_exec_named() {
        let mut d = decoder();
        d.decode(
            &test_event(KernelEventKind::CgroupMkdir, 7, &format!("/k8s.io/{ID}")),
            SystemTime::UNIX_EPOCH,
        );
        d.decode(
            &test_event(KernelEventKind::Exec, 7, "/bin/dd"),
            SystemTime::UNIX_EPOCH,
        );
        assert!(!d.knows_victim(&oom_event(98, true)), "no cgroup 98");
        let dying = VictimProc {
            cgroup2: Some("/".into()),
            ..VictimProc::default()
        };
        assert!(d.knows_victim(&oom_event(99, false)));
        let decoded = d.oom(&oom_event(99, false), SystemTime::UNIX_EPOCH, &dying);
        let trigger = decoded.only();
        assert_eq!(trigger.scope, Scope::Container(ContainerId(ID.into())));
        let Some(ObservationKind::OomKill(kill)) = trigger.observations.get(1).map(|o| &o.kind)
        else {
            panic!("{trigger:?}");
        };
        assert!(kill.victim_init, "{kill:?}");
        assert_eq!(kill.victim_comm, "dd", "the exec'd file's name");
        // Once it exited, its pid names nothing.
        let mut exit = test_event(KernelEventKind::Exit, 7, "");
        exit.pid = 42;
        d.decode(&exit, SystemTime::UNIX_EPOCH);
        assert_eq!(
            d.oom(&oom_event(99, false), SystemTime::UNIX_EPOCH, &dying),
            Decoded::default()
        );
    }

    #[test]
    fn proc_says_the_memory_hierarchys_path_on_cgroup_v1_and_cgroup2s_alone() {
        let hybrid =
            "12:pids:/k8s.io/a\n6:cpu,cpuacct:/k8s.io/a\n4:memory:/kubepods/pod1/a\n0::/k8s.io/a\n";
        let victim = VictimProc::parse(Some(hybrid), Some("dd\n"));
        assert_eq!(victim.memory.as_deref(), Some("/kubepods/pod1/a"));
        assert_eq!(victim.cgroup2.as_deref(), Some("/k8s.io/a"));
        assert_eq!(victim.comm.as_deref(), Some("dd"));
        let unified = VictimProc::parse(Some("0::/kubepods.slice/x.scope\n"), None);
        assert_eq!(unified.memory.as_deref(), Some("/kubepods.slice/x.scope"));
        assert_eq!(VictimProc::parse(None, Some("")), VictimProc::default());
    }

    #[test]
    fn exec_names_the_binary_and_unknown_kinds_are_ignored() {
        let mut d = decoder();
        d.decode(
            &test_event(KernelEventKind::CgroupMkdir, 7, &format!("/k8s.io/{ID}")),
            SystemTime::UNIX_EPOCH,
        );
        let trigger = d
            .decode(
                &test_event(KernelEventKind::Exec, 7, "/bin/sleep"),
                SystemTime::UNIX_EPOCH,
            )
            .only();
        assert_eq!(
            trigger.observations[0].kind,
            ObservationKind::Exec("/bin/sleep".into())
        );
        let mut unknown = test_event(KernelEventKind::Exec, 7, "");
        unknown.kind = 99;
        assert_eq!(
            d.decode(&unknown, SystemTime::UNIX_EPOCH),
            Decoded::default()
        );
    }
}
