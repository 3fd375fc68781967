//! One container's record after a relist, in the one order of the lifecycle: how far the
//! container's life has gone first (created, running, exited: [`ContainerState::progress`]),
//! then which of the runtime's records said it.
//!
//! Three records may speak of a container: the one plegd committed last, what the runtime
//! showed now (a status read of its CRI store, or containerd's own records for the containerd
//! backend), and the runtime's task record (containerd's `/tasks/start` or `/tasks/exit`, or
//! its task status read on a kernel hint). The task service knows of a start or an exit some
//! 30 ms before the CRI store, which is updated only after the runtime's cleanup; so a record
//! further on wins, and of two as far on the CRI store's wins, for it carries the runtime's
//! reason (`OOMKilled`, `Completed`, ...). A reading never takes a container back unless the
//! store that moved it on says so (a task restarted in place, on the containerd backend), nor
//! back from an exit to a start (or creation) it shows no later than that exit, nor a running
//! container back to created.

use std::{collections::BTreeSet, sync::Arc};

use crate::pleg::model::{
    oom::OomKill,
    record::{
        ContainerRecord, ContainerState, HostIdentity, OomWitness, Store, TaskRecord, exit_reason,
    },
    source::Source,
};

/// The record of a container after a relist: `committed` (what plegd had), `shown` (what the
/// runtime showed now, a complete record with its status; `None`: not read) and `task` (the
/// task service's record, when confirming by the task store). `None` when neither record
/// exists: a container never read cannot be built from a task record alone. `witness`: whose
/// word on an OOM kill decides the reason of an exit only the task service confirmed.
pub fn merge(
    committed: Option<&ContainerRecord>,
    shown: Option<ContainerRecord>,
    task: Option<TaskRecord>,
    witness: OomWitness,
) -> Option<ContainerRecord> {
    let mut record = match (committed, shown) {
        (Some(committed), Some(shown)) if lags(&shown, committed) => committed.clone(),
        (Some(committed), Some(shown)) => ContainerRecord {
            // What plegd learned of the container (its OOM kill, who it is on the host) no
            // reading carries: it stays.
            oom_killed_by: &shown.oom_killed_by | &committed.oom_killed_by,
            oom_kill: shown
                .oom_kill
                .clone()
                .or_else(|| committed.oom_kill.clone()),
            host: shown.host.clone().or_else(|| committed.host.clone()),
            ..shown
        },
        (None, Some(shown)) => shown,
        (Some(committed), None) => committed.clone(),
        (None, None) => return None,
    };
    match (task, record.state) {
        (
            Some(TaskRecord::Exited { code, at }),
            ContainerState::Created | ContainerState::Running,
        ) => {
            record.state = ContainerState::Exited;
            record.exit_code = Some(code);
            record.finished_at = Some(at);
            record.confirmed_by = Store::Task;
        }
        (Some(TaskRecord::Started { at }), ContainerState::Created) => {
            record.state = ContainerState::Running;
            record.started_at = at.or(record.started_at);
            record.confirmed_by = Store::Task;
        }
        _ => {}
    }
    settle_reason(&mut record, witness);
    Some(record)
}

/// What a relist learned of a container beyond its state: that the OOM killer killed one of
/// its processes (and the kernel's account of the kill), and who it is on the host. Laid over
/// its record, which keeps them.
pub fn learn(
    record: &mut ContainerRecord,
    oom_killed_by: &BTreeSet<Source>,
    oom_kill: Option<&Arc<OomKill>>,
    host: Option<&HostIdentity>,
    witness: OomWitness,
) {
    record.oom_killed_by.extend(oom_killed_by);
    if let Some(kill) = oom_kill {
        record.oom_kill = Some(Arc::clone(kill));
    }
    if let Some(host) = host {
        let merged = match &record.host {
            Some(known) => known.updated(host),
            None => host.clone(),
        };
        if record.host.as_deref() != Some(&merged) {
            record.host = Some(std::sync::Arc::new(merged));
        }
    }
    settle_reason(record, witness);
}

