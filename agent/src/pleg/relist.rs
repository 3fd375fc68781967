//! The relist: read the runtime, diff against the last reading, publish what changed (kubelet's
//! `GenericPLEG.Relist`).
//!
//! [`Relister::relist`] reads top to bottom: list, diff, inspect, commit what inspected fine,
//! refresh the cache, publish, and for a full relist raise the cache's timestamp last. New
//! features belong in the trigger sources or the scheduler, not in this function.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, btree_map},
    iter::Peekable,
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::{StreamExt as _, stream};
use tokio::time::Instant;
use tracing::{debug, trace, warn};

use crate::{
    pleg::{
        cache::PodCache,
        confirm::{self, TaskRecords},
        diff::{ContainerEvent, diff_pods},
        event::{PodLifecycleEvent, PodLifecycleEventType, Scope},
        health::Health,
        hints::Hints,
        provenance::{PodReadings, pod_events},
        record::{ContainerId, Layer, PodRecord, PodRecords, PodUid, SortedLookup},
        sink::EventSink,
    },
    runtime::{Runtime, RuntimeError},
};

/// Default number of pod inspections in flight at once.
pub const DEFAULT_INSPECT_CONCURRENCY: usize = 8;

/// How long a relist waits for one task status before retrying later: the shim holds the
/// task's lock through its cleanup after an exit (`runc kill`, `runc delete`), and a status
/// call issued then waits for all of it, holding up the relists behind it, among them the one
/// containerd's own exit event asks for about a millisecond later (seen in the bench: 25 ms
/// put the default mode 13 ms behind `/tasks/exit` at p50, the events-only mode 5 ms).
pub const TASK_STATUS_DEADLINE: Duration = Duration::from_millis(3);

/// How long a container whose task status missed [`TASK_STATUS_DEADLINE`] is not asked again.
/// Under churn the kernel hint's retries and every relist carrying it asked again and again: in
/// a 10/s churn bench 48 containers' task statuses timed out 971 times in 25 s, one of them 128
/// times in 13 s, each call more work for a shim already busy. The CRI store, or the runtime's
/// own event, tells meanwhile.
pub const TASK_BUSY_BACKOFF: Duration = Duration::from_secs(1);

/// Relist settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelistConfig {
    /// Pod inspections in flight at once (at least one).
    pub inspect_concurrency: usize,
    /// Send `ContainerChanged` events; kubelet computes but never sends them.
    pub emit_changed: bool,
    /// The runtime record that confirms a start or an exit (see [`crate::pleg::confirm`]).
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

/// What a relist did, for the driver's next decisions and for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelistOutcome {
    pub events_sent: usize,
    /// Pods whose inspection failed; they are inspected again by the next relist of their pod.
    pub failed_inspections: usize,
    /// The hints this reading does not reflect (a container a source saw does not exist yet,
    /// or still runs though a source saw it die), or every hint when a pod must be read again:
    /// retry them with backoff.
    pub unreflected: Hints,
    /// A targeted relist left a state only the task layer confirmed: read the pod again soon
    /// (no event), so the cache takes the CRI store's status and reason once it catches up.
    pub awaiting_cri: bool,
}

impl RelistOutcome {
    /// Whether a hint behind the relist is to be retried.
    pub fn not_reflected(&self) -> bool {
        !self.unreflected.is_empty()
    }
}

/// Owns the last reading of the runtime and turns each new reading into events.
pub struct Relister<R> {
    runtime: R,
    cache: Arc<PodCache>,
    health: Arc<Health>,
    sink: Arc<dyn EventSink>,
    config: RelistConfig,
    /// The list records of the last committed reading (kubelet's `podRecords`).
    records: PodRecords,
    /// Container -> pod, over `records`, so container triggers can be relisted by pod.
    pods_of_containers: HashMap<ContainerId, PodUid>,
    /// Pods whose last inspection failed (kubelet's `podsToReinspect`).
    to_reinspect: BTreeSet<PodUid>,
    /// Containers whose task status missed its deadline, until when it is not read again.
    busy_tasks: HashMap<ContainerId, Instant>,
    sequence: u64,
}

/// What a relist read before diffing: the listing with the task records laid over, and the
/// inspections already at hand.
struct Reading {
    listed: PodRecords,
    listed_at: SystemTime,
    tasks: TaskRecords,
    inspections: BTreeMap<PodUid, Inspection>,
}

