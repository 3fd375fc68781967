//! Reconcile: what plegd committed, what a relist read and why it looked, in; each pod's plan
//! (its new record and the events that announce it) and what to read again, out. No runtime,
//! no clock, no channel: each pod's plan is handed to an [`Act`] as soon as it is decided,
//! which the relist carries out there and then (cache, events, commit: `crate::pleg::driver::relist`,
//! read, decide, act) and the tables of the tests collect. The decisions about the hints (what
//! to read again, what settles) are taken once every pod is committed, against the node as it
//! is then and the few facts of before they need (`Before`).
//!
//! Each container is merged by the one lifecycle order ([`crate::pleg::decide::merge`]); its events
//! are kubelet's transitions ([`crate::pleg::decide::diff`]) along the way it went: from its committed
//! record, through the run the task service recorded where no reading showed it, to its new
//! record, then to nothing when it is gone. A hint is reflected once the result shows what its
//! source saw; one that is not is handed back to be read again, with why.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::SystemTime,
};

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::pleg::{
    decide::{
        committed::Committed,
        diff::transition,
        hints::{Hint, Hints},
        merge::{learn, merge, moves_on, while_running},
        provenance::{Change, event},
    },
    model::{
        event::{PodLifecycleEvent, PodLifecycleEventType},
        oom::OomKill,
        record::{
            ContainerId, ContainerRecord, ContainerState, HostIdentity, OomWitness, PodRecord,
            PodUid, Store, TaskRecord, TaskRecords, side_by_side,
        },
        source::Source,
        trigger::{Observation, ObservationKind, Says, Scope},
    },
};

/// How reconcile decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The runtime record that confirms a start, an exit or a removal: the task store takes
    /// the runtime's own records the triggers carry (`/tasks/start`, `/tasks/exit`,
    /// `/containers/delete`) and its task status; the CRI store only its own record.
    pub confirm: Store,
    /// Send `ContainerChanged` events; kubelet computes but never sends them.
    pub emit_changed: bool,
    /// Whose word on an OOM kill decides the reason of a death the task service confirmed.
    pub oom_witness: OomWitness,
    /// The runtime's own records of each start, exit and deletion are on their way
    /// (containerd's event stream is connected): a life a reading asked for found already
    /// over is told whole, its start from the runtime's record of it.
    pub runtime_events: bool,
    /// The run's first full relist (its baseline) is behind: while the runtime's records are
    /// on their way, a life any reading finds over is told whole, asked about or not (a full
    /// relist that ran before the records of a container's life reached plegd: one frozen or
    /// descheduled while containers came and went). The baseline keeps kubelet's rule for a
    /// container that started before it: one that died before plegd started has died,
    /// nothing more.
    pub baseline_read: bool,
}

/// What a reading covers: where it can say a container is absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Covers {
    /// Nothing was read: only the runtime's records the hints carry speak.
    Nothing,
    /// The whole node (a full relist).
    Node,
    /// One pod, read whole.
    Pod(PodUid),
    /// These containers, each read by its id.
    Containers(Vec<ContainerId>),
}

/// What the runtime showed of one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodReading {
    /// Inspected: every container with its status.
    Inspected(PodRecord),
    /// Some of its containers, each read by its id: `pod` holds those found (with the pod's
    /// identity), `gone` those the runtime no longer has; the others stay as committed.
    Containers {
        pod: PodRecord,
        gone: Vec<ContainerId>,
    },
    /// The runtime does not have it.
    Gone,
    /// Its inspection failed: it stays as committed and is read again.
    Failed,
}

impl PodReading {
    /// Whether the runtime's statuses were read (the pod whole or some of its containers).
    pub fn is_read(&self) -> bool {
        self.record().is_some()
    }

    /// The containers read, with their pod's identity (none when nothing was read).
    pub fn record(&self) -> Option<&PodRecord> {
        match self {
            Self::Inspected(pod) | Self::Containers { pod, .. } => Some(pod),
            Self::Gone | Self::Failed => None,
        }
    }
}

/// What a relist read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    pub covers: Covers,
    /// The pods read, ascending. A pod it does not hold is as committed: a full relist leaves
    /// out the pods it listed as committed, state for state (at 10,000 pods, holding each of
    /// them only to pass it over took a third of a steady relist's time).
    pub pods: Vec<(PodUid, PodReading)>,
    /// Task statuses read on kernel hints (beside the records the hints carry).
    pub tasks: TaskRecords,
    /// When the runtime was read (or, for no reading, when reconciled): the time of changes
    /// no trigger pointed at.
    pub read_at: SystemTime,
}

impl Reading {
    /// No reading at all: the hints' runtime records alone, against the committed records.
    pub fn none(at: SystemTime) -> Self {
        Self {
            covers: Covers::Nothing,
            pods: Vec::new(),
            tasks: TaskRecords::new(),
            read_at: at,
        }
    }
}

/// Why a scope is to be read again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Why {
    /// The reading does not show what a source saw yet (or nothing was read).
    Unreflected,
    /// The pod's inspection failed.
    Failed,
}

/// A scope to read again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reread {
    pub scope: Scope,
    pub hint: Hint,
    pub why: Why,
}

/// `reading` (begun at `began`) without what a reading begun since showed of the committed
/// containers: reads run side by side, and a listing taken before a container was read (the
/// full relist, beside the container's own read) must neither take its record back nor find it
/// gone. Those containers stay as committed (the pod's reading names the others); the rest of
/// the reading stands.
pub fn fresh(reading: Reading, committed: &Committed, began: Instant) -> Reading {
    let newer = |id: &ContainerId| committed.read_since(id, began);
    let pods = reading
        .pods
        .into_iter()
        .map(|(uid, read)| {
            let Some(held) = committed
                .get(&uid)
                .filter(|pod| pod.containers.keys().any(&newer))
            else {
                return (uid, read);
            };
            let older = || held.containers.keys().filter(|id| !newer(id)).cloned();
            let read = match read {
                PodReading::Inspected(mut pod) => {
                    pod.containers.retain(|id, _| !newer(id));
                    let gone = older()
                        .filter(|id| !pod.containers.contains_key(id))
                        .collect();
                    PodReading::Containers { pod, gone }
                }
                PodReading::Containers { mut pod, mut gone } => {
                    pod.containers.retain(|id, _| !newer(id));
                    gone.retain(|id| !newer(id));
                    PodReading::Containers { pod, gone }
                }
                PodReading::Gone => PodReading::Containers {
                    pod: held.identity(),
                    gone: older().collect(),
                },
                PodReading::Failed => PodReading::Failed,
            };
            (uid, read)
        })
        .collect();
    Reading { pods, ..reading }
}

