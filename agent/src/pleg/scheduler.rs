//! When to relist what: turns a stream of [`Trigger`]s into relist batches.
//!
//! Pure bookkeeping; the driver owns the tasks and the timer. It pushes triggers as they come,
//! then loops on [`RelistScheduler::next_due`] until it yields nothing and sleeps until
//! [`RelistScheduler::next_deadline`] or the next trigger, whichever comes first.
//!
//! - Triggers coalesce per pod (a container trigger whose pod is known counts for its pod), so a
//!   burst of kernel and stream events about one pod costs one targeted relist.
//! - A due full relist subsumes every targeted one, and carries their hints along, so the events
//!   it finds are still credited to the sources that saw them first. When [`BATCH_TARGETS`] or
//!   more targets are due at once (churn), one full relist serves them all.
//! - Fresh triggers run before due retries, but a due retry is passed over once at most.
//! - A kernel trigger waits a short grace while the runtime's own event stream is connected
//!   (see [`RelistScheduler::set_kernel_grace`]): the runtime's event about the same change
//!   follows within milliseconds and answers it without a CRI read. It waits by container:
//!   the runtime's event about another container of the pod does not carry it along.
//! - A trigger can beat the runtime (containerd's exit event before CRI says exited); the driver
//!   hands the hints the reading did not reflect back with [`RelistScheduler::retry`], which
//!   backs off exponentially a bounded number of times per target, whether the relist was
//!   targeted or full. After that, the periodic full relist is the safety net.

use std::{collections::BTreeMap, time::Duration};

use tokio::time::Instant;
use tracing::debug;

use crate::{
    backoff::Exponential,
    pleg::{
        event::{DEFAULT_RELIST_PERIOD, Scope, Trigger, TriggerSource},
        hints::{Hint, Hints, Target},
        record::{ContainerId, PodUid},
    },
};

/// Default delay between the first retries, while the runtime usually catches up: containerd's
/// task service records an exit some 5 ms after the kernel saw it, its CRI store some 40 ms.
pub const DEFAULT_RETRY_BASE: Duration = Duration::from_millis(5);

/// How long a kernel trigger waits for the runtime's own event while its event stream is
/// connected: containerd publishes `/tasks/exit` some 1 to 10 ms after the kernel saw the exit
/// (a few tens under load). Relisting at once would read a CRI store that shows nothing yet
/// and hold up the relist the runtime's event asks for; past the grace, the kernel's trigger
/// runs on its own, so a runtime event that never comes costs only this much.
pub const DEFAULT_KERNEL_GRACE: Duration = Duration::from_millis(25);

/// Retries at the base delay before backing off.
pub const STEADY_RETRIES: u32 = 10;

/// Default number of retries of one targeted relist: [`STEADY_RETRIES`] at the base delay,
/// then doubling up to [`MAX_RETRY_DELAY`], about 4.3 s in all. A runtime catching up after
/// its own restart can lag a trigger by seconds; past that, the next full relist catches up.
pub const DEFAULT_MAX_RETRIES: u32 = 20;

/// Longest wait between two retries.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(1);

/// The wait before retry number `attempt + 1`: steady first, then doubling, capped. No
/// jitter: the scheduler is a pure function of its inputs.
fn retry_delay(base: Duration, attempt: u32) -> Duration {
    Exponential {
        base,
        cap: MAX_RETRY_DELAY,
        steady: STEADY_RETRIES,
    }
    .delay(attempt)
}

/// Scheduler settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    pub full_relist_period: Duration,
    pub retry_base: Duration,
    pub max_retries: u32,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            full_relist_period: DEFAULT_RELIST_PERIOD,
            retry_base: DEFAULT_RETRY_BASE,
            max_retries: DEFAULT_MAX_RETRIES,
        }
    }
}

/// Targeted relists due at once from which on one full listing serves them all: a listing
/// filtered by pod costs the runtime a scan of every container anyway (containerd's CRI store
/// filters in memory), and under churn one relist at a time per target fell seconds behind.
pub const BATCH_TARGETS: usize = 3;

/// When a pod whose state only the task layer confirmed is read again, for the CRI store's
/// status and reason: containerd's CRI plugin updates its store some 40 ms after the exit
/// (60 ms under load), after its cleanup. Twice at most; past that, the next full relist.
pub const SETTLE_DELAYS: [Duration; 2] = [Duration::from_millis(100), Duration::from_secs(1)];

/// One relist to run now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub scope: Scope,
    pub hints: Hints,
    /// The scope must be read even if the runtime's records answer every hint: the periodic
    /// full relist, or one asked for. A full batch of due targets ([`BATCH_TARGETS`]) is
    /// read only for what the records leave; the driver says whether it was
    /// ([`RelistScheduler::full_relisted`]).
    pub required: bool,
    /// Retries so far of each target's hint (absent: none).
    attempts: BTreeMap<Target, u32>,
    /// For a settling read ([`RelistScheduler::settle`]): how many settling reads of the pod
    /// this one makes, from 1.
    pub settle: Option<u32>,
    /// Copies of the hints still queued (not due yet, or in their kernel grace) for targets
    /// this batch reads: a change it finds that one of them saw first is credited to its
    /// sources ([`crate::pleg::provenance::credit`]). They stay queued as they were: once
    /// this batch commits the change, their own relist finds nothing new to announce, and
    /// what they observed would reach no consumer.
    pub riders: Hints,
}

