//! The relist: read the runtime, reconcile, carry the plan out (kubelet's `GenericPLEG.Relist`,
//! as read, decide, act).
//!
//! [`Relister::relist`] first reconciles the hints against what it committed, without reading
//! anything: the runtime's own records that triggers carry (containerd's `/tasks/exit`,
//! `/tasks/start`, `/containers/delete`) often answer them in full. Only what is left is read:
//! a targeted relist reads the containers the hints left name, each by its id (one status call
//! each; [`what_to_read`] decides), or its pod whole when a hint names none; a full relist lists
//! the node and inspects the pods whose listing moved on. The reading goes through
//! [`reconcile`] once more, and each pod's plan is carried out as it is decided (`Publisher`):
//! the cache written, the events published, the record committed; for a full relist the
//! cache's timestamp is raised last. New features belong in the sources, the scheduler or
//! `reconcile`, not here.

use std::{
    cmp::Ordering,
    collections::{BTreeSet, HashMap, HashSet, VecDeque},
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::time::Instant;
use tracing::{debug, info, trace, warn};

use crate::pleg::{
    decide::{
        committed::{Committed, PodKey},
        hints::Hints,
        provenance,
        reconcile::{
            Act, Covers, FollowUp, PodPlan, PodReading, Reading, Reread, Settings, TaskAsk, ToRead,
            fresh, inspection_needed, reconcile, tasks_to_read, unanswered, what_to_read,
        },
    },
    driver::sink::EventSink,
    model::{
        event::{PodLifecycleEvent, PodLifecycleEventType},
        record::{ContainerId, ContainerState, OomWitness, PodRecord, PodRecords, PodUid, Store},
        runtime::{ExitWatch, Runtime, RuntimeError},
        source::Source,
        trigger::{Observation, ObservationKind, Scope, Trigger},
    },
    shared::{cache::PodCache, health::Health},
};

mod read;

use read::{Found, Step};
pub use read::{ReadDone, ReadJob, TASK_EXIT_WAIT};

/// Default number of pod inspections in flight at once.
pub const DEFAULT_INSPECT_CONCURRENCY: usize = 8;

/// How long a relist waits for one task status before retrying later, while the runtime's
/// event stream is connected: the shim holds the task's lock through its cleanup after an
/// exit (`runc kill`, `runc delete`), and a status call issued then waits for all of it,
/// holding up the relist that containerd's own `/tasks/exit`, a millisecond later, asks for.
pub const TASK_STATUS_DEADLINE: Duration = Duration::from_millis(3);

/// The same wait while no runtime event stream is connected (eBPF-only mode, or the stream
/// down): no `/tasks/exit` will come, and a status missed is a death the CRI store confirms
/// some 50 to 110 ms after the exit. The shim's cleanup takes 10-20 ms; this outlasts it.
pub const TASK_STATUS_DEADLINE_ALONE: Duration = Duration::from_millis(25);

/// How long an ask of a container's task that missed its deadline (its start's status, its exit's
/// `Wait`) is not made again; the other ask of the same task still is.
/// Under churn the kernel hint's retries and every relist carrying it would ask again and
/// again, each call more work for a shim already busy. The CRI store, or the runtime's own
/// event, tells meanwhile.
pub const TASK_BUSY_BACKOFF: Duration = Duration::from_secs(1);

/// How long the relist before a stop reads again what it did not reflect: the CRI store shows
/// an exit some 40 to 200 ms after the kernel and containerd saw it (a few hundred under load).
pub const STOP_CONFIRM: Duration = Duration::from_secs(1);

/// How long the relist before saving may take at shutdown: with the consumers' drain after it,
/// plegd exits within 5 s of SIGTERM.
const LAST_RELIST_GRACE: Duration = Duration::from_secs(2);

/// The wait between those readings.
const STOP_RETRY: Duration = Duration::from_millis(20);

/// How long a container the runtime recorded deleted is kept from coming back: containerd
/// publishes `/containers/delete` a moment before its CRI store forgets the container, and a
/// listing taken in between (or a slow one taken before) still shows it.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(30);

/// Relist settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelistConfig {
    /// Pod inspections in flight at once (at least one).
    pub inspect_concurrency: usize,
    /// Send `ContainerChanged` events; kubelet computes but never sends them.
    pub emit_changed: bool,
    /// The runtime record that confirms a start, an exit or a removal (see
    /// [`crate::pleg::decide::merge`]).
    pub confirm: Store,
    /// Whose word on an OOM kill decides the reason of a death the task service confirmed:
    /// containerd's own where its event stream reaches plegd.
    pub oom_witness: OomWitness,
}