/// The hints a reconcile left unreflected, to be read.
pub fn unanswered(reread: &[Reread]) -> Hints {
    reread
        .iter()
        .map(|reread| (reread.scope.clone(), reread.hint.clone()))
        .collect()
}

/// One pod's change, or its inspection: its new record (`None`: gone) and the events that
/// announce it, in order (unnumbered; none for an inspection that found no change).
#[derive(Debug)]
pub struct PodPlan<'e> {
    pub uid: PodUid,
    pub record: Option<PodRecord>,
    /// The record holds the containers (by id) the committed one holds: the container index
    /// stays ([`Committed::commit`]). Found here, where both records were just read; at
    /// 10,000 pods the commit's own comparison read the committed record out of memory again.
    pub same_containers: bool,
    /// Drained from one buffer that serves every pod of the reading; what the `Act` leaves is
    /// dropped with the drain. One buffer, not one per pod: why is in docs/design.md ("The
    /// full relist at node scale").
    pub events: std::vec::Drain<'e, PodLifecycleEvent>,
    /// Deaths whose reason the CRI store, catching up, shows other than the one their event
    /// told (from the task service's record and containerd's rule): the record takes CRI's,
    /// and `events` holds a ContainerChanged with it.
    pub corrected: Vec<Correction>,
}

/// A death's reason as its event told it, and as the CRI store shows it since (or the
/// runtime's later word: containerd's `/tasks/oom` after its `/tasks/exit`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Correction {
    pub container: ContainerId,
    pub told: String,
    pub shown: String,
}

impl Correction {
    /// The correction of `told` (a death the task service confirmed, its reason predicted, or
    /// one the CRI store showed before the OOM kill containerd told: [`ContainerRecord::awaits_cri`])
    /// by `shown` (the CRI store's record of it, or its reason predicted again from what the
    /// runtime said since: `/tasks/oom` comes apart from `/tasks/exit`, and after it on a busy
    /// node), if they differ. The prediction redone is said too: the record takes it, and the
    /// store showing the same later is no correction of what was told.
    fn of(told: &ContainerRecord, shown: &ContainerRecord) -> Option<Self> {
        let exited = |c: &ContainerRecord, store| {
            c.state == ContainerState::Exited && c.confirmed_by == store
        };
        // An empty reason was told by no one (a record an older plegd saved): the store
        // fills it in.
        let differ = !told.reason.is_empty() && told.reason != shown.reason;
        let caught_up = told.awaits_cri() && exited(shown, Store::Cri);
        let predicted_again = exited(told, Store::Task) && exited(shown, Store::Task);
        ((caught_up || predicted_again) && differ).then(|| Self {
            container: told.id.clone(),
            told: told.reason.clone(),
            shown: shown.reason.clone(),
        })
    }
}

/// Carries out each pod's plan as reconcile decides it: the relist writes the cache, publishes
/// and commits; the tests collect. Handed over one pod at a time, while the pod's records are
/// still in the CPU's caches: at 10,000 changed pods, deciding all of them before carrying
/// out any read each one's records out of memory twice.
pub trait Act {
    /// The records as committed so far: a pod's own are as before until its plan is acted on.
    fn committed(&self) -> &Committed;
    /// Carries out `pod`, committing its record.
    fn act(&mut self, pod: PodPlan<'_>);
    /// Tells the events of containers no record of plegd's ever held ([`unread lives`]): none
    /// is committed, no pod's status changes.
    ///
    /// [`unread lives`]: Decide::unread_lives
    fn tell(&mut self, events: std::vec::Drain<'_, PodLifecycleEvent>);
}

/// What reconcile leaves once every pod's plan is acted on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FollowUp {
    /// What to read again, and why.
    pub reread: Vec<Reread>,
    /// Containers in a state only the task service confirmed: to read once more when the CRI
    /// store has caught up, for its status and reason (no event: the state does not change).
    pub settling: Vec<ContainerId>,
    /// Containers gone: those the runtime recorded deleted, and those a reading found gone. A
    /// listing that still shows one (the CRI store forgets a deleted container a moment after;
    /// a listing taken before a reading found it gone) must not bring it back, nor a record of
    /// the runtime's that comes after tell its end again: container ids are never reused.
    pub deleted: Vec<ContainerId>,
    /// Pods whose inspection failed.
    pub failed: Vec<PodUid>,
}

/// Reconciles `reading` (and the runtime records `hints` carry) against what `out` committed,
/// handing each pod's plan to `out` as it is decided, ascending by pod; returns what is left.
/// `queued`: hints of other triggers about what was read (still queued, `Batch::queued`, or
/// come while it was read, `Relister::relist_crediting`); of them only the starts
/// the task service recorded are taken, so a container first read exited is announced started
/// though the record of its start waits in another hint. `tombstones`: containers the runtime
/// recorded deleted at earlier relists.
/// `unread`: whether containers no reading ever showed, whose whole life the runtime's records
/// tell, are told ([`Decide::unread_lives`]). Not while a read of them is in flight: that read
/// will show who they are.
pub fn reconcile(
    out: &mut impl Act,
    reading: Reading,
    hints: &Hints,
    queued: &Hints,
    tombstones: &HashSet<ContainerId>,
    settings: Settings,
    unread: bool,
) -> FollowUp {
    let Reading {
        covers,
        pods,
        tasks,
        read_at,
    } = reading;
    let decide = Decide {
        records: Records::of(hints, queued, tasks, tombstones, settings),
        hints,
        queued,
        read_at,
        settings,
    };
    let before = Before::of(out.committed(), hints);
    let mut plan = FollowUp::default();
    let mut unsettled: Vec<ContainerId> = Vec::new();
    let mut gone: Vec<ContainerId> = Vec::new();
    let mut events = Vec::new();
    for (uid, pod_reading) in considered(out.committed(), pods, &decide.records) {
        if matches!(pod_reading, Some(PodReading::Failed)) {
            plan.failed.push(uid);
            continue;
        }
        if settings.confirm == Store::Task {
            // What the reading showed, whatever the plan: a settling read that found the CRI
            // store still behind settles on.
            unsettled.extend(shown(pod_reading.as_ref()).cloned());
        }
        let Some(pod) = decide.pod(out.committed(), uid, pod_reading, &mut events) else {
            continue;
        };
        if settings.confirm == Store::Task {
            unsettled.extend(newly_unsettled(
                out.committed().get(&pod.uid),
                pod.record.as_ref(),
            ));
        }
        gone.extend(removed(out.committed().get(&pod.uid), pod.record.as_ref()));
        out.act(pod);
    }
    unsettled.retain(|id| is_unsettled(out.committed().container(id)));
    let lives = match settings.confirm {
        Store::Task => decide.unread_lives(&before, out.committed(), tombstones),
        Store::Cri => Vec::new(),
    };
    // Gone, but not recorded deleted: containerd's records of its life may come after CRI's
    // word of its deletion, and tell it then.
    let untold = decide.records.lives_untold(&lives);
    // Not told now (a read of them is in flight), they are not answered either: the read, or
    // the records once it is done, will tell them.
    let withheld: Vec<ContainerId> = if unread {
        decide.tell_unread(&lives, out.committed(), &mut events);
        if !events.is_empty() {
            out.tell(events.drain(..));
        }
        Vec::new()
    } else {
        lives.into_iter().cloned().collect()
    };
    gone.extend(
        decide
            .records
            .deleted
            .iter()
            .filter(|id| !withheld.contains(id) && !untold.contains(id))
            .map(|id| (*id).clone()),
    );
    gone.sort();
    gone.dedup();
    plan.deleted = gone;
    let world = World {
        before: &before,
        after: out.committed(),
        withheld: &withheld,
        untold: &untold,
        covers: &covers,
        tombstones,
        deleted: &plan.deleted,
        failed: &plan.failed,
        emit_changed: settings.emit_changed,
    };
    let (reread, settling) = reread(&world, hints, unsettled, settings);
    (plan.reread, plan.settling) = (reread, settling);
    plan
}

/// What decides each pod's plan: the runtime's records and the hints, the same for every pod
/// of a reading.
struct Decide<'a> {
    records: Records<'a>,
    hints: &'a Hints,
    /// Other triggers' hints about what was read ([`reconcile`]'s `queued`).
    queued: &'a Hints,
    read_at: SystemTime,
    settings: Settings,
}

