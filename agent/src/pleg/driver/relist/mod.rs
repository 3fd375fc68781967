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
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque},
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::{StreamExt as _, stream};
use tokio::time::Instant;
use tracing::{debug, info, trace, warn};

use crate::pleg::{
    decide::{
        committed::{Committed, PodKey},
        hints::Hints,
        provenance,
        reconcile::{
            Act, Covers, FollowUp, PodPlan, PodReading, Reading, Reread, Settings, ToRead,
            inspection_needed, reconcile, tasks_to_read, unanswered, what_to_read,
        },
    },
    driver::sink::EventSink,
    model::{
        event::PodLifecycleEvent,
        record::{
            ContainerId, ContainerState, OomWitness, PodRecord, PodRecords, PodUid, Store,
            TaskRecords,
        },
        runtime::{ContainerRead, Runtime, RuntimeError},
        trigger::Scope,
    },
    shared::{cache::PodCache, health::Health},
};

/// Default number of pod inspections in flight at once.
pub const DEFAULT_INSPECT_CONCURRENCY: usize = 8;

/// How long a relist waits for one task status before retrying later, while the runtime's
/// event stream is connected: the shim holds the task's lock through its cleanup after an
/// exit (`runc kill`, `runc delete`), and a status call issued then waits for all of it,
/// holding up the relist that containerd's own `/tasks/exit`, a millisecond later, asks for.
pub const TASK_STATUS_DEADLINE: Duration = Duration::from_millis(3);

/// The same wait while no runtime event stream is connected (eBPF-only mode, or the stream
/// down): no `/tasks/exit` will come, and a status missed is a death the CRI store confirms
/// some 50 to 110 ms after the exit. The shim's cleanup takes 10-20 ms here: eBPF-only mode,
/// 60 kill -9s per run, had 20 to 25 deaths confirmed by the CRI store with 3 ms (p90 67-75
/// ms), 0 or 1 with this (p90 18-20 ms).
pub const TASK_STATUS_DEADLINE_ALONE: Duration = Duration::from_millis(25);

/// How long a container whose task status missed its deadline is not asked again.
/// Under churn the kernel hint's retries and every relist carrying it asked again and again: in
/// a 10/s churn bench 48 containers' task statuses timed out 971 times in 25 s, one of them 128
/// times in 13 s, each call more work for a shim already busy. The CRI store, or the runtime's
/// own event, tells meanwhile.
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
    /// The whole node.
    Full,
}

/// What a relist did, for the driver's next decisions and for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelistOutcome {
    pub events_sent: usize,
    /// Pods whose inspection failed; they are inspected again.
    pub failed_inspections: usize,
    /// What to read again, and why.
    pub reread: Vec<Reread>,
    /// Pods to read once more when the CRI store has caught up with the task layer.
    pub settling: Vec<PodUid>,
    /// Pods read whole (inspected), whatever they showed.
    pub inspected: Vec<PodUid>,
    pub read: Read,
}

