//! The generator loop: feeds triggers from every source to the scheduler and runs the batches
//! it hands out until shut down (kubelet's `GenericPLEG.Start` + `Relist` ticker, with
//! targeted reads beside the periodic full relist). What a batch decides on what is known
//! (the runtime's records) is carried out at once; what it reads runs beside the other reads,
//! polled here, and is decided on when it is done, one at a time: the loop never waits on a
//! read while a trigger, another read's end or a deadline is due.

use std::{collections::BTreeMap, future::Future, pin::Pin, sync::Arc, time::Duration};

use futures::{StreamExt as _, stream::FuturesUnordered};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, trace, warn};

use crate::{
    base::metrics::Metrics,
    pleg::{
        decide::{
            hints::Hints,
            reconcile::Reread,
            scheduler::{Batch, CATCH_UP_LIMIT, Exhausted, RelistScheduler},
        },
        driver::{
            relist::{Begun, Finished, Read, ReadDone, RelistError, RelistOutcome, Relister},
            triggers::TriggerReceiver,
        },
        model::{
            event::NoticeKind,
            record::TaskRecord,
            runtime::Runtime,
            source::Source,
            trigger::{ObservationKind, Scope, Trigger},
        },
    },
};

/// How soon after a relist failed on a runtime error the node is read whole (again while the
/// runtime keeps failing: a failed listing costs little).
pub const FULL_RELIST_AFTER_ERROR: Duration = Duration::from_secs(1);

/// The longest the loop waits without turning, whatever is due later (the next full relist
/// can be minutes away): each turn is told ([`Generator::turns`]), so a loop that stops
/// turning for much longer than this is stuck, not idle.
pub const LONGEST_WAIT: Duration = Duration::from_secs(10);

/// What the daemon changes while the PLEG runs: the full relist period (adaptive: long while
/// push sources are healthy, short otherwise) and how long kernel triggers wait for the
/// runtime's own event ([`RelistScheduler::set_kernel_grace`]). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Tuning {
    pub period: watch::Sender<Duration>,
    pub kernel_grace: watch::Sender<Duration>,
}

/// The generator's end of [`Tuning`].
#[derive(Debug)]
pub struct Tuned {
    period: watch::Receiver<Duration>,
    kernel_grace: watch::Receiver<Duration>,
}

/// Tuning starting at `period` and no kernel grace.
pub fn tuning(period: Duration) -> (Tuning, Tuned) {
    let (period_tx, period) = watch::channel(period);
    let (grace_tx, kernel_grace) = watch::channel(Duration::ZERO);
    (
        Tuning {
            period: period_tx,
            kernel_grace: grace_tx,
        },
        Tuned {
            period,
            kernel_grace,
        },
    )
}

/// What a stopped generator hands back: the relister, whose reading is saved, and the hints of
/// every trigger not relisted yet (those of the reads cut short included), for the last relist
/// before saving.
pub struct Stopped<R> {
    pub relister: Relister<R>,
    pub pending: Hints,
}

/// The loop's state: the relister and the scheduler, fed by the trigger channel.
pub struct Generator<R> {
    pub relister: Relister<R>,
    pub scheduler: RelistScheduler,
    pub triggers: TriggerReceiver,
    pub tuned: Tuned,
    pub metrics: Metrics,
    /// When the loop last turned: set at each turn, at least every [`LONGEST_WAIT`]; dropped
    /// when the loop ends.
    pub turns: watch::Sender<Instant>,
}

/// A read in flight: the batch it serves and the read itself.
type Reading = Pin<Box<dyn Future<Output = (u64, Batch, ReadDone)> + Send>>;

/// A watched exit's answer as the runtime's record of it, and whether the kernel's ring was
/// read up to it since.
struct Answered {
    trigger: Trigger,
    ring_read: bool,
}

/// A watched exit to come (`None`: no exit to tell).
type ExitAnswer = Pin<Box<dyn Future<Output = Option<Answered>> + Send>>;

/// The reads in flight, and the hints each carries (for a stop that cuts them short); the
/// watched exits to come.
#[derive(Default)]
struct InFlight {
    reads: FuturesUnordered<Reading>,
    hints: BTreeMap<u64, Hints>,
    next: u64,
    exits: FuturesUnordered<ExitAnswer>,
}