impl Decide<'_> {
    /// Pod `uid`'s plan from its reading (`None`: unread), its events put in `events`, or
    /// `None` when nothing is to be done. A reading unchanged is still written to the cache
    /// (fresher, and after a restart the first); nothing else unchanged is.
    fn pod<'e>(
        &self,
        committed: &Committed,
        uid: PodUid,
        reading: Option<PodReading>,
        events: &'e mut Vec<PodLifecycleEvent>,
    ) -> Option<PodPlan<'e>> {
        let old = committed.get(&uid);
        let inspected = reading.as_ref().is_some_and(PodReading::is_read);
        let overtaken = overtaken(reading.as_ref(), &self.records);
        let new = new_pod(old, reading, &self.records)?;
        // Compared only when it decides: at 10,000 inspected pods the old record was a miss.
        if (new.is_none() || !inspected) && new.as_ref() == old {
            return None;
        }
        let mut corrected = Vec::new();
        pod_events(old, new.as_ref(), &overtaken, self, events, &mut corrected);
        let same_containers = old
            .zip(new.as_ref())
            .is_some_and(|(old, new)| old.containers.keys().eq(new.containers.keys()));
        Some(PodPlan {
            uid,
            record: new,
            same_containers,
            events: events.drain(..),
            corrected,
        })
    }
}

impl Decide<'_> {
    /// The containers no reading ever showed that the runtime deleted (`/containers/delete`)
    /// before any read of it could run: the runtime no longer has it, and by its own word. Its
    /// life is what the runtime's own records tell (`/tasks/start`, `/tasks/exit`): the hints
    /// of a read of it in flight may hold them, so a try of the records alone leaves it to
    /// that read.
    fn unread_lives<'c>(
        &'c self,
        before: &Before<'_>,
        committed: &Committed,
        tombstones: &HashSet<ContainerId>,
    ) -> Vec<&'c ContainerId> {
        // Neither committed before the reading (its plan has told its end), nor now.
        let unread = |id: &ContainerId| {
            before.pod_of(id).is_none()
                && committed.pod_of(id).is_none()
                && !tombstones.contains(id)
        };
        let mut lives: Vec<&ContainerId> = self
            .records
            .deleted
            .iter()
            .copied()
            .filter(|id| unread(id))
            .collect();
        lives.sort();
        lives
    }

    /// The exit the task service recorded of `id`, if any.
    fn exit(&self, id: &ContainerId) -> Option<TaskRecord> {
        self.records
            .tasks
            .get(id)
            .copied()
            .filter(|r| matches!(r, TaskRecord::Exited { .. }))
    }

    /// The events of the [`Self::unread_lives`] `lives`, put in `events`: each transition the
    /// runtime's records say, in order, confirmed by the task service (the removal by the
    /// deletion). Its pod is the one its cgroup's path names, when the kernel's probes saw it,
    /// else none (an empty uid); its name, none.
    fn tell_unread(
        &self,
        lives: &[&ContainerId],
        committed: &Committed,
        events: &mut Vec<PodLifecycleEvent>,
    ) {
        for &id in lives {
            let started = self.records.started.get(id).copied();
            let exited = self.exit(id);
            // Created and deleted without a start: no event, as for kubelet.
            if started.is_none() && exited.is_none() {
                continue;
            }
            let unread = ContainerRecord {
                id: id.clone(),
                name: String::new(),
                attempt: 0,
                image: String::new(),
                state: ContainerState::Created,
                sandbox: false,
                created_at: None,
                started_at: None,
                finished_at: None,
                exit_code: None,
                reason: String::new(),
                confirmed_by: Store::Task,
                oom_killed_by: BTreeSet::new(),
                oom_kill: None,
                host: None,
            };
            let told = |task: Option<TaskRecord>| {
                let mut record = merge(None, Some(unread.clone()), task, self.records.witness)?;
                self.records.teach(id, &mut record);
                Some(record)
            };
            let ran = started.and_then(|started| told(Some(started)));
            let last = exited.and_then(|exited| told(Some(exited)));
            let pod = self.records.pod_of_unread(id, committed);
            let mut way: SmallVec<[Option<&ContainerRecord>; 4]> = SmallVec::new();
            way.push(None);
            way.extend(ran.as_ref().map(Some));
            way.extend(last.as_ref().map(Some));
            way.push(None);
            for step in way.windows(2) {
                let (from, to) = (step[0], step[1]);
                let Some(record) = to.or(from) else {
                    continue;
                };
                for &event_type in transition(from.map(|c| c.state), to.map(|c| c.state)) {
                    let change = Change {
                        pod: &pod,
                        event_type,
                        record,
                    };
                    events.push(event(change, self.hints, self.read_at));
                }
            }
        }
    }
}