impl Default for RelistConfig {
    fn default() -> Self {
        Self {
            inspect_concurrency: DEFAULT_INSPECT_CONCURRENCY,
            emit_changed: false,
            confirm: Store::Task,
            oom_witness: OomWitness::Any,
        }
    }
}

/// A relist that could not complete.
#[derive(Debug, thiserror::Error)]
pub enum RelistError {
    #[error("listing pods: {0}")]
    List(#[from] RuntimeError),
}

/// What a relist read of the runtime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Read {
    /// Nothing: the runtime's records the triggers carried answered every hint.
    #[default]
    Nothing,
    /// One pod, or the pod of one container.
    Targeted,
    /// The whole node (a full relist).
    Node,
}

/// What a relist did, for the driver's next decisions and for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelistOutcome {
    pub events_sent: usize,
    /// Pods whose inspection failed; they are inspected again.
    pub failed_inspections: usize,
    /// What to read again, and why.
    pub reread: Vec<Reread>,
    /// Containers to read once more when the CRI store has caught up with the task service.
    pub settling: Vec<ContainerId>,
    /// Containers whose status was read (found or gone), whatever it showed.
    pub read_containers: Vec<ContainerId>,
    pub read: Read,
}

/// Owns the committed records and turns each reading into events.
pub struct Relister<R> {
    runtime: Arc<R>,
    cache: Arc<PodCache>,
    health: Arc<Health>,
    sink: Arc<dyn EventSink>,
    config: RelistConfig,
    committed: Committed,
    /// Pods whose last inspection failed (kubelet's `podsToReinspect`): a full relist inspects
    /// them whatever their listing shows.
    to_reinspect: BTreeSet<PodUid>,
    /// Whether the runtime's own task events are on their way ([`Self::set_runtime_events`]).
    runtime_events: bool,
    /// Whether the run's first full relist, its baseline, is reconciled.
    baseline_read: bool,
    /// How long a task status is waited for ([`Self::set_runtime_events`]).
    task_deadline: Duration,
    /// Asks of the task service that missed their deadline, until when the same ask of the
    /// same container is not made again: a start's status that missed (a shim busy starting)
    /// must not keep the exit's `Wait` from being made.
    busy_tasks: HashMap<(ContainerId, TaskAsk), Instant>,
    /// Containers the runtime recorded deleted, and since when.
    tombstones: HashSet<ContainerId>,
    tombstoned_at: VecDeque<(Instant, ContainerId)>,
    sequence: u64,
    /// The exits watched since the last [`Self::take_exit_watches`] whose answers are to be
    /// told as the runtime's records.
    exit_watches: Vec<(ContainerId, ExitWatch)>,
}

/// How a relist began ([`Relister::begin`]).
#[derive(Debug)]
pub enum Begun {
    /// The runtime's records answered every hint: nothing to read.
    Answered(RelistOutcome),
    /// Not all, and it was not to read: what they did, and the hints left.
    Left { outcome: RelistOutcome, left: Hints },
    /// It reads the runtime: run the job, then [`Relister::finish`] it.
    Read(ReadJob),
}

/// How a read ended ([`Relister::finish`]).
#[derive(Debug)]
pub enum Finished {
    Done(Result<RelistOutcome, RelistError>),
    /// The node was listed: the pods that moved on are to be inspected next.
    More(ReadJob),
}

impl<R: Runtime> Relister<R> {
    pub fn new(
        runtime: R,
        cache: Arc<PodCache>,
        health: Arc<Health>,
        sink: Arc<dyn EventSink>,
        config: RelistConfig,
    ) -> Self {
        Self {
            runtime: Arc::new(runtime),
            cache,
            health,
            sink,
            config,
            committed: Committed::default(),
            to_reinspect: BTreeSet::new(),
            runtime_events: false,
            baseline_read: false,
            task_deadline: TASK_STATUS_DEADLINE_ALONE,
            busy_tasks: HashMap::new(),
            tombstones: HashSet::new(),
            tombstoned_at: VecDeque::new(),
            sequence: 0,
            exit_watches: Vec::new(),
        }
    }

    /// Takes in what the kernel saw of a container as its trigger comes: a start told before
    /// its exec reached plegd has its exit watched now ([`Self::watch_started_before_exec`]).
    pub fn kernel_saw(&mut self, trigger: &Trigger) {
        if trigger.source != Source::Ebpf || self.config.confirm != Store::Task {
            return;
        }
        if let Scope::Container(id) = &trigger.scope {
            self.watch_started_before_exec(trigger.observations.iter().map(|o| (id, o)));
        }
    }