impl InFlight {
    fn push(&mut self, batch: Batch, read: impl Future<Output = ReadDone> + Send + 'static) {
        let id = self.next;
        self.next += 1;
        self.hints.insert(id, batch.hints.clone());
        self.reads
            .push(Box::pin(async move { (id, batch, read.await) }));
    }

    /// Awaits the exits `relister` began watching, each answer to be told as containerd tells
    /// `/tasks/exit` ([`Generator::take_watched`]): the shim answers the watch as it reaps the
    /// init, apart from the queue its events wait in (one shim serves a pod's containers, and
    /// publishes one event at a time), so on a busy node the answer often comes first; either
    /// tells the death, the other is then answered by the record.
    fn watch_exits<R: Runtime>(&mut self, relister: &mut Relister<R>) {
        for (id, answer) in relister.take_exit_watches() {
            self.exits.push(Box::pin(async move {
                let TaskRecord::Exited { code, at } = answer.await? else {
                    return None;
                };
                let kind = ObservationKind::TaskExited { code, at };
                let trigger = Trigger::about(id, Source::Containerd, at, [kind]);
                Some(Answered {
                    trigger,
                    ring_read: false,
                })
            }));
        }
    }

    /// Adds to `queued` the hints the reads in flight carry about what `scope` covers.
    fn add_hints(&self, scope: &Scope, queued: &mut Hints) {
        for (target, hint) in self.hints.values().flat_map(Hints::iter) {
            if scope.covers(target) {
                queued.insert(target.clone(), hint.clone());
            }
        }
    }
}

impl<R: Runtime> Generator<R> {
    /// Runs until `shutdown` is cancelled, then hands the relister back with the triggers
    /// still pending ([`Stopped`]). Every event is handed to the relister's sink, which never
    /// blocks: no consumer can stall the relists or make them spin.
    pub async fn run(mut self, shutdown: CancellationToken) -> Stopped<R> {
        let mut in_flight = InFlight::default();
        while !shutdown.is_cancelled() {
            self.turns.send_replace(Instant::now());
            while let Ok(trigger) = self.triggers.triggers.try_recv() {
                self.accept(trigger);
            }
            // Those the kernel's triggers began ([`Relister::kernel_saw`]).
            in_flight.watch_exits(&mut self.relister);
            // What is due runs now, not through the timer: tokio's timer turns on millisecond
            // ticks, and a sleep until a deadline already past waited for the next one (half a
            // millisecond on average between containerd's `/tasks/exit` and the event).
            let now = Instant::now();
            while let Some(batch) = self.scheduler.next_due(now) {
                self.begin(batch, &mut in_flight);
            }
            if !self.wait(&shutdown, &mut in_flight).await {
                break;
            }
        }
        self.stopped(in_flight)
    }

    /// Hands a trigger to the scheduler. A death the runtime told as an OOM kill, whose
    /// account the kernel's ring has not handed over yet, waits for the ring's reader to catch
    /// up.
    fn accept(&mut self, trigger: Trigger) {
        trace!(scope = ?trigger.scope, source = ?trigger.source, observations = ?trigger.observations, "trigger");
        self.metrics.trigger(trigger.source.name());
        self.relister.kernel_saw(&trigger);
        let now = Instant::now();
        if let Some(id) = self.scheduler.push(trigger, now)
            && let Some(ask) = self.triggers.ask_catch_up()
        {
            debug!(container = %id, ask, "the runtime's word of an OOM kill waits for the kernel's account");
            self.scheduler.hold_for_kernel(id, ask, now);
        }
    }

    /// Takes a watched exit's answer. It comes apart from the shim's event queue, where
    /// containerd's `/tasks/oom` may still wait, and a death's reason follows containerd's
    /// word of an OOM kill (CRI's rule): an answer about a container the kernel's ring has not
    /// handed over yet waits for the ring's reader to catch up ([`CATCH_UP_LIMIT`] at most;
    /// the kernel's account of an OOM kill comes before the death), and one whose OOM kill the
    /// kernel accounted for and containerd has not told is left to `/tasks/exit`, which comes
    /// behind `/tasks/oom`.
    fn take_watched(&mut self, answered: Answered, in_flight: &mut InFlight) {
        let Answered { trigger, ring_read } = answered;
        let Scope::Container(id) = &trigger.scope else {
            return;
        };
        if !ring_read
            && self.scheduler.awaits_kernel(id)
            && let Some(ask) = self.triggers.ask_catch_up()
        {
            let caught_up = self.triggers.caught_up(ask);
            in_flight.exits.push(Box::pin(async move {
                let _ = tokio::time::timeout(CATCH_UP_LIMIT, caught_up).await;
                Some(Answered {
                    trigger,
                    ring_read: true,
                })
            }));
            return;
        }
        if self.scheduler.oom_untold(id) {
            debug!(container = %id, "a watched exit of an OOM kill containerd has not told: left to its /tasks/exit");
            return;
        }
        self.accept(trigger);
    }