/// The containers a plan leaves in a state only the task service confirmed, and that were
/// not so before it (those that were have their settling read queued already, or gave up on
/// it: another container's change must not start it over).
fn newly_unsettled(old: Option<&PodRecord>, new: Option<&PodRecord>) -> Vec<ContainerId> {
    let Some(new) = new else {
        return Vec::new();
    };
    new.containers
        .values()
        .filter(|c| c.awaits_cri())
        .filter(|c| old.and_then(|old| old.containers.get(&c.id)) != Some(*c))
        .map(|c| c.id.clone())
        .collect()
}

/// The containers of `old` that `new` no longer holds.
fn removed(old: Option<&PodRecord>, new: Option<&PodRecord>) -> Vec<ContainerId> {
    let kept = |id: &ContainerId| new.is_some_and(|new| new.containers.contains_key(id));
    old.into_iter()
        .flat_map(|old| old.containers.keys())
        .filter(|id| !kept(id))
        .cloned()
        .collect()
}

/// The containers a pod's reading shows.
fn shown(reading: Option<&PodReading>) -> impl Iterator<Item = &ContainerId> {
    reading
        .and_then(PodReading::record)
        .into_iter()
        .flat_map(|pod| pod.containers.keys())
}

fn is_unsettled(container: Option<&ContainerRecord>) -> bool {
    container.is_some_and(ContainerRecord::awaits_cri)
}

/// The pods the hinted containers were committed in before the reading. Each pod's plan is
/// committed as it is decided; whether a container was known, or in the pod read, is a
/// question about before.
struct Before<'h>(HashMap<&'h ContainerId, PodUid>);

impl<'h> Before<'h> {
    fn of(committed: &Committed, hints: &'h Hints) -> Self {
        let targets = hints.iter().filter_map(|(target, _)| match target {
            Scope::Container(id) => Some(id),
            Scope::Pod(_) | Scope::Node => None,
        });
        let named = targets.chain(hints.observations().map(|(id, _)| id));
        Self(
            named
                .filter_map(|id| Some((id, committed.pod_of(id)?.clone())))
                .collect(),
        )
    }

    fn pod_of(&self, id: &ContainerId) -> Option<&PodUid> {
        self.0.get(id)
    }
}

/// The runtime records a relist takes: the task records (those the hints carry, and those
/// read), the starts the task service recorded, and the containers the runtime deleted (none
/// when confirming at the CRI store, which takes none of them); and what the hints taught of
/// containers beyond their state.
struct Records<'a> {
    tasks: TaskRecords,
    started: TaskRecords,
    deleted: HashSet<&'a ContainerId>,
    /// Deleted by containerd's word, whose stream brings a container's `/tasks/start` and
    /// `/tasks/exit` ahead of its `/containers/delete`: a life without them had neither. CRI's
    /// events carry no such record: a deletion only they told leaves the life untold.
    closed: HashSet<&'a ContainerId>,
    tombstones: &'a HashSet<ContainerId>,
    learned: HashMap<&'a ContainerId, Learned>,
    /// Whose word on an OOM kill decides a death's reason.
    witness: OomWitness,
}

/// What the hints taught of a container beyond its state ([`learn`]).
#[derive(Debug, Default)]
struct Learned {
    oom_killed_by: BTreeSet<Source>,
    oom_kill: Option<Arc<OomKill>>,
    host: Option<HostIdentity>,
    /// The pod its cgroup's path names: who it is when no reading ever showed it.
    pod: Option<PodUid>,
}

impl Learned {
    /// What `observation` teaches, laid over what was learned before.
    fn take(&mut self, observation: &Observation) {
        let host = match &observation.kind {
            ObservationKind::OomKilled => {
                self.oom_killed_by.insert(observation.source);
                return;
            }
            ObservationKind::OomKill(kill) => {
                self.oom_kill = Some(Arc::clone(kill));
                return;
            }
            ObservationKind::Identity(identity) => {
                if self.pod.is_none() {
                    self.pod.clone_from(&identity.pod);
                }
                HostIdentity {
                    cgroup_id: Some(identity.cgroup_id),
                    cgroup_path: Some(identity.cgroup_path.to_string()),
                    init_pid: identity.init_pid,
                }
            }
            &ObservationKind::TaskStarted { pid, .. } if pid != 0 => HostIdentity {
                init_pid: Some(pid),
                ..HostIdentity::default()
            },
            _ => return,
        };
        self.host = Some(match &self.host {
            Some(known) => known.updated(&host),
            None => host,
        });
    }
}

