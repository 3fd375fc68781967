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
//!   follows within milliseconds and answers it without a CRI read.
//! - A trigger can beat the runtime (containerd's exit event before CRI says exited); the driver
//!   hands the hints the reading did not reflect back with [`RelistScheduler::retry`], which
//!   backs off exponentially a bounded number of times per target, whether the relist was
//!   targeted or full. After that, the periodic full relist is the safety net.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

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

/// One relist to run now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub scope: Scope,
    pub hints: Hints,
    /// Retries so far of each target's hint (absent: none).
    attempts: BTreeMap<Target, u32>,
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
    attempt: u32,
    hint: Hint,
}

/// Coalesces triggers into batches; see the module doc.
#[derive(Debug)]
pub struct RelistScheduler {
    config: SchedulerConfig,
    pending: BTreeMap<Target, Pending>,
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
        let (target, observations) = match scope {
            Scope::All => {
                debug!(?source, "node-wide trigger: full relist requested");
                self.request_full_relist(now);
                return;
            }
            Scope::Pod(uid) => {
                if !observations.is_empty() {
                    debug!(%uid, ?observations, "pod-wide observations dropped: no container to attach them to");
                }
                (Target::Pod(uid), Vec::new())
            }
            Scope::Container(id) => {
                let observations = observations.into_iter().map(|o| (id.clone(), o)).collect();
                let target = match pod_of(&id) {
                    Some(uid) => Target::Pod(uid),
                    None => Target::Container(id),
                };
                (target, observations)
            }
        };
        let due = match source {
            TriggerSource::Ebpf => now + self.kernel_grace,
            _ => now,
        };
        let hint = Hint {
            sources: BTreeSet::from([source]),
            observed_at,
            listing_needed: observations.is_empty(),
            observations,
        };
        self.enqueue(target, hint, due, 0);
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
        if self.full_relist_due(now) {
            let every: Vec<Target> = self.pending.keys().cloned().collect();
            return Some(self.full_batch(every, now));
        }
        let due: Vec<Target> = self
            .pending
            .iter()
            .filter(|(_, p)| p.due <= now)
            .map(|(target, _)| target.clone())
            .collect();
        if due.len() >= BATCH_TARGETS {
            return Some(self.full_batch(due, now));
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
                .filter(|(_, p)| p.due <= now && (p.attempt > 0) == retry)
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
            (None, retry) => retry?,
        };
        if self.pending.get(&target).is_some_and(|p| p.attempt > 0) {
            self.retry_passed_over = false;
        }
        let pending = self.pending.remove(&target)?;
        let mut hints = Hints::default();
        let scope = target.scope();
        hints.insert(target.clone(), pending.hint);
        Some(Batch {
            scope,
            hints,
            attempts: BTreeMap::from([(target, pending.attempt)]),
        })
    }

    /// A full relist carrying the hints of `targets` (each with its retries so far). It is a
    /// full relist in every way: the next periodic one is due a period after it.
    fn full_batch(&mut self, targets: Vec<Target>, now: Instant) -> Batch {
        let mut hints = Hints::default();
        let mut attempts = BTreeMap::new();
        for target in targets {
            if let Some(pending) = self.pending.remove(&target) {
                attempts.insert(target.clone(), pending.attempt);
                hints.insert(target, pending.hint);
            }
        }
        self.last_full = Some(now);
        self.periodic_due = now + self.config.full_relist_period;
        self.full_requested = None;
        Batch {
            scope: Scope::All,
            hints,
            attempts,
        }
    }

    /// When [`Self::next_due`] will next have something (the next full relist at the latest).
    pub fn next_deadline(&self) -> Instant {
        self.pending
            .values()
            .map(|p| p.due)
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
            let attempt = batch.attempts.get(&target).copied().unwrap_or(0);
            if attempt >= self.config.max_retries {
                exhausted.attempts = exhausted.attempts.max(attempt);
                exhausted.hints.insert(target, hint);
                continue;
            }
            let delay = retry_delay(self.config.retry_base, attempt);
            self.enqueue(target, hint, now + delay, attempt + 1);
        }
        if exhausted.hints.is_empty() {
            Ok(())
        } else {
            Err(exhausted)
        }
    }

    /// Requeues a targeted batch whose change is confirmed but whose pod another layer of the
    /// runtime still shows behind (the CRI store after the task service): on the doubling part
    /// of the schedule only, since that layer takes tens of milliseconds, and every recheck is
    /// a relist (under churn, the steady retries of many pods at once would crowd the loop).
    pub fn recheck(&mut self, mut batch: Batch, now: Instant) -> Result<(), Exhausted> {
        for target in batch.hints.targets() {
            let attempt = batch.attempts.entry(target.clone()).or_default();
            *attempt = (*attempt).max(STEADY_RETRIES);
        }
        self.retry(batch, now)
    }

    fn enqueue(&mut self, target: Target, hint: Hint, due: Instant, attempt: u32) {
        match self.pending.get_mut(&target) {
            Some(pending) => {
                pending.hint.merge(hint);
                pending.due = pending.due.min(due);
                // The freshest hint's budget: a new trigger for a pod whose older hint is still
                // being retried must not inherit that hint's spent attempts.
                pending.attempt = pending.attempt.min(attempt);
            }
            None => {
                self.pending.insert(target, Pending { due, attempt, hint });
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
    use std::time::SystemTime;

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
        assert_eq!(
            scheduler.next_deadline(),
            later + DEFAULT_RELIST_PERIOD,
            "it was the period's full relist"
        );

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
    fn a_recheck_skips_the_steady_retries() {
        let t0 = Instant::now();
        let mut scheduler = one_pod_trigger(t0, TriggerSource::Containerd);
        let batch = scheduler.next_due(t0).expect("first run");
        scheduler.recheck(batch, t0).expect("recheck allowed");
        // The first doubled delay, not the 5 ms steady one.
        assert_eq!(scheduler.next_deadline(), t0 + 10 * MS);
        let batch = scheduler.next_due(t0 + 10 * MS).expect("recheck due");
        assert_eq!(attempt(&batch), STEADY_RETRIES + 1);
    }
}