/// Owns the committed records and turns each reading into events.
pub struct Relister<R> {
    runtime: R,
    cache: Arc<PodCache>,
    health: Arc<Health>,
    sink: Arc<dyn EventSink>,
    config: RelistConfig,
    committed: Committed,
    /// Pods whose last inspection failed (kubelet's `podsToReinspect`): a full relist inspects
    /// them whatever their listing shows.
    to_reinspect: BTreeSet<PodUid>,
    /// How long a task status is waited for ([`Self::set_runtime_events`]).
    task_deadline: Duration,
    /// Containers whose task status missed its deadline, until when it is not read again.
    busy_tasks: HashMap<ContainerId, Instant>,
    /// Containers the runtime recorded deleted, and since when.
    tombstones: HashSet<ContainerId>,
    tombstoned_at: VecDeque<(Instant, ContainerId)>,
    sequence: u64,
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
            runtime,
            cache,
            health,
            sink,
            config,
            committed: Committed::default(),
            to_reinspect: BTreeSet::new(),
            task_deadline: TASK_STATUS_DEADLINE_ALONE,
            busy_tasks: HashMap::new(),
            tombstones: HashSet::new(),
            tombstoned_at: VecDeque::new(),
            sequence: 0,
        }
    }

    /// Whether the runtime's own task events are on their way ([`TASK_STATUS_DEADLINE`])
    /// or not ([`TASK_STATUS_DEADLINE_ALONE`]): how long a task status is waited for.
    pub fn set_runtime_events(&mut self, connected: bool) {
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
            let outcome = self.relist(&Scope::All, &hints, true).await?;
            hints = unanswered(&outcome.reread);
            if hints.is_empty() || Instant::now() + STOP_RETRY > until {
                return Ok(hints);
            }
            tokio::time::sleep(STOP_RETRY).await;
        }
    }

    /// The pod holding `container`, as last committed.
    pub fn pod_of(&self, container: &ContainerId) -> Option<PodUid> {
        self.committed.pod_of(container).cloned()
    }

    /// Relists `scope`; `hints` are the triggers that asked for it. `required`: the scope must
    /// be read even if the runtime's records answer every hint (a periodic or requested full
    /// relist), else only what they leave unanswered is read.
    pub async fn relist(
        &mut self,
        scope: &Scope,
        hints: &Hints,
        required: bool,
    ) -> Result<RelistOutcome, RelistError> {
        self.relist_crediting(scope, hints, Hints::default, required)
            .await
    }

    /// [`Self::relist`], crediting a change no hint of its own is about to the queued hints,
    /// those still waiting for what it reads ([`provenance::credit`]), as `queued` returns
    /// them when asked: before the read, and again after it, for the triggers that came while
    /// it ran (a death the reading found may be one of them).
    pub async fn relist_crediting(
        &mut self,
        scope: &Scope,
        hints: &Hints,
        mut queued: impl FnMut() -> Hints,
        required: bool,
    ) -> Result<RelistOutcome, RelistError> {
        let started = Instant::now();
        // 1. Decide on what is known: the committed records and the records the hints carry.
        let before = queued();
        let (answered, events_sent) =
            self.reconcile(Reading::none(SystemTime::now()), hints, &before, started);
        let left = unanswered(&answered.reread);
        let mut outcome = RelistOutcome {
            settling: answered.settling.clone(),
            events_sent,
            ..RelistOutcome::default()
        };
        self.remember(answered);
        if left.is_empty() && !required {
            trace!(?hints, "answered by the runtime's records");
            return Ok(outcome);
        }

        // 2. Read what is left.
        let scope = self.resolve(scope);
        let full = scope == Scope::All;
        outcome.read = if full { Read::Full } else { Read::Targeted };
        if full {
            self.health.relist_started(started);
        }
        let read_started = Instant::now();
        let reading = match self.read(&scope, &left).await {
            Ok(reading) => reading,
            Err(error) => {
                if full {
                    self.health.relist_failed();
                }
                return Err(error.into());
            }
        };
        let read_in = read_started.elapsed();

        // 3. Reconcile the reading, and act.
        let queued = queued();
        let pods_read = reading.pods.len();
        self.note_read(&reading, &mut outcome);
        let (plan, events_sent) = self.reconcile(reading, &left, &queued, read_started);
        note_plan(&plan, &mut outcome);
        outcome.events_sent += events_sent;
        self.remember(plan);

        // 4. A full relist vouches for every pod: raise the cache's timestamp last, so waiters
        //    released by it find every entry above already written.
        if full {
            self.cache.update_time(read_started);
            self.health.relist_succeeded(started);
        }
        debug!(
            ?scope,
            pods_read,
            events = outcome.events_sent,
            failed_inspections = outcome.failed_inspections,
            reread = outcome.reread.len(),
            elapsed = ?started.elapsed(),
            ?read_in,
            "relisted"
        );
        trace!(?hints, ?left, reread = ?outcome.reread, "relisted on");
        Ok(outcome)
    }

    /// Notes in `outcome` what a reading read; a pod read is no longer to be inspected again.
    fn note_read(&mut self, reading: &Reading, outcome: &mut RelistOutcome) {
        for (uid, pod) in &reading.pods {
            if *pod != PodReading::Failed {
                self.to_reinspect.remove(uid);
            }
            if pod.is_read() {
                outcome.inspected.push(uid.clone());
            }
        }
    }

    /// Reconciles `reading`, each pod's plan carried out as it is decided ([`Publisher`]).
    /// Returns what is left, and how many events went out. `read_at`: when the runtime was
    /// read (the cache entries are at least this fresh).
    fn reconcile(
        &mut self,
        reading: Reading,
        hints: &Hints,
        queued: &Hints,
        read_at: Instant,
    ) -> (FollowUp, usize) {
        let settings = Settings {
            confirm: self.config.confirm,
            emit_changed: self.config.emit_changed,
            oom_witness: self.config.oom_witness,
        };
        let mut publisher = Publisher {
            committed: &mut self.committed,
            cache: &self.cache,
            sink: &*self.sink,
            sequence: &mut self.sequence,
            queued,
            read_at,
            sent: 0,
        };
        let plan = reconcile(
            &mut publisher,
            reading,
            hints,
            queued,
            &self.tombstones,
            settings,
        );
        (plan, publisher.sent)
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

    /// Reads `scope`, and the task statuses `hints` ask for.
    async fn read(&mut self, scope: &Scope, hints: &Hints) -> Result<Reading, RuntimeError> {
        let now = Instant::now();
        self.busy_tasks.retain(|_, until| *until > now);
        match scope {
            Scope::All => self.read_node(hints).await,
            Scope::Pod(uid) => Ok(self.read_pod(uid, hints).await),
            Scope::Container(id) => {
                // Not committed: its pod is the one its record names.
                let reads = self
                    .runtime
                    .read_containers(std::slice::from_ref(id), None)
                    .await?;
                let pods = by_pod(reads, None);
                // Its kernel hints' task statuses are asked by what the reading shows (an
                // exec while CRI still says created).
                let state = |id: &ContainerId| {
                    pods.iter().find_map(|(_, pod)| match pod {
                        PodReading::Containers { pod, .. } => {
                            pod.containers.get(id).map(|c| c.state)
                        }
                        _ => None,
                    })
                };
                let to_read = self.tasks_to_read(hints, state);
                let tasks = self.read_tasks(to_read).await;
                let tasks = self.note_busy(tasks);
                Ok(self.reading(Covers::Containers(vec![id.clone()]), pods, tasks))
            }
        }
    }

    /// A committed pod's reading: the containers its hints name, each by its id, or the pod
    /// whole ([`what_to_read`]); a failure is the pod's, read again.
    async fn read_pod(&mut self, uid: &PodUid, hints: &Hints) -> Reading {
        let committed = &self.committed;
        let to_read = self.tasks_to_read(hints, |id| committed.container(id).map(|c| c.state));
        let pod = committed.get(uid);
        let (tasks, covers, pods) = match what_to_read(pod, hints) {
            ToRead::Whole => {
                let (tasks, read) = futures::join!(self.read_tasks(to_read), self.inspect(uid));
                (tasks, Covers::Pod(uid.clone()), vec![(uid.clone(), read)])
            }
            ToRead::Containers(ids) if ids.is_empty() => (
                self.read_tasks(to_read).await,
                Covers::Containers(ids),
                Vec::new(),
            ),
            ToRead::Containers(ids) => {
                let (tasks, read) = futures::join!(
                    self.read_tasks(to_read),
                    self.runtime.read_containers(&ids, pod)
                );
                let pods = match read {
                    Ok(reads) => by_pod(reads, pod),
                    Err(error) => {
                        debug!(%error, "reading containers failed");
                        vec![(uid.clone(), PodReading::Failed)]
                    }
                };
                (tasks, Covers::Containers(ids), pods)
            }
        };
        let tasks = self.note_busy(tasks);
        self.reading(covers, pods, tasks)
    }

    /// A full relist's reading: the node listed, the pods whose listing moved on inspected.
    async fn read_node(&mut self, hints: &Hints) -> Result<Reading, RuntimeError> {
        let mut listed = self.runtime.list_pods(&Scope::All).await?;
        let read_at = SystemTime::now();
        listed.sort_by(|a, b| a.uid.cmp(&b.uid));
        let state = |id: &ContainerId| {
            listed
                .iter()
                .find_map(|pod| pod.containers.get(id))
                .or_else(|| self.committed.container(id))
                .map(|c| c.state)
        };
        let to_read = self.tasks_to_read(hints, state);
        let node = node_pods(
            &self.committed,
            &self.to_reinspect,
            listed,
            &self.tombstones,
        );
        let NodeListing {
            mut pods,
            to_inspect,
            fingerprints,
        } = node;
        let runtime = &self.runtime;
        let listed = &pods;
        // Each inspection goes back to its pod's place: a search for it among 10,000 uids
        // read a dozen of them, each a miss.
        // By index: a stream of borrowed entries made the future not `Send` for every lifetime
        // (rustc cannot prove it of the closure's higher-ranked borrow).
        let to_inspect = &to_inspect;
        let inspections = stream::iter(0..to_inspect.len())
            .map(|i| async move {
                let (at, known) = to_inspect[i];
                let uid = &listed[at].0;
                (at, inspection(runtime.inspect_pod(uid, known).await))
            })
            .buffer_unordered(self.config.inspect_concurrency.max(1))
            .collect::<Vec<_>>();
        let (inspected, tasks) = futures::join!(inspections, self.read_tasks(to_read));
        // A fact about the records as they are, not a decision: a commit of the pod forgets it.
        for (uid, listing) in &fingerprints {
            self.committed.note_listing(uid, *listing);
        }
        let tasks = self.note_busy(tasks);
        for (at, reading) in inspected {
            pods[at].1 = reading;
        }
        Ok(Reading {
            covers: Covers::Node,
            pods,
            tasks,
            read_at,
        })
    }

    fn reading(
        &self,
        covers: Covers,
        pods: Vec<(PodUid, PodReading)>,
        tasks: TaskRecords,
    ) -> Reading {
        Reading {
            covers,
            pods,
            tasks,
            read_at: SystemTime::now(),
        }
    }

    async fn read_tasks(&self, ids: Vec<ContainerId>) -> (TaskRecords, Vec<ContainerId>) {
        read_tasks(&self.runtime, ids, self.task_deadline).await
    }

    async fn inspect(&self, uid: &PodUid) -> PodReading {
        inspection(self.runtime.inspect_pod(uid, self.committed.get(uid)).await)
    }

    /// The containers whose task status is to be read, leaving out those whose status missed
    /// its deadline lately. None when confirming at the CRI layer.
    fn tasks_to_read(
        &self,
        hints: &Hints,
        state: impl Fn(&ContainerId) -> Option<ContainerState>,
    ) -> Vec<ContainerId> {
        if self.config.confirm != Store::Task {
            return Vec::new();
        }
        let mut ids = tasks_to_read(hints, state);
        ids.retain(|id| !self.busy_tasks.contains_key(id));
        ids
    }

    /// Keeps the task records read; a container whose status missed its deadline is not asked
    /// again for [`TASK_BUSY_BACKOFF`].
    fn note_busy(&mut self, (tasks, busy): (TaskRecords, Vec<ContainerId>)) -> TaskRecords {
        let until = Instant::now() + TASK_BUSY_BACKOFF;
        self.busy_tasks
            .extend(busy.into_iter().map(|id| (id, until)));
        tasks
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
}

impl Publisher<'_> {
    /// Numbers `events` and hands them to the sink, each credited to the queued hints.
    fn publish(&mut self, events: impl ExactSizeIterator<Item = PodLifecycleEvent>) {
        let emitted_at = SystemTime::now();
        self.sent += events.len();
        for mut event in events {
            provenance::credit(&mut event, self.queued);
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
    outcome
        .settling
        .retain(|uid| !outcome.inspected.contains(uid));
    outcome.settling.extend(plan.settling.iter().cloned());
    outcome.settling.sort();
    outcome.settling.dedup();
    outcome.reread = plan.reread.clone();
}

/// The task statuses of `ids`, each within `deadline`, and the containers whose status missed
/// it. All at once: under churn a full relist carries kernel hints of many
/// containers, and one busy shim after another would each cost the whole deadline.
async fn read_tasks<R: Runtime>(
    runtime: &R,
    ids: Vec<ContainerId>,
    deadline: Duration,
) -> (TaskRecords, Vec<ContainerId>) {
    let read = ids.into_iter().map(|id| async move {
        let record = tokio::time::timeout(deadline, runtime.task_record(&id)).await;
        (id, record)
    });
    let (mut tasks, mut busy) = (TaskRecords::new(), Vec::new());
    for (id, record) in futures::future::join_all(read).await {
        match record {
            Ok(Ok(Some(record))) => {
                tasks.insert(id, record);
            }
            Ok(Ok(None)) => {}
            Ok(Err(error)) => debug!(container = %id, %error, "task status unavailable"),
            Err(_) => {
                debug!(container = %id, "task status busy; the CRI store will tell");
                busy.push(id);
            }
        }
    }
    (tasks, busy)
}

/// A pod's inspection as a reading.
fn inspection(result: Result<Option<PodRecord>, RuntimeError>) -> PodReading {
    match result {
        Ok(Some(record)) => PodReading::Inspected(record),
        // Removed between the trigger (or the list) and the inspection.
        Ok(None) => PodReading::Gone,
        Err(error) => {
            debug!(%error, "inspection failed");
            PodReading::Failed
        }
    }
}

/// Containers read by id as pod readings, ascending: each found one in its pod, those gone in
/// `home` (the pod they were committed in, if any).
fn by_pod(reads: Vec<ContainerRead>, home: Option<&PodRecord>) -> Vec<(PodUid, PodReading)> {
    let mut pods: BTreeMap<PodUid, (PodRecord, Vec<ContainerId>)> = BTreeMap::new();
    for read in reads {
        let Some(identity) = read.found.as_ref().or(home) else {
            continue;
        };
        let (pod, gone) = pods
            .entry(identity.uid.clone())
            .or_insert_with(|| (identity.identity(), Vec::new()));
        match read.found {
            Some(found) => {
                for (id, record) in found.containers.iter() {
                    pod.containers.insert(id.clone(), record.clone());
                }
            }
            None => gone.push(read.id),
        }
    }
    pods.into_iter()
        .map(|(uid, (pod, gone))| (uid, PodReading::Containers { pod, gone }))
        .collect()
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
    to_inspect: Vec<(usize, Option<&'a PodRecord>)>,
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
            node.to_inspect
                .push((node.pods.len(), old.map(|old| old.record)));
            node.pods.push((pod.uid, PodReading::Failed));
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

#[cfg(test)]
mod tests;