impl<'a> Records<'a> {
    /// `read`: the task statuses the reading read.
    fn of(
        hints: &'a Hints,
        queued: &'a Hints,
        read: TaskRecords,
        tombstones: &'a HashSet<ContainerId>,
        settings: Settings,
    ) -> Self {
        let mut records = Self {
            tasks: TaskRecords::new(),
            started: TaskRecords::new(),
            deleted: HashSet::new(),
            closed: HashSet::new(),
            tombstones,
            learned: HashMap::new(),
            witness: settings.oom_witness,
        };
        // The queued hints too: an OOM kill waiting in the kernel's grace is the reason of
        // the exit the runtime's own event answers now. The batch's own last: theirs stands.
        for (id, observation) in queued.observations().chain(hints.observations()) {
            if matches!(
                observation.kind,
                ObservationKind::OomKilled
                    | ObservationKind::OomKill(_)
                    | ObservationKind::Identity(_)
                    | ObservationKind::TaskStarted { .. }
            ) {
                records.learned.entry(id).or_default().take(observation);
            }
        }
        if settings.confirm != Store::Task {
            return records;
        }
        records.tasks = read;
        for (id, record) in hints.task_records() {
            // An exit outranks a start, whichever was read and whichever carried.
            if !matches!(records.tasks.get(&id), Some(TaskRecord::Exited { .. })) {
                records.tasks.insert(id, record);
            }
        }
        for (id, observation) in hints.observations() {
            if observation.kind == ObservationKind::Deleted {
                records.deleted.insert(id);
                if observation.source == Source::Containerd {
                    records.closed.insert(id);
                }
            }
        }
        // The batch's own hints last: theirs stands where both carry one.
        records.started = queued
            .observations()
            .chain(hints.observations())
            .filter(|(_, observation)| {
                matches!(observation.kind, ObservationKind::TaskStarted { .. })
            })
            .filter_map(|(id, observation)| Some((id.clone(), observation.kind.task_record()?)))
            .collect();
        records
    }

    /// The pod of a container no reading showed: the one its cgroup names (the committed
    /// pod of that uid, for its name), else none.
    fn pod_of_unread(&self, id: &ContainerId, committed: &Committed) -> PodRecord {
        let uid = self.learned.get(id).and_then(|learned| learned.pod.clone());
        match uid {
            Some(uid) => committed
                .get(&uid)
                .map_or_else(|| PodRecord::known_as(uid), PodRecord::identity),
            None => PodRecord::known_as(PodUid(String::new())),
        }
    }

    /// Those of `lives` (deleted unread) still to be told: no record of their start or exit
    /// came, nor containerd's word of their deletion (behind which those would have).
    fn lives_untold(&self, lives: &[&ContainerId]) -> Vec<ContainerId> {
        lives
            .iter()
            .filter(|id| {
                !self.closed.contains(*id)
                    && !self.started.contains_key(*id)
                    && !matches!(self.tasks.get(*id), Some(TaskRecord::Exited { .. }))
            })
            .map(|id| (*id).clone())
            .collect()
    }

    fn is_deleted(&self, id: &ContainerId) -> bool {
        self.deleted.contains(id) || self.tombstones.contains(id)
    }

    /// Whether a record of the runtime's, or something learned, speaks of `id` (so its pod is
    /// reconciled unread).
    fn speak_of(&self, id: &ContainerId) -> bool {
        self.tasks.contains_key(id) || self.deleted.contains(id) || self.learned.contains_key(id)
    }

    /// Lays what was learned of `id` over its record.
    fn teach(&self, id: &ContainerId, record: &mut ContainerRecord) {
        if let Some(learned) = self.learned.get(id) {
            learn(
                record,
                &learned.oom_killed_by,
                learned.oom_kill.as_ref(),
                learned.host.as_ref(),
                self.witness,
            );
        }
    }
}

/// The pods to reconcile, ascending: those read, and those of committed containers a runtime
/// record speaks of (unread: as committed).
fn considered(
    committed: &Committed,
    read: Vec<(PodUid, PodReading)>,
    records: &Records<'_>,
) -> Vec<(PodUid, Option<PodReading>)> {
    let mut spoken: Vec<&PodUid> = records
        .tasks
        .keys()
        .chain(records.deleted.iter().copied())
        .chain(records.learned.keys().copied())
        .filter_map(|id| committed.pod_of(id))
        .collect();
    spoken.sort();
    spoken.dedup();
    let unread: Vec<_> = spoken
        .into_iter()
        .filter(|uid| read.binary_search_by(|(read, _)| read.cmp(uid)).is_err())
        .map(|uid| (uid.clone(), None))
        .collect();
    let mut pods: Vec<(PodUid, Option<PodReading>)> = read
        .into_iter()
        .map(|(uid, pod)| (uid, Some(pod)))
        .collect();
    // Two ascending runs: the stable sort merges them. Most relists have no unread pod, and a
    // full one of 10,000 pods would compare them all for nothing.
    if !unread.is_empty() {
        pods.extend(unread);
        pods.sort_by(|a, b| a.0.cmp(&b.0));
    }
    pods
}

/// The pod's new record (`Some(None)`: gone), or `None` when there is nothing to reconcile (a
/// pod listed as committed that no record speaks of, or one never committed and not read).
/// What the reading holds is moved into the record, not copied: at 10,000 changed pods each
/// copy of a string read it out of memory the caches no longer held, and each was freed with
/// the reading, out of the caches again.
fn new_pod(
    old: Option<&PodRecord>,
    reading: Option<PodReading>,
    records: &Records<'_>,
) -> Option<Option<PodRecord>> {
    let (mut pod, shown) = match reading {
        Some(PodReading::Inspected(pod)) => (pod, Shown::Pod),
        Some(PodReading::Containers { pod, gone }) => (pod, Shown::Some { gone }),
        Some(PodReading::Gone) => return Some(None),
        None => {
            let old = old?;
            if !old.containers.keys().any(|id| records.speak_of(id)) {
                return None;
            }
            (old.identity(), Shown::Nothing)
        }
        Some(PodReading::Failed) => return None,
    };
    // A pod's labels and annotations are its sandbox's: a reading without the sandbox (its
    // containers read by id) keeps the ones committed.
    if let Some(old) = old {
        if pod.labels.is_empty() {
            pod.labels.clone_from(&old.labels);
        }
        if pod.annotations.is_empty() {
            pod.annotations.clone_from(&old.annotations);
        }
    }
    let found = std::mem::take(&mut pod.containers);
    let committed = old.into_iter().flat_map(|p| p.containers.iter());
    let task = |id: &ContainerId| (!records.is_deleted(id)).then(|| records.tasks.get(id).copied());
    pod.containers = side_by_side(committed, found)
        .filter_map(|sides| match sides {
            (old, Some((id, found))) => {
                let task = task(&id)?;
                let mut record = merge(old.map(|(_, c)| c), Some(found), task, records.witness)?;
                records.teach(&id, &mut record);
                Some((id, record))
            }
            (Some((id, old)), None) => {
                let task = task(id)?;
                if shown.absent(id) {
                    return None;
                }
                let mut record = merge(Some(old), None, task, records.witness)?;
                records.teach(id, &mut record);
                Some((id.clone(), record))
            }
            (None, None) => None,
        })
        .collect();
    Some((!pod.containers.is_empty()).then_some(pod))
}

