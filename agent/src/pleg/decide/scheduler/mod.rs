//! When to read what: turns a stream of [`Trigger`]s into batches, each a read of one target
//! (a container, a pod, the node) or a try of the runtime's records alone.
//!
//! Pure bookkeeping; the driver owns the reads and the timer. It pushes triggers as they come,
//! takes every batch [`RelistScheduler::next_due`] hands out (each read runs beside the others),
//! tells [`RelistScheduler::finished`] when one is done, and sleeps until
//! [`RelistScheduler::next_deadline`], the next trigger or the next read done.
//!
//! How a hint becomes a read (docs/design.md, "From hints to reads"):
//! - Triggers coalesce per target: a container's, a pod's, or the node's. A read answers every
//!   hint pending for its target when it starts; hints that come while it is in flight wait for
//!   the next one: one read in flight per target, however many triggers came. So the reads a
//!   busy node costs grow with the containers that change, not with the triggers about them.
//! - Reads of different targets run side by side (up to [`DEFAULT_READS_IN_FLIGHT`], and the
//!   full relist beside them): one slow read (a shim busy with its cleanup, a listing of a busy
//!   node) holds up no other; but a run's first full relist, the baseline, is read alone. What
//!   a read begun later showed stands against one begun earlier
//!   (`crate::pleg::decide::reconcile::fresh`). The full relist carries no hint (each goes
//!   on to its own read), but lends them all its credit: the events it finds are still
//!   credited to the sources that saw them first.
//! - A target's hints are tried against the runtime's own records at once, even while a read of
//!   it is in flight ([`Batch::read`] false): an exit containerd's `/tasks/exit` recorded never
//!   waits on a read.
//! - A kernel trigger waits a grace while the runtime's own event stream is connected
//!   ([`RelistScheduler::set_kernel_grace`]): the runtime's event about the same change follows
//!   and answers it with no read. It waits by container, and the grace follows how late the
//!   runtime's events have come.
//! - The runtime's word of an OOM kill, or of the death after it, waits while the kernel's
//!   ring is read up to the kill, 100 ms at most ([`RelistScheduler::hold_for_kernel`]): the
//!   kernel's account of the kill then rides with the death.
//! - What a reading did not reflect yet is read again ([`RelistScheduler::retry`]). While the
//!   runtime's event stream answers, the runtime's event about it is awaited, and a read comes
//!   back only a while later ([`EVENT_RETRY`]); without one, the runtime is read again after a
//!   short doubling backoff ([`POLL_RETRY`]). Each a bounded number of times; then the periodic
//!   full relist is the safety net. Neither grows with how busy the node is: a new trigger for
//!   a target merges with its pending retry instead of adding one.
//! - A container whose exit only the task service confirmed is read once more for the CRI
//!   store's status and reason ([`RelistScheduler::settle`]): soon after the runtime deleted its
//!   task (the store is updated right after), else a while after the exit; again after 1, 2
//!   and 4 s while the store lags.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use tokio::time::Instant;
use tracing::debug;

mod grace;
mod oom_account;

use grace::KernelGrace;
pub use oom_account::CATCH_UP_LIMIT;
use oom_account::OomAccounts;

use crate::{
    base::backoff::Exponential,
    pleg::{
        decide::hints::{Hint, Hints},
        model::{
            record::ContainerId,
            source::Source,
            trigger::{ObservationKind, Says, Scope, Trigger},
        },
    },
};

/// How often a full relist runs when nothing else asks for one (kubelet's `relistPeriod`).
pub const DEFAULT_RELIST_PERIOD: Duration = Duration::from_secs(1);

/// How long a kernel trigger waits for the runtime's own event while its event stream is
/// connected: containerd publishes `/tasks/exit` some 1 to 10 ms after the kernel saw the exit,
/// and a hundred or more on a node under churn. Reading at once would read a CRI store that
/// shows nothing yet, and read it again and again until it did; past the grace, the kernel's
/// trigger is read on its own, so a runtime event that never comes costs only this much. The
/// shortest grace: it stretches while the runtime's events come later (`grace`).
pub const DEFAULT_KERNEL_GRACE: Duration = Duration::from_millis(250);

