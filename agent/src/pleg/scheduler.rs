//! When to relist what: turns a stream of [`Trigger`]s into relist batches.
//!
//! Pure bookkeeping; the driver owns the tasks and the timer. It pushes triggers as they come,
//! then loops on [`RelistScheduler::next_due`] until it yields nothing and sleeps until
//! [`RelistScheduler::next_deadline`] or the next trigger, whichever comes first.
//!
//! - Triggers coalesce per pod (a container trigger whose pod is known counts for its pod), so a
//!   burst of kernel and stream events about one pod costs one targeted relist.
//! - A due full relist subsumes every targeted one, and carries their hints along, so the events
//!   it finds are still credited to the sources that saw them first.
//! - A kernel trigger waits a short grace while the runtime's own event stream is connected
//!   (see [`RelistScheduler::set_kernel_grace`]): the runtime's event about the same change
//!   follows within milliseconds and answers it without a CRI read.
//! - A trigger can beat the runtime (containerd's exit event before CRI says exited); the driver
//!   hands such a batch back with [`RelistScheduler::retry`], which backs off exponentially a
//!   bounded number of times. After that, the periodic full relist is the safety net.

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

/// One relist to run now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub scope: Scope,
    pub hints: Hints,
    /// Retries so far (0 for a first run).
    pub attempt: u32,
}

/// Why a batch handed to [`RelistScheduler::retry`] was not requeued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RetryError {
    #[error("a full relist is not retried; the next period runs it again")]
    FullRelist,
    #[error("gave up after {attempts} retries; the next full relist will catch up")]
    Exhausted { attempts: u32 },
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
            let mut hints = Hints::default();
            for (target, pending) in std::mem::take(&mut self.pending) {
                hints.insert(target, pending.hint);
            }
            self.last_full = Some(now);
            self.periodic_due = now + self.config.full_relist_period;
            self.full_requested = None;
            return Some(Batch {
                scope: Scope::All,
                hints,
                attempt: 0,
            });
        }
        // Fresh triggers before retries, each in due order: a retry waits on a runtime that
        // lags, a fresh trigger is news. Under churn, the due retries of many targets (every
        // hint for a container CRI does not list yet, or any more, is retried for seconds)
        // otherwise keep a new trigger waiting behind them for as long as a short-lived
        // container lives, and the change it pointed at is gone before it is relisted.
        let target = self
            .pending
            .iter()
            .filter(|(_, p)| p.due <= now)
            .min_by_key(|(_, p)| (p.attempt > 0, p.due))
            .map(|(target, _)| target.clone())?;
        let pending = self.pending.remove(&target)?;
        let mut hints = Hints::default();
        let scope = target.scope();
        hints.insert(target, pending.hint);
        Some(Batch {
            scope,
            hints,
            attempt: pending.attempt,
        })
    }

    /// When [`Self::next_due`] will next have something (the next full relist at the latest).
    pub fn next_deadline(&self) -> Instant {
        self.pending
            .values()
            .map(|p| p.due)
            .fold(self.full_deadline(), Instant::min)
    }

    /// Requeues a targeted batch whose trigger the runtime did not reflect yet, after an
    /// exponential backoff. New triggers for the same target merge with it.
    pub fn retry(&mut self, batch: Batch, now: Instant) -> Result<(), RetryError> {
        if batch.scope == Scope::All {
            return Err(RetryError::FullRelist);
        }
        if batch.attempt >= self.config.max_retries {
            return Err(RetryError::Exhausted {
                attempts: batch.attempt,
            });
        }
        let delay = retry_delay(self.config.retry_base, batch.attempt);
        for (target, hint) in batch.hints {
            self.enqueue(target, hint, now + delay, batch.attempt + 1);
        }
        Ok(())
    }

    /// Requeues a targeted batch whose change is confirmed but whose pod another layer of the
    /// runtime still shows behind (the CRI store after the task service): on the doubling part
    /// of the schedule only, since that layer takes tens of milliseconds, and every recheck is
    /// a relist (under churn, the steady retries of many pods at once would crowd the loop).
    pub fn recheck(&mut self, mut batch: Batch, now: Instant) -> Result<(), RetryError> {
        batch.attempt = batch.attempt.max(STEADY_RETRIES);
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
        assert_eq!(batch.attempt, 0);
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
        for (attempt, delay_ms) in delays.enumerate() {
            assert_eq!(batch.attempt, attempt as u32);
            scheduler.retry(batch, now).expect("retry allowed");
            assert_eq!(scheduler.next_deadline(), now + delay_ms * MS);
            assert_eq!(scheduler.next_due(now + (delay_ms - 1) * MS), None);
            now += delay_ms * MS;
            batch = scheduler.next_due(now).expect("retry due");
            assert_eq!(batch.scope, Scope::Pod(uid("p")));
        }
        assert_eq!(
            scheduler.retry(batch, now),
            Err(RetryError::Exhausted {
                attempts: DEFAULT_MAX_RETRIES
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
        assert_eq!(batch.attempt, 0);
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
        assert_eq!(batch.attempt, 0);
        let hint = batch
            .hints
            .for_container(&uid("p"), &cid("c"))
            .expect("hint");
        assert_eq!(
            hint.sources,
            BTreeSet::from([TriggerSource::Ebpf, TriggerSource::Containerd])
        );
    }

    #[test]
    fn a_fresh_trigger_runs_before_retries_due_earlier() {
        let t0 = Instant::now();
        let mut scheduler = after_first_full(t0);
        scheduler.push(
            trigger(Scope::Pod(uid("lagging")), TriggerSource::Containerd, 1),
            t0,
            no_index,
        );
        let batch = scheduler.next_due(t0).expect("first run");
        scheduler.retry(batch, t0).expect("retry allowed");
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
        assert_eq!(second.attempt, 1);
    }

    #[test]
    fn full_relists_are_not_retried() {
        let t0 = Instant::now();
        let mut scheduler = RelistScheduler::new(SchedulerConfig::default(), t0);
        let batch = scheduler.next_due(t0).expect("full relist");
        assert_eq!(scheduler.retry(batch, t0), Err(RetryError::FullRelist));
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
        assert_eq!(batch.attempt, STEADY_RETRIES + 1);
    }
}