    /// The exits watched since the last call whose answers are to be told as the runtime's
    /// records of them, as containerd's `/tasks/exit` is: those of the starts told while the
    /// runtime's events come (see [`Publisher`]).
    pub fn take_exit_watches(&mut self) -> Vec<(ContainerId, ExitWatch)> {
        std::mem::take(&mut self.exit_watches)
    }

    /// The runtime, for the reads that run beside the relister.
    pub fn runtime(&self) -> &Arc<R> {
        &self.runtime
    }

    /// Whether the runtime's own task events are on their way ([`TASK_STATUS_DEADLINE`])
    /// or not ([`TASK_STATUS_DEADLINE_ALONE`]): how long a task status is waited for.
    pub fn set_runtime_events(&mut self, connected: bool) {
        self.runtime_events = connected;
        self.task_deadline = if connected {
            TASK_STATUS_DEADLINE
        } else {
            TASK_STATUS_DEADLINE_ALONE
        };
    }

    /// Continues from records saved by a previous run: the next relists reconcile against
    /// them (so only what changed since is an event), number events after `sequence`, and
    /// inspect every pod again (the cache starts empty).
    pub fn restore(&mut self, records: PodRecords, sequence: u64) {
        for (uid, pod) in records {
            self.to_reinspect.insert(uid.clone());
            self.committed.commit(&uid, Some(Arc::new(pod)), false);
        }
        self.sequence = sequence;
    }

    /// The committed records and the last sequence handed out, to save at shutdown.
    pub fn into_saved(self) -> (PodRecords, u64) {
        (self.committed.into_pods(), self.sequence)
    }

    /// The relist before the reading is saved at a stop: a full relist carrying `pending` (the
    /// hints not relisted yet), then, for up to `confirm`, what it did not reflect read again,
    /// busy tasks asked again too. A death the kernel or containerd saw a moment before the
    /// stop was otherwise saved as running, and by the next start the runtime had forgotten the
    /// container: its ContainerDied had no exit code (soak, fault plegd-term). Returns the hints
    /// still unreflected.
    pub async fn relist_before_stop(
        &mut self,
        pending: &Hints,
        confirm: Duration,
    ) -> Result<Hints, RelistError> {
        let until = Instant::now() + confirm;
        let mut hints = pending.clone();
        loop {
            self.busy_tasks.clear();
            let outcome = self.relist(&Scope::Node, &hints, true).await?;
            hints = unanswered(&outcome.reread);
            // A read may wait for an exit as long as TASK_EXIT_WAIT: the next one must end in time.
            if hints.is_empty() || Instant::now() + STOP_RETRY + TASK_EXIT_WAIT > until {
                return Ok(hints);
            }
            tokio::time::sleep(STOP_RETRY).await;
        }
    }

    /// The pod holding `container`, as last committed.
    #[cfg(test)]
    pub fn pod_of(&self, container: &ContainerId) -> Option<PodUid> {
        self.committed.pod_of(container).cloned()
    }

    /// Relists `scope` at once, start to end; `hints` are the triggers that asked for it.
    /// `required`: the scope must be read even if the runtime's records answer every hint (a
    /// periodic or requested full relist), else only what they leave unanswered is read. The
    /// generator runs the same steps with its reads beside one another.
    pub async fn relist(
        &mut self,
        scope: &Scope,
        hints: &Hints,
        required: bool,
    ) -> Result<RelistOutcome, RelistError> {
        let queued = Hints::default();
        let mut job = match self.begin(scope, hints, &queued, required, true) {
            Begun::Answered(outcome) | Begun::Left { outcome, .. } => return Ok(outcome),
            Begun::Read(job) => job,
        };
        loop {
            let done = job.run(Arc::clone(&self.runtime)).await;
            match self.finish(done, &queued) {
                Finished::Done(result) => return result,
                Finished::More(next) => job = next,
            }
        }
    }