/// Reads of different targets in flight at once.
pub const DEFAULT_READS_IN_FLIGHT: usize = 8;

/// Rereads while the runtime's event stream answers: its event about what the reading did not
/// show is on its way and merges with the hint (read at once), so the reads that come back on
/// their own are few and late. What they wait for is what no event tells: a new pod's sandbox,
/// which the kernel sees start while the CRI plugin is still making it (it joins the CRI
/// store when RunPodSandbox returns, seconds later on a loaded node), and a container of
/// another runtime, which never comes. About 7 s in all.
pub const EVENT_RETRY: Retry = Retry {
    schedule: Exponential::doubling(Duration::from_secs(1), Duration::from_secs(4)),
    max: 3,
};

/// Rereads with no runtime event to wait for (eBPF-only mode, the stream down, confirming at
/// the CRI store): the CRI store shows an exit some 40 ms after the kernel saw it, a few
/// hundred under load, and seconds while containerd catches up after its own restart; about
/// 3.3 s in all, then the next full relist catches up.
pub const POLL_RETRY: Retry = Retry {
    schedule: Exponential::doubling(Duration::from_millis(10), Duration::from_secs(1)),
    max: 9,
};

/// When a container whose exit only the task service confirmed is read again for the CRI
/// store's status and reason, counted from when its reading was done: containerd's CRI plugin
/// updates its store after its cleanup, some 40 ms after the exit on a calm node, a few
/// hundred under churn ([`SETTLE_AFTER_DELETE`] comes sooner when the runtime says the cleanup
/// is done). Then, while the store still lags (its writes are fsync'd: they can fall seconds
/// behind on a node whose disk is busy), after 1, 2 and 4 s: a death's reason is the
/// store's within seconds, not at the next full relist (30 s away while the runtime's events
/// answer), and a store that keeps up costs one read. Past that, the next full relist.
pub const SETTLE_DELAYS: [Duration; 4] = [
    Duration::from_millis(300),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

/// How soon a settling read comes once the runtime deleted the container's task
/// (`/tasks/delete`): the CRI plugin writes its store (an fsync'd file) after it, a few
/// milliseconds on a calm node, past a hundred under churn, where a read sooner finds the
/// store still showing the container running and costs a read more (docs/benchmarks.md).
pub const SETTLE_AFTER_DELETE: Duration = Duration::from_millis(250);

/// The first settling read while the runtime's events answer, for a `/tasks/delete` that does
/// not come (a stream that broke, an OOM kill told after the task was deleted): the delete
/// brings it to [`SETTLE_AFTER_DELETE`]. A timed read before the delete finds the store
/// behind: at 64 lifecycles in flight, where the runtime's cleanup takes seconds, both of
/// [`SETTLE_DELAYS`] did, two calls a lifecycle for nothing.
pub const SETTLE_AWAITING_DELETE: Duration = Duration::from_secs(3);

/// A bounded backoff of rereads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    pub schedule: Exponential,
    /// Rereads before giving up.
    pub max: u32,
}

/// Scheduler settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    pub full_relist_period: Duration,
    /// Targeted reads in flight at once (at least one).
    pub reads_in_flight: usize,
    /// Rereads while the runtime's events answer ([`EVENT_RETRY`]), and while they do not
    /// ([`POLL_RETRY`]).
    pub event_retry: Retry,
    pub poll_retry: Retry,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            full_relist_period: DEFAULT_RELIST_PERIOD,
            reads_in_flight: DEFAULT_READS_IN_FLIGHT,
            event_retry: EVENT_RETRY,
            poll_retry: POLL_RETRY,
        }
    }
}