/// The reason of an exit only the task service confirmed: the one the CRI store will show
/// (the task service itself keeps none). CRI shows none for a sandbox.
fn settle_reason(record: &mut ContainerRecord, witness: OomWitness) {
    if record.state == ContainerState::Exited
        && !record.sandbox
        && record.confirmed_by == Store::Task
        && let Some(code) = record.exit_code
    {
        let reason = exit_reason(code, record.oom_killed_for(witness));
        if record.reason != reason {
            record.reason = reason.to_owned();
        }
    }
}

/// Whether `shown` would change `committed`'s state or the store confirming it (what
/// [`merge`] without a task record decides, without building the record).
pub fn moves_on(committed: &ContainerRecord, shown: &ContainerRecord) -> bool {
    !lags(shown, committed)
        && (shown.state, shown.confirmed_by) != (committed.state, committed.confirmed_by)
}

/// Whether `shown` is behind `committed` in the container's life: it comes from another of the
/// runtime's stores, the CRI store that has not caught up with what the task service
/// confirmed, or it was read before the exit `committed` holds ([`before_exit`]), or it shows
/// created a container running (no runtime takes a running container back to created: a task
/// restarted in place exits first; such a reading was read before the start, and a `Created`
/// then `Running` again would tell the start twice). Unknown states are in no order, but an
/// exit is final: a CRI store that lost track of a container (containerd restarted after its
/// task service recorded the exit and before its CRI store did) does not undo the exit, which
/// would be told again when the container goes.
fn lags(shown: &ContainerRecord, committed: &ContainerRecord) -> bool {
    let before_start =
        shown.state == ContainerState::Created && committed.state == ContainerState::Running;
    before_start
        || before_exit(shown, committed)
        || shown.confirmed_by != committed.confirmed_by
            && match (shown.state.progress(), committed.state.progress()) {
                (Some(shown), Some(committed)) => shown < committed,
                (None, _) => committed.state == ContainerState::Exited,
                (Some(_), None) => false,
            }
}

/// Whether `shown` shows the container short of the exit `committed` holds, started (or
/// created) no later than that exit: read before it, whichever read began first. A full
/// relist's inspection runs well after the relist began, and a targeted read begun in between
/// may have read the container running: the soak saw its death told again after a start. A
/// start after the exit is a task restarted in place (the containerd backend, whose listing
/// keeps no start time: then nothing says which came first).
fn before_exit(shown: &ContainerRecord, committed: &ContainerRecord) -> bool {
    let exited = match committed.state {
        ContainerState::Exited => committed.finished_at,
        _ => None,
    };
    let since = match shown.state {
        ContainerState::Running => shown.started_at,
        ContainerState::Created => shown.created_at,
        ContainerState::Exited | ContainerState::Unknown => None,
    };
    since
        .zip(exited)
        .is_some_and(|(since, exited)| since <= exited)
}