    /// Begins a relist of `scope` on `hints`: decides on what is known first (the committed
    /// records and the runtime's records the hints carry, which often answer them in full),
    /// then plans a read of what is left, if `read` allows. `queued`: the hints still queued
    /// for what it reads, credited with a change none of its own is about
    /// ([`provenance::credit`]).
    pub fn begin(
        &mut self,
        scope: &Scope,
        hints: &Hints,
        queued: &Hints,
        required: bool,
        read: bool,
    ) -> Begun {
        let started = Instant::now();
        let (answered, events_sent) = self.reconcile(
            Reading::none(SystemTime::now()),
            hints,
            queued,
            started,
            read,
        );
        // What the runtime's own records committed stands against a read begun before them: a
        // read still in flight that shows the container running must not take back its
        // /tasks/exit (on the containerd backend, a task record's Running would read as a
        // restart in place: a second ContainerStarted).
        for (id, observation) in hints.observations() {
            if observation.kind.is_runtime_record() {
                self.committed.shown(id, started);
            }
        }
        let left = unanswered(&answered.reread);
        // A settling read (no hint) of a container the runtime removed since: its last record
        // stands, the store has nothing more to tell.
        let removed = matches!(scope, Scope::Container(id) if hints.is_empty() && self.committed.pod_of(id).is_none());
        let outcome = RelistOutcome {
            settling: answered.settling.clone(),
            events_sent,
            ..RelistOutcome::default()
        };
        self.remember(answered);
        if left.is_empty() && (!required || removed) {
            trace!(?hints, "answered by the runtime's records");
            return Begun::Answered(outcome);
        }
        if !read {
            return Begun::Left { outcome, left };
        }
        Begun::Read(self.plan(scope, left, outcome, started))
    }

    /// The read of what `hints` left of `scope`.
    fn plan(
        &mut self,
        scope: &Scope,
        hints: Hints,
        mut outcome: RelistOutcome,
        started: Instant,
    ) -> ReadJob {
        let now = Instant::now();
        self.busy_tasks.retain(|_, until| *until > now);
        let resolved = self.resolve(scope);
        let step = match &resolved {
            Scope::Node => {
                self.health.relist_started(started);
                outcome.read = Read::Node;
                Step::List
            }
            Scope::Pod(uid) => {
                outcome.read = Read::Targeted;
                let committed = &self.committed;
                let tasks =
                    self.tasks_to_read(&hints, |id| committed.container(id).map(|c| c.state));
                let pod = committed.shared(uid);
                // A settling read (no hint) of one container reads that container alone.
                let what = match scope {
                    Scope::Container(id) if hints.is_empty() => {
                        ToRead::Containers(vec![id.clone()])
                    }
                    _ => what_to_read(pod.map(|p| &**p), &hints),
                };
                Step::Pod {
                    uid: uid.clone(),
                    committed: pod.cloned(),
                    what,
                    tasks,
                }
            }
            Scope::Container(id) => {
                outcome.read = Read::Targeted;
                Step::Container {
                    id: id.clone(),
                    busy: self.busy_tasks.keys().cloned().collect(),
                }
            }
        };
        ReadJob {
            scope: resolved,
            hints,
            started,
            read_started: now,
            outcome,
            step,
            task_deadline: self.task_deadline,
            concurrency: self.config.inspect_concurrency,
        }
    }

    /// Ends a read `done` began with [`Self::begin`]: reconciles what it read and acts on it
    /// (cache, events, commit), or, for the node's listing, plans the inspections of the pods
    /// that moved on. `queued`: the hints queued for what it read by now (those that came
    /// while it read, and those of the other reads in flight, included: a change it found may
    /// be one of theirs).
    pub fn finish(&mut self, done: ReadDone, queued: &Hints) -> Finished {
        let ReadDone { mut job, found } = done;
        let full = job.scope == Scope::Node;
        let (reading, busy) = match found {
            Ok(Found::Listed(listed)) => return Finished::More(self.inspections(job, listed)),
            Ok(Found::Read { reading, busy }) => (reading, busy),
            Err(error) => {
                if full {
                    self.health.relist_failed();
                }
                return Finished::Done(Err(error.into()));
            }
        };
        self.note_busy(busy);
        let read_in = job.read_started.elapsed();
        // Other reads ran beside this one: what one begun since showed stands.
        let reading = fresh(reading, &self.committed, job.read_started);
        if !full {
            trace!(shown = %Shown(&reading), "read");
        }
        let pods_read = reading.pods.len();
        let mut outcome = std::mem::take(&mut job.outcome);
        self.note_read(&reading, &mut outcome);
        let (plan, events_sent) =
            self.reconcile(reading, &job.hints, queued, job.read_started, true);
        for id in &outcome.read_containers {
            self.committed.shown(id, job.read_started);
        }
        note_plan(&plan, &mut outcome);
        outcome.events_sent += events_sent;
        self.remember(plan);

        // A full relist vouches for every pod: raise the cache's timestamp last, so waiters
        // released by it find every entry above already written.
        if full {
            self.cache.update_time(job.read_started);
            self.health.relist_succeeded(job.started);
        }
        debug!(
            scope = ?job.scope,
            pods_read,
            events = outcome.events_sent,
            failed_inspections = outcome.failed_inspections,
            reread = outcome.reread.len(),
            elapsed = ?job.started.elapsed(),
            ?read_in,
            "relisted"
        );
        trace!(hints = ?job.hints, reread = ?outcome.reread, "relisted on");
        Finished::Done(Ok(outcome))
    }