/// One batch to run now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub scope: Scope,
    pub hints: Hints,
    /// The scope must be read even if the runtime's records answer every hint: the periodic
    /// full relist, one asked for, a settling read.
    pub required: bool,
    /// Whether it may read the runtime: false for a try of the runtime's records alone, for a
    /// target whose read is in flight. What they leave goes back with
    /// [`RelistScheduler::untried`], to be read once that read is done. A batch that may read
    /// holds its target in flight until [`RelistScheduler::finished`].
    pub read: bool,
    /// Retries so far of each target's hint (absent: none).
    attempts: BTreeMap<Scope, u32>,
    /// For a settling read ([`RelistScheduler::settle`]): how many settling reads of the
    /// container this one makes, from 1.
    pub settle: Option<u32>,
    /// Copies of the hints still queued (not due yet, or in their kernel grace) for the target
    /// this batch reads: a change it finds that one of them saw first is credited to its
    /// sources ([`crate::pleg::decide::provenance::credit`]). They stay queued as they were: once
    /// this batch commits the change, their own turn finds nothing new to announce.
    pub queued: Hints,
}

impl Batch {
    /// The same batch carrying `hints` instead (those of its targets to read again).
    pub fn with_hints(&self, hints: Hints) -> Self {
        Self {
            scope: self.scope.clone(),
            hints,
            required: self.required,
            read: self.read,
            attempts: self.attempts.clone(),
            settle: self.settle,
            queued: Hints::default(),
        }
    }
}

/// Hints handed to [`RelistScheduler::retry`] that were not requeued: their retries are spent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("gave up after {attempts} retries; the next full relist will catch up")]
pub struct Exhausted {
    pub attempts: u32,
    pub hints: Hints,
}

#[derive(Debug)]
struct Pending {
    due: Instant,
    /// Retries so far: a fresh trigger merged in resets them.
    retries: u32,
    hint: Hint,
    /// Tried against the runtime's records while its target was in flight, and left for the
    /// read after: not tried again until a new trigger merges in.
    tried: bool,
}

/// A kernel hint about one container, waiting for the runtime's own event about it.
#[derive(Debug)]
struct Waiting {
    /// The furthest step of the container's life the kernel saw, and when.
    seen: KernelSeen,
    /// When its grace ends.
    due: Instant,
    hint: Hint,
}

/// When a hint came, and the furthest step of its container's life it told.
#[derive(Clone, Copy, Debug)]
struct KernelSeen {
    at: Instant,
    says: Option<Says>,
}

impl KernelSeen {
    /// How late the runtime's event (`runtime`) came after the kernel's hint about the same
    /// step (an exit's `/tasks/exit`, a start's `/tasks/start`); `None` for another step (an
    /// init's second exec, no runtime event, and its exit's later).
    fn answered_by(self, runtime: KernelSeen) -> Option<Duration> {
        (self.says.is_some() && self.says == runtime.says).then(|| runtime.at - self.at)
    }
}

/// How long a kernel hint whose grace ended is remembered: a runtime event about the same step
/// that comes later still tells how late the runtime's events are, up to the longest grace.
const REMEMBER_ENDED_GRACE: Duration = Duration::from_secs(4);

/// A container's settling read to come.
#[derive(Debug)]
struct Settling {
    due: Instant,
    /// Which settling read of the container it is, from 1.
    count: u32,
}

/// The reads in flight.
#[derive(Debug, Default)]
struct InFlight {
    /// The full relist.
    full: bool,
    /// Targets (containers, pods) read.
    targets: BTreeSet<Scope>,
}

impl InFlight {
    /// Whether `target` is being read by its own read.
    fn reads(&self, target: &Scope) -> bool {
        self.targets.contains(target)
    }

    /// Whether a read of `target` can start beside those in flight, `limit` targeted ones at
    /// most (the full relist is not one of them: it runs beside them).
    fn admits(&self, target: &Scope, limit: usize) -> bool {
        match target {
            Scope::Node => !self.full,
            target => !self.targets.contains(target) && self.targets.len() < limit.max(1),
        }
    }
}

