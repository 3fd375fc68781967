//! The relist: read the runtime, reconcile, carry the plan out (kubelet's `GenericPLEG.Relist`,
//! as read, decide, act).
//!
//! [`Relister::relist`] first reconciles the hints against what it committed, without reading
//! anything: the runtime's own records that triggers carry (containerd's `/tasks/exit`,
//! `/tasks/start`, `/containers/delete`) often answer them in full. Only what is left is read:
//! a targeted relist reads the containers the hints left name, each by its id (one status call
//! each; [`pod_read`] decides), or its pod whole when a hint names none; a full relist lists
//! the node and inspects the pods whose listing moved on. The reading goes through
//! [`reconcile`] once more, and each pod's plan is carried out as it is decided (`Acting`):
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
use tracing::{debug, trace, warn};

use crate::{
    pleg::{
        cache::PodCache,
        committed::{Committed, PodKey},
        event::{PodLifecycleEvent, Scope},
        health::Health,
        hints::Hints,
        provenance,
        reconcile::{
            Act, Again, Covers, Plan, PodPlan, PodRead, PodReading, Reading, Settings,
            inspection_needed, pod_read, reconcile, tasks_to_read, unanswered,
        },
        record::{ContainerId, ContainerState, Layer, PodRecord, PodRecords, PodUid, TaskRecords},
        sink::EventSink,
    },
    runtime::{ContainerRead, Runtime, RuntimeError},
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
    /// [`crate::pleg::merge`]).
    pub confirm: Layer,
}