    /// The full relist's second step: the node as `listed` against the committed records; the
    /// pods that moved on (or are new, or await reinspection) to inspect, the task statuses
    /// the hints ask for beside.
    fn inspections(&mut self, mut job: ReadJob, mut listed: Vec<PodRecord>) -> ReadJob {
        let read_at = SystemTime::now();
        listed.sort_by(|a, b| a.uid.cmp(&b.uid));
        let committed = &self.committed;
        let state = |id: &ContainerId| {
            listed
                .iter()
                .find_map(|pod| pod.containers.get(id))
                .or_else(|| committed.container(id))
                .map(|c| c.state)
        };
        let tasks = self.tasks_to_read(&job.hints, state);
        let NodeListing {
            pods,
            to_inspect,
            fingerprints,
        } = node_pods(committed, &self.to_reinspect, listed, &self.tombstones);
        let to_inspect = to_inspect
            .into_iter()
            .map(|(at, known, listed)| (at, known.cloned(), listed))
            .collect();
        // A fact about the records as they are, not a decision: a commit of the pod forgets it.
        for (uid, listing) in &fingerprints {
            self.committed.note_listing(uid, *listing);
        }
        job.step = Step::Inspect {
            pods,
            to_inspect,
            tasks,
            read_at,
        };
        job
    }

    /// Notes in `outcome` what a reading read; a pod read is no longer to be inspected again.
    fn note_read(&mut self, reading: &Reading, outcome: &mut RelistOutcome) {
        for (uid, pod) in &reading.pods {
            if *pod != PodReading::Failed {
                self.to_reinspect.remove(uid);
            }
            match pod {
                PodReading::Inspected(pod) => {
                    outcome
                        .read_containers
                        .extend(pod.containers.keys().cloned());
                }
                PodReading::Containers { pod, gone } => {
                    let found = pod.containers.keys();
                    outcome.read_containers.extend(found.chain(gone).cloned());
                }
                PodReading::Gone | PodReading::Failed => {}
            }
        }
    }

    /// Reconciles `reading`, each pod's plan carried out as it is decided ([`Publisher`]).
    /// Returns what is left, and how many events went out. `read_at`: when the runtime was
    /// read (the cache entries are at least this fresh). `unread`: whether containers no
    /// reading showed are told from the runtime's records (not while a read of them is in
    /// flight).
    fn reconcile(
        &mut self,
        reading: Reading,
        hints: &Hints,
        queued: &Hints,
        read_at: Instant,
        unread: bool,
    ) -> (FollowUp, usize) {
        let settings = Settings {
            confirm: self.config.confirm,
            emit_changed: self.config.emit_changed,
            oom_witness: self.config.oom_witness,
            runtime_events: self.runtime_events,
            baseline_read: self.baseline_read,
        };
        let full = reading.covers == Covers::Node;
        let runtime = &*self.runtime;
        let watch_exit = |id: &ContainerId| runtime.watch_exit(id);
        let mut publisher = Publisher {
            committed: &mut self.committed,
            cache: &self.cache,
            sink: &*self.sink,
            sequence: &mut self.sequence,
            queued,
            read_at,
            sent: 0,
            watch_exits: (self.config.confirm == Store::Task).then_some(&watch_exit),
            runtime_events: self.runtime_events,
            exit_watches: &mut self.exit_watches,
        };
        let plan = reconcile(
            &mut publisher,
            reading,
            hints,
            queued,
            &self.tombstones,
            settings,
            unread,
        );
        self.baseline_read |= full;
        let sent = publisher.sent;
        if self.config.confirm == Store::Task {
            let seen = hints.observations().chain(queued.observations());
            self.watch_started_before_exec(seen.map(|(id, observation)| (id, observation)));
        }
        (plan, sent)
    }