/// What a reading showed of a pod's containers, beside those it found.
enum Shown {
    /// Nothing: the pod was not read.
    Nothing,
    /// The whole pod, every container: one it did not find is gone.
    Pod,
    /// Some containers, each read by its id: `gone` those the runtime no longer has.
    Some { gone: Vec<ContainerId> },
}

impl Shown {
    /// Whether it showed that `id`, which it did not find, is gone.
    fn absent(&self, id: &ContainerId) -> bool {
        match self {
            Self::Nothing => false,
            Self::Pod => true,
            Self::Some { gone } => gone.contains(id),
        }
    }
}

/// The records a reading showed running that an exit the task service recorded overtakes:
/// the start the runtime showed, told before the death. Its own record (containerd's
/// `/tasks/start`) can come after both: a kernel hint past its grace is read while the
/// runtime's events lag, and a start that then comes finds the container exited. Looked up
/// from the exits, a few at most: a full relist's pods are not walked again for them.
fn overtaken(reading: Option<&PodReading>, records: &Records<'_>) -> Vec<ContainerRecord> {
    let Some(pod) = reading.and_then(PodReading::record) else {
        return Vec::new();
    };
    records
        .tasks
        .iter()
        .filter(|(_, task)| matches!(task, TaskRecord::Exited { .. }))
        .filter_map(|(id, _)| pod.containers.get(id))
        .filter(|c| c.state == ContainerState::Running)
        .cloned()
        .collect()
}

/// The events of a pod that went from `old` to `new`, by container id, put in `events`; the
/// reasons the CRI store corrected, in `corrected`. `overtaken`: the records the reading
/// showed running that a recorded exit overtook ([`overtaken`]).
fn pod_events<'a>(
    old: Option<&'a PodRecord>,
    new: Option<&'a PodRecord>,
    overtaken: &[ContainerRecord],
    decide: &Decide<'_>,
    events: &mut Vec<PodLifecycleEvent>,
    corrected: &mut Vec<Correction>,
) {
    let Some(pod) = new.or(old) else {
        return;
    };
    let containers = |p: Option<&'a PodRecord>| p.into_iter().flat_map(|p| p.containers.iter());
    for sides in side_by_side(containers(old), containers(new)) {
        let (id, before, after) = match sides {
            (Some((id, before)), after) => (id, Some(before), after.map(|(_, c)| c)),
            (None, Some((id, after))) => (id, None, Some(after)),
            (None, None) => continue,
        };
        correct_reason(pod, before, after, decide, events, corrected);
        let shown_running = overtaken.iter().find(|c| &c.id == id);
        container_events(pod, (id, before, after), shown_running, decide, events);
    }
}

/// A death's reason told from the task service's record, which the CRI store shows
/// otherwise, or which containerd's later `/tasks/oom` changes ([`Correction::of`]): the
/// consumer is told by a ContainerChanged carrying the new reason (whatever `emit_changed`
/// says: that governs news of created containers), so its pod is synced too.
fn correct_reason(
    pod: &PodRecord,
    before: Option<&ContainerRecord>,
    after: Option<&ContainerRecord>,
    decide: &Decide<'_>,
    events: &mut Vec<PodLifecycleEvent>,
    corrected: &mut Vec<Correction>,
) {
    let Some((correction, shown)) = before
        .zip(after)
        .and_then(|(told, shown)| Correction::of(told, shown).map(|c| (c, shown)))
    else {
        return;
    };
    corrected.push(correction);
    events.push(event(
        Change {
            pod,
            event_type: PodLifecycleEventType::ContainerChanged,
            record: shown,
        },
        decide.hints,
        decide.read_at,
    ));
}

/// The lifecycle events of one container of `pod` that went from `before` to `after`, put in
/// `events`, each step of the way it took. `shown_running`: the reading showed it running,
/// and a recorded exit overtook that.
fn container_events(
    pod: &PodRecord,
    (id, before, after): (
        &ContainerId,
        Option<&ContainerRecord>,
        Option<&ContainerRecord>,
    ),
    shown_running: Option<&ContainerRecord>,
    decide: &Decide<'_>,
    events: &mut Vec<PodLifecycleEvent>,
) {
    let Decide {
        records,
        hints,
        read_at,
        settings,
        ..
    } = decide;
    // A container gone: its last record, with what the task service recorded of its end.
    let gone = match after {
        Some(_) => None,
        None => merge(
            before,
            None,
            records.tasks.get(id).copied(),
            records.witness,
        )
        .map(|mut last| {
            records.teach(id, &mut last);
            last
        }),
    };
    let Some(last) = after.or(gone.as_ref()) else {
        return;
    };
    let ran = ran_meanwhile(id, before, last, decide, shown_running);
    // Borrowed, not cloned: at every changed pod of a full relist the clones were a
    // handful of allocations per container, unchanged ones included.
    let mut way: SmallVec<[Option<&ContainerRecord>; 4]> = SmallVec::new();
    way.push(before);
    way.extend(ran.as_ref().map(Some));
    way.push(Some(last));
    if after.is_none() {
        way.push(None);
    }
    for step in way.windows(2) {
        let (from, to) = (step[0], step[1]);
        for &event_type in transition(from.map(|c| c.state), to.map(|c| c.state)) {
            if event_type == PodLifecycleEventType::ContainerChanged && !settings.emit_changed {
                continue;
            }
            events.push(event(
                Change {
                    pod,
                    event_type,
                    record: to.unwrap_or(last),
                },
                hints,
                *read_at,
            ));
        }
    }
}