/// One pod's inspection.
enum Inspection {
    Found { record: PodRecord, read_at: Instant },
    Gone,
    Failed(RuntimeError),
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
            records: PodRecords::new(),
            pods_of_containers: HashMap::new(),
            to_reinspect: BTreeSet::new(),
            busy_tasks: HashMap::new(),
            sequence: 0,
        }
    }

    /// Continues from a reading saved by a previous run: the next relists diff against
    /// `records` (so only what changed since is an event), number events after `sequence`,
    /// and inspect every pod again (the cache starts empty).
    pub fn restore(&mut self, records: PodRecords, sequence: u64) {
        for (uid, pod) in records {
            self.to_reinspect.insert(uid.clone());
            self.commit(&uid, Some(pod));
        }
        self.sequence = sequence;
    }

    /// The last committed reading and the last sequence handed out, to save at shutdown.
    pub fn into_saved(self) -> (PodRecords, u64) {
        (self.records, self.sequence)
    }

    /// The pod holding `container`, as of the last relist that saw it.
    pub fn pod_of(&self, container: &ContainerId) -> Option<PodUid> {
        self.pods_of_containers.get(container).cloned()
    }

    /// Relists `scope`; `hints` are the triggers that asked for it.
    pub async fn relist(
        &mut self,
        scope: &Scope,
        hints: &Hints,
    ) -> Result<RelistOutcome, RelistError> {
        let full = *scope == Scope::All;
        let started = Instant::now();
        if full {
            self.health.relist_started(started);
        }

        // 1. Read: list, or, where the runtime's own task events answer every hint, take the
        //    committed reading with them laid over (the CRI store is read on the recheck).
        let Reading {
            listed,
            listed_at,
            tasks,
            mut inspections,
        } = match self.answered_by_task_events(scope, hints) {
            Some(reading) => reading,
            None => match self.read(scope, hints).await {
                Ok(reading) => reading,
                Err(e) => {
                    if full {
                        self.health.relist_failed();
                    }
                    return Err(e.into());
                }
            },
        };

        let read_in = started.elapsed();

        // 2. Diff, only over the pods this reading vouches for.
        let considered = considered_pods(scope, &self.records, &self.to_reinspect, &listed);
        let mut changes: BTreeMap<PodUid, Vec<ContainerEvent>> = BTreeMap::new();
        let mut diffed = diff_pods(&self.records, &listed, &considered);
        if self.config.confirm == Layer::Task {
            let diffed_alone = diffed.len();
            diffed = confirm::recorded_starts(diffed, hints, &self.records);
            if diffed.len() > diffed_alone {
                debug!(
                    starts = diffed.len() - diffed_alone,
                    "starts no reading showed, published from the runtime's task events"
                );
            }
        }
        for change in diffed {
            changes.entry(change.pod.clone()).or_default().push(change);
        }

        // 3. Inspect changed pods, those whose inspection failed last time, and those whose
        //    CRI store caught up with what the task layer confirmed (for the cache only).
        let mut to_inspect: BTreeSet<PodUid> = changes.keys().cloned().collect();
        to_inspect.extend(
            self.to_reinspect
                .iter()
                .filter(|uid| considered.binary_search(uid).is_ok())
                .cloned(),
        );
        let (mut committed, mut now) =
            (SortedLookup::new(&self.records), SortedLookup::new(&listed));
        to_inspect.extend(
            considered
                .iter()
                .filter(|uid| confirm::caught_up(committed.get(uid), now.get(uid)))
                .cloned(),
        );
        to_inspect.retain(|uid| !inspections.contains_key(uid));
        let inspecting = Instant::now();
        let mut inspected = self.inspect(&to_inspect, &listed).await;
        let inspected_in = inspecting.elapsed();
        for (uid, inspection) in &mut inspected {
            if let Inspection::Found { record, .. } = inspection {
                confirm::apply(record, &tasks, self.records.get(uid));
            }
        }
        inspections.append(&mut inspected);

        let mut outcome = RelistOutcome {
            unreflected: hints.unreflected(&listed, &self.records),
            ..RelistOutcome::default()
        };
        // `considered` ascends and holds every listed pod: the listing is taken in one walk.
        let mut listed = listed.into_iter().peekable();
        for uid in &considered {
            let mut pod_changes = changes.remove(uid).unwrap_or_default();
            let inspection = inspections.remove(uid);
            let new = take_sorted(&mut listed, uid);
            // Steps 5 and 6 as one to a listing (`PodCache::publishing`).
            let cache = Arc::clone(&self.cache);
            let _publishing = cache.publishing();

            // 4. Keep the old reading of a pod that failed inspection: the next relist diffs
            //    it again, so its events are delayed, never lost.
            match inspection {
                Some(Inspection::Failed(error)) => {
                    warn!(pod = %uid, %error, "inspection failed; reinspecting next relist");
                    outcome.failed_inspections += 1;
                    self.to_reinspect.insert(uid.clone());
                    continue;
                }
                // An inspection that shows a container in an earlier state than the listing did
                // read the runtime mid-change (its status call lags its list call): the event
                // would go out with a status that contradicts it. Read the pod again soon.
                Some(Inspection::Found { record, .. }) if lags_listing(&record, new.as_ref()) => {
                    debug!(pod = %uid, "inspection older than the listing; reinspecting");
                    outcome.failed_inspections += 1;
                    outcome.unreflected = hints.clone();
                    self.to_reinspect.insert(uid.clone());
                    continue;
                }
                // 5. Refresh the cache before publishing: a consumer that reads it on an event
                //    must find the state the event announces, and no later one (a listing of
                //    the cache would show a change whose event comes after its position).
                Some(Inspection::Found {
                    mut record,
                    read_at,
                }) => {
                    if let Some(listed) = &new
                        && record.hold_back_to(listed)
                    {
                        debug!(pod = %uid, "inspection ahead of the listing; cached as listed");
                    }
                    self.cache.set(uid.clone(), Some(record), read_at);
                }
                // Removed between the list and the status calls: cached as listed too (its
                // removal is the next reading's), as read no later than this relist started.
                Some(Inspection::Gone) => match &new {
                    Some(listed) => self.cache.set(uid.clone(), Some(listed.clone()), started),
                    None => self.cache.delete(uid),
                },
                None if new.is_none() => self.cache.delete(uid),
                None => {}
            }
            self.to_reinspect.remove(uid);

            // 6. Publish the pod's events, then commit its reading.
            if !self.config.emit_changed {
                pod_changes.retain(|c| c.event_type != PodLifecycleEventType::ContainerChanged);
            }
            if !pod_changes.is_empty() {
                let readings = PodReadings {
                    new: new.as_ref(),
                    old: self.records.get(uid),
                };
                let events = pod_events(uid, &pod_changes, readings, hints, listed_at);
                outcome.events_sent += self.publish(events);
            }
            self.commit(uid, new);
        }

        outcome.awaiting_cri = !full
            && considered.iter().any(|uid| {
                self.records.get(uid).is_some_and(|pod| {
                    pod.containers
                        .values()
                        .any(|c| c.confirmed_by == Layer::Task)
                })
            });

        // 7. A full relist vouches for every pod: raise the cache's timestamp last, so waiters
        //    released by it find every entry above already written.
        if full {
            self.cache.update_time(started);
            self.health.relist_succeeded(started);
        }
        debug!(
            ?scope,
            pods = considered.len(),
            events = outcome.events_sent,
            failed_inspections = outcome.failed_inspections,
            unreflected = outcome.unreflected.targets().count(),
            awaiting_cri = outcome.awaiting_cri,
            elapsed = ?started.elapsed(),
            // Where a slow relist spent its time: listing (and task status reads), or the
            // status calls of the pods it inspected.
            ?read_in,
            inspected = to_inspect.len(),
            ?inspected_in,
            "relisted"
        );
        trace!(?hints, "relisted on");
        Ok(outcome)
    }

    /// Lists `scope`, and lays the task records behind this relist over the listing.
    async fn read(&mut self, scope: &Scope, hints: &Hints) -> Result<Reading, RuntimeError> {
        let listed = self.runtime.list_pods(scope).await?;
        let listed_at = SystemTime::now();
        let mut listed: PodRecords = listed
            .into_iter()
            .filter(|pod| in_scope(scope, pod))
            .map(|pod| (pod.uid.clone(), pod))
            .collect();
        let tasks = self.task_records(hints, &listed).await;
        let mut committed = SortedLookup::new(&self.records);
        for pod in listed.values_mut() {
            confirm::apply(pod, &tasks, committed.get(&pod.uid));
        }
        Ok(Reading {
            listed,
            listed_at,
            tasks,
            inspections: BTreeMap::new(),
        })
    }

    /// The reading of a targeted relist whose every hint the runtime's own task events answer
    /// ([`confirm::answered`]): the pod's committed listing and its cached inspection, with the
    /// task records laid over both. No runtime call: the CRI store updates some 30 ms after the
    /// task service, after the runtime's cleanup, and a listing now would show nothing new.
    fn answered_by_task_events(&self, scope: &Scope, hints: &Hints) -> Option<Reading> {
        if self.config.confirm != Layer::Task {
            return None;
        }
        let tasks = confirm::from_hints(hints);
        let uid = confirm::answered(scope, hints, &tasks, &self.records)
            .filter(|uid| !self.to_reinspect.contains(uid))?;
        debug!(pod = %uid, "the runtime's task events answer the relist: no CRI read");
        let mut inspected = self.cache.get(&uid).record?;
        let committed = self.records.get(&uid)?;
        let mut listed = committed.clone();
        confirm::apply(&mut listed, &tasks, Some(committed));
        confirm::apply(&mut inspected, &tasks, Some(committed));
        let read_at = Instant::now();
        Some(Reading {
            listed: PodRecords::from([(uid.clone(), listed)]),
            listed_at: SystemTime::now(),
            tasks,
            inspections: BTreeMap::from([(
                uid,
                Inspection::Found {
                    record: inspected,
                    read_at,
                },
            )]),
        })
    }

    /// The task records behind this relist: those the runtime's own events carried, and,
    /// where a kernel hint is ahead of the CRI store, the task status read from the runtime
    /// within [`TASK_STATUS_DEADLINE`] (unless it missed that deadline less than
    /// [`TASK_BUSY_BACKOFF`] ago). None when confirming at the CRI layer.
    async fn task_records(&mut self, hints: &Hints, listed: &PodRecords) -> TaskRecords {
        if self.config.confirm != Layer::Task {
            return TaskRecords::new();
        }
        let mut tasks = confirm::from_hints(hints);
        let now = Instant::now();
        self.busy_tasks.retain(|_, until| *until > now);
        let busy = &self.busy_tasks;
        // All at once: under churn a full relist carries kernel hints of many containers, and
        // one busy shim after another would each cost the whole deadline.
        let runtime = &self.runtime;
        let read = confirm::to_read(listed, hints, &tasks)
            .into_iter()
            .filter(|id| !busy.contains_key(id))
            .map(|id| async move {
                let record =
                    tokio::time::timeout(TASK_STATUS_DEADLINE, runtime.task_record(&id)).await;
                (id, record)
            });
        for (id, record) in futures::future::join_all(read).await {
            match record {
                Ok(Ok(Some(record))) => {
                    tasks.insert(id, record);
                }
                Ok(Ok(None)) => {}
                Ok(Err(error)) => debug!(container = %id, %error, "task status unavailable"),
                Err(_) => {
                    debug!(container = %id, "task status busy; the CRI store will tell");
                    self.busy_tasks.insert(id, now + TASK_BUSY_BACKOFF);
                }
            }
        }
        tasks
    }

    /// Inspects `pods` with bounded concurrency. Pods missing from `listed` are gone: kubelet
    /// does not inspect those either.
    async fn inspect(
        &self,
        pods: &BTreeSet<PodUid>,
        listed: &PodRecords,
    ) -> BTreeMap<PodUid, Inspection> {
        let (present, gone): (Vec<&PodUid>, Vec<&PodUid>) =
            pods.iter().partition(|uid| listed.contains_key(*uid));
        let mut inspections: BTreeMap<PodUid, Inspection> = gone
            .into_iter()
            .map(|uid| (uid.clone(), Inspection::Gone))
            .collect();
        let runtime = &self.runtime;
        // Owned uids: futures borrowing from the iterator trip rustc's higher-ranked `Send`
        // inference when the relist runs in a spawned task.
        let found: Vec<(PodUid, Inspection)> = stream::iter(present.into_iter().cloned())
            .map(|uid| async move {
                // Taken before the call: the record is at least this fresh.
                let read_at = Instant::now();
                let known = self.cache.get(&uid).record;
                let inspection = match runtime.inspect_pod(&uid, known.as_ref()).await {
                    Ok(Some(record)) => Inspection::Found { record, read_at },
                    // Removed between the list and the inspection: the next relist sees it gone.
                    Ok(None) => Inspection::Gone,
                    Err(e) => Inspection::Failed(e),
                };
                (uid, inspection)
            })
            .buffer_unordered(self.config.inspect_concurrency.max(1))
            .collect()
            .await;
        inspections.extend(found);
        inspections
    }

    /// Numbers `events` and hands them to the sink; returns how many.
    fn publish(&mut self, events: Vec<PodLifecycleEvent>) -> usize {
        let emitted_at = SystemTime::now();
        let count = events.len();
        for mut event in events {
            self.sequence += 1;
            event.sequence = self.sequence;
            event.emitted_at = emitted_at;
            self.sink.publish(event);
        }
        count
    }

    /// Makes `new` the last reading of pod `uid` (`None`: the pod is gone).
    fn commit(&mut self, uid: &PodUid, new: Option<PodRecord>) {
        let Some(pod) = new else {
            if let Some(old) = self.records.remove(uid) {
                for id in old.containers.keys() {
                    self.pods_of_containers.remove(id);
                }
            }
            return;
        };
        let index = &mut self.pods_of_containers;
        match self.records.get_mut(uid) {
            // Most pods keep their containers from one relist to the next: replace the record
            // in place, leaving the map and the container index as they are (rebuilding both
            // for every pod was the largest part of a steady full relist at 10,000 pods).
            Some(old) if old.containers.keys().eq(pod.containers.keys()) => *old = pod,
            Some(old) => {
                for id in old.containers.keys() {
                    if !pod.containers.contains_key(id) {
                        index.remove(id);
                    }
                }
                index_containers(index, uid, &pod);
                *old = pod;
            }
            None => {
                index_containers(index, uid, &pod);
                self.records.insert(uid.clone(), pod);
            }
        }
    }
}