    /// Watches the exit of each container running whose start was told before the kernel's
    /// exec of its init reached plegd, as if the kernel had seen the start ([`Publisher`]):
    /// runc's `start` returns, and the shim publishes `/tasks/start`, as it lets the init
    /// exec; under load the exec comes after, and the overload section found such deaths
    /// unwatched, told at `/tasks/exit`'s pace (49 ms after the kill in one). The exec comes
    /// among the hints queued while the start's read ran (which that read answers), or after
    /// it ([`Self::kernel_saw`]: the kernel's hints then wait out their grace, for the
    /// runtime's events to answer them). One already watched is not watched again.
    fn watch_started_before_exec<'a>(
        &mut self,
        seen: impl Iterator<Item = (&'a ContainerId, &'a Observation)>,
    ) {
        for (id, observation) in seen {
            if observation.source == Source::Ebpf
                && matches!(observation.kind, ObservationKind::Exec(_))
                && self
                    .committed
                    .container(id)
                    .is_some_and(|c| c.state == ContainerState::Running)
                && !self.runtime.exit_watched(id)
                && let Some(answer) = self.runtime.watch_exit(id)
                && self.runtime_events
            {
                self.exit_watches.push((id.clone(), answer));
            }
        }
    }

    /// A container scope whose container is committed is its pod's.
    fn resolve(&self, scope: &Scope) -> Scope {
        match scope {
            Scope::Container(id) => self
                .committed
                .pod_of(id)
                .map_or_else(|| scope.clone(), |uid| Scope::Pod(uid.clone())),
            scope => scope.clone(),
        }
    }

    /// The containers whose task status is to be read, leaving out those whose status missed
    /// its deadline lately. None when confirming by the CRI store.
    fn tasks_to_read(
        &self,
        hints: &Hints,
        state: impl Fn(&ContainerId) -> Option<ContainerState>,
    ) -> Vec<(ContainerId, TaskAsk)> {
        if self.config.confirm != Store::Task {
            return Vec::new();
        }
        let mut asks = tasks_to_read(hints, state);
        asks.retain(|ask| !self.busy_tasks.contains_key(ask));
        asks
    }

    /// An ask that missed its deadline is not made again for [`TASK_BUSY_BACKOFF`], unless it
    /// is a watched exit's: asking again costs the runtime nothing, and the next read then
    /// takes the watch's answer as it comes (the shim's `runc kill --all` alone outlasted the
    /// wait under churn).
    fn note_busy(&mut self, busy: Vec<(ContainerId, TaskAsk)>) {
        let until = Instant::now() + TASK_BUSY_BACKOFF;
        let runtime = &self.runtime;
        self.busy_tasks.extend(
            busy.into_iter()
                .filter(|(id, ask)| !(*ask == TaskAsk::Exit && runtime.exit_watched(id)))
                .map(|ask| (ask, until)),
        );
    }

    /// Keeps what a plan leaves for later relists: the pods whose inspection failed, to
    /// inspect again, and the containers the runtime deleted, for [`TOMBSTONE_TTL`].
    fn remember(&mut self, plan: FollowUp) {
        self.to_reinspect.extend(plan.failed);
        let now = Instant::now();
        while self
            .tombstoned_at
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > TOMBSTONE_TTL)
        {
            if let Some((_, id)) = self.tombstoned_at.pop_front() {
                self.tombstones.remove(&id);
            }
        }
        for id in plan.deleted {
            if self.tombstones.insert(id.clone()) {
                self.tombstoned_at.push_back((now, id));
            }
        }
    }
}

/// Relists everything once more before the reading is saved, on the hints of the triggers
/// still `pending`: a start or an exit whose trigger was still queued at the signal is
/// published now, with its exit code, rather than diffed by the next start from a runtime that
/// may have removed the container meanwhile (then its start is never told, and its death has
/// no code). The hints matter: containerd's `/tasks/exit` confirms an exit some 30 ms before
/// its CRI store shows it, and a plain listing then shows the container still running; what
/// no reading reflects yet is read again for up to `confirm`. Bounded: a runtime that
/// does not answer costs the save nothing but [`LAST_RELIST_GRACE`].
pub async fn last_relist<R: Runtime>(
    relister: &mut Relister<R>,
    pending: &Hints,
    confirm: Duration,
) {
    match tokio::time::timeout(
        LAST_RELIST_GRACE,
        relister.relist_before_stop(pending, confirm),
    )
    .await
    {
        Ok(Ok(left)) if left.is_empty() => debug!("relisted before saving"),
        Ok(Ok(left)) => info!(
            unreflected = left.scopes().count(),
            "relisted before saving; the runtime did not reflect every last trigger in time"
        ),
        Ok(Err(error)) => warn!(%error, "the last relist failed; saving the reading before it"),
        Err(_) => warn!(
            grace = ?LAST_RELIST_GRACE,
            "the last relist did not finish; saving the reading before it"
        ),
    }
}