/// Coalesces triggers into batches; see the module doc.
#[derive(Debug)]
pub struct RelistScheduler {
    config: SchedulerConfig,
    pending: BTreeMap<Scope, Pending>,
    /// Kernel hints in their grace, by container ([`RelistScheduler::set_kernel_grace`]).
    waiting: BTreeMap<ContainerId, Waiting>,
    /// The kernel's hints whose grace ended without the runtime's event, by container.
    grace_ended: BTreeMap<ContainerId, KernelSeen>,
    /// Containers to read once the CRI store has caught up with the task service. Apart from
    /// `pending`: a settling read needs a reading, and merged into a container's hints it made
    /// every trigger about it read, records or not.
    settling: BTreeMap<ContainerId, Settling>,
    in_flight: InFlight,
    /// Start of the last full relist handed out; `None` before the first.
    last_full: Option<Instant>,
    /// When the next periodic full relist is due.
    periodic_due: Instant,
    /// Earliest full relist asked for out of period (sign of loss), if any.
    full_requested: Option<Instant>,
    /// How long a kernel trigger waits for the runtime's own event (zero: not at all, and no
    /// runtime event answers a reread either).
    kernel_grace: KernelGrace,
    /// A due retry was passed over for a fresh trigger: the next turn is a retry's.
    retry_passed_over: bool,
    /// Whether a full relist has ended in this run: none is read on its own before.
    first_full_done: bool,
    /// The OOM kills the runtime and the kernel told, for the deaths that wait for the
    /// kernel's account ([`RelistScheduler::hold_for_kernel`]).
    oom: OomAccounts,
}

impl RelistScheduler {
    /// A scheduler whose first full relist is due at `now`.
    pub fn new(config: SchedulerConfig, now: Instant) -> Self {
        Self {
            config,
            pending: BTreeMap::new(),
            waiting: BTreeMap::new(),
            grace_ended: BTreeMap::new(),
            settling: BTreeMap::new(),
            in_flight: InFlight::default(),
            last_full: None,
            periodic_due: now,
            full_requested: None,
            kernel_grace: KernelGrace::default(),
            retry_passed_over: false,
            first_full_done: false,
            oom: OomAccounts::default(),
        }
    }

    /// Queues a trigger, due at `now`. Returns its container when it is the runtime's word of
    /// an OOM kill, or of the death after it, and the kernel's account of the kill is not in
    /// yet: [`Self::hold_for_kernel`] holds its reading while the kernel's reader catches up.
    pub fn push(&mut self, trigger: Trigger, now: Instant) -> Option<ContainerId> {
        let Trigger {
            scope,
            source,
            observed_at,
            observations,
        } = trigger;
        let mut unaccounted = None;
        let (target, container, observations) = match scope {
            Scope::Node => {
                debug!(?source, "node-wide trigger: full relist requested");
                self.request_full_relist(now);
                return None;
            }
            Scope::Pod(uid) => {
                if !observations.is_empty() {
                    debug!(%uid, ?observations, "pod-wide observations dropped: no container to attach them to");
                }
                (Scope::Pod(uid), None, Vec::new())
            }
            Scope::Container(id) => {
                self.hurry_settling(&id, &observations, now);
                unaccounted = self
                    .oom
                    .observe(&id, source, &observations, now)
                    .then(|| id.clone());
                let observations = observations.into_iter().map(|o| (id.clone(), o)).collect();
                (Scope::Container(id.clone()), Some(id), observations)
            }
        };
        let seen = KernelSeen {
            at: now,
            says: observations.iter().map(|(_, o)| o.kind.says()).max(),
        };
        let hint = Hint::seen(source, observed_at, observations);
        if source != Source::Ebpf {
            // The runtime's own event: the kernel's hints it answers ride along, and how late
            // it came after them sets the grace.
            if let Some(id) = &container {
                let kernel = match self.waiting.remove(id) {
                    Some(waited) => {
                        self.enqueue(target.clone(), waited.hint, now, 0);
                        Some(waited.seen)
                    }
                    None => self.grace_ended.remove(id),
                };
                if let Some(lag) = kernel.and_then(|kernel| kernel.answered_by(seen)) {
                    self.kernel_grace.observe(lag);
                }
            }
            self.enqueue(target, hint, now, 0);
            return unaccounted;
        }
        let grace = self.kernel_grace.current();
        match container {
            Some(id) if !grace.is_zero() => self.wait(id, hint, seen, grace),
            _ => self.enqueue(target, hint, now + grace, 0),
        }
        unaccounted
    }