/// The running state a container that exited passed through unseen, when the record before
/// showed it short of running: as the task service recorded its start; else as the reading
/// showed it (`shown_running`) before the exit the task service recorded overtook it; else,
/// while the runtime's events are on their way, as the runtime's record of its start (its
/// `started_at`) says, for a container the hints asked about (a read on CRI's
/// `CONTAINER_CREATED` that found it exited, its `/tasks/start` still on the way; a full
/// relist that found it so while a hint about it waited, whose read would find it told) or
/// any container once the run's baseline is read (a full relist that ran before the records
/// of its life reached plegd), or one that started after the read began (the baseline listed
/// it created, and its `/tasks/start` waited for the baseline's end). Without them, and in
/// the baseline for a container nothing asked about that started before it, kubelet's rule:
/// a container first seen exited has died, nothing more.
fn ran_meanwhile(
    id: &ContainerId,
    before: Option<&ContainerRecord>,
    last: &ContainerRecord,
    decide: &Decide<'_>,
    shown_running: Option<&ContainerRecord>,
) -> Option<ContainerRecord> {
    let short_of_running = before
        .and_then(|c| c.state.progress())
        .is_none_or(|p| p < 1);
    if !short_of_running || last.state != ContainerState::Exited {
        return None;
    }
    if let Some(&started) = decide.records.started.get(id) {
        return Some(while_running(last, Some(started)));
    }
    if let Some(shown) = shown_running {
        return Some(shown.clone());
    }
    let asked = || {
        decide
            .hints
            .iter()
            .chain(decide.queued.iter())
            .any(|(target, hint)| containers_of(target, hint).any(|c| c == id))
    };
    // Started after the read began (a baseline listed it created): its start is this run's.
    let started_while_read = last.started_at.is_some_and(|at| at >= decide.read_at);
    let told_whole = decide.settings.baseline_read || started_while_read || asked();
    (decide.settings.runtime_events && last.started_at.is_some() && told_whole).then(|| {
        ContainerRecord {
            confirmed_by: last.confirmed_by,
            ..while_running(last, None)
        }
    })
}

/// The hints the result does not reflect, and the containers awaiting the CRI store.
/// `unsettled`: the containers the plans left in a state only the task service confirmed.
fn reread(
    world: &World<'_>,
    hints: &Hints,
    unsettled: Vec<ContainerId>,
    settings: Settings,
) -> (Vec<Reread>, Vec<ContainerId>) {
    let mut reread = Vec::new();
    let mut looked_at: Vec<&ContainerId> = Vec::new();
    for (target, hint) in hints.iter() {
        let why = if world.failed(target, hint) {
            Some(Why::Failed)
        } else if !world.reflects(target, hint) {
            Some(Why::Unreflected)
        } else {
            None
        };
        match why {
            Some(Why::Unreflected) => reread.push(Reread {
                scope: target.clone(),
                hint: world.unreflected(target, hint),
                why: Why::Unreflected,
            }),
            Some(why) => reread.push(Reread {
                scope: target.clone(),
                hint: hint.clone(),
                why,
            }),
            None => looked_at.extend(containers_of(target, hint)),
        }
    }
    if settings.confirm != Store::Task {
        return (reread, Vec::new());
    }
    let mut pending: Vec<&ContainerId> = reread
        .iter()
        .flat_map(|r| containers_of(&r.scope, &r.hint))
        .collect();
    pending.sort();
    // Those the plans left so, and those of the hints reflected as committed before.
    let looked_at = looked_at
        .into_iter()
        .filter(|id| is_unsettled(world.after.container(id)))
        .cloned();
    let mut settling: Vec<ContainerId> = unsettled
        .into_iter()
        .chain(looked_at)
        .filter(|id| pending.binary_search(&id).is_err())
        .collect();
    settling.sort();
    settling.dedup();
    (reread, settling)
}

/// The containers a hint is about: its target's, and its observations'.
fn containers_of<'h>(target: &'h Scope, hint: &'h Hint) -> impl Iterator<Item = &'h ContainerId> {
    let own = match target {
        Scope::Container(id) => Some(id),
        Scope::Pod(_) | Scope::Node => None,
    };
    own.into_iter()
        .chain(hint.observations.iter().map(|(id, _)| id))
}

/// The node after a reconcile, as far as the hints ask about it.
struct World<'a> {
    before: &'a Before<'a>,
    /// Containers whose life the runtime's records tell, not told yet: nothing about them is
    /// answered.
    withheld: &'a [ContainerId],
    /// Containers deleted unread whose life no record told yet ([`Records::lives_untold`]):
    /// gone, though not recorded deleted.
    untold: &'a [ContainerId],
    /// The records with every pod's plan committed.
    after: &'a Committed,
    /// Where the reading can say a container is absent.
    covers: &'a Covers,
    tombstones: &'a HashSet<ContainerId>,
    /// Containers the runtime recorded deleted ([`Plan::deleted`]).
    deleted: &'a [ContainerId],
    /// Pods whose inspection failed ([`Plan::failed`]).
    failed: &'a [PodUid],
    /// Created containers are news (`ContainerChanged`): a container's presence is worth a
    /// reading only then.
    emit_changed: bool,
}