impl Default for RelistConfig {
    fn default() -> Self {
        Self {
            inspect_concurrency: DEFAULT_INSPECT_CONCURRENCY,
            emit_changed: false,
            confirm: Layer::Task,
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
    pub again: Vec<Again>,
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
            hints = unanswered(&outcome.again);
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

    /// [`Self::relist`], crediting a change no hint of its own is about to the riders, the
    /// hints still queued for what it reads ([`provenance::credit`]), as `riders` returns them
    /// when asked: before the read, and again after it, for the triggers that came while it
    /// ran (a death the reading found may be one of them).
    pub async fn relist_crediting(
        &mut self,
        scope: &Scope,
        hints: &Hints,
        mut riders: impl FnMut() -> Hints,
        required: bool,
    ) -> Result<RelistOutcome, RelistError> {
        let started = Instant::now();
        // 1. Decide on what is known: the committed records and the records the hints carry.
        let before = riders();
        let (answered, events_sent) =
            self.reconcile(Reading::none(SystemTime::now()), hints, &before, started);
        let left = unanswered(&answered.again);
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
        let riders = riders();
        let pods_read = reading.pods.len();
        self.note_read(&reading, &mut outcome);
        let (plan, events_sent) = self.reconcile(reading, &left, &riders, read_started);
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
            again = outcome.again.len(),
            elapsed = ?started.elapsed(),
            ?read_in,
            "relisted"
        );
        trace!(?hints, ?left, again = ?outcome.again, "relisted on");
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

    /// Reconciles `reading`, each pod's plan carried out as it is decided ([`Acting`]).
    /// Returns what is left, and how many events went out. `read_at`: when the runtime was
    /// read (the cache entries are at least this fresh).
    fn reconcile(
        &mut self,
        reading: Reading,
        hints: &Hints,
        riders: &Hints,
        read_at: Instant,
    ) -> (Plan, usize) {
        let settings = Settings {
            confirm: self.config.confirm,
            emit_changed: self.config.emit_changed,
        };
        let mut acting = Acting {
            committed: &mut self.committed,
            cache: &self.cache,
            sink: &*self.sink,
            sequence: &mut self.sequence,
            riders,
            read_at,
            sent: 0,
        };
        let plan = reconcile(
            &mut acting,
            reading,
            hints,
            riders,
            &self.tombstones,
            settings,
        );
        (plan, acting.sent)
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
    /// whole ([`pod_read`]); a failure is the pod's, read again.
    async fn read_pod(&mut self, uid: &PodUid, hints: &Hints) -> Reading {
        let committed = &self.committed;
        let to_read = self.tasks_to_read(hints, |id| committed.container(id).map(|c| c.state));
        let pod = committed.get(uid);
        let (tasks, covers, pods) = match pod_read(pod, hints) {
            PodRead::Whole => {
                let (tasks, read) = futures::join!(self.read_tasks(to_read), self.inspect(uid));
                (tasks, Covers::Pod(uid.clone()), vec![(uid.clone(), read)])
            }
            PodRead::Containers(ids) if ids.is_empty() => (
                self.read_tasks(to_read).await,
                Covers::Containers(ids),
                Vec::new(),
            ),
            PodRead::Containers(ids) => {
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
        if self.config.confirm != Layer::Task {
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
    fn remember(&mut self, plan: Plan) {
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

/// Carries out each pod's plan as reconcile hands it over: the cache written, then its events
/// published (credited to `riders` where none of the batch's hints was about them), then its
/// record committed.
struct Acting<'a> {
    committed: &'a mut Committed,
    cache: &'a PodCache,
    sink: &'a dyn EventSink,
    sequence: &'a mut u64,
    riders: &'a Hints,
    /// When the runtime was read: the cache entries are at least this fresh.
    read_at: Instant,
    /// How many events went out.
    sent: usize,
}

impl Act for Acting<'_> {
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
        self.committed.commit(&pod.uid, record, pod.same_containers);
    }
}

impl Acting<'_> {
    /// Numbers `events` and hands them to the sink, each credited to the riders.
    fn publish(&mut self, events: impl ExactSizeIterator<Item = PodLifecycleEvent>) {
        let emitted_at = SystemTime::now();
        self.sent += events.len();
        for mut event in events {
            provenance::credit(&mut event, self.riders);
            *self.sequence += 1;
            event.sequence = *self.sequence;
            event.emitted_at = emitted_at;
            self.sink.publish(event);
        }
    }
}

/// Notes in `outcome` what a reading's plan leaves to do.
fn note_plan(plan: &Plan, outcome: &mut RelistOutcome) {
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
    outcome.again = plan.again.clone();
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
mod tests {
    use ContainerState::{Created, Exited, Running};
    use PodLifecycleEventType::*;
    use futures::FutureExt as _;
    use tokio::sync::mpsc::{self, UnboundedReceiver};

    use super::*;
    use crate::{
        pleg::{
            event::{
                DEFAULT_RELIST_THRESHOLD, Observation, ObservationKind, PodLifecycleEvent,
                PodLifecycleEventType, TriggerSource,
            },
            health::HealthError,
            hints::{Hint, Target, pod_hints},
            reconcile::Why,
            record::{ContainerRecord, TaskRecord},
        },
        runtime::testing::{FakeRuntime, container},
    };

    struct Harness {
        runtime: FakeRuntime,
        cache: Arc<PodCache>,
        health: Arc<Health>,
        relister: Relister<FakeRuntime>,
        events: UnboundedReceiver<PodLifecycleEvent>,
    }

    fn harness(config: RelistConfig) -> Harness {
        let runtime = FakeRuntime::new();
        let cache = Arc::new(PodCache::new());
        let health = Arc::new(Health::new(DEFAULT_RELIST_THRESHOLD));
        let (tx, events) = mpsc::unbounded_channel();
        let relister = Relister::new(
            runtime.clone(),
            cache.clone(),
            health.clone(),
            Arc::new(tx),
            config,
        );
        Harness {
            runtime,
            cache,
            health,
            relister,
            events,
        }
    }

    fn default_harness() -> Harness {
        harness(RelistConfig::default())
    }

    fn uid(s: &str) -> PodUid {
        PodUid(s.to_owned())
    }

    fn cid(s: &str) -> ContainerId {
        ContainerId(s.to_owned())
    }

    /// A pod with a running sandbox `<pod>-sb` and running containers.
    fn add_running_pod(runtime: &FakeRuntime, pod: &str, containers: &[&str]) {
        runtime.add_pod(pod, "ns", &format!("{pod}-name"));
        let mut sandbox = container(&format!("{pod}-sb"), "", Running);
        sandbox.sandbox = true;
        runtime.set_container(pod, sandbox);
        for id in containers {
            runtime.set_container(pod, container(id, &format!("{id}-name"), Running));
        }
    }

    fn drain(events: &mut UnboundedReceiver<PodLifecycleEvent>) -> Vec<PodLifecycleEvent> {
        std::iter::from_fn(|| events.try_recv().ok()).collect()
    }

    /// (pod, container, type) of each event, for compact assertions.
    fn summary(events: &[PodLifecycleEvent]) -> Vec<(String, String, PodLifecycleEventType)> {
        events
            .iter()
            .map(|e| {
                let id = e.container_id.as_ref().map_or("", |c| c.0.as_str());
                (e.pod.0.clone(), id.to_owned(), e.event_type)
            })
            .collect()
    }

    /// A full relist's walk: committed and listed side by side, reinspections forced, the
    /// unlisted gone, what moved on (or is new) to inspect.
    #[test]
    fn a_full_relist_inspects_what_moved_on_and_reads_the_unlisted_gone() {
        use crate::runtime::testing::{container, pod};
        let running = |uid: &str| pod(uid, uid, [container(&format!("{uid}-c"), "app", Running)]);
        let exited = |uid: &str| pod(uid, uid, [container(&format!("{uid}-c"), "app", Exited)]);
        let mut committed = Committed::default();
        for p in ["a", "b", "c", "d"] {
            committed.commit(&uid(p), Some(Arc::new(running(p))), false);
        }
        let to_reinspect: BTreeSet<PodUid> = [uid("b"), uid("bb")].into();
        // a unlisted, b as committed but awaiting reinspection, bb awaiting it but gone (sorted
        // in among the pods to inspect), c moved on, d as committed, e new.
        let listed = vec![running("b"), exited("c"), running("d"), running("e")];
        let node = node_pods(&committed, &to_reinspect, listed, &HashSet::new());
        let read: Vec<(&str, &PodReading)> =
            node.pods.iter().map(|(u, r)| (u.0.as_str(), r)).collect();
        use PodReading::{Failed as ToInspect, Gone};
        assert_eq!(
            read,
            [
                ("a", &Gone),
                ("b", &ToInspect),
                ("bb", &Gone),
                ("c", &ToInspect),
                ("e", &ToInspect),
            ]
        );
        let to_inspect: Vec<&PodUid> = node
            .to_inspect
            .iter()
            .map(|&(at, _)| &node.pods[at].0)
            .collect();
        assert_eq!(to_inspect, [&uid("b"), &uid("c"), &uid("e")]);
        let known: Vec<bool> = node.to_inspect.iter().map(|(_, k)| k.is_some()).collect();
        assert_eq!(
            known,
            [true, true, false],
            "the committed record, where there is one"
        );
        let noted: Vec<&PodUid> = node.fingerprints.iter().map(|(u, _)| u).collect();
        assert_eq!(noted, [&uid("d")], "only the pod listed as committed");
    }

    /// A pod listed as it was last listed is not compared with its record again; a listing
    /// that moved on, or a record committed since, is.
    #[test]
    fn a_pod_listed_as_last_time_is_compared_again_only_when_either_side_changed() {
        use crate::runtime::testing::{container, pod};
        let with = |state, layer| {
            let mut c = container("c", "app", state);
            c.confirmed_by = layer;
            pod("p", "web", [c])
        };
        let listed = with(Running, Layer::Cri);
        let none = HashSet::new();
        let walk = |committed: &mut Committed, listed: &PodRecord| {
            let node = node_pods(committed, &BTreeSet::new(), vec![listed.clone()], &none);
            let counts = (node.to_inspect.len(), node.fingerprints.len());
            for (uid, listing) in &node.fingerprints {
                committed.note_listing(uid, *listing);
            }
            counts
        };
        let mut committed = Committed::default();
        committed.commit(&uid("p"), Some(Arc::new(listed.clone())), false);
        assert_eq!(walk(&mut committed, &listed), (0, 1), "compared, and noted");
        assert_eq!(
            walk(&mut committed, &listed),
            (0, 0),
            "as last listed: not compared"
        );
        // The runtime recorded its container deleted since: the listing that still shows it
        // is another listing.
        let tombstones = HashSet::from([cid("c")]);
        let node = node_pods(
            &committed,
            &BTreeSet::new(),
            vec![listed.clone()],
            &tombstones,
        );
        assert_eq!(node.to_inspect.len(), 1, "its only container deleted");
        let died = with(Exited, Layer::Cri);
        assert_eq!(walk(&mut committed, &died), (1, 0), "the listing moved on");
        // The task service confirmed the start: the CRI store's listing, as it was, is now
        // worth an inspection (it confirms the start at its layer).
        committed.commit(&uid("p"), Some(Arc::new(with(Running, Layer::Task))), false);
        assert_eq!(walk(&mut committed, &listed), (1, 0), "the record changed");
    }

    fn ev(
        pod: &str,
        id: &str,
        t: PodLifecycleEventType,
    ) -> (String, String, PodLifecycleEventType) {
        (pod.to_owned(), id.to_owned(), t)
    }

    async fn relist_all(h: &mut Harness) -> RelistOutcome {
        h.relister
            .relist(&Scope::All, &Hints::default(), true)
            .await
            .expect("relist")
    }

    async fn relist_on(h: &mut Harness, scope: &Scope, hints: &Hints) -> RelistOutcome {
        h.relister
            .relist(scope, hints, false)
            .await
            .expect("relist")
    }

    fn whys(outcome: &RelistOutcome) -> Vec<Why> {
        outcome.again.iter().map(|a| a.why).collect()
    }

    /// Runtime calls so far: (lists, inspections, task statuses).
    fn calls(h: &Harness) -> (usize, usize, usize) {
        (
            h.runtime.list_calls().len(),
            h.runtime.inspect_calls().len(),
            h.runtime.task_calls().len(),
        )
    }

    fn cached(h: &Harness, pod: &str, id: &str) -> ContainerRecord {
        h.cache
            .get(&uid(pod))
            .record
            .expect("cached pod")
            .containers[&cid(id)]
            .clone()
    }

    fn exit(code: i32, secs: u64) -> ObservationKind {
        ObservationKind::TaskExited {
            code,
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        }
    }

    /// After a restart from a saved reading, only what changed meanwhile is an event, numbered
    /// after the saved sequence, and every pod is inspected again into the empty cache.
    #[tokio::test]
    async fn a_restored_reading_yields_only_what_changed_since() {
        let mut before = default_harness();
        add_running_pod(&before.runtime, "p", &["c1", "c2"]);
        add_running_pod(&before.runtime, "q", &["d"]);
        relist_all(&mut before).await;
        assert_eq!(drain(&mut before.events).len(), 5);
        let (records, sequence) = before.relister.into_saved();
        assert_eq!(sequence, 5);

        let mut after = default_harness();
        add_running_pod(&after.runtime, "p", &["c1", "c2"]);
        add_running_pod(&after.runtime, "q", &["d"]);
        after
            .runtime
            .set_container("p", container("c2", "c2-name", Exited));
        after.relister.restore(records, sequence);
        assert_eq!(after.relister.pod_of(&cid("d")), Some(uid("q")));
        relist_all(&mut after).await;
        let events = drain(&mut after.events);
        assert_eq!(summary(&events), [ev("p", "c2", ContainerDied)]);
        assert_eq!(events[0].sequence, 6);
        for pod in ["p", "q"] {
            assert!(
                after.cache.get(&uid(pod)).record.is_some(),
                "{pod} inspected"
            );
        }
    }

    /// However many events one pod yields, each is published once, in order.
    #[tokio::test]
    async fn every_event_of_a_large_pod_is_published_in_order() {
        let mut h = default_harness();
        let names: Vec<String> = (0..50).map(|i| format!("c{i:02}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        add_running_pod(&h.runtime, "p", &names);
        let outcome = relist_all(&mut h).await;
        assert_eq!(outcome.events_sent, 51);
        let events = drain(&mut h.events);
        assert_eq!(
            events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            (1..=51).collect::<Vec<_>>()
        );
        let outcome = relist_all(&mut h).await;
        assert_eq!((outcome.events_sent, outcome.again.len()), (0, 0));
    }

    #[tokio::test]
    async fn start_kill_remove() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        let outcome = relist_all(&mut h).await;
        assert_eq!((outcome.events_sent, outcome.read), (2, Read::Full));
        let events = drain(&mut h.events);
        assert_eq!(
            summary(&events),
            [
                ev("p", "c", ContainerStarted),
                ev("p", "p-sb", ContainerStarted)
            ]
        );
        assert_eq!(events[0].container_name, "c-name");
        assert_eq!(events[0].pod_name, "p-name");
        assert_eq!(events[0].sources, [TriggerSource::Relist]);
        assert_eq!(events[0].confirmed_by, Some(Layer::Cri));
        assert_eq!(h.relister.pod_of(&cid("c")), Some(uid("p")));
        assert_eq!(h.health.check(), Ok(()));

        h.runtime.set_state("p", "c", Exited, Some(137));
        relist_all(&mut h).await;
        let events = drain(&mut h.events);
        assert_eq!(summary(&events), [ev("p", "c", ContainerDied)]);
        assert_eq!((events[0].sequence, events[0].exit_code), (3, Some(137)));
        assert_eq!(cached(&h, "p", "c").exit_code, Some(137));

        h.runtime.remove_container("p", "c");
        relist_all(&mut h).await;
        let events = drain(&mut h.events);
        assert_eq!(summary(&events), [ev("p", "c", ContainerRemoved)]);
        assert_eq!(events[0].exit_code, Some(137), "its last record's");
        assert_eq!(h.relister.pod_of(&cid("c")), None);

        // The sandbox vanishes while running: died, then removed.
        h.runtime.remove_pod("p");
        relist_all(&mut h).await;
        assert_eq!(
            summary(&drain(&mut h.events)),
            [
                ev("p", "p-sb", ContainerDied),
                ev("p", "p-sb", ContainerRemoved)
            ]
        );
        assert_eq!(h.cache.get(&uid("p")).record, None);

        // Nothing changed: nothing sent, nothing inspected.
        let before = calls(&h);
        assert_eq!(relist_all(&mut h).await.events_sent, 0);
        assert_eq!(calls(&h), (before.0 + 1, before.1, before.2));
    }

    #[tokio::test]
    async fn a_failed_inspection_is_read_again_by_the_next_relist() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        h.runtime.fail_inspection("p", true);
        let outcome = relist_all(&mut h).await;
        assert_eq!((outcome.failed_inspections, outcome.events_sent), (1, 0));
        assert_eq!(h.cache.get(&uid("p")).record, None);

        h.runtime.fail_inspection("p", false);
        let outcome = relist_all(&mut h).await;
        assert_eq!((outcome.failed_inspections, outcome.events_sent), (0, 2));
        assert_eq!(h.runtime.inspect_calls(), [uid("p"), uid("p")]);
    }

    /// The container dies, the inspection fails, and it runs again by the next relist: its
    /// listing shows no change, but the pod is inspected again.
    #[tokio::test]
    async fn a_failed_inspection_without_a_change_is_read_again() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        h.runtime.set_state("p", "c", Exited, Some(1));
        h.runtime.fail_inspection("p", true);
        relist_all(&mut h).await;
        h.runtime.fail_inspection("p", false);
        h.runtime.set_state("p", "c", Running, None);
        let before = h.runtime.inspect_calls().len();
        assert_eq!(relist_all(&mut h).await.events_sent, 0);
        assert_eq!(h.runtime.inspect_calls().len(), before + 1);
    }

    #[tokio::test]
    async fn a_pod_that_vanishes_after_a_failed_inspection_is_forgotten() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        h.runtime.fail_inspection("p", true);
        relist_all(&mut h).await;
        h.runtime.remove_pod("p");
        let before = h.runtime.inspect_calls().len();
        for _ in 0..2 {
            assert_eq!(relist_all(&mut h).await.events_sent, 0);
        }
        assert_eq!(h.runtime.inspect_calls().len(), before);
        assert!(h.cache.pods().is_empty());
        assert!(format!("{:?}", h.relister).contains("to_reinspect: {}"));
    }

    /// A targeted relist inspects its pod, lists nothing, and leaves the others to the next
    /// full relist.
    #[tokio::test]
    async fn a_targeted_relist_inspects_its_pod_only() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "a", &["ca"]);
        add_running_pod(&h.runtime, "b", &["cb"]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        h.runtime.set_state("a", "ca", Exited, Some(0));
        h.runtime.set_state("b", "cb", Exited, Some(0));
        let (lists, inspections, _) = calls(&h);

        let outcome = relist_on(&mut h, &Scope::Pod(uid("a")), &pod_hints("a", &[])).await;
        assert_eq!((outcome.read, whys(&outcome)), (Read::Targeted, vec![]));
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("a", "ca", ContainerDied)]
        );
        assert_eq!(h.runtime.inspect_calls()[inspections..], [uid("a")]);
        assert_eq!(h.runtime.list_calls().len(), lists, "no listing");
        assert_eq!(h.relister.pod_of(&cid("cb")), Some(uid("b")));
        relist_all(&mut h).await;
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("b", "cb", ContainerDied)]
        );
    }

    fn exec_hint(id: &str) -> Hints {
        let mut hints = Hints::default();
        hints.insert(
            Target::Container(cid(id)),
            Hint {
                sources: [TriggerSource::Ebpf].into(),
                observed_at: SystemTime::UNIX_EPOCH,
                observations: vec![(
                    cid(id),
                    Observation {
                        source: TriggerSource::Ebpf,
                        kind: ObservationKind::Exec("/app".into()),
                    },
                )],
                unspecific: false,
            },
        );
        hints
    }

    /// A container a source saw exec that the runtime does not hold yet is read again until it
    /// does, and its start is then credited to that source.
    #[tokio::test]
    async fn a_new_container_is_read_again_until_the_runtime_holds_it() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &[]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        let scope = Scope::Container(cid("new"));
        let hints = exec_hint("new");
        let outcome = relist_on(&mut h, &scope, &hints).await;
        assert_eq!(whys(&outcome), [Why::Unreflected]);
        assert!(drain(&mut h.events).is_empty());

        h.runtime.set_container("p", container("new", "n", Created));
        let outcome = relist_on(&mut h, &scope, &hints).await;
        assert_eq!(whys(&outcome), [Why::Unreflected], "created, not running");
        assert_eq!(h.runtime.task_calls(), [cid("new")], "its task was asked");

        h.runtime.set_state("p", "new", Running, None);
        let outcome = relist_on(&mut h, &scope, &hints).await;
        assert_eq!(whys(&outcome), []);
        let events = drain(&mut h.events);
        assert_eq!(summary(&events), [ev("p", "new", ContainerStarted)]);
        assert_eq!(events[0].sources, [TriggerSource::Ebpf]);
        assert_eq!(events[0].observations.len(), 1);
    }

    /// Without the runtime's event stream (eBPF only), a new container's exec is confirmed by
    /// its task status while the CRI store still shows it created.
    #[tokio::test]
    async fn an_exec_of_a_new_container_is_confirmed_by_its_task_status() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &[]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        h.runtime.set_container("p", container("new", "n", Created));
        h.runtime
            .set_task("new", Some(TaskRecord::Started { at: None }));
        let outcome = relist_on(&mut h, &Scope::Container(cid("new")), &exec_hint("new")).await;
        assert_eq!(whys(&outcome), []);
        let events = drain(&mut h.events);
        assert_eq!(summary(&events), [ev("p", "new", ContainerStarted)]);
        assert_eq!(events[0].confirmed_by, Some(Layer::Task));
        assert_eq!(outcome.settling, [uid("p")], "CRI's status to come");
    }

    /// containerd's `/tasks/exit` confirms the death while its CRI store still shows the
    /// container running: one ContainerDied, complete, and no runtime call; the pod is read
    /// once more for CRI's reason, which reaches the cache without a second event.
    #[tokio::test]
    async fn a_task_exit_confirms_a_death_with_no_runtime_call() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        relist_all(&mut h).await;
        drain(&mut h.events);

        let hints = pod_hints("p", &[("c", TriggerSource::Containerd, exit(137, 7))]);
        let scope = Scope::Pod(uid("p"));
        let before = calls(&h);
        let outcome = relist_on(&mut h, &scope, &hints).await;
        assert_eq!(
            (outcome.read, whys(&outcome), outcome.settling),
            (Read::Nothing, vec![], vec![uid("p")])
        );
        assert_eq!(calls(&h), before, "the record answered it");
        let events = drain(&mut h.events);
        assert_eq!(summary(&events), [ev("p", "c", ContainerDied)]);
        assert_eq!(
            (events[0].exit_code, events[0].confirmed_by),
            (Some(137), Some(Layer::Task))
        );
        let c = cached(&h, "p", "c");
        assert_eq!(
            (c.state, c.exit_code, c.confirmed_by),
            (Exited, Some(137), Layer::Task)
        );

        // The settling read: CRI still lags; the confirmed death stands, and it settles on.
        let settle = Hints::default();
        let outcome = h
            .relister
            .relist(&scope, &settle, true)
            .await
            .expect("relist");
        assert_eq!(
            (outcome.read, outcome.settling),
            (Read::Targeted, vec![uid("p")])
        );
        assert!(drain(&mut h.events).is_empty());

        // CRI caught up: no second event, its reason reaches the cache.
        let mut record = cached(&h, "p", "c");
        record.reason = "OOMKilled".into();
        record.confirmed_by = Layer::Cri;
        h.runtime.set_container("p", record);
        let outcome = h
            .relister
            .relist(&scope, &settle, true)
            .await
            .expect("relist");
        assert_eq!(
            (outcome.settling, outcome.inspected),
            (vec![], vec![uid("p")])
        );
        assert!(drain(&mut h.events).is_empty());
        let c = cached(&h, "p", "c");
        assert_eq!(
            (c.reason.as_str(), c.confirmed_by),
            ("OOMKilled", Layer::Cri)
        );
    }

    /// A task record does not stand in for a reading when another trigger behind the relist
    /// needs one (a container the runtime created): the pod is read and both changes found.
    #[tokio::test]
    async fn a_task_record_beside_an_unspecific_hint_still_reads() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        h.runtime.set_container("p", container("d", "d", Running));
        let mut hints = pod_hints("p", &[("c", TriggerSource::Containerd, exit(1, 0))]);
        for (target, hint) in pod_hints("p", &[]) {
            hints.insert(target, hint);
        }
        let inspections = h.runtime.inspect_calls().len();
        relist_on(&mut h, &Scope::Pod(uid("p")), &hints).await;
        assert_eq!(h.runtime.inspect_calls().len(), inspections + 1);
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "c", ContainerDied), ev("p", "d", ContainerStarted)]
        );
    }

    /// A container that started and exited before its relist read it: the runtime's
    /// `/tasks/start` makes its `ContainerStarted` go out before its death. Without that
    /// record, or confirming at the CRI layer, it folds into the death as in kubelet's PLEG.
    #[tokio::test]
    async fn a_start_the_task_service_recorded_is_published_though_the_reading_shows_the_exit() {
        let started = ObservationKind::TaskStarted {
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(3),
        };
        let runtime_said = |observations: &[ObservationKind]| {
            let observations: Vec<_> = observations
                .iter()
                .map(|o| ("d", TriggerSource::Containerd, o.clone()))
                .collect();
            let mut hints = pod_hints("p", &observations);
            for (target, hint) in pod_hints("p", &[]) {
                hints.insert(target, hint);
            }
            hints
        };
        let cri = RelistConfig {
            confirm: Layer::Cri,
            ..RelistConfig::default()
        };
        let cases = [
            (
                RelistConfig::default(),
                runtime_said(&[started.clone(), exit(2, 4)]),
                vec![ContainerStarted, ContainerDied],
            ),
            (
                RelistConfig::default(),
                runtime_said(&[exit(2, 4)]),
                vec![ContainerDied],
            ),
            (
                cri,
                runtime_said(&[started, exit(2, 4)]),
                vec![ContainerDied],
            ),
        ];
        for (config, hints, wanted) in cases {
            let mut h = harness(config);
            add_running_pod(&h.runtime, "p", &["c"]);
            relist_all(&mut h).await;
            drain(&mut h.events);
            h.runtime.set_container("p", container("d", "d", Exited));
            relist_on(&mut h, &Scope::Pod(uid("p")), &hints).await;
            let got: Vec<_> = summary(&drain(&mut h.events))
                .into_iter()
                .map(|(_, id, t)| {
                    assert_eq!(id, "d");
                    t
                })
                .collect();
            assert_eq!(got, wanted, "hints {hints:?}");
        }
    }

    /// Pod `p` running `c`, committed; the relist scope and the kernel's hint that `c` died.
    async fn kernel_death_of_running_container() -> (Harness, Scope, Hints) {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        let hints = pod_hints(
            "p",
            &[("c", TriggerSource::Ebpf, ObservationKind::Signal(9))],
        );
        (h, Scope::Pod(uid("p")), hints)
    }

    /// A death seen a moment before a stop, not in the runtime's reading yet, is read again
    /// until it is, so that the saved reading holds it with its code.
    #[tokio::test(start_paused = true)]
    async fn the_relist_before_a_stop_reads_again_what_it_did_not_reflect() {
        let (mut h, _, hints) = kernel_death_of_running_container().await;
        h.runtime
            .set_task("c", Some(TaskRecord::Started { at: None }));
        let runtime = h.runtime.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            runtime.set_task(
                "c",
                Some(TaskRecord::Exited {
                    code: 137,
                    at: SystemTime::UNIX_EPOCH,
                }),
            );
        });
        let left = h
            .relister
            .relist_before_stop(&hints, STOP_CONFIRM)
            .await
            .expect("relist");
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "c", ContainerDied)]
        );
        let (records, _) = h.relister.into_saved();
        let saved = &records[&uid("p")].containers[&cid("c")];
        assert_eq!((saved.state, saved.exit_code), (Exited, Some(137)));
    }

    /// What the runtime never reflects is given up on at the bound, and handed back.
    #[tokio::test(start_paused = true)]
    async fn the_relist_before_a_stop_is_bounded() {
        let (mut h, _, hints) = kernel_death_of_running_container().await;
        h.runtime
            .set_task("c", Some(TaskRecord::Started { at: None }));
        let started = Instant::now();
        let left = h
            .relister
            .relist_before_stop(&hints, STOP_CONFIRM)
            .await
            .expect("relist");
        assert_eq!(left.targets().count(), 1);
        assert!(started.elapsed() <= STOP_CONFIRM, "{:?}", started.elapsed());
        assert!(drain(&mut h.events).is_empty());
    }

    /// A kernel hint is not a confirmation: the relist reads the task's status, and only a
    /// stopped task (or the CRI store) confirms the death.
    #[tokio::test]
    async fn a_kernel_death_is_confirmed_by_the_task_status_never_alone() {
        let (mut h, scope, hints) = kernel_death_of_running_container().await;
        h.runtime
            .set_task("c", Some(TaskRecord::Started { at: None }));
        let outcome = relist_on(&mut h, &scope, &hints).await;
        assert_eq!(whys(&outcome), [Why::Unreflected], "the task still runs");
        assert!(drain(&mut h.events).is_empty());

        h.runtime.set_task(
            "c",
            Some(TaskRecord::Exited {
                code: 137,
                at: SystemTime::UNIX_EPOCH,
            }),
        );
        let outcome = relist_on(&mut h, &scope, &hints).await;
        assert_eq!((whys(&outcome), outcome.settling), (vec![], vec![uid("p")]));
        let events = drain(&mut h.events);
        assert_eq!(summary(&events), [ev("p", "c", ContainerDied)]);
        assert_eq!(events[0].confirmed_by, Some(Layer::Task));
        assert_eq!(events[0].sources, [TriggerSource::Ebpf]);
        assert_eq!(h.runtime.task_calls(), [cid("c"), cid("c")]);
    }

    /// A task status that missed its deadline is not asked again at once: the shim is busy.
    #[tokio::test(start_paused = true)]
    async fn a_busy_task_is_not_asked_again_until_its_backoff_passes() {
        let (mut h, scope, hints) = kernel_death_of_running_container().await;
        h.relister.set_runtime_events(true);
        h.runtime.set_task(
            "c",
            Some(TaskRecord::Exited {
                code: 137,
                at: SystemTime::UNIX_EPOCH,
            }),
        );
        h.runtime.set_delay(Some(TASK_STATUS_DEADLINE * 2));
        for _ in 0..3 {
            let outcome = relist_on(&mut h, &scope, &hints).await;
            assert_eq!(whys(&outcome), [Why::Unreflected], "no answer in time");
        }
        assert_eq!(h.runtime.task_calls(), [cid("c")]);
        assert!(drain(&mut h.events).is_empty());

        h.runtime.set_delay(None);
        tokio::time::advance(TASK_BUSY_BACKOFF).await;
        relist_on(&mut h, &scope, &hints).await;
        assert_eq!(h.runtime.task_calls(), [cid("c"), cid("c")]);
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "c", ContainerDied)]
        );
    }

    /// How long a task status is waited for depends on whether the runtime's own exit event
    /// is on its way: with the event stream connected, not past a short deadline (the event
    /// answers); without it, long enough for a shim still cleaning up, as the CRI store
    /// would take longer still.
    #[tokio::test(start_paused = true)]
    async fn a_task_status_is_waited_for_longer_when_no_runtime_event_will_come() {
        let slow = (TASK_STATUS_DEADLINE + TASK_STATUS_DEADLINE_ALONE) / 2;
        for (events_connected, died) in [(true, false), (false, true)] {
            let (mut h, scope, hints) = kernel_death_of_running_container().await;
            h.relister.set_runtime_events(events_connected);
            h.runtime.set_task(
                "c",
                Some(TaskRecord::Exited {
                    code: 137,
                    at: SystemTime::UNIX_EPOCH,
                }),
            );
            h.runtime.set_delay(Some(slow));
            let outcome = relist_on(&mut h, &scope, &hints).await;
            let events = drain(&mut h.events);
            assert_eq!(
                (outcome.again.is_empty(), summary(&events)),
                (
                    died,
                    died.then(|| ev("p", "c", ContainerDied))
                        .into_iter()
                        .collect()
                ),
                "runtime events connected: {events_connected}"
            );
        }
    }

    /// Confirming at the CRI layer, neither the runtime's records nor the task status make an
    /// event before CRI shows the change.
    #[tokio::test]
    async fn confirming_at_the_cri_layer_waits_for_the_cri_store() {
        let mut h = harness(RelistConfig {
            confirm: Layer::Cri,
            ..RelistConfig::default()
        });
        add_running_pod(&h.runtime, "p", &["c"]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        let hints = pod_hints(
            "p",
            &[
                ("c", TriggerSource::Containerd, exit(137, 0)),
                ("c", TriggerSource::Ebpf, ObservationKind::Signal(9)),
            ],
        );
        h.runtime.set_task(
            "c",
            Some(TaskRecord::Exited {
                code: 137,
                at: SystemTime::UNIX_EPOCH,
            }),
        );
        let outcome = relist_on(&mut h, &Scope::Pod(uid("p")), &hints).await;
        assert_eq!(whys(&outcome), [Why::Unreflected]);
        assert!(drain(&mut h.events).is_empty());
        assert!(h.runtime.task_calls().is_empty());

        h.runtime.set_state("p", "c", Exited, Some(137));
        relist_on(&mut h, &Scope::Pod(uid("p")), &hints).await;
        let events = drain(&mut h.events);
        assert_eq!(summary(&events), [ev("p", "c", ContainerDied)]);
        assert_eq!(events[0].confirmed_by, Some(Layer::Cri));
    }

    /// `/containers/delete` comes a moment before the CRI store forgets the container: a
    /// listing taken meanwhile does not bring it back.
    #[tokio::test]
    async fn a_deleted_container_does_not_come_back_from_a_lagging_listing() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        h.runtime.set_state("p", "c", Exited, Some(0));
        relist_all(&mut h).await;
        drain(&mut h.events);
        let deleted = pod_hints(
            "p",
            &[("c", TriggerSource::Containerd, ObservationKind::Deleted)],
        );
        let outcome = relist_on(&mut h, &Scope::Pod(uid("p")), &deleted).await;
        assert_eq!(outcome.read, Read::Nothing);
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "c", ContainerRemoved)]
        );
        relist_all(&mut h).await;
        assert!(drain(&mut h.events).is_empty(), "still listed, not back");
    }

    #[tokio::test]
    async fn changed_events_only_when_asked_for() {
        for emit_changed in [false, true] {
            let mut h = harness(RelistConfig {
                emit_changed,
                ..RelistConfig::default()
            });
            h.runtime.add_pod("p", "ns", "p");
            h.runtime.set_container("p", container("c", "c", Created));
            relist_all(&mut h).await;
            let expected = if emit_changed {
                vec![ev("p", "c", ContainerChanged)]
            } else {
                Vec::new()
            };
            assert_eq!(summary(&drain(&mut h.events)), expected);
            assert!(h.cache.get(&uid("p")).record.is_some());
        }
    }

    #[tokio::test]
    async fn a_failed_list_keeps_state_and_reports_the_error() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &[]);
        h.runtime.fail_lists(true);
        let result = h
            .relister
            .relist(&Scope::All, &Hints::default(), true)
            .await;
        assert!(matches!(result, Err(RelistError::List(_))));
        assert_eq!(h.health.check(), Err(HealthError::NeverSucceeded));
        h.runtime.fail_lists(false);
        assert_eq!(relist_all(&mut h).await.events_sent, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_relist_makes_health_fail() {
        let mut h = default_harness();
        relist_all(&mut h).await;
        h.runtime.set_hang(true);
        let stuck = h
            .relister
            .relist(&Scope::All, &Hints::default(), true)
            .now_or_never();
        assert!(stuck.is_none());
        tokio::time::advance(DEFAULT_RELIST_THRESHOLD + Duration::from_secs(1)).await;
        match h.health.check() {
            Err(HealthError::Stale { running_for, .. }) => {
                assert_eq!(
                    running_for,
                    Some(DEFAULT_RELIST_THRESHOLD + Duration::from_secs(1))
                );
            }
            other => panic!("expected stale health, got {other:?}"),
        }
    }

    /// A node-sized load (10,000 pods of a sandbox and one container each): every start, then
    /// every tenth death, in order, and an idle relist that inspects nothing. Its timing is
    /// the relist bench's (`cargo xtask bench`).
    #[tokio::test]
    async fn ten_thousand_pods_are_relisted_in_order() {
        const PODS: usize = 10_000;
        let mut h = default_harness();
        for i in 0..PODS {
            add_running_pod(
                &h.runtime,
                &format!("pod-{i:05}"),
                &[&format!("ctr-{i:05}")],
            );
        }
        assert_eq!(relist_all(&mut h).await.events_sent, 2 * PODS);
        let events = drain(&mut h.events);
        assert!(
            events
                .windows(2)
                .all(|w| w[0].sequence + 1 == w[1].sequence && w[0].pod <= w[1].pod)
        );
        for i in (0..PODS).step_by(10) {
            let pod = format!("pod-{i:05}");
            h.runtime
                .set_state(&pod, &format!("ctr-{i:05}"), Exited, Some(1));
        }
        let inspections = h.runtime.inspect_calls().len();
        assert_eq!(relist_all(&mut h).await.events_sent, PODS / 10);
        assert_eq!(h.runtime.inspect_calls().len(), inspections + PODS / 10);
        assert!(
            drain(&mut h.events)
                .iter()
                .all(|e| e.event_type == ContainerDied)
        );
        let inspections = h.runtime.inspect_calls().len();
        assert_eq!(relist_all(&mut h).await.events_sent, 0);
        assert_eq!(h.runtime.inspect_calls().len(), inspections);
        assert_eq!(h.cache.pods().len(), PODS);
    }
}