    /// Holds the reading of container `id` (whose OOM kill the runtime told: [`Self::push`])
    /// until the kernel's reader answers ask `ask` to catch up ([`Self::kernel_caught_up`]),
    /// 100 ms at most: the kernel's account of the kill, in its ring before the death, then
    /// rides with the death.
    pub fn hold_for_kernel(&mut self, id: ContainerId, ask: u64, now: Instant) {
        self.oom.hold(id, ask, now);
    }

    /// Whether the kernel's ring may still hold the account of an OOM kill of `id`: it handed
    /// over neither that nor `id`'s death.
    pub fn awaits_kernel(&self, id: &ContainerId) -> bool {
        self.oom.awaits_kernel(id)
    }

    /// Whether the kernel accounted for an OOM kill of `id` that the runtime has not told yet.
    pub fn oom_untold(&self, id: &ContainerId) -> bool {
        self.oom.untold(id)
    }

    /// The kernel's reader handed over everything it held when ask `answered` came (`None`:
    /// no reader answers any more).
    pub fn kernel_caught_up(&mut self, answered: Option<u64>) {
        self.oom.caught_up(answered);
    }

    /// When `target`'s pending hint may be handed out: when it is due, but not before the
    /// kernel's reader caught up for a death held for it ([`Self::hold_for_kernel`]).
    fn ready_at(&self, target: &Scope, pending: &Pending) -> Instant {
        match target {
            Scope::Container(id) => self
                .oom
                .held_until(id)
                .map_or(pending.due, |until| pending.due.max(until)),
            _ => pending.due,
        }
    }

    /// The runtime deleted the container's task: its CRI store is written right after, so its
    /// settling read comes soon. (The kernel's cgroup removal comes earlier, in the middle of
    /// the runtime's cleanup: too soon.)
    fn hurry_settling(
        &mut self,
        id: &ContainerId,
        observations: &[crate::pleg::model::trigger::Observation],
        now: Instant,
    ) {
        let deleted = observations
            .iter()
            .any(|o| o.kind == ObservationKind::TaskDeleted);
        if let Some(settling) = self.settling.get_mut(id).filter(|_| deleted) {
            settling.due = settling.due.min(now + SETTLE_AFTER_DELETE);
        }
    }

    /// Holds a kernel hint about `container` for its grace, apart from `pending`.
    fn wait(&mut self, container: ContainerId, hint: Hint, seen: KernelSeen, grace: Duration) {
        let due = seen.at + grace;
        match self.waiting.get_mut(&container) {
            Some(waiting) => {
                waiting.hint.merge(hint);
                waiting.due = waiting.due.min(due);
                if seen.says > waiting.seen.says {
                    waiting.seen = seen;
                }
            }
            None => {
                self.grace_ended.remove(&container);
                self.waiting.insert(container, Waiting { seen, due, hint });
            }
        }
    }

    /// Moves the kernel hints whose grace ended by `now` (all of them: `None`) to `pending`.
    fn end_waits(&mut self, now: Option<Instant>) {
        let ended: Vec<ContainerId> = self
            .waiting
            .iter()
            .filter(|(_, w)| now.is_none_or(|now| w.due <= now))
            .map(|(id, _)| id.clone())
            .collect();
        if let Some(now) = now.filter(|_| !ended.is_empty()) {
            self.grace_ended
                .retain(|_, seen| now.duration_since(seen.at) < REMEMBER_ENDED_GRACE);
        }
        for id in ended {
            if let Some(Waiting { seen, due, hint }) = self.waiting.remove(&id) {
                self.grace_ended.insert(id.clone(), seen);
                self.enqueue(Scope::Container(id), hint, due, 0);
            }
        }
    }