impl World<'_> {
    /// A container's pod and state after the plan.
    fn find(&self, id: &ContainerId) -> Option<(&PodUid, ContainerState)> {
        let uid = self.after.pod_of(id)?;
        Some((uid, self.after.container(id)?.state))
    }

    fn pod_of_target<'t>(&'t self, target: &'t Scope) -> Option<&'t PodUid> {
        match target {
            Scope::Pod(uid) => Some(uid),
            Scope::Container(id) => self.find(id).map(|(uid, _)| uid),
            Scope::Node => None,
        }
    }

    /// Whether the reading can say `id` is absent.
    fn covers(&self, id: &ContainerId) -> bool {
        match &self.covers {
            Covers::Nothing => false,
            Covers::Node => true,
            Covers::Pod(uid) => {
                self.before.pod_of(id) == Some(uid) || self.find(id).is_some_and(|(p, _)| p == uid)
            }
            Covers::Containers(read) => read.contains(id),
        }
    }

    fn covers_target(&self, target: &Scope) -> bool {
        match (target, &self.covers) {
            (_, Covers::Nothing) => false,
            (_, Covers::Node) => true,
            (Scope::Pod(uid), Covers::Pod(read)) => uid == read,
            (Scope::Pod(_), Covers::Containers(_)) | (Scope::Node, _) => false,
            (Scope::Container(id), _) => self.covers(id),
        }
    }

    /// Whether the pod of a hint's target or of one of its containers failed inspection.
    fn failed(&self, target: &Scope, hint: &Hint) -> bool {
        let failed = |uid: Option<&PodUid>| uid.is_some_and(|uid| self.failed.contains(uid));
        failed(self.pod_of_target(target))
            || hint
                .observations
                .iter()
                .any(|(id, _)| failed(self.before.pod_of(id)))
    }

    /// What of `hint` the node does not show yet: a pod's hint gathers the observations of
    /// several containers, and those shown already are not read again.
    fn unreflected(&self, target: &Scope, hint: &Hint) -> Hint {
        let observations: Vec<_> = hint
            .observations
            .iter()
            .filter(|(id, observation)| !self.shows(id, observation.kind.says()))
            .cloned()
            .collect();
        // A trigger without observations is a source's too.
        let sources = if hint.unspecific {
            hint.sources.clone()
        } else {
            observations.iter().map(|(_, o)| o.source).collect()
        };
        Hint {
            sources,
            observed_at: hint.observed_at,
            observations,
            unspecific: hint.unspecific && !self.covers_target(target),
        }
    }

    /// Whether the node shows what `hint`'s sources saw.
    fn reflects(&self, target: &Scope, hint: &Hint) -> bool {
        (!hint.unspecific || self.covers_target(target))
            && hint
                .observations
                .iter()
                .all(|(id, observation)| self.shows(id, observation.kind.says()))
    }

    /// Whether the node shows that `id` did what `says`.
    fn shows(&self, id: &ContainerId, says: Says) -> bool {
        if self.withheld.contains(id) {
            return false;
        }
        let state = self.find(id).map(|(_, state)| state);
        let known = self.before.pod_of(id).is_some();
        let deleted =
            self.tombstones.contains(id) || self.deleted.contains(id) || self.untold.contains(id);
        // Not there now, and it was there before (or the runtime said it deleted it): gone,
        // and nothing more will come of what was seen of it.
        let gone = state.is_none() && (deleted || (known && self.covers(id)));
        match says {
            // A container created and not started yet makes no event: it is read with its
            // start (or by the next full relist), not for its presence alone. When its
            // ContainerChanged is to be sent, a reading that did not find it (containerd
            // publishes /containers/create before its CRI store holds the container) is
            // followed by another, unless the runtime said it deleted it.
            Says::Present => !self.emit_changed || known || state.is_some() || deleted,
            Says::Started => {
                gone || matches!(
                    state,
                    Some(ContainerState::Running | ContainerState::Exited)
                )
            }
            // The OOM kill of a process is news of the container's reason, not of its state
            // (the init may live on): shown once its record holds it.
            Says::OomKill => {
                gone || self.after.container(id).is_some_and(|record| {
                    record.oom_killed() || record.state == ContainerState::Exited
                })
            }
            Says::Died => {
                gone || matches!(
                    state,
                    Some(ContainerState::Exited | ContainerState::Unknown)
                )
            }
            Says::Deleted => state.is_none() && (deleted || self.covers(id)),
        }
    }
}

/// What a targeted relist of a pod reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToRead {
    /// The whole pod (a listing of it and the statuses of what moved on).
    Pod,
    /// These containers, each by its id.
    Containers(Vec<ContainerId>),
}

/// What a targeted relist of a pod reads: the containers its hints name, each by its id; the
/// pod whole when a hint names none (it said only that something in the pod changed). With no
/// hint at all (a settling read, for the CRI store's status and reason), the containers of
/// `committed` that await the CRI store ([`ContainerRecord::awaits_cri`]).
pub fn what_to_read(committed: Option<&PodRecord>, hints: &Hints) -> ToRead {
    if hints.is_empty() {
        let unsettled = committed.into_iter().flat_map(|pod| {
            pod.containers
                .values()
                .filter(|c| c.awaits_cri())
                .map(|c| c.id.clone())
        });
        return ToRead::Containers(unsettled.collect());
    }
    if hints.iter().any(|(_, hint)| hint.unspecific) {
        return ToRead::Pod;
    }
    let mut ids: Vec<ContainerId> = hints.observations().map(|(id, _)| id.clone()).collect();
    ids.sort();
    ids.dedup();
    ToRead::Containers(ids)
}

/// Whether a full relist must inspect a pod it listed as well as committed: its containers
/// changed, or one of them moved on (or its CRI store caught up with what the task service
/// confirmed), or one awaits the CRI store's reason.
/// Containers the runtime recorded deleted are not looked at.
pub fn inspection_needed(
    committed: &PodRecord,
    listed: &PodRecord,
    tombstones: &HashSet<ContainerId>,
) -> bool {
    // One walk over both, ascending: each id compared once (at 10,000 pods every compare of
    // two ids is two cache misses).
    let mut listed = listed
        .containers
        .values()
        .filter(|c| !tombstones.contains(&c.id));
    let mut committed = committed.containers.values();
    loop {
        match (committed.next(), listed.next()) {
            (None, None) => return false,
            (Some(old), Some(shown)) if old.id == shown.id => {
                if moves_on(old, shown) || old.awaits_cri() {
                    return true;
                }
            }
            _ => return true,
        }
    }
}

/// What the task service is asked of a container's init ([`tasks_to_read`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaskAsk {
    /// Whether it started: its status.
    Start,
    /// Its exit, waited for: the task service answers it the moment the shim reaps the init,
    /// where a status call made then waits out the runtime's cleanup.
    Exit,
}

/// The containers whose task the task service is worth asking about: a kernel hint says their
/// init started or died, `state` (what the runtime shows now) does not show it, and no record
/// of the runtime's said it. An exit outranks a start.
pub fn tasks_to_read(
    hints: &Hints,
    state: impl Fn(&ContainerId) -> Option<ContainerState>,
) -> Vec<(ContainerId, TaskAsk)> {
    let carried = hints.task_records();
    let mut asks: Vec<(ContainerId, TaskAsk)> = hints
        .observations()
        .filter(|(id, observation)| {
            !observation.kind.is_runtime_record() && !carried.contains_key(id)
        })
        .filter_map(|(id, observation)| {
            let ask = match (observation.kind.says(), state(id)?) {
                (Says::Died, ContainerState::Created | ContainerState::Running) => TaskAsk::Exit,
                (Says::Started, ContainerState::Created) => TaskAsk::Start,
                _ => return None,
            };
            Some((id.clone(), ask))
        })
        .collect();
    // The exit last of each container's: it stands.
    asks.sort();
    asks.reverse();
    asks.dedup_by(|a, b| a.0 == b.0);
    asks.reverse();
    asks
}

#[cfg(test)]
mod tests;