/// The record a container had while running, between `before` (short of running) and `after`
/// (exited), when the runtime's task service recorded its start: the start no reading showed.
pub fn while_running(after: &ContainerRecord, started: Option<TaskRecord>) -> ContainerRecord {
    let started_at = match started {
        Some(TaskRecord::Started { at }) => at,
        _ => None,
    };
    ContainerRecord {
        state: ContainerState::Running,
        started_at: started_at.or(after.started_at),
        finished_at: None,
        exit_code: None,
        reason: String::new(),
        confirmed_by: Store::Task,
        ..after.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use ContainerState::{Created, Exited, Running, Unknown};
    use Store::{Cri, Task};

    use super::*;
    use crate::runtime::testing::{container, exited};

    const ANY: OomWitness = OomWitness::Any;

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn record(state: ContainerState, layer: Store) -> ContainerRecord {
        let mut c = match state {
            Exited => exited("c", "app", 1, "Error"),
            state => container("c", "app", state),
        };
        c.confirmed_by = layer;
        c
    }

    const EXIT: TaskRecord = TaskRecord::Exited {
        code: 137,
        at: SystemTime::UNIX_EPOCH,
    };

    /// (name, committed, shown, task record, wanted state and layer; None: no record).
    type Case = (
        &'static str,
        Option<(ContainerState, Store)>,
        Option<(ContainerState, Store)>,
        Option<TaskRecord>,
        Option<(ContainerState, Store)>,
    );

    #[test]
    fn the_record_furthest_on_wins_then_the_cri_stores() {
        let start = Some(TaskRecord::Started { at: Some(at(5)) });
        #[rustfmt::skip]
        let cases: [Case; 16] = [
            // (name, committed, shown, task, merged)
            ("nothing known", None, None, Some(EXIT), None),
            ("first reading", None, Some((Running, Cri)), None, Some((Running, Cri))),
            ("not read", Some((Running, Cri)), None, None, Some((Running, Cri))),
            ("a new reading", Some((Running, Cri)), Some((Exited, Cri)), None, Some((Exited, Cri))),
            ("an exit over running", Some((Running, Cri)), None, Some(EXIT), Some((Exited, Task))),
            ("an exit over created", None, Some((Created, Cri)), Some(EXIT), Some((Exited, Task))),
            ("a start over created", Some((Created, Cri)), None, start, Some((Running, Task))),
            ("a start is no news to running", Some((Running, Cri)), None, start, Some((Running, Cri))),
            ("an exit is no news to exited", Some((Exited, Cri)), None, Some(EXIT), Some((Exited, Cri))),
            ("the store lags the task", Some((Exited, Task)), Some((Running, Cri)), None, Some((Exited, Task))),
            ("the store caught up", Some((Exited, Task)), Some((Exited, Cri)), None, Some((Exited, Cri))),
            ("the store caught up with the task record", Some((Running, Cri)), Some((Exited, Cri)), Some(EXIT), Some((Exited, Cri))),
            ("a task restarted in place", Some((Exited, Task)), Some((Running, Task)), None, Some((Running, Task))),
            ("never back from running to created", Some((Running, Cri)), Some((Created, Cri)), None, Some((Running, Cri))),
            ("unknown is in no order", Some((Running, Task)), Some((Unknown, Cri)), None, Some((Unknown, Cri))),
            ("unknown does not undo an exit another store confirmed", Some((Exited, Task)), Some((Unknown, Cri)), None, Some((Exited, Task))),
        ];
        for (name, committed, shown, task, want) in cases {
            let committed = committed.map(|(s, l)| record(s, l));
            let shown = shown.map(|(s, l)| record(s, l));
            let got = merge(committed.as_ref(), shown.clone(), task, OomWitness::Any);
            assert_eq!(got.map(|c| (c.state, c.confirmed_by)), want, "{name}");
        }
    }

    /// A reading that shows a start (or creation) no later than the exit committed was read
    /// before it; one that shows a later start is a restart in place; without the times
    /// nothing says which came first.
    #[test]
    fn a_reading_short_of_an_exit_it_began_before_does_not_take_it_back() {
        let exited = ContainerRecord {
            finished_at: Some(at(10)),
            ..record(Exited, Cri)
        };
        let running = |started| ContainerRecord {
            started_at: started,
            ..record(Running, Cri)
        };
        let created = ContainerRecord {
            created_at: Some(at(3)),
            ..record(Created, Cri)
        };
        let start = Some(TaskRecord::Started { at: Some(at(5)) });
        #[rustfmt::skip]
        let cases = [
            ("started before the exit", running(Some(at(5))), None, Exited),
            ("started as it exited", running(Some(at(10))), None, Exited),
            ("created before the exit, its start read", created, start, Exited),
            ("started after the exit: restarted in place", running(Some(at(15))), None, Running),
            ("no start time", running(None), None, Running),
        ];
        for (name, shown, task, want) in cases {
            let got = merge(Some(&exited), Some(shown), task, ANY).map(|c| c.state);
            assert_eq!(got, Some(want), "{name}");
        }
    }

    #[test]
    fn a_task_exit_brings_its_code_and_time_and_the_reason_the_cri_store_will_show() {
        let merged = merge(Some(&record(Running, Cri)), None, Some(EXIT), ANY).expect("a record");
        assert_eq!(merged.exit_code, Some(137));
        assert_eq!(merged.finished_at, Some(SystemTime::UNIX_EPOCH));
        assert_eq!(merged.reason, "Error");
        let clean = Some(TaskRecord::Exited {
            code: 0,
            at: SystemTime::UNIX_EPOCH,
        });
        let merged = merge(Some(&record(Running, Cri)), None, clean, ANY).expect("a record");
        assert_eq!(merged.reason, "Completed");
        // An OOM kill recorded while it ran is the reason, whatever the code (a child was the
        // victim, the init exited 0 after it).
        let killed = ContainerRecord {
            oom_killed_by: BTreeSet::from([Source::Containerd]),
            ..record(Running, Cri)
        };
        let merged = merge(Some(&killed), None, clean, ANY).expect("a record");
        assert_eq!(
            (merged.reason.as_str(), merged.exit_code),
            ("OOMKilled", Some(0))
        );
        // Learned after the exit was merged: the reason follows, until the CRI store tells.
        let mut exited = merge(Some(&record(Running, Cri)), None, Some(EXIT), ANY).unwrap();
        learn(
            &mut exited,
            &BTreeSet::from([Source::Ebpf]),
            None,
            None,
            ANY,
        );
        assert_eq!(exited.reason, "OOMKilled");
        let mut shown = exited.clone();
        shown.confirmed_by = Cri;
        shown.reason = "Error".into();
        learn(&mut shown, &BTreeSet::from([Source::Ebpf]), None, None, ANY);
        assert_eq!(shown.reason, "Error", "the CRI store's reason stands");
        let started = merge(
            Some(&record(Created, Cri)),
            None,
            Some(TaskRecord::Started { at: Some(at(9)) }),
            ANY,
        )
        .expect("a record");
        assert_eq!(started.started_at, Some(at(9)));
    }

    /// The kernel's account of an OOM kill, learned while the container ran, stays on its
    /// record through the readings that follow (none carries it), for the death's event.
    #[test]
    fn the_kernels_account_of_an_oom_kill_stays_through_readings() {
        use crate::pleg::model::oom::{OomKill, OomScope};
        let kill = Arc::new(OomKill {
            scope: OomScope::Pod,
            cgroup: Some("/kubepods/besteffort/pod1".into()),
            limit_bytes: Some(48 << 20),
            victim_pid: 42,
            victim_comm: "dd".into(),
            victim_init: false,
        });
        let mut running = record(Running, Cri);
        learn(
            &mut running,
            &BTreeSet::from([Source::Ebpf]),
            Some(&kill),
            None,
            ANY,
        );
        let exited = merge(Some(&running), Some(record(Exited, Cri)), None, ANY).unwrap();
        assert_eq!(exited.oom_kill, Some(Arc::clone(&kill)));
        let again = merge(Some(&exited), Some(record(Exited, Cri)), None, ANY).unwrap();
        assert_eq!(again.oom_kill, Some(kill));
    }

    /// Where containerd's event stream reaches plegd, only its own record of an OOM kill
    /// decides the reason, as only that one reaches its CRI store: the kernel's word of one
    /// the shim did not see is no reason CRI ever shows.
    #[test]
    fn with_the_runtime_as_witness_only_its_oom_record_is_the_reason() {
        let runtime = OomWitness::Runtime;
        let mut told_by_kernel =
            merge(Some(&record(Running, Cri)), None, Some(EXIT), runtime).expect("a record");
        learn(
            &mut told_by_kernel,
            &BTreeSet::from([Source::Ebpf]),
            None,
            None,
            runtime,
        );
        assert_eq!(told_by_kernel.reason, "Error");
        assert!(
            told_by_kernel.oom_killed(),
            "still learned, for its observation"
        );
        learn(
            &mut told_by_kernel,
            &BTreeSet::from([Source::Containerd]),
            None,
            None,
            runtime,
        );
        assert_eq!(told_by_kernel.reason, "OOMKilled");
    }

    #[test]
    fn a_sandbox_has_no_reason_as_cri_shows_none() {
        let sandbox = ContainerRecord {
            sandbox: true,
            ..record(Running, Cri)
        };
        let merged = merge(Some(&sandbox), None, Some(EXIT), ANY).expect("a record");
        assert_eq!((merged.state, merged.reason.as_str()), (Exited, ""));
    }

    #[test]
    fn the_run_no_reading_showed_is_running_from_the_tasks_start() {
        let after = merge(Some(&record(Created, Cri)), None, Some(EXIT), ANY).expect("a record");
        let during = while_running(&after, Some(TaskRecord::Started { at: Some(at(3)) }));
        assert_eq!(
            (
                during.state,
                during.exit_code,
                during.started_at,
                during.confirmed_by
            ),
            (Running, None, Some(at(3)), Task)
        );
        assert_eq!(during.name, after.name);
    }
}