    /// Makes kernel triggers from now on wait `grace` for the runtime's own event before their
    /// read ([`DEFAULT_KERNEL_GRACE`] while the runtime's event stream is connected and its
    /// task events confirm, zero otherwise). It also says how rereads back off: a grace means
    /// the runtime's events answer them ([`EVENT_RETRY`]), none that only a reading does
    /// ([`POLL_RETRY`]). The grace stretches to follow how late the runtime's events come, up
    /// to 2 s (`grace` is the shortest).
    pub fn set_kernel_grace(&mut self, grace: Duration) {
        self.kernel_grace.set_base(grace);
    }

    /// Asks for a full relist at `now` (stream reconnect, ring buffer loss, dropped events).
    pub fn request_full_relist(&mut self, now: Instant) {
        self.full_requested = Some(self.full_requested.map_or(now, |t| t.min(now)));
    }

    /// Changes the period of full relists from the last one on (e.g. longer while event
    /// sources are healthy). A requested full relist stays due.
    pub fn set_full_relist_period(&mut self, period: Duration) {
        self.config.full_relist_period = period;
        if let Some(last) = self.last_full {
            self.periodic_due = last + period;
        }
    }

    /// Whether a full relist is due at `now`.
    pub fn full_relist_due(&self, now: Instant) -> bool {
        self.full_deadline() <= now
    }

    /// The next batch due at `now`, if any: a try of the records for a target in flight first,
    /// then a full relist (carrying every pending hint) once nothing else is in flight, else a
    /// read of the target due the earliest that can start beside those in flight.
    pub fn next_due(&mut self, now: Instant) -> Option<Batch> {
        let mut batch = self.next_batch(now)?;
        if batch.read {
            match &batch.scope {
                Scope::Node => self.in_flight.full = true,
                target => {
                    self.in_flight.targets.insert(target.clone());
                }
            }
        }
        batch.queued = self.queued(&batch.scope);
        Some(batch)
    }

    /// The read of `scope` (a batch handed out to read) is done: its target can be read again.
    pub fn finished(&mut self, scope: &Scope) {
        match scope {
            Scope::Node => {
                self.in_flight.full = false;
                self.first_full_done = true;
            }
            target => {
                self.in_flight.targets.remove(target);
            }
        }
    }

    /// The hints queued for targets `scope` covers, copied (see [`Batch::queued`]).
    pub fn queued(&self, scope: &Scope) -> Hints {
        let queued = self
            .pending
            .iter()
            .map(|(target, p)| (target.clone(), &p.hint));
        let waiting = self
            .waiting
            .iter()
            .map(|(id, w)| (Scope::Container(id.clone()), &w.hint));
        queued
            .chain(waiting)
            .filter(|(target, _)| scope.covers(target))
            .map(|(target, hint)| (target, hint.clone()))
            .collect()
    }

    fn next_batch(&mut self, now: Instant) -> Option<Batch> {
        if let Some(tried) = self.next_records_try(now) {
            return Some(tried);
        }
        if self.full_relist_due(now) && self.in_flight.admits(&Scope::Node, 0) {
            self.full_relisted(now);
            return Some(Self::full_batch());
        }
        // A run's first full relist is the baseline every later read is held against (and a
        // resyncing watcher's listing): no target is read beside it, so none is committed
        // before it, half-read.
        if !self.first_full_done {
            return None;
        }
        self.end_waits(Some(now));
        // Fresh triggers before retries, each in due order: a retry waits on a runtime that
        // lags, a fresh trigger is news. But a due retry is passed over once at most: the
        // kernel's hints come in a steady stream under churn, and a retry starved behind them
        // for a second (a death the CRI store had not shown yet) read a container already
        // removed, its exit code gone.
        let limit = self.config.reads_in_flight;
        let earliest = |retry: bool| {
            self.pending
                .iter()
                .filter(|(target, p)| {
                    self.ready_at(target, p) <= now
                        && (p.retries > 0) == retry
                        && self.in_flight.admits(target, limit)
                })
                .min_by_key(|(target, p)| self.ready_at(target, p))
                .map(|(target, _)| target.clone())
        };
        let (fresh, retry) = (earliest(false), earliest(true));
        let target = match (fresh, retry) {
            (Some(_), Some(retry)) if self.retry_passed_over => retry,
            (Some(fresh), retry) => {
                self.retry_passed_over = retry.is_some();
                fresh
            }
            (None, None) => return self.next_settling(now),
            (None, Some(retry)) => retry,
        };
        if self.pending.get(&target).is_some_and(|p| p.retries > 0) {
            self.retry_passed_over = false;
        }
        let pending = self.pending.remove(&target)?;
        Some(Self::one(target, pending, true))
    }