/// Points each container of `pod` at `uid` in the container index.
fn index_containers(index: &mut HashMap<ContainerId, PodUid>, uid: &PodUid, pod: &PodRecord) {
    for id in pod.containers.keys() {
        match index.get_mut(id) {
            Some(known) if known == uid => {}
            Some(known) => *known = uid.clone(),
            None => {
                index.insert(id.clone(), uid.clone());
            }
        }
    }
}

impl<R> std::fmt::Debug for Relister<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relister")
            .field("pods", &self.records.len())
            .field("to_reinspect", &self.to_reinspect)
            .field("sequence", &self.sequence)
            .finish_non_exhaustive()
    }
}

/// Whether `inspected` shows a container of the pod in an earlier lifecycle state than
/// `listed` does (created before running before exited; unknown states are not compared).
fn lags_listing(inspected: &PodRecord, listed: Option<&PodRecord>) -> bool {
    let Some(listed) = listed else {
        return false;
    };
    listed.containers.iter().any(|(id, listed)| {
        let inspected = inspected
            .containers
            .get(id)
            .and_then(|c| c.state.progress());
        matches!((inspected, listed.state.progress()), (Some(i), Some(l)) if i < l)
    })
}

/// Whether a listed pod belongs to the scope asked for (a runtime may return more).
fn in_scope(scope: &Scope, pod: &PodRecord) -> bool {
    match scope {
        Scope::All => true,
        Scope::Pod(uid) => pod.uid == *uid,
        Scope::Container(id) => pod.containers.contains_key(id),
    }
}