impl Batch {
    /// The same batch carrying `hints` instead (those of its targets to read again).
    pub fn with_hints(&self, hints: Hints) -> Self {
        Self {
            scope: self.scope.clone(),
            hints,
            required: self.required,
            attempts: self.attempts.clone(),
            settle: self.settle,
            riders: Hints::default(),
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
}

/// A kernel hint about one container, waiting for the runtime's own event about it.
#[derive(Debug)]
struct Waiting {
    /// When its grace ends.
    due: Instant,
    /// Where it goes then: its pod, or the container if no relist has seen it yet.
    target: Target,
    hint: Hint,
}

/// A pod's settling read to come.
#[derive(Debug)]
struct Settling {
    due: Instant,
    /// Which settling read of the pod it is, from 1.
    count: u32,
}

/// Coalesces triggers into batches; see the module doc.
#[derive(Debug)]
pub struct RelistScheduler {
    config: SchedulerConfig,
    pending: BTreeMap<Target, Pending>,
    /// Kernel hints in their grace, by container ([`RelistScheduler::set_kernel_grace`]).
    waiting: BTreeMap<ContainerId, Waiting>,
    /// Pods to read once the CRI store has caught up with the task layer. Apart from
    /// `pending`: a settling read needs a reading, and merged into a pod's hints it made every
    /// trigger of the pod read, records or not.
    settling: BTreeMap<PodUid, Settling>,
    /// Start of the last full relist handed out; `None` before the first.
    last_full: Option<Instant>,
    /// When the next periodic full relist is due.
    periodic_due: Instant,
    /// Earliest full relist asked for out of period (sign of loss), if any.
    full_requested: Option<Instant>,
    /// How long a kernel trigger waits for the runtime's own event (zero: not at all).
    kernel_grace: Duration,
    /// A due retry was passed over for a fresh trigger: the next turn is a retry's.
    retry_passed_over: bool,
}

impl RelistScheduler {
    /// A scheduler whose first full relist is due at `now`.
    pub fn new(config: SchedulerConfig, now: Instant) -> Self {
        Self {
            config,
            pending: BTreeMap::new(),
            waiting: BTreeMap::new(),
            settling: BTreeMap::new(),
            last_full: None,
            periodic_due: now,
            full_requested: None,
            kernel_grace: Duration::ZERO,
            retry_passed_over: false,
        }
    }

    /// Queues a trigger, due at `now`. `pod_of` maps a container to its pod when a relist has
    /// seen it, so container triggers coalesce with the rest of their pod's.
    pub fn push(
        &mut self,
        trigger: Trigger,
        now: Instant,
        pod_of: impl FnOnce(&ContainerId) -> Option<PodUid>,
    ) {
        let Trigger {
            scope,
            source,
            observed_at,
            observations,
        } = trigger;
        let (target, container, observations) = match scope {
            Scope::All => {
                debug!(?source, "node-wide trigger: full relist requested");
                self.request_full_relist(now);
                return;
            }
            Scope::Pod(uid) => {
                if !observations.is_empty() {
                    debug!(%uid, ?observations, "pod-wide observations dropped: no container to attach them to");
                }
                (Target::Pod(uid), None, Vec::new())
            }
            Scope::Container(id) => {
                let observations = observations.into_iter().map(|o| (id.clone(), o)).collect();
                let target = match pod_of(&id) {
                    Some(uid) => Target::Pod(uid),
                    None => Target::Container(id.clone()),
                };
                (target, Some(id), observations)
            }
        };
        let hint = Hint::seen(source, observed_at, observations);
        if source != TriggerSource::Ebpf {
            // The runtime's own event: the kernel's hints it answers ride along.
            for waited in self.answered_waits(&target, container.as_ref()) {
                self.enqueue(target.clone(), waited.hint, now, 0);
            }
            self.enqueue(target, hint, now, 0);
            return;
        }
        let due = now + self.kernel_grace;
        match container {
            Some(id) if !self.kernel_grace.is_zero() => self.wait(id, target, hint, due),
            _ => self.enqueue(target, hint, due, 0),
        }
    }

    /// Holds a kernel hint about `container` for its grace, apart from `pending`: merged into
    /// its pod's pending relist, the runtime's event about another container of the pod (a
    /// start beside a death) ran it at once, before containerd had recorded the death, and
    /// the read found nothing and was retried (churn bench: a quarter more runtime calls).
    fn wait(&mut self, container: ContainerId, target: Target, hint: Hint, due: Instant) {
        match self.waiting.get_mut(&container) {
            Some(waiting) => {
                waiting.hint.merge(hint);
                waiting.due = waiting.due.min(due);
                waiting.target = target;
            }
            None => {
                self.waiting
                    .insert(container, Waiting { due, target, hint });
            }
        }
    }

    /// The kernel hints waiting for a runtime event about `container` (a container's event),
    /// or about any container of `target` (a pod's event), taken out.
    fn answered_waits(&mut self, target: &Target, container: Option<&ContainerId>) -> Vec<Waiting> {
        let answered: Vec<ContainerId> = match container {
            Some(id) => self
                .waiting
                .contains_key(id)
                .then(|| id.clone())
                .into_iter()
                .collect(),
            None => self
                .waiting
                .iter()
                .filter(|(_, w)| w.target == *target)
                .map(|(id, _)| id.clone())
                .collect(),
        };
        answered
            .iter()
            .filter_map(|id| self.waiting.remove(id))
            .collect()
    }

    /// Moves the kernel hints whose grace ended by `now` (all of them: `None`) to `pending`.
    fn end_waits(&mut self, now: Option<Instant>) {
        let ended: Vec<ContainerId> = self
            .waiting
            .iter()
            .filter(|(_, w)| now.is_none_or(|now| w.due <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ended {
            if let Some(Waiting { due, target, hint }) = self.waiting.remove(&id) {
                self.enqueue(target, hint, due, 0);
            }
        }
    }

    /// Makes kernel triggers from now on wait `grace` for the runtime's own event before their
    /// relist ([`DEFAULT_KERNEL_GRACE`] while the runtime's event stream is connected, zero
    /// otherwise). A runtime event for the same pod merges with the waiting trigger and runs
    /// at once.
    pub fn set_kernel_grace(&mut self, grace: Duration) {
        self.kernel_grace = grace;
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

    /// The next relist due at `now`, if any: a full relist (carrying every pending hint) first,
    /// else the targeted relist due the earliest.
    pub fn next_due(&mut self, now: Instant) -> Option<Batch> {
        let mut batch = self.next_batch(now)?;
        batch.riders = self.riders(&batch.scope);
        Some(batch)
    }

    /// The hints queued for targets `scope` covers, copied (see [`Batch::riders`]).
    fn riders(&self, scope: &Scope) -> Hints {
        let covered = |target: &Target| match (scope, target) {
            (Scope::All, _) => true,
            (Scope::Pod(uid), Target::Pod(of)) => uid == of,
            (Scope::Container(id), Target::Container(of)) => id == of,
            _ => false,
        };
        let queued = self.pending.iter().map(|(target, p)| (target, &p.hint));
        let waiting = self.waiting.values().map(|w| (&w.target, &w.hint));
        queued
            .chain(waiting)
            .filter(|(target, _)| covered(target))
            .map(|(target, hint)| (target.clone(), hint.clone()))
            .collect()
    }

    fn next_batch(&mut self, now: Instant) -> Option<Batch> {
        if self.full_relist_due(now) {
            // The node is read whole: the kernel's hints still waiting are read with it.
            self.end_waits(None);
            let every: Vec<Target> = self.pending.keys().cloned().collect();
            self.full_relisted(now);
            return Some(self.full_batch(every, true));
        }
        self.end_waits(Some(now));
        let due: Vec<Target> = self
            .pending
            .iter()
            .filter(|(_, p)| p.due <= now)
            .map(|(target, _)| target.clone())
            .collect();
        if due.len() >= BATCH_TARGETS {
            return Some(self.full_batch(due, false));
        }
        // Fresh triggers before retries, each in due order: a retry waits on a runtime that
        // lags, a fresh trigger is news. Under churn, the due retries of many targets otherwise
        // keep a new trigger waiting behind them for as long as a short-lived container lives.
        // But a due retry is passed over once at most: the kernel's hints come in a steady
        // stream under churn, and a retry starved behind them for a second (a death the CRI
        // store had not shown yet) read a container already removed, its exit code gone.
        let earliest = |retry: bool| {
            self.pending
                .iter()
                .filter(|(_, p)| p.due <= now && (p.retries > 0) == retry)
                .min_by_key(|(_, p)| p.due)
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
        let mut hints = Hints::default();
        let scope = target.scope();
        hints.insert(target.clone(), pending.hint);
        Some(Batch {
            scope,
            hints,
            required: false,
            attempts: BTreeMap::from([(target, pending.retries)]),
            settle: None,
            riders: Hints::default(),
        })
    }

    /// The settling read due the earliest at `now`, if any: after every trigger and retry.
    fn next_settling(&mut self, now: Instant) -> Option<Batch> {
        let (uid, _) = self
            .settling
            .iter()
            .filter(|(_, s)| s.due <= now)
            .min_by_key(|(_, s)| s.due)?;
        let uid = uid.clone();
        let settling = self.settling.remove(&uid)?;
        Some(Batch {
            scope: Scope::Pod(uid),
            hints: Hints::default(),
            required: true,
            attempts: BTreeMap::new(),
            settle: Some(settling.count),
            riders: Hints::default(),
        })
    }

    /// A full relist ran at `now`: the next periodic one is due a period after it.
    pub fn full_relisted(&mut self, now: Instant) {
        self.last_full = Some(now);
        self.periodic_due = now + self.config.full_relist_period;
        self.full_requested = None;
    }

    /// A full relist carrying the hints of `targets` (each with its retries so far).
    fn full_batch(&mut self, targets: Vec<Target>, required: bool) -> Batch {
        let mut hints = Hints::default();
        let mut attempts = BTreeMap::new();
        for target in targets {
            if let Some(pending) = self.pending.remove(&target) {
                attempts.insert(target.clone(), pending.retries);
                hints.insert(target, pending.hint);
            }
        }
        Batch {
            scope: Scope::All,
            hints,
            required,
            attempts,
            settle: None,
            riders: Hints::default(),
        }
    }

    /// When [`Self::next_due`] will next have something (the next full relist at the latest).
    pub fn next_deadline(&self) -> Instant {
        self.pending
            .values()
            .map(|p| p.due)
            .chain(self.waiting.values().map(|w| w.due))
            .chain(self.settling.values().map(|s| s.due))
            .fold(self.full_deadline(), Instant::min)
    }

    /// Requeues the hints of a batch (full or targeted) the runtime did not reflect yet, each
    /// target after its own exponential backoff; new triggers for the same target merge with
    /// it. Targets whose retries are spent are handed back.
    pub fn retry(&mut self, batch: Batch, now: Instant) -> Result<(), Exhausted> {
        let mut exhausted = Exhausted {
            attempts: 0,
            hints: Hints::default(),
        };
        for (target, hint) in batch.hints {
            let retries = batch.attempts.get(&target).copied().unwrap_or_default();
            if retries >= self.config.max_retries {
                exhausted.attempts = exhausted.attempts.max(retries);
                exhausted.hints.insert(target, hint);
                continue;
            }
            let delay = retry_delay(self.config.retry_base, retries);
            self.enqueue(target, hint, now + delay, retries + 1);
        }
        if exhausted.hints.is_empty() {
            Ok(())
        } else {
            Err(exhausted)
        }
    }

    /// Queues a read of pod `uid` for the CRI store's status and reason once it has caught
    /// up with the task layer ([`SETTLE_DELAYS`]); `batch` found it still behind. One already
    /// queued stands. Past the last delay the next full relist reads it: `false`.
    pub fn settle(&mut self, batch: &Batch, uid: PodUid, now: Instant) -> bool {
        if self.settling.contains_key(&uid) {
            return true;
        }
        let done = batch.settle.unwrap_or(0);
        let Some(delay) = SETTLE_DELAYS.get(done as usize) else {
            return false;
        };
        let count = done + 1;
        self.settling.insert(
            uid,
            Settling {
                due: now + *delay,
                count,
            },
        );
        true
    }

    /// A reading of pod `uid` found its CRI store caught up: no settling read is needed.
    pub fn settled(&mut self, uid: &PodUid) {
        self.settling.remove(uid);
    }

    fn enqueue(&mut self, target: Target, hint: Hint, due: Instant, retries: u32) {
        match self.pending.get_mut(&target) {
            Some(pending) => {
                pending.hint.merge(hint);
                pending.due = pending.due.min(due);
                // A new trigger for a target whose older hint is still being read again must
                // not inherit that hint's spent budget.
                pending.retries = pending.retries.min(retries);
            }
            None => {
                self.pending.insert(target, Pending { due, retries, hint });
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
mod tests {
    use std::{collections::BTreeSet, time::SystemTime};

    use super::*;
    use crate::pleg::event::{Observation, ObservationKind, TriggerSource};

    const MS: Duration = Duration::from_millis(1);

    /// The most retries of any of a batch's targets (0 for first runs).
    fn attempt(batch: &Batch) -> u32 {
        batch.attempts.values().copied().max().unwrap_or(0)
    }

    fn uid(s: &str) -> PodUid {
        PodUid(s.to_owned())
    }

    fn cid(s: &str) -> ContainerId {
        ContainerId(s.to_owned())
    }

    fn trigger(scope: Scope, source: TriggerSource, at_secs: u64) -> Trigger {
        Trigger {
            scope,
            source,
            observed_at: SystemTime::UNIX_EPOCH + Duration::from_secs(at_secs),
            observations: Vec::new(),
        }
    }

    fn exit_code(source: TriggerSource, code: i32) -> Observation {
        Observation {
            source,
            kind: ObservationKind::ExitCode(code),
        }
    }

    fn no_index(_: &ContainerId) -> Option<PodUid> {
        None
    }

    /// A scheduler that has just run its first full relist at `t0`.
    fn after_first_full(t0: Instant) -> RelistScheduler {
        let mut scheduler = RelistScheduler::new(SchedulerConfig::default(), t0);
        let first = scheduler.next_due(t0).expect("first full relist");
        assert_eq!(first.scope, Scope::All);
        scheduler
    }

    /// A scheduler past its first full relist, the next an hour away, with one trigger from
    /// `source` for pod `p` pushed at `t0`.
    fn one_pod_trigger(t0: Instant, source: TriggerSource) -> RelistScheduler {
        let mut scheduler = after_first_full(t0);
        scheduler.set_full_relist_period(Duration::from_secs(3600));
        scheduler.push(trigger(Scope::Pod(uid("p")), source, 1), t0, no_index);
        scheduler
    }

    #[test]
    fn a_batch_lends_the_hints_queued_for_what_it_reads_and_leaves_them_queued() {
        let t0 = Instant::now();
        let mut scheduler = after_first_full(t0);
        scheduler.set_full_relist_period(Duration::from_secs(3600));
        // Pod q's hint, read once and not reflected yet: queued for its retry.
        scheduler.push(
            trigger(Scope::Pod(uid("q")), TriggerSource::Ebpf, 1),
            t0,
            no_index,
        );
        let first = scheduler.next_due(t0).expect("q's first run");
        assert!(first.riders.is_empty(), "{first:?}");
        scheduler.retry(first, t0).expect("retry allowed");
        let retry_due = scheduler.next_deadline();
        assert!(retry_due > t0);
        // Three other pods due at once: one full listing serves them, and reads q too.
        for pod in ["a", "b", "c"] {
            scheduler.push(
                trigger(Scope::Pod(uid(pod)), TriggerSource::Ebpf, 2),
                t0,
                no_index,
            );
        }
        let batch = scheduler.next_due(t0).expect("the three at once");
        assert_eq!(batch.scope, Scope::All);
        let targets = |hints: &Hints| hints.targets().cloned().collect::<Vec<_>>();
        assert_eq!(targets(&batch.riders), [Target::Pod(uid("q"))]);
        assert!(!targets(&batch.hints).contains(&Target::Pod(uid("q"))));
        // q's retry is still queued as it was: due when it was, one retry spent.
        assert_eq!(scheduler.next_deadline(), retry_due);
        let retry = scheduler.next_due(retry_due).expect("q's retry");
        assert_eq!((&retry.scope, attempt(&retry)), (&Scope::Pod(uid("q")), 1));
        assert!(retry.riders.is_empty());
    }

    #[test]
    fn full_relist_is_due_at_once_then_every_period() {
        let t0 = Instant::now();
        let mut scheduler = after_first_full(t0);
        assert_eq!(scheduler.next_due(t0), None);
        assert_eq!(scheduler.next_deadline(), t0 + DEFAULT_RELIST_PERIOD);
        assert!(!scheduler.full_relist_due(t0 + DEFAULT_RELIST_PERIOD - MS));
        let t1 = t0 + DEFAULT_RELIST_PERIOD;
        assert!(scheduler.full_relist_due(t1));
        assert_eq!(scheduler.next_due(t1).map(|b| b.scope), Some(Scope::All));
        assert_eq!(scheduler.next_deadline(), t1 + DEFAULT_RELIST_PERIOD);
    }

    #[test]
    fn period_can_change_at_run_time() {
        let t0 = Instant::now();
        let mut scheduler = after_first_full(t0);
        scheduler.set_full_relist_period(Duration::from_secs(30));
        assert_eq!(scheduler.next_deadline(), t0 + Duration::from_secs(30));
        assert_eq!(scheduler.next_due(t0 + Duration::from_secs(29)), None);
        scheduler.set_full_relist_period(Duration::from_millis(500));
        assert!(scheduler.full_relist_due(t0 + Duration::from_millis(500)));
    }

    /// While the runtime's event stream is connected, a kernel trigger waits the grace for the
    /// runtime's own event, which runs at once and carries the kernel's hint along; without
    /// one, the kernel's trigger runs when the grace ends; with no grace, at once.
    #[test]
    fn kernel_triggers_wait_the_grace_for_the_runtimes_event() {
        let t0 = Instant::now();
        let grace = 20 * MS;
        let kernel = || {
            let mut t = trigger(Scope::Pod(uid("p")), TriggerSource::Ebpf, 1);
            t.scope = Scope::Container(cid("c"));
            t.observations = vec![exit_code(TriggerSource::Ebpf, 137)];
            t
        };
        let pod_of = |_: &ContainerId| Some(uid("p"));

        let mut scheduler = one_pod_trigger(t0, TriggerSource::Relist);
        scheduler.next_due(t0).expect("the setup's trigger");
        scheduler.set_kernel_grace(grace);
        scheduler.push(kernel(), t0, pod_of);
        assert_eq!(scheduler.next_due(t0 + grace - MS), None);
        scheduler.push(
            trigger(Scope::Pod(uid("p")), TriggerSource::Containerd, 2),
            t0 + 5 * MS,
            no_index,
        );
        let batch = scheduler
            .next_due(t0 + 5 * MS)
            .expect("the runtime's event runs at once");
        assert_eq!(
            batch.hints.sources(),
            BTreeSet::from([TriggerSource::Ebpf, TriggerSource::Containerd])
        );

        scheduler.push(kernel(), t0, pod_of);
        assert_eq!(scheduler.next_deadline(), t0 + grace);
        assert!(
            scheduler.next_due(t0 + grace).is_some(),
            "alone, after the grace"
        );

        scheduler.set_kernel_grace(Duration::ZERO);
        scheduler.push(kernel(), t0, pod_of);
        assert!(scheduler.next_due(t0).is_some(), "no grace: at once");
    }

    /// The runtime's event about one container of a pod leaves the kernel's hint about another
    /// container of the pod waiting: read with it, before the runtime had recorded that
    /// other change, the read found nothing and was retried.
    #[test]
    fn a_kernel_hint_waits_for_the_runtimes_event_about_its_own_container() {
        let t0 = Instant::now();
        let grace = 20 * MS;
        let in_pod = |_: &ContainerId| Some(uid("p"));
        let container = |id: &str, source| {
            let mut t = trigger(Scope::Container(cid(id)), source, 1);
            t.observations = vec![exit_code(source, 137)];
            t
        };
        let mut scheduler = after_first_full(t0);
        scheduler.set_kernel_grace(grace);
        scheduler.push(container("c1", TriggerSource::Ebpf), t0, in_pod);

        scheduler.push(container("c2", TriggerSource::Containerd), t0 + MS, in_pod);
        let other = scheduler
            .next_due(t0 + MS)
            .expect("c2's event runs at once");
        assert_eq!(
            other
                .hints
                .observations()
                .map(|(id, _)| id)
                .collect::<Vec<_>>(),
            [&cid("c2")],
            "without c1's kernel hint"
        );
        assert_eq!(scheduler.next_deadline(), t0 + grace, "c1's still waits");

        scheduler.push(
            container("c1", TriggerSource::Containerd),
            t0 + 5 * MS,
            in_pod,
        );
        let own = scheduler
            .next_due(t0 + 5 * MS)
            .expect("c1's event runs at once");
        assert_eq!(
            own.hints.sources(),
            BTreeSet::from([TriggerSource::Ebpf, TriggerSource::Containerd]),
            "with c1's kernel hint"
        );
        assert_eq!(scheduler.next_due(t0 + grace), None, "nothing left waiting");

        scheduler.push(container("c3", TriggerSource::Ebpf), t0, in_pod);
        assert_eq!(scheduler.next_due(t0 + grace - MS), None);
        let alone = scheduler
            .next_due(t0 + grace)
            .expect("alone, after the grace");
        assert_eq!(alone.scope, Scope::Pod(uid("p")));
    }

    #[test]
    fn triggers_coalesce_per_pod() {
        let t0 = Instant::now();
        let mut scheduler = after_first_full(t0);
        let mut from_kernel = trigger(Scope::Container(cid("c1")), TriggerSource::Ebpf, 5);
        from_kernel.observations = vec![exit_code(TriggerSource::Ebpf, 137)];
        scheduler.push(from_kernel, t0, |c| (c == &cid("c1")).then(|| uid("p")));
        scheduler.push(
            trigger(Scope::Pod(uid("p")), TriggerSource::Containerd, 3),
            t0,
            no_index,
        );
        scheduler.push(
            trigger(Scope::Pod(uid("q")), TriggerSource::Containerd, 4),
            t0,
            no_index,
        );

        let batch = scheduler.next_due(t0).expect("a batch for p");
        assert_eq!(batch.scope, Scope::Pod(uid("p")));
        assert_eq!(attempt(&batch), 0);
        let hint = batch
            .hints
            .for_container(&uid("p"), &cid("c1"))
            .expect("hint for c1");
        assert_eq!(
            hint.sources,
            BTreeSet::from([TriggerSource::Ebpf, TriggerSource::Containerd])
        );
        assert_eq!(
            hint.observed_at,
            SystemTime::UNIX_EPOCH + Duration::from_secs(3)
        );
        assert_eq!(
            hint.observations,
            [(cid("c1"), exit_code(TriggerSource::Ebpf, 137))]
        );
        // Another container of the pod shares the sources, not the observations.
        let other = batch
            .hints
            .for_container(&uid("p"), &cid("c2"))
            .expect("pod hint");
        assert!(other.observations.is_empty());

        assert_eq!(
            scheduler.next_due(t0).map(|b| b.scope),
            Some(Scope::Pod(uid("q")))
        );
        assert_eq!(scheduler.next_due(t0), None);
    }

    #[test]
    fn unknown_container_is_relisted_by_container() {
        let t0 = Instant::now();
        let mut scheduler = after_first_full(t0);
        scheduler.push(
            trigger(Scope::Container(cid("new")), TriggerSource::CriEvents, 1),
            t0,
            no_index,
        );
        let batch = scheduler.next_due(t0).expect("batch");
        assert_eq!(batch.scope, Scope::Container(cid("new")));
        assert!(
            batch
                .hints
                .for_container(&uid("any"), &cid("new"))
                .is_some()
        );
    }

    #[test]
    fn full_relist_subsumes_targeted_ones() {
        let t0 = Instant::now();
        let mut scheduler = after_first_full(t0);
        scheduler.push(
            trigger(Scope::Pod(uid("p")), TriggerSource::Ebpf, 1),
            t0,
            no_index,
        );
        scheduler.push(
            trigger(Scope::All, TriggerSource::Containerd, 2),
            t0,
            no_index,
        );
        scheduler.push(
            trigger(Scope::Container(cid("c")), TriggerSource::CriEvents, 3),
            t0,
            no_index,
        );
        let batch = scheduler.next_due(t0).expect("full relist");
        assert_eq!(batch.scope, Scope::All);
        assert!(batch.hints.for_container(&uid("p"), &cid("x")).is_some());
        assert!(
            batch
                .hints
                .for_container(&uid("other"), &cid("c"))
                .is_some()
        );
        assert_eq!(scheduler.next_due(t0), None);
    }

    #[test]
    fn pod_wide_observations_are_dropped() {
        let t0 = Instant::now();
        let mut scheduler = after_first_full(t0);
        let mut pod_trigger = trigger(Scope::Pod(uid("p")), TriggerSource::Ebpf, 1);
        pod_trigger.observations = vec![exit_code(TriggerSource::Ebpf, 1)];
        scheduler.push(pod_trigger, t0, no_index);
        let batch = scheduler.next_due(t0).expect("batch");
        assert_eq!(batch.hints.observations().count(), 0);
    }

    #[test]
    fn retry_backs_off_exponentially_then_gives_up() {
        let t0 = Instant::now();
        let mut scheduler = one_pod_trigger(t0, TriggerSource::Containerd);
        let mut now = t0;
        let mut batch = scheduler.next_due(now).expect("first run");
        // 5 ms ten times, then doubling, capped at MAX_RETRY_DELAY.
        let delays = [5; 10]
            .into_iter()
            .chain([10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        for (retries, delay_ms) in delays.enumerate() {
            assert_eq!(attempt(&batch), retries as u32);
            scheduler.retry(batch, now).expect("retry allowed");
            assert_eq!(scheduler.next_deadline(), now + delay_ms * MS);
            assert_eq!(scheduler.next_due(now + (delay_ms - 1) * MS), None);
            now += delay_ms * MS;
            batch = scheduler.next_due(now).expect("retry due");
            assert_eq!(batch.scope, Scope::Pod(uid("p")));
        }
        let hints = batch.hints.clone();
        assert_eq!(
            scheduler.retry(batch, now),
            Err(Exhausted {
                attempts: DEFAULT_MAX_RETRIES,
                hints
            })
        );
        assert_eq!(scheduler.next_deadline(), t0 + Duration::from_secs(3600));
    }

    #[test]
    fn a_new_trigger_gets_a_full_retry_budget_even_merged_into_an_old_one() {
        let t0 = Instant::now();
        let mut scheduler = one_pod_trigger(t0, TriggerSource::Ebpf);
        let mut batch = scheduler.next_due(t0).expect("first run");
        let mut now = t0;
        for _ in 0..DEFAULT_MAX_RETRIES - 1 {
            scheduler.retry(batch, now).expect("retry allowed");
            now = scheduler.next_deadline();
            batch = scheduler.next_due(now).expect("retry due");
        }
        // Nearly exhausted; a fresh trigger for the same pod arrives and merges.
        scheduler.retry(batch, now).expect("last retry allowed");
        scheduler.push(
            trigger(Scope::Pod(uid("p")), TriggerSource::Ebpf, 2),
            now,
            no_index,
        );
        let batch = scheduler.next_due(now).expect("fresh trigger runs at once");
        assert_eq!(attempt(&batch), 0);
    }

    #[test]
    fn a_new_trigger_during_backoff_runs_at_once_with_the_retry_merged() {
        let t0 = Instant::now();
        let mut scheduler = after_first_full(t0);
        scheduler.push(
            trigger(Scope::Pod(uid("p")), TriggerSource::Containerd, 1),
            t0,
            no_index,
        );
        let batch = scheduler.next_due(t0).expect("first run");
        scheduler.retry(batch, t0).expect("retry allowed");
        scheduler.push(
            trigger(Scope::Pod(uid("p")), TriggerSource::Ebpf, 2),
            t0,
            no_index,
        );
        let batch = scheduler.next_due(t0).expect("due at once");
        // The merged batch has the fresh trigger's full budget.
        assert_eq!(attempt(&batch), 0);
        let hint = batch
            .hints
            .for_container(&uid("p"), &cid("c"))
            .expect("hint");
        assert_eq!(
            hint.sources,
            BTreeSet::from([TriggerSource::Ebpf, TriggerSource::Containerd])
        );
    }

    /// A scheduler whose pod "lagging" ran at `t0` and is being retried.
    fn with_a_retry(t0: Instant) -> RelistScheduler {
        let mut scheduler = after_first_full(t0);
        scheduler.push(
            trigger(Scope::Pod(uid("lagging")), TriggerSource::Containerd, 1),
            t0,
            no_index,
        );
        let batch = scheduler.next_due(t0).expect("first run");
        scheduler.retry(batch, t0).expect("retry allowed");
        scheduler
    }

    #[test]
    fn a_fresh_trigger_runs_before_retries_due_earlier() {
        let t0 = Instant::now();
        let mut scheduler = with_a_retry(t0);
        let later = t0 + 50 * MS;
        scheduler.push(
            trigger(Scope::Pod(uid("fresh")), TriggerSource::Containerd, 2),
            later,
            no_index,
        );
        let first = scheduler.next_due(later).expect("both due");
        assert_eq!(first.scope, Scope::Pod(uid("fresh")));
        let second = scheduler.next_due(later).expect("the retry next");
        assert_eq!(second.scope, Scope::Pod(uid("lagging")));
        assert_eq!(attempt(&second), 1);
    }

    #[test]
    fn a_due_retry_is_passed_over_once_at_most() {
        let t0 = Instant::now();
        let mut scheduler = with_a_retry(t0);
        // Fresh triggers keep coming one at a time, fewer than a batch's worth due at once.
        let later = t0 + 50 * MS;
        let mut order = Vec::new();
        for (i, pod) in ["a", "b", "c"].into_iter().enumerate() {
            scheduler.push(
                trigger(Scope::Pod(uid(pod)), TriggerSource::Ebpf, 2 + i as u64),
                later,
                no_index,
            );
            order.push(scheduler.next_due(later).expect("due").scope);
        }
        order.extend(std::iter::from_fn(|| scheduler.next_due(later)).map(|b| b.scope));
        assert_eq!(
            order,
            ["a", "lagging", "b", "c"].map(|p| Scope::Pod(uid(p)))
        );
    }

    #[test]
    fn targets_due_together_share_one_full_relist_and_retry_each_on_its_own() {
        let t0 = Instant::now();
        let mut scheduler = after_first_full(t0);
        let push = |scheduler: &mut RelistScheduler, pod: &str, at: Instant| {
            scheduler.push(
                trigger(Scope::Pod(uid(pod)), TriggerSource::Containerd, 1),
                at,
                no_index,
            );
        };
        // Fewer than BATCH_TARGETS due: one targeted relist each.
        push(&mut scheduler, "a", t0);
        let a = scheduler.next_due(t0).expect("a due");
        assert_eq!(a.scope, Scope::Pod(uid("a")));
        scheduler.retry(a, t0).expect("a retried");

        let later = t0 + 50 * MS;
        push(&mut scheduler, "b", later);
        push(&mut scheduler, "c", later);
        let batch = scheduler.next_due(later).expect("three due");
        assert_eq!(batch.scope, Scope::All);
        assert_eq!(batch.hints.targets().count(), BATCH_TARGETS);
        assert_eq!(attempt(&batch), 1, "a's retry keeps its count");
        assert!(
            !batch.required,
            "read only for what the runtime's records leave"
        );
        assert_eq!(
            scheduler.full_deadline(),
            t0 + DEFAULT_RELIST_PERIOD,
            "not the period's full relist until it reads"
        );
        scheduler.full_relisted(later);
        assert_eq!(scheduler.full_deadline(), later + DEFAULT_RELIST_PERIOD);

        // Only what the reading did not reflect comes back, with its own count.
        let mut unreflected = batch.clone();
        unreflected.hints = batch
            .hints
            .clone()
            .into_iter()
            .filter(|(target, _)| *target != Target::Pod(uid("b")))
            .fold(Hints::default(), |mut hints, (target, hint)| {
                hints.insert(target, hint);
                hints
            });
        scheduler.retry(unreflected, later).expect("retried");
        let due = later + 10 * MS;
        let first = scheduler.next_due(due).expect("a, second retry");
        let second = scheduler.next_due(due).expect("c, first retry");
        assert_eq!(
            [
                (attempt(&first), first.scope),
                (attempt(&second), second.scope)
            ],
            [(2, Scope::Pod(uid("a"))), (1, Scope::Pod(uid("c")))]
        );
        assert_eq!(scheduler.next_due(due), None, "b was reflected");
    }

    #[test]
    fn requested_full_relist_is_due_before_the_period() {
        let t0 = Instant::now();
        let mut scheduler = after_first_full(t0);
        scheduler.request_full_relist(t0 + 5 * MS);
        assert_eq!(scheduler.next_deadline(), t0 + 5 * MS);
        assert_eq!(
            scheduler.next_due(t0 + 5 * MS).map(|b| b.scope),
            Some(Scope::All)
        );
        assert_eq!(
            scheduler.next_deadline(),
            t0 + 5 * MS + DEFAULT_RELIST_PERIOD
        );
    }

    #[test]
    fn a_pod_awaiting_the_cri_store_is_read_twice_at_most_then_left_to_the_full_relist() {
        let t0 = Instant::now();
        let mut scheduler = one_pod_trigger(t0, TriggerSource::Containerd);
        let mut batch = scheduler.next_due(t0).expect("first run");
        let mut now = t0;
        for (delay, count) in SETTLE_DELAYS.into_iter().zip(1..) {
            assert!(scheduler.settle(&batch, uid("p"), now));
            assert_eq!(scheduler.next_deadline(), now + delay);
            assert_eq!(scheduler.next_due(now + delay - MS), None, "not yet");
            now += delay;
            batch = scheduler.next_due(now).expect("the settling read");
            assert_eq!(
                (
                    &batch.scope,
                    batch.hints.is_empty(),
                    batch.required,
                    batch.settle
                ),
                (&Scope::Pod(uid("p")), true, true, Some(count))
            );
        }
        assert!(!scheduler.settle(&batch, uid("p"), now));
        assert_eq!(scheduler.next_due(now + SETTLE_DELAYS[1]), None);
    }

    /// A settling read neither merges with the pod's triggers (they stay answerable by the
    /// runtime's records) nor comes twice; a reading that found the store caught up drops it.
    #[test]
    fn a_settling_read_stands_apart_from_triggers_and_is_dropped_once_settled() {
        let t0 = Instant::now();
        let mut scheduler = one_pod_trigger(t0, TriggerSource::Containerd);
        let batch = scheduler.next_due(t0).expect("first run");
        assert!(scheduler.settle(&batch, uid("p"), t0));
        assert!(scheduler.settle(&batch, uid("p"), t0 + MS), "one stands");
        let mut exit = trigger(Scope::Container(cid("c")), TriggerSource::Containerd, 2);
        exit.observations = vec![exit_code(TriggerSource::Containerd, 137)];
        scheduler.push(exit, t0 + MS, |_| Some(uid("p")));
        let fresh = scheduler.next_due(t0 + MS).expect("the trigger, at once");
        assert_eq!((fresh.settle, fresh.required), (None, false));
        assert!(
            fresh.hints.iter().all(|(_, h)| !h.unspecific),
            "answerable by records: {fresh:?}"
        );
        let due = t0 + SETTLE_DELAYS[0];
        assert_eq!(scheduler.next_deadline(), due);
        scheduler.settled(&uid("p"));
        assert_eq!(scheduler.next_due(due), None);
    }
}