    /// A due hint whose target is being read, not tried against the records yet.
    fn next_records_try(&mut self, now: Instant) -> Option<Batch> {
        let target = self
            .pending
            .iter()
            .find(|(target, p)| {
                self.ready_at(target, p) <= now && !p.tried && self.in_flight.reads(target)
            })
            .map(|(target, _)| target.clone())?;
        let pending = self.pending.remove(&target)?;
        Some(Self::one(target, pending, false))
    }

    /// A batch of one target's pending hint.
    fn one(target: Scope, pending: Pending, read: bool) -> Batch {
        let mut hints = Hints::default();
        hints.insert(target.clone(), pending.hint);
        Batch {
            scope: target.clone(),
            hints,
            required: false,
            read,
            attempts: BTreeMap::from([(target, pending.retries)]),
            settle: None,
            queued: Hints::default(),
        }
    }

    /// The settling read due the earliest at `now` that can start, if any: after every trigger
    /// and retry.
    fn next_settling(&mut self, now: Instant) -> Option<Batch> {
        let limit = self.config.reads_in_flight;
        let id = self
            .settling
            .iter()
            .filter(|(id, s)| {
                s.due <= now
                    && self
                        .in_flight
                        .admits(&Scope::Container((*id).clone()), limit)
            })
            .min_by_key(|(_, s)| s.due)
            .map(|(id, _)| id.clone())?;
        let settling = self.settling.remove(&id)?;
        Some(Batch {
            scope: Scope::Container(id),
            hints: Hints::default(),
            required: true,
            read: true,
            attempts: BTreeMap::new(),
            settle: Some(settling.count),
            queued: Hints::default(),
        })
    }

    /// A full relist ran at `now`: the next periodic one is due a period after it.
    pub fn full_relisted(&mut self, now: Instant) {
        self.last_full = Some(now);
        self.periodic_due = now + self.config.full_relist_period;
        self.full_requested = None;
    }

    /// A full relist. It carries no hint: each goes on to its own read, beside it (a listing of
    /// the node takes long on a busy one), and lends it only its credit ([`Batch::queued`]).
    fn full_batch() -> Batch {
        Batch {
            scope: Scope::Node,
            hints: Hints::default(),
            required: true,
            read: true,
            attempts: BTreeMap::new(),
            settle: None,
            queued: Hints::default(),
        }
    }

    /// Every hint pending or waiting in its grace, taken out (a stop: the last relist reads
    /// them).
    pub fn drain(&mut self) -> Hints {
        self.end_waits(None);
        std::mem::take(&mut self.pending)
            .into_iter()
            .map(|(target, pending)| (target, pending.hint))
            .collect()
    }

    /// When [`Self::next_due`] will next have something (the next full relist at the latest),
    /// or `None` until a read in flight is done: what cannot start before is left out, and
    /// that read's end wakes the driver.
    pub fn next_deadline(&self) -> Option<Instant> {
        let limit = self.config.reads_in_flight;
        let full_waits = !self.in_flight.admits(&Scope::Node, 0);
        // Nothing is read on its own before the run's first full relist has ended.
        let startable =
            |target: &Scope| self.first_full_done && self.in_flight.admits(target, limit);
        let pending = self.pending.iter().filter_map(|(target, p)| {
            let tried_now = !p.tried && self.in_flight.reads(target);
            (tried_now || startable(target)).then(|| self.ready_at(target, p))
        });
        let waiting = self
            .waiting
            .values()
            .filter(|_| self.first_full_done)
            .map(|w| w.due);
        let settling = self
            .settling
            .iter()
            .filter(|(id, _)| startable(&Scope::Container((*id).clone())))
            .map(|(_, s)| s.due);
        let full = (!full_waits).then(|| self.full_deadline());
        pending.chain(waiting).chain(settling).chain(full).min()
    }