/// The pods a reading vouches for, ascending: every pod for a full relist (including those
/// known only from a failed inspection); the pod itself for a pod relist (absent means gone);
/// for a container relist only the pods listed, since not finding a container says nothing
/// about its pod. A vector, not a set: the relist walks it in order, and building a tree of
/// every uid on each full relist cost a tenth of a steady one.
fn considered_pods(
    scope: &Scope,
    old: &PodRecords,
    to_reinspect: &BTreeSet<PodUid>,
    listed: &PodRecords,
) -> Vec<PodUid> {
    match scope {
        Scope::All => {
            let mut all: Vec<&PodUid> = old
                .keys()
                .chain(to_reinspect)
                .chain(listed.keys())
                .collect();
            // Three ascending runs: the stable sort merges them.
            all.sort();
            all.dedup();
            all.into_iter().cloned().collect()
        }
        Scope::Pod(uid) => vec![uid.clone()],
        Scope::Container(_) => listed.keys().cloned().collect(),
    }
}

/// Takes the value of `key` from a walk over a sorted map's entries, where keys are asked for
/// in ascending order: a walk, not a `BTreeMap::remove` per key, which rebalanced the tree on
/// every pod of a full relist. Entries before `key` were never asked for and are dropped.
fn take_sorted<K: Ord, V>(walk: &mut Peekable<btree_map::IntoIter<K, V>>, key: &K) -> Option<V> {
    while walk.next_if(|(next, _)| next < key).is_some() {}
    walk.next_if(|(next, _)| next == key)
        .map(|(_, value)| value)
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
                DEFAULT_RELIST_THRESHOLD, Observation, ObservationKind, Trigger, TriggerSource,
            },
            health::HealthError,
            hints::{Hint, Target, pod_hints},
            record::{ContainerRecord, ContainerState, TaskRecord},
            scheduler::{RelistScheduler, SchedulerConfig},
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

    fn ev(
        pod: &str,
        id: &str,
        t: PodLifecycleEventType,
    ) -> (String, String, PodLifecycleEventType) {
        (pod.to_owned(), id.to_owned(), t)
    }

    async fn relist_all(h: &mut Harness) -> RelistOutcome {
        h.relister
            .relist(&Scope::All, &Hints::default())
            .await
            .expect("relist")
    }

    /// After a restart from a saved reading, only what changed meanwhile is an event, numbered
    /// after the saved sequence, and every pod is inspected again into the empty cache.
    #[tokio::test]
    async fn a_restored_reading_yields_only_what_changed_since() {
        let mut before = default_harness();
        add_running_pod(&before.runtime, "p", &["c1", "c2"]);
        add_running_pod(&before.runtime, "q", &["d"]);
        relist_all(&mut before).await;
        // Two sandboxes and three containers started.
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

    /// However many events one pod yields, each is published once, in order, and the pod is
    /// committed: nothing is truncated or counted lost.
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
        assert_eq!(relist_all(&mut h).await, RelistOutcome::default());
    }

    #[tokio::test]
    async fn start_kill_remove() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        let outcome = relist_all(&mut h).await;
        assert_eq!(outcome.events_sent, 2);
        let events = drain(&mut h.events);
        assert_eq!(
            summary(&events),
            [
                ev("p", "c", ContainerStarted),
                ev("p", "p-sb", ContainerStarted)
            ]
        );
        assert_eq!(
            events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(events[0].container_name, "c-name");
        assert_eq!(events[0].pod_name, "p-name");
        assert_eq!(events[0].sources, [TriggerSource::Relist]);
        assert!(h.cache.get(&uid("p")).record.is_some());
        assert_eq!(h.relister.pod_of(&cid("c")), Some(uid("p")));
        assert_eq!(h.health.check(), Ok(()));

        h.runtime.set_state("p", "c", Exited, Some(137));
        relist_all(&mut h).await;
        let events = drain(&mut h.events);
        assert_eq!(summary(&events), [ev("p", "c", ContainerDied)]);
        assert_eq!(events[0].sequence, 3);
        // The cache holds the inspected record, exit code included.
        let cached = h.cache.get(&uid("p")).record.expect("cached pod");
        assert_eq!(cached.containers[&cid("c")].exit_code, Some(137));

        h.runtime.remove_container("p", "c");
        relist_all(&mut h).await;
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "c", ContainerRemoved)]
        );
        assert_eq!(h.relister.pod_of(&cid("c")), None);
        assert_eq!(h.relister.pod_of(&cid("p-sb")), Some(uid("p")));

        // The sandbox vanishes while running: died, then removed.
        h.runtime.remove_pod("p");
        relist_all(&mut h).await;
        assert_eq!(h.relister.pod_of(&cid("p-sb")), None);
        assert_eq!(
            summary(&drain(&mut h.events)),
            [
                ev("p", "p-sb", ContainerDied),
                ev("p", "p-sb", ContainerRemoved)
            ]
        );
        assert_eq!(h.cache.get(&uid("p")).record, None);

        // Nothing changed: nothing sent, nothing inspected.
        let inspections = h.runtime.inspect_calls().len();
        assert_eq!(relist_all(&mut h).await, RelistOutcome::default());
        assert_eq!(h.runtime.inspect_calls().len(), inspections);
    }

    #[tokio::test]
    async fn failed_inspection_is_retried_by_the_next_relist() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        h.runtime.fail_inspection("p", true);
        let outcome = relist_all(&mut h).await;
        assert_eq!((outcome.failed_inspections, outcome.events_sent), (1, 0));
        assert!(drain(&mut h.events).is_empty());
        assert_eq!(h.cache.get(&uid("p")).record, None);

        h.runtime.fail_inspection("p", false);
        let outcome = relist_all(&mut h).await;
        assert_eq!((outcome.failed_inspections, outcome.events_sent), (0, 2));
        assert!(h.cache.get(&uid("p")).record.is_some());
        assert_eq!(h.runtime.inspect_calls(), [uid("p"), uid("p")]);
    }

    /// An inspection that lags the listing (the runtime's status call still shows the
    /// container running after its list call showed it exited) publishes nothing and is read
    /// again, so the event goes out with the runtime's exit code, not without one.
    #[tokio::test]
    async fn an_inspection_older_than_the_listing_is_read_again() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        let before = h.cache.get(&uid("p")).record.unwrap();
        h.runtime.set_state("p", "c", Exited, Some(137));
        h.runtime.lag_next_inspection("p", before);

        let outcome = relist_all(&mut h).await;
        assert_eq!((outcome.events_sent, outcome.failed_inspections), (0, 1));
        assert!(drain(&mut h.events).is_empty());

        let outcome = relist_all(&mut h).await;
        assert_eq!(outcome.events_sent, 1);
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "c", ContainerDied)]
        );
        let cached = h.cache.get(&uid("p")).record.unwrap();
        assert_eq!(cached.containers[&cid("c")].exit_code, Some(137));
    }

    /// An inspection further on than the listing (the container exited, or its pod was
    /// removed, between the list and the status calls) is cached as listed: the cache, and so
    /// a listing of it, never shows a change before the event that announces it.
    #[tokio::test]
    async fn an_inspection_ahead_of_the_listing_is_cached_as_listed() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        h.runtime.set_state("p", "c", Exited, Some(137));
        let ahead = h
            .runtime
            .inspect_pod(&uid("p"), None)
            .await
            .unwrap()
            .unwrap();
        h.runtime.set_state("p", "c", Running, None);
        h.runtime.lag_next_inspection("p", ahead);

        relist_all(&mut h).await;
        assert!(summary(&drain(&mut h.events)).contains(&ev("p", "c", ContainerStarted)));
        let cached = h.cache.get(&uid("p")).record.unwrap();
        assert_eq!(cached.containers[&cid("c")].state, Running);

        h.runtime.set_state("p", "c", Exited, Some(137));
        relist_all(&mut h).await;
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "c", ContainerDied)]
        );
        let cached = h.cache.get(&uid("p")).record.unwrap();
        assert_eq!(cached.containers[&cid("c")].exit_code, Some(137));
    }

    #[tokio::test]
    async fn failed_inspection_without_state_change_is_reinspected() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        // The container dies, the inspection fails, and it comes back to life before the next
        // relist: no state change, but the pod is still inspected again.
        h.runtime.set_state("p", "c", Exited, Some(1));
        h.runtime.fail_inspection("p", true);
        relist_all(&mut h).await;
        h.runtime.fail_inspection("p", false);
        h.runtime.set_state("p", "c", Running, None);
        let before = h.runtime.inspect_calls().len();
        let outcome = relist_all(&mut h).await;
        assert_eq!(outcome.events_sent, 0);
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
        // Never committed, so no events; gone, so not inspected again, now or later.
        assert_eq!(relist_all(&mut h).await, RelistOutcome::default());
        assert_eq!(relist_all(&mut h).await, RelistOutcome::default());
        assert_eq!(h.runtime.inspect_calls().len(), before);
        assert!(h.cache.pods().is_empty());
        assert!(format!("{:?}", h.relister).contains("to_reinspect: {}"));
    }

    #[tokio::test]
    async fn targeted_relist_leaves_other_pods_alone() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "a", &["ca"]);
        add_running_pod(&h.runtime, "b", &["cb"]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        h.runtime.set_state("a", "ca", Exited, Some(0));
        h.runtime.set_state("b", "cb", Exited, Some(0));
        let inspected_before = h.runtime.inspect_calls().len();

        let outcome = h
            .relister
            .relist(&Scope::Pod(uid("a")), &Hints::default())
            .await
            .expect("relist");
        assert!(!outcome.not_reflected());
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("a", "ca", ContainerDied)]
        );
        assert_eq!(h.runtime.inspect_calls()[inspected_before..], [uid("a")]);
        assert_eq!(h.runtime.list_calls().last(), Some(&Scope::Pod(uid("a"))));
        // Pod b is neither removed nor refreshed by a's relist; the next full one finds it.
        assert_eq!(h.relister.pod_of(&cid("cb")), Some(uid("b")));
        relist_all(&mut h).await;
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("b", "cb", ContainerDied)]
        );
    }

    /// A container a source saw exec that the runtime does not list yet is read again until
    /// it does; one nothing was observed of (a create or delete event) is not: not listed is
    /// then an answer.
    #[tokio::test]
    async fn container_relist_retries_until_the_runtime_catches_up() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &[]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        let scope = Scope::Container(cid("new"));
        let outcome = h
            .relister
            .relist(&scope, &Hints::default())
            .await
            .expect("relist");
        assert!(
            !outcome.not_reflected(),
            "nothing observed: not listed is an answer"
        );
        let mut exec = Hints::default();
        exec.insert(
            Target::Container(cid("new")),
            Hint {
                sources: [TriggerSource::Ebpf].into(),
                observed_at: SystemTime::UNIX_EPOCH,
                observations: vec![(
                    cid("new"),
                    Observation {
                        source: TriggerSource::Ebpf,
                        kind: ObservationKind::Exec("/app".into()),
                    },
                )],
                listing_needed: false,
            },
        );
        let outcome = h.relister.relist(&scope, &exec).await.expect("relist");
        assert!(outcome.not_reflected());
        // Not finding the container does not make its would-be pod look removed.
        assert!(drain(&mut h.events).is_empty());

        h.runtime
            .set_container("p", container("new", "new-name", Running));
        let outcome = h.relister.relist(&scope, &exec).await.expect("relist");
        assert!(!outcome.not_reflected());
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "new", ContainerStarted)]
        );
    }

    /// The kernel sees a container's init exec before the runtime marks it running: the
    /// targeted relist is not reflected (retried) until it does, then emits the start.
    #[tokio::test]
    async fn an_exec_ahead_of_the_runtime_is_not_reflected_until_running() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &[]);
        h.runtime.set_container("p", container("c", "app", Created));
        relist_all(&mut h).await;
        drain(&mut h.events);
        let exec = Observation {
            source: TriggerSource::Ebpf,
            kind: ObservationKind::Exec("/bin/sh".into()),
        };
        let t0 = Instant::now();
        let mut scheduler = RelistScheduler::new(SchedulerConfig::default(), t0);
        scheduler.next_due(t0);
        let trigger = Trigger {
            scope: Scope::Container(ContainerId("c".into())),
            source: TriggerSource::Ebpf,
            observed_at: SystemTime::UNIX_EPOCH,
            observations: vec![exec.clone()],
        };
        scheduler.push(trigger, t0, |c| h.relister.pod_of(c));
        let batch = scheduler.next_due(t0).expect("targeted batch");
        let outcome = h
            .relister
            .relist(&batch.scope, &batch.hints)
            .await
            .expect("relist");
        assert!(outcome.not_reflected(), "c is still created in the runtime");

        h.runtime.set_state("p", "c", Running, None);
        let outcome = h
            .relister
            .relist(&batch.scope, &batch.hints)
            .await
            .expect("relist");
        assert!(!outcome.not_reflected());
        let events = drain(&mut h.events);
        assert_eq!(summary(&events), [ev("p", "c", ContainerStarted)]);
        assert_eq!(events[0].observations, vec![exec]);
    }

    #[tokio::test]
    async fn observations_join_the_events_of_their_container() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        relist_all(&mut h).await;
        drain(&mut h.events);

        // containerd reports the exit before the runtime's list does.
        let t0 = Instant::now();
        let mut scheduler = RelistScheduler::new(SchedulerConfig::default(), t0);
        scheduler.next_due(t0);
        let exit = Observation {
            source: TriggerSource::Containerd,
            kind: ObservationKind::ExitCode(137),
        };
        let observed_at = SystemTime::UNIX_EPOCH + Duration::from_secs(42);
        let trigger = Trigger {
            scope: Scope::Container(cid("c")),
            source: TriggerSource::Containerd,
            observed_at,
            observations: vec![exit.clone()],
        };
        scheduler.push(trigger, t0, |c| h.relister.pod_of(c));
        let batch = scheduler.next_due(t0).expect("targeted batch");
        assert_eq!(batch.scope, Scope::Pod(uid("p")));

        let outcome = h
            .relister
            .relist(&batch.scope, &batch.hints)
            .await
            .expect("relist");
        assert!(outcome.not_reflected(), "c still runs in the runtime");
        assert!(drain(&mut h.events).is_empty());
        scheduler.retry(batch, t0).expect("retry");

        h.runtime.set_state("p", "c", Exited, Some(137));
        let t1 = t0 + crate::pleg::scheduler::DEFAULT_RETRY_BASE;
        let batch = scheduler.next_due(t1).expect("retry due");
        let outcome = h
            .relister
            .relist(&batch.scope, &batch.hints)
            .await
            .expect("relist");
        assert!(!outcome.not_reflected());
        let events = drain(&mut h.events);
        assert_eq!(summary(&events), [ev("p", "c", ContainerDied)]);
        assert_eq!(events[0].sources, [TriggerSource::Containerd]);
        assert_eq!(events[0].observed_at, observed_at);
        assert_eq!(events[0].observations, [exit]);
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
            // The pod was inspected and cached either way.
            assert!(h.cache.get(&uid("p")).record.is_some());
        }
    }

    #[tokio::test]
    async fn a_failed_list_keeps_state_and_reports_the_error() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &[]);
        h.runtime.fail_lists(true);
        let result = h.relister.relist(&Scope::All, &Hints::default()).await;
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
        // Poll the relist once: it is stuck in the runtime call.
        let stuck = h
            .relister
            .relist(&Scope::All, &Hints::default())
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

    #[test]
    fn a_sorted_walk_takes_the_keys_asked_for_and_skips_the_rest() {
        let map = BTreeMap::from([(1, "a"), (3, "c"), (4, "d"), (7, "g")]);
        let mut walk = map.into_iter().peekable();
        assert_eq!(take_sorted(&mut walk, &0), None);
        assert_eq!(take_sorted(&mut walk, &3), Some("c"), "1 is skipped");
        assert_eq!(take_sorted(&mut walk, &5), None, "4 is skipped");
        assert_eq!(take_sorted(&mut walk, &7), Some("g"));
        assert_eq!(take_sorted(&mut walk, &7), None, "taken once");
        assert_eq!(walk.next(), None);
    }

    /// Correctness and a rough timing on a node-sized load: 10,000 pods of a sandbox and one
    /// container each.
    #[tokio::test]
    async fn ten_thousand_pods() {
        const PODS: usize = 10_000;
        let mut h = default_harness();
        for i in 0..PODS {
            add_running_pod(
                &h.runtime,
                &format!("pod-{i:05}"),
                &[&format!("ctr-{i:05}")],
            );
        }

        let start = std::time::Instant::now();
        let outcome = relist_all(&mut h).await;
        let first = start.elapsed();
        assert_eq!(outcome.events_sent, 2 * PODS);
        let events = drain(&mut h.events);
        assert_eq!(events.len(), 2 * PODS);
        assert!(
            events
                .windows(2)
                .all(|w| w[0].sequence + 1 == w[1].sequence)
        );

        for i in (0..PODS).step_by(10) {
            let pod = format!("pod-{i:05}");
            h.runtime
                .set_state(&pod, &format!("ctr-{i:05}"), Exited, Some(1));
        }
        let start = std::time::Instant::now();
        let outcome = relist_all(&mut h).await;
        let second = start.elapsed();
        assert_eq!(outcome.events_sent, PODS / 10);
        assert!(
            drain(&mut h.events)
                .iter()
                .all(|e| e.event_type == ContainerDied)
        );

        let start = std::time::Instant::now();
        assert_eq!(relist_all(&mut h).await, RelistOutcome::default());
        let idle = start.elapsed();
        assert_eq!(h.cache.pods().len(), PODS);
        eprintln!(
            "relist of {PODS} pods: first {first:?} (all new), {} died {second:?}, idle {idle:?}",
            PODS / 10
        );
    }

    fn cached(h: &Harness, pod: &str, id: &str) -> ContainerRecord {
        h.cache
            .get(&uid(pod))
            .record
            .expect("cached pod")
            .containers[&cid(id)]
            .clone()
    }

    /// containerd's `/tasks/exit` confirms the death while its CRI store still shows the
    /// container running: one ContainerDied, with the task's code and time in the cache; none
    /// when CRI catches up, whose reason then reaches the cache.
    #[tokio::test]
    async fn the_task_services_exit_confirms_a_death_before_the_cri_store_shows_it() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        relist_all(&mut h).await;
        drain(&mut h.events);

        let exited_at = SystemTime::UNIX_EPOCH + Duration::from_secs(7);
        let exit = ObservationKind::TaskExited {
            code: 137,
            at: exited_at,
        };
        let hints = pod_hints("p", &[("c", TriggerSource::Containerd, exit)]);
        let scope = Scope::Pod(uid("p"));
        let reads = (
            h.runtime.list_calls().len(),
            h.runtime.inspect_calls().len(),
        );
        let outcome = h.relister.relist(&scope, &hints).await.expect("relist");
        assert!(!outcome.not_reflected());
        assert!(outcome.awaiting_cri, "the CRI store is read again soon");
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "c", ContainerDied)]
        );
        assert_eq!(
            (
                h.runtime.list_calls().len(),
                h.runtime.inspect_calls().len()
            ),
            reads,
            "the event answered it: the CRI store, which lags, was not read"
        );
        let c = cached(&h, "p", "c");
        assert_eq!(
            (c.state, c.exit_code, c.finished_at, c.confirmed_by),
            (Exited, Some(137), Some(exited_at), Layer::Task)
        );
        assert!(
            h.runtime.task_calls().is_empty(),
            "the event was the record"
        );

        // CRI still lags: the confirmed death stands, no event.
        relist_all(&mut h).await;
        assert!(drain(&mut h.events).is_empty());
        assert_eq!(cached(&h, "p", "c").confirmed_by, Layer::Task);

        // CRI catches up: no second event, its reason reaches the cache.
        h.runtime.set_state("p", "c", Exited, Some(137));
        let mut record = cached(&h, "p", "c");
        record.reason = "OOMKilled".into();
        record.confirmed_by = Layer::Cri;
        record.finished_at = None;
        h.runtime.set_container("p", record);
        relist_all(&mut h).await;
        assert!(drain(&mut h.events).is_empty());
        let c = cached(&h, "p", "c");
        assert_eq!(
            (c.reason.as_str(), c.confirmed_by),
            ("OOMKilled", Layer::Cri)
        );
    }

    /// A task event does not stand in for a listing when another trigger behind the relist
    /// needs one (here, a container the runtime created): the pod is listed and both changes
    /// are found.
    #[tokio::test]
    async fn a_task_event_beside_a_trigger_without_observations_still_lists() {
        let mut h = default_harness();
        add_running_pod(&h.runtime, "p", &["c"]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        h.runtime.set_container("p", container("d", "d", Running));

        let exit = ObservationKind::TaskExited {
            code: 1,
            at: SystemTime::UNIX_EPOCH,
        };
        let mut hints = pod_hints("p", &[("c", TriggerSource::Containerd, exit)]);
        for (target, hint) in pod_hints("p", &[]) {
            hints.insert(target, hint);
        }
        let lists = h.runtime.list_calls().len();
        h.relister
            .relist(&Scope::Pod(uid("p")), &hints)
            .await
            .expect("relist");
        assert_eq!(h.runtime.list_calls().len(), lists + 1);
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "c", ContainerDied), ev("p", "d", ContainerStarted)]
        );
    }

    /// A container that started and exited while its relist waited (behind a slow full one)
    /// is listed exited at once: the runtime's `/tasks/start` behind the relist makes its
    /// `ContainerStarted` go out before its death. Without that record, or confirming at the
    /// CRI layer, it folds into the death as in kubelet's PLEG.
    #[tokio::test]
    async fn a_start_the_task_service_recorded_is_published_though_the_reading_shows_the_exit() {
        let started = ObservationKind::TaskStarted {
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(3),
        };
        let exited = ObservationKind::TaskExited {
            code: 2,
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(4),
        };
        let runtime_said = |observations: &[ObservationKind]| {
            let observations: Vec<_> = observations
                .iter()
                .map(|o| ("d", TriggerSource::Containerd, o.clone()))
                .collect();
            let mut hints = pod_hints("p", &observations);
            // The container's create event: only a listing answers it.
            for (target, hint) in pod_hints("p", &[]) {
                hints.insert(target, hint);
            }
            hints
        };
        let cases = [
            (
                RelistConfig::default(),
                runtime_said(&[started.clone(), exited.clone()]),
                vec![ContainerStarted, ContainerDied],
            ),
            (
                RelistConfig::default(),
                runtime_said(std::slice::from_ref(&exited)),
                vec![ContainerDied],
            ),
            (
                RelistConfig {
                    confirm: Layer::Cri,
                    ..RelistConfig::default()
                },
                runtime_said(&[started, exited]),
                vec![ContainerDied],
            ),
        ];
        for (config, hints, wanted) in cases {
            let mut h = harness(config);
            add_running_pod(&h.runtime, "p", &["c"]);
            relist_all(&mut h).await;
            drain(&mut h.events);
            h.runtime.set_container("p", container("d", "d", Exited));
            h.relister
                .relist(&Scope::Pod(uid("p")), &hints)
                .await
                .expect("relist");
            let got: Vec<_> = summary(&drain(&mut h.events))
                .into_iter()
                .map(|(pod, id, t)| {
                    assert_eq!((pod.as_str(), id.as_str()), ("p", "d"));
                    t
                })
                .collect();
            assert_eq!(got, wanted, "hints {hints:?}");
        }
    }

    /// A harness whose pod `p` runs `c` as committed; the relist scope and the kernel's hint
    /// that `c` died.
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

    /// A kernel hint is not a confirmation: the relist reads the task's status, and only a
    /// stopped task confirms the death.
    #[tokio::test]
    async fn a_kernel_death_is_confirmed_by_the_task_status_never_alone() {
        let (mut h, scope, hints) = kernel_death_of_running_container().await;

        h.runtime
            .set_task("c", Some(TaskRecord::Started { at: None }));
        let outcome = h.relister.relist(&scope, &hints).await.expect("relist");
        assert!(outcome.not_reflected(), "the task still runs");
        assert!(drain(&mut h.events).is_empty());

        let exited_at = SystemTime::UNIX_EPOCH + Duration::from_secs(9);
        h.runtime.set_task(
            "c",
            Some(TaskRecord::Exited {
                code: 137,
                at: exited_at,
            }),
        );
        let outcome = h.relister.relist(&scope, &hints).await.expect("relist");
        assert!(!outcome.not_reflected());
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "c", ContainerDied)]
        );
        assert_eq!(cached(&h, "p", "c").confirmed_by, Layer::Task);
        assert_eq!(h.runtime.task_calls(), [cid("c"), cid("c")]);
    }

    /// A task status that missed its deadline is not asked again at once: the shim is busy,
    /// and each retry of the kernel hint would ask it again.
    #[tokio::test(start_paused = true)]
    async fn a_busy_task_is_not_asked_again_until_its_backoff_passes() {
        let (mut h, scope, hints) = kernel_death_of_running_container().await;
        h.runtime.set_task(
            "c",
            Some(TaskRecord::Exited {
                code: 137,
                at: SystemTime::UNIX_EPOCH,
            }),
        );

        h.runtime.set_delay(Some(TASK_STATUS_DEADLINE * 2));
        for _ in 0..3 {
            let outcome = h.relister.relist(&scope, &hints).await.expect("relist");
            assert!(
                outcome.not_reflected(),
                "no answer in time: nothing confirmed"
            );
        }
        assert_eq!(h.runtime.task_calls(), [cid("c")]);
        assert!(drain(&mut h.events).is_empty());

        h.runtime.set_delay(None);
        tokio::time::advance(TASK_BUSY_BACKOFF).await;
        let outcome = h.relister.relist(&scope, &hints).await.expect("relist");
        assert!(!outcome.not_reflected());
        assert_eq!(h.runtime.task_calls(), [cid("c"), cid("c")]);
        assert_eq!(
            summary(&drain(&mut h.events)),
            [ev("p", "c", ContainerDied)]
        );
    }

    /// With confirmation at the CRI layer, neither the runtime's events nor the task status
    /// make an event before CRI shows the change.
    #[tokio::test]
    async fn confirming_at_the_cri_layer_waits_for_the_cri_store() {
        let mut h = harness(RelistConfig {
            confirm: Layer::Cri,
            ..RelistConfig::default()
        });
        add_running_pod(&h.runtime, "p", &["c"]);
        relist_all(&mut h).await;
        drain(&mut h.events);
        let exit = ObservationKind::TaskExited {
            code: 137,
            at: SystemTime::UNIX_EPOCH,
        };
        let hints = pod_hints(
            "p",
            &[
                ("c", TriggerSource::Containerd, exit),
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
        let outcome = h
            .relister
            .relist(&Scope::Pod(uid("p")), &hints)
            .await
            .expect("relist");
        assert!(outcome.not_reflected());
        assert!(drain(&mut h.events).is_empty());
        assert!(h.runtime.task_calls().is_empty());
    }
}