/// Starts watching a container's exit ([`Runtime::watch_exit`]).
type WatchExit<'a> = dyn Fn(&ContainerId) -> Option<ExitWatch> + Sync + 'a;

/// Carries out each pod's plan as reconcile hands it over: the cache written, then its events
/// published (credited to the queued hints where none of the batch's hints was about them), then its
/// record committed.
struct Publisher<'a> {
    committed: &'a mut Committed,
    cache: &'a PodCache,
    sink: &'a dyn EventSink,
    sequence: &'a mut u64,
    queued: &'a Hints,
    /// When the runtime was read: the cache entries are at least this fresh.
    read_at: Instant,
    /// How many events went out.
    sent: usize,
    /// Starts watching a container's exit ([`Runtime::watch_exit`]), for the starts the
    /// kernel saw, where the task service confirms; before the start is told, so its watch is
    /// on by the time a consumer hears of it. The kernel's hint of the death asks for the
    /// answer; its reader also holds the kernel's account of an OOM kill, which a death told
    /// apart from containerd's `/tasks/oom` needs (see `Generator::take_watched`).
    watch_exits: Option<&'a WatchExit<'a>>,
    /// Whether the runtime's task events are on their way: then each watch's answer is also
    /// told as the runtime's record ([`Self::exit_watches`]), whichever of it and `/tasks/exit`
    /// comes first (without them, the kernel's hint alone asks for it).
    runtime_events: bool,
    exit_watches: &'a mut Vec<(ContainerId, ExitWatch)>,
}

impl Act for Publisher<'_> {
    fn committed(&self) -> &Committed {
        self.committed
    }

    fn act(&mut self, pod: PodPlan<'_>) {
        // Cache and events as one to a listing (`PodCache::publishing`): a consumer that
        // reads the cache on an event must find the state the event announces.
        let cache = self.cache;
        let _publishing = cache.publishing();
        let record = pod.record.map(Arc::new);
        match &record {
            Some(record) => cache.set(pod.uid.clone(), Some(Arc::clone(record)), self.read_at),
            None => cache.delete(&pod.uid),
        }
        self.publish(pod.events);
        for correction in &pod.corrected {
            self.sink.corrected(&pod.uid, correction);
        }
        self.committed.commit(&pod.uid, record, pod.same_containers);
    }

    fn tell(&mut self, events: std::vec::Drain<'_, PodLifecycleEvent>) {
        self.publish(events);
    }
}

impl Publisher<'_> {
    /// Numbers `events` and hands them to the sink, each credited to the queued hints.
    fn publish(&mut self, events: impl ExactSizeIterator<Item = PodLifecycleEvent>) {
        let emitted_at = SystemTime::now();
        self.sent += events.len();
        for mut event in events {
            provenance::credit(&mut event, self.queued);
            if let Some(watch_exit) = self.watch_exits
                && event.event_type == PodLifecycleEventType::ContainerStarted
                && event.sources.contains(&Source::Ebpf)
                && let Some(answer) = watch_exit(&event.container_id)
                && self.runtime_events
            {
                self.exit_watches.push((event.container_id.clone(), answer));
            }
            *self.sequence += 1;
            event.sequence = *self.sequence;
            event.emitted_at = emitted_at;
            self.sink.publish(event);
        }
    }
}

/// Notes in `outcome` what a reading's plan leaves to do.
fn note_plan(plan: &FollowUp, outcome: &mut RelistOutcome) {
    outcome.failed_inspections = plan.failed.len();
    for uid in &plan.failed {
        warn!(pod = %uid, "inspection failed; reading it again");
    }
    // What the records alone left settling, unless the reading has read it since.
    let read = &outcome.read_containers;
    outcome.settling.retain(|id| !read.contains(id));
    outcome.settling.extend(plan.settling.iter().cloned());
    outcome.settling.sort();
    outcome.settling.dedup();
    outcome.reread = plan.reread.clone();
}