    /// Requeues the hints of a batch (full or targeted) the runtime did not reflect yet, each
    /// target after its own backoff ([`EVENT_RETRY`] while the runtime's events answer,
    /// [`POLL_RETRY`] otherwise); new triggers for the same target merge with it. Targets whose
    /// retries are spent are handed back.
    pub fn retry(&mut self, batch: Batch, now: Instant) -> Result<(), Exhausted> {
        let policy = if self.kernel_grace.base().is_zero() {
            self.config.poll_retry
        } else {
            self.config.event_retry
        };
        let mut exhausted = Exhausted {
            attempts: 0,
            hints: Hints::default(),
        };
        for (target, hint) in batch.hints {
            let retries = batch.attempts.get(&target).copied().unwrap_or_default();
            if retries >= policy.max {
                exhausted.attempts = exhausted.attempts.max(retries);
                exhausted.hints.insert(target, hint);
                continue;
            }
            let delay = policy.schedule.delay(retries);
            self.enqueue(target, hint, now + delay, retries + 1);
        }
        if exhausted.hints.is_empty() {
            Ok(())
        } else {
            Err(exhausted)
        }
    }

    /// Puts back what a try of the records alone ([`Batch::read`] false) left: due as it was,
    /// read once the read in flight of its target is done.
    pub fn untried(&mut self, batch: Batch, now: Instant) {
        for (target, hint) in batch.hints {
            let retries = batch.attempts.get(&target).copied().unwrap_or_default();
            let tried = !self.pending.contains_key(&target);
            self.enqueue(target.clone(), hint, now, retries);
            if let Some(pending) = self.pending.get_mut(&target) {
                pending.tried = tried;
            }
        }
    }

    /// Queues a read of container `id` for the CRI store's status and reason once it has
    /// caught up with the task service; `batch` found it still behind. Soon after
    /// `/tasks/delete` ([`SETTLE_AFTER_DELETE`], now if `batch` carried it); else, while the
    /// runtime's events answer, when the delete comes ([`SETTLE_AWAITING_DELETE`] at the
    /// latest); else after [`SETTLE_DELAYS`]. One already queued stands. Past the last delay
    /// the next full relist reads it: `false`.
    pub fn settle(&mut self, batch: &Batch, id: ContainerId, now: Instant) -> bool {
        if self.settling.contains_key(&id) {
            return true;
        }
        let done = batch.settle.unwrap_or(0);
        let Some(&delay) = SETTLE_DELAYS.get(done as usize) else {
            return false;
        };
        let deleted = batch
            .hints
            .observations()
            .any(|(of, o)| *of == id && o.kind == ObservationKind::TaskDeleted);
        let delay = if deleted {
            SETTLE_AFTER_DELETE
        } else if done == 0 && !self.kernel_grace.base().is_zero() {
            SETTLE_AWAITING_DELETE
        } else {
            delay
        };
        self.settling.insert(
            id,
            Settling {
                due: now + delay,
                count: done + 1,
            },
        );
        true
    }

    /// A reading found container `id`'s CRI store caught up (or the container gone): no
    /// settling read is needed.
    pub fn settled(&mut self, id: &ContainerId) {
        self.settling.remove(id);
    }

    fn enqueue(&mut self, target: Scope, hint: Hint, due: Instant, retries: u32) {
        match self.pending.get_mut(&target) {
            Some(pending) => {
                pending.hint.merge(hint);
                pending.due = pending.due.min(due);
                // A new trigger for a target whose older hint is still being read again must
                // not inherit that hint's spent budget.
                pending.retries = pending.retries.min(retries);
                pending.tried = false;
            }
            None => {
                self.pending.insert(
                    target,
                    Pending {
                        due,
                        retries,
                        hint,
                        tried: false,
                    },
                );
            }
        }
    }

    fn full_deadline(&self) -> Instant {
        self.full_requested.map_or(self.periodic_due, |requested| {
            requested.min(self.periodic_due)
        })
    }
}

#[cfg(test)]
mod tests;