    /// Waits for the next trigger, read done, deadline or change of tuning, or
    /// [`LONGEST_WAIT`]; `false` at shutdown.
    async fn wait(&mut self, shutdown: &CancellationToken, in_flight: &mut InFlight) -> bool {
        let longest = Instant::now() + LONGEST_WAIT;
        let deadline = self
            .scheduler
            .next_deadline()
            .map_or(longest, |deadline| deadline.min(longest));
        let Tuned {
            period,
            kernel_grace,
        } = &mut self.tuned;
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return false,
            // A read done before a trigger: each turn drains the triggers anyway, and a steady
            // stream of them must not keep what was read from being told.
            Some((id, batch, done)) = in_flight.reads.next(), if !in_flight.reads.is_empty() => {
                in_flight.hints.remove(&id);
                self.finish(batch, done, in_flight);
            }
            Some(trigger) = self.triggers.triggers.recv() => self.accept(trigger),
            // After the triggers (biased): what the kernel's reader handed over before it
            // answered an ask a watched exit waited for is taken in first.
            Some(answer) = in_flight.exits.next(), if !in_flight.exits.is_empty() => {
                if let Some(answered) = answer {
                    self.take_watched(answered, in_flight);
                }
            }
            // What the kernel's reader held is in the channel, ahead of its answer: the next
            // turn takes it in before anything due is handed out.
            Ok(()) = self.triggers.catch_up_done.changed() => {
                let answered = *self.triggers.catch_up_done.borrow_and_update();
                self.scheduler.kernel_caught_up(answered);
            }
            () = self.triggers.full_relist.notified() => {
                self.scheduler.request_full_relist(Instant::now());
            }
            Ok(()) = period.changed() => {
                let new = *period.borrow_and_update();
                info!(period = ?new, "full relist period changed");
                self.scheduler.set_full_relist_period(new);
            }
            Ok(()) = kernel_grace.changed() => {
                let grace = *kernel_grace.borrow_and_update();
                debug!(?grace, "kernel triggers' grace changed");
                self.scheduler.set_kernel_grace(grace);
                // A grace means the runtime's task events are on their way: a task status
                // need not be waited for long.
                self.relister.set_runtime_events(!grace.is_zero());
            }
            () = tokio::time::sleep_until(deadline) => {}
        }
        true
    }

    /// Begins a batch: what the runtime's records answer at once, what is left read beside the
    /// other reads (or, for a try of the records alone, handed back to wait for its read).
    fn begin(&mut self, batch: Batch, in_flight: &mut InFlight) {
        let begun = self.relister.begin(
            &batch.scope,
            &batch.hints,
            &batch.queued,
            batch.required,
            batch.read,
        );
        match begun {
            Begun::Answered(outcome) => {
                if batch.read {
                    self.scheduler.finished(&batch.scope);
                }
                self.metrics.answered_by_records();
                self.end(&batch, Ok(outcome));
            }
            Begun::Left { outcome, left } => {
                self.end(&batch, Ok(outcome));
                self.scheduler
                    .untried(batch.with_hints(left), Instant::now());
            }
            Begun::Read(job) => {
                in_flight.push(batch, job.run(Arc::clone(self.relister.runtime())));
            }
        }
        in_flight.watch_exits(&mut self.relister);
    }

    /// Ends a read: the relister decides on what it found (or plans its next step: the pods a
    /// listing showed moved on), and the scheduler hears how it went.
    fn finish(&mut self, batch: Batch, done: ReadDone, in_flight: &mut InFlight) {
        let started = done.job.started();
        // The hints of the other reads in flight count as queued: a full relist that finds a
        // container already over tells its start from the record a targeted read carries,
        // rather than commit it `unknown → exited` (a death alone) and leave that read
        // nothing to tell.
        let mut queued = self.scheduler.queued(&batch.scope);
        in_flight.add_hints(&batch.scope, &mut queued);
        match self.relister.finish(done, &queued) {
            Finished::More(job) => {
                in_flight.push(batch, job.run(Arc::clone(self.relister.runtime())));
            }
            Finished::Done(result) => {
                self.scheduler.finished(&batch.scope);
                let answered = self.count(&batch, &result, started);
                self.end(&batch, result);
                if answered {
                    self.triggers.runtime_answered(started);
                }
            }
        }
        in_flight.watch_exits(&mut self.relister);
    }

    /// Counts a read in the metrics; returns whether it read the runtime, answered.
    fn count(
        &self,
        batch: &Batch,
        result: &Result<RelistOutcome, RelistError>,
        started: Instant,
    ) -> bool {
        let full = match result {
            Ok(outcome) => outcome.read == Read::Node,
            Err(_) => batch.scope == Scope::Node,
        };
        self.metrics
            .relisted(full, started.into_std(), started.elapsed(), result.is_ok());
        result
            .as_ref()
            .is_ok_and(|outcome| outcome.failed_inspections == 0)
    }

    /// Hands a batch's outcome to the scheduler: which containers settled, which still await
    /// the CRI store, and what to read again.
    fn end(&mut self, batch: &Batch, result: Result<RelistOutcome, RelistError>) {
        let now = Instant::now();
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(RelistError::List(error)) => {
                // The hints it carried are retried, and the node is read whole once the runtime
                // answers again: what changed while it did not (a restart) may have no hint
                // left by then, and the periodic full relist can be minutes away (eBPF-only
                // mode). The soak lost a start that way: its hint's retries ran out during a
                // containerd restart. Health reports a runtime that keeps failing.
                warn!(scope = ?batch.scope, %error, "relist failed");
                self.scheduler
                    .request_full_relist(now + FULL_RELIST_AFTER_ERROR);
                self.retry(batch.with_hints(batch.hints.clone()), now);
                return;
            }
        };
        for id in &outcome.read_containers {
            if !outcome.settling.contains(id) {
                self.scheduler.settled(id);
            }
        }
        for id in outcome.settling {
            if !self.scheduler.settle(batch, id.clone(), now) {
                debug!(container = %id, "the CRI store still lags the task service; the next full relist reads it");
            }
        }
        let reread: Hints = outcome
            .reread
            .into_iter()
            .map(|Reread { scope, hint, .. }| (scope, hint))
            .collect();
        if batch.read && !reread.is_empty() {
            self.retry(batch.with_hints(reread), now);
        }
    }

    fn retry(&mut self, batch: Batch, now: Instant) {
        if let Err(exhausted) = self.scheduler.retry(batch, now) {
            self.report_unconfirmed(&exhausted);
        }
    }

    /// Never silent: a hint the runtime never confirmed is either a source's false alarm or a
    /// runtime that lags badly, and either is worth knowing.
    fn report_unconfirmed(&self, exhausted: &Exhausted) {
        let scopes: Vec<&Scope> = exhausted.hints.scopes().collect();
        let sources = exhausted.hints.sources();
        warn!(?scopes, ?sources, %exhausted, "hint not confirmed by the runtime");
        for source in sources {
            self.metrics.unconfirmed_hint(source.name());
        }
        if let Some(notices) = &self.triggers.notices {
            for (container, observation) in exhausted.hints.observations() {
                if observation.source == Source::Ebpf {
                    notices.tell(
                        NoticeKind::Unconfirmed,
                        container,
                        std::slice::from_ref(observation),
                        std::time::SystemTime::now(),
                    );
                }
            }
        }
    }

    /// What the generator hands back: with the relister, whatever was seen and not relisted
    /// yet (the triggers still in the channel, those the scheduler holds and those of the reads
    /// cut short) as one full relist's hints.
    fn stopped(mut self, in_flight: InFlight) -> Stopped<R> {
        let now = Instant::now();
        while let Ok(trigger) = self.triggers.triggers.try_recv() {
            self.scheduler.push(trigger, now);
        }
        let mut pending = Hints::default();
        for hints in in_flight.hints.into_values() {
            for (scope, hint) in hints.iter() {
                pending.insert(scope.clone(), hint.clone());
            }
        }
        for (scope, hint) in self.scheduler.drain().iter() {
            pending.insert(scope.clone(), hint.clone());
        }
        debug!(pending = pending.scopes().count(), "generator stopped");
        Stopped {
            relister: self.relister,
            pending,
        }
    }
}

#[cfg(test)]
mod tests;