/// What a full relist's listing shows against the committed records.
#[derive(Debug, Default)]
struct NodeListing<'a> {
    /// The pods committed or awaiting reinspection that are not listed, gone, and those to
    /// inspect, [`PodReading::Failed`] until their inspection says otherwise; ascending. The
    /// pods listed as committed are left out.
    pods: Vec<(PodUid, PodReading)>,
    /// Where in `pods` the pods to inspect are (those listed that are new, awaiting
    /// reinspection, or whose listing moved on, [`inspection_needed`]), each with its
    /// committed record: the walk has it at hand, a lookup per inspection was a B-tree's
    /// descent out of the caches at 10,000 pods.
    to_inspect: Vec<(usize, Option<&'a Arc<PodRecord>>, PodRecord)>,
    /// The pods listed as committed whose listing's fingerprint the records do not hold yet,
    /// with it ([`Committed::note_listing`]).
    fingerprints: Vec<(PodUid, u64)>,
}

/// The pods of `listed` (ascending) against `committed`. One walk over the committed and
/// listed pods side by side: at 10,000 pods, looking each one up by its uid was most of a
/// steady relist's time. A pod listed as its committed record was last listed (the same
/// fingerprint) is not compared with the record again.
fn node_pods<'a>(
    committed: &'a Committed,
    to_reinspect: &BTreeSet<PodUid>,
    listed: Vec<PodRecord>,
    tombstones: &HashSet<ContainerId>,
) -> NodeListing<'a> {
    let mut node = NodeListing::default();
    let mut walk = committed.iter().peekable();
    let not_listed = |key: &PodKey| (key.uid(), PodReading::Gone);
    for pod in listed {
        // The committed pod of the same uid, those before it not listed; one compare of two
        // uids a step.
        let old = loop {
            let Some(&(key, old)) = walk.peek() else {
                break None;
            };
            match key.as_bytes().cmp(pod.uid.0.as_bytes()) {
                Ordering::Greater => break None,
                Ordering::Equal => {
                    walk.next();
                    break Some(old);
                }
                Ordering::Less => {
                    node.pods.push(not_listed(key));
                    walk.next();
                }
            }
        };
        let inspect = to_reinspect.contains(&pod.uid)
            || old.is_none_or(|old| {
                let listing = committed.fingerprint(&pod, tombstones);
                if old.listed == Some(listing) {
                    return false;
                }
                let needed = inspection_needed(old.record, &pod, tombstones);
                if !needed {
                    node.fingerprints.push((pod.uid.clone(), listing));
                }
                needed
            });
        if inspect {
            node.pods.push((pod.uid.clone(), PodReading::Failed));
            node.to_inspect
                .push((node.pods.len() - 1, old.map(|old| old.record), pod));
        }
    }
    node.pods.extend(walk.map(|(key, _)| not_listed(key)));
    // Awaiting reinspection, neither listed nor committed: gone, and no longer awaited.
    let len = node.pods.len();
    for uid in to_reinspect {
        if node.pods[..len]
            .binary_search_by(|(p, _)| p.cmp(uid))
            .is_err()
        {
            node.pods.push((uid.clone(), PodReading::Gone));
        }
    }
    if node.pods.len() > len {
        node.pods.sort_by(|a, b| a.0.cmp(&b.0));
        // The pods to inspect keep their order among themselves.
        let awaiting = node
            .pods
            .iter()
            .enumerate()
            .filter(|(_, (_, pod))| *pod == PodReading::Failed);
        for (inspect, (at, _)) in node.to_inspect.iter_mut().zip(awaiting) {
            inspect.0 = at;
        }
    }
    node
}

impl<R> std::fmt::Debug for Relister<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relister")
            .field("pods", &self.committed.len())
            .field("to_reinspect", &self.to_reinspect)
            .field("sequence", &self.sequence)
            .finish_non_exhaustive()
    }
}

/// What a targeted read showed, `id:state/store` a container, in a trace: the debug log of a
/// run that lost an event says what each read saw of it (a full relist's would be the node).
struct Shown<'r>(&'r Reading);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (uid, pod) in &self.0.pods {
            if matches!(pod, PodReading::Failed) {
                write!(f, "{uid}: failed; ")?;
                continue;
            }
            write!(f, "{uid}:")?;
            for c in pod.record().iter().flat_map(|r| r.containers.values()) {
                write!(f, " {}:{:?}/{:?}", c.id, c.state, c.confirmed_by)?;
            }
            if let PodReading::Containers { gone, .. } = pod {
                for id in gone {
                    write!(f, " {id}:gone")?;
                }
            }
            write!(f, "; ")?;
        }
        write!(f, "tasks {:?}", self.0.tasks)
    }
}

#[cfg(test)]
mod tests;
