//! When to relist what: turns a stream of [`Trigger`]s into relist batches.
//!
//! Pure bookkeeping; the driver owns the tasks and the timer. It pushes triggers as they come,
//! takes one batch from [`RelistScheduler::next_due`] per turn of its loop (the triggers that
//! came meanwhile first), and sleeps until [`RelistScheduler::next_deadline`] or the next
//! trigger, whichever comes first.
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
    base::backoff::Exponential,
    pleg::{
        decide::hints::{Hint, Hints},
        model::{
            record::{ContainerId, PodUid},
            trigger::{Scope, Trigger, TriggerSource},
        },
    },
};

/// How often a full relist runs when nothing else asks for one (kubelet's `relistPeriod`).
pub const DEFAULT_RELIST_PERIOD: Duration = Duration::from_secs(1);

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
    attempts: BTreeMap<Scope, u32>,
    /// For a settling read ([`RelistScheduler::settle`]): how many settling reads of the pod
    /// this one makes, from 1.
    pub settle: Option<u32>,
    /// Copies of the hints still queued (not due yet, or in their kernel grace) for targets
    /// this batch reads: a change it finds that one of them saw first is credited to its
    /// sources ([`crate::pleg::decide::provenance::credit`]). They stay queued as they were: once
    /// this batch commits the change, their own relist finds nothing new to announce, and
    /// what they observed would reach no consumer.
    pub queued: Hints,
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
}

/// A kernel hint about one container, waiting for the runtime's own event about it.
#[derive(Debug)]
struct Waiting {
    /// When its grace ends.
    due: Instant,
    /// Where it goes then: its pod, or the container if no relist has seen it yet.
    target: Scope,
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
    pending: BTreeMap<Scope, Pending>,
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
                (Scope::Pod(uid), None, Vec::new())
            }
            Scope::Container(id) => {
                let observations = observations.into_iter().map(|o| (id.clone(), o)).collect();
                let target = match pod_of(&id) {
                    Some(uid) => Scope::Pod(uid),
                    None => Scope::Container(id.clone()),
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
    fn wait(&mut self, container: ContainerId, target: Scope, hint: Hint, due: Instant) {
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
    fn answered_waits(&mut self, target: &Scope, container: Option<&ContainerId>) -> Vec<Waiting> {
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
        batch.queued = self.queued(&batch.scope);
        Some(batch)
    }

    /// The hints queued for targets `scope` covers, copied (see [`Batch::queued`]).
    fn queued(&self, scope: &Scope) -> Hints {
        let covered = |target: &Scope| match (scope, target) {
            (Scope::All, _) => true,
            (Scope::Pod(uid), Scope::Pod(of)) => uid == of,
            (Scope::Container(id), Scope::Container(of)) => id == of,
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
            let every: Vec<Scope> = self.pending.keys().cloned().collect();
            self.full_relisted(now);
            return Some(self.full_batch(every, true));
        }
        self.end_waits(Some(now));
        let due: Vec<Scope> = self
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
        let scope = target.clone();
        hints.insert(target.clone(), pending.hint);
        Some(Batch {
            scope,
            hints,
            required: false,
            attempts: BTreeMap::from([(target, pending.retries)]),
            settle: None,
            queued: Hints::default(),
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
            queued: Hints::default(),
        })
    }

    /// A full relist ran at `now`: the next periodic one is due a period after it.
    pub fn full_relisted(&mut self, now: Instant) {
        self.last_full = Some(now);
        self.periodic_due = now + self.config.full_relist_period;
        self.full_requested = None;
    }

    /// A full relist carrying the hints of `targets` (each with its retries so far).
    fn full_batch(&mut self, targets: Vec<Scope>, required: bool) -> Batch {
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
            queued: Hints::default(),
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

    fn enqueue(&mut self, target: Scope, hint: Hint, due: Instant, retries: u32) {
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
mod tests;
