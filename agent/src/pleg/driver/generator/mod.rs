//! The generator loop: feeds triggers from every source to the scheduler and runs the relists
//! it hands out, one at a time, until shut down (kubelet's `GenericPLEG.Start` + `Relist`
//! ticker, with targeted relists beside the periodic one).

use std::time::Duration;

use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, trace, warn};

use crate::{
    base::metrics::Metrics,
    pleg::{
        decide::{
            hints::{Hint, Hints},
            reconcile::Reread,
            scheduler::{Batch, Exhausted, RelistScheduler},
        },
        driver::{
            relist::{Read, RelistError, RelistOutcome, Relister},
            triggers::TriggerReceiver,
        },
        model::{
            event::NoticeKind,
            runtime::Runtime,
            trigger::{Scope, Trigger, TriggerSource},
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
/// every trigger not relisted yet, for the last relist before saving.
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

impl<R: Runtime> Generator<R> {
    /// Runs relists until `shutdown` is cancelled, then hands the relister back with the
    /// triggers still pending ([`Stopped`]). Every event is handed to the relister's sink,
    /// which never blocks: no consumer can stall the relists or make them spin.
    pub async fn run(mut self, shutdown: CancellationToken) -> Stopped<R> {
        while !shutdown.is_cancelled() {
            self.turns.send_replace(Instant::now());
            // One relist per turn of the loop, after the triggers that came meanwhile: under
            // churn many relists are due at once (retries of hints the runtime has not caught
            // up with), and draining them all first kept fresh triggers waiting in the channel
            // for up to a second, past the lives of short containers.
            while let Ok(trigger) = self.triggers.triggers.try_recv() {
                self.accept(trigger);
            }
            // What is due runs now, not through the timer: tokio's timer turns on millisecond
            // ticks, and a sleep until a deadline already past waited for the next one (half a
            // millisecond on average between containerd's `/tasks/exit` and the event).
            let now = Instant::now();
            if self.scheduler.next_deadline() <= now
                && let Some(batch) = self.scheduler.next_due(now)
            {
                self.run_batch(batch, now).await;
                continue;
            }
            if !self.wait(&shutdown).await {
                break;
            }
        }
        self.stopped()
    }

    /// Hands a trigger to the scheduler.
    fn accept(&mut self, trigger: Trigger) {
        trace!(scope = ?trigger.scope, source = ?trigger.source, observations = ?trigger.observations, "trigger");
        self.metrics.trigger(trigger.source.name());
        let relister = &self.relister;
        self.scheduler
            .push(trigger, Instant::now(), |c| relister.pod_of(c));
    }

    /// Waits for the next trigger, deadline or change of tuning, or [`LONGEST_WAIT`]; `false`
    /// at shutdown.
    async fn wait(&mut self, shutdown: &CancellationToken) -> bool {
        let deadline = self
            .scheduler
            .next_deadline()
            .min(Instant::now() + LONGEST_WAIT);
        let Tuned {
            period,
            kernel_grace,
        } = &mut self.tuned;
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return false,
            Some(trigger) = self.triggers.triggers.recv() => self.accept(trigger),
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

    /// Runs one relist due at `now`, feeds its outcome back to the scheduler, then the
    /// triggers that came while it ran.
    async fn run_batch(&mut self, batch: Batch, now: Instant) {
        let mut arrivals = Arrivals {
            channel: &mut self.triggers.triggers,
            taken: Vec::new(),
        };
        let started = Instant::now();
        let queued = || arrivals.with_queued(&batch.queued);
        let result = self
            .relister
            .relist_crediting(&batch.scope, &batch.hints, queued, batch.required)
            .await;
        let taken = std::mem::take(&mut arrivals.taken);
        let answered = self.count(&batch, &result, started);
        let retry = self.follow_up(&batch, result);
        if !retry.is_empty()
            && let Err(exhausted) = self
                .scheduler
                .retry(batch.with_hints(retry), Instant::now())
        {
            self.report_unconfirmed(&exhausted);
        }
        for trigger in taken {
            self.accept(trigger);
        }
        if answered {
            self.triggers.runtime_answered(now);
        }
    }

    /// Counts a relist in the metrics, tells the scheduler of a full one; returns whether it
    /// read the runtime, answered.
    fn count(
        &mut self,
        batch: &Batch,
        result: &Result<RelistOutcome, RelistError>,
        started: Instant,
    ) -> bool {
        let read = match result {
            Ok(outcome) => outcome.read,
            Err(_) if batch.scope == Scope::All => Read::Full,
            Err(_) => Read::Targeted,
        };
        match read {
            Read::Nothing => self.metrics.answered_by_records(),
            read => self.metrics.relisted(
                read == Read::Full,
                started.into_std(),
                started.elapsed(),
                result.is_ok(),
            ),
        }
        if read == Read::Full && !batch.required {
            self.scheduler.full_relisted(started);
        }
        read != Read::Nothing
            && result
                .as_ref()
                .is_ok_and(|outcome| outcome.failed_inspections == 0)
    }

    /// Hands a relist's outcome to the scheduler: which pods settled, which still await the
    /// CRI store; returns the hints to retry.
    fn follow_up(&mut self, batch: &Batch, result: Result<RelistOutcome, RelistError>) -> Hints {
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
                return batch.hints.clone();
            }
        };
        for uid in &outcome.inspected {
            if !outcome.settling.contains(uid) {
                self.scheduler.settled(uid);
            }
        }
        for uid in outcome.settling {
            if !self.scheduler.settle(batch, uid.clone(), now) {
                debug!(pod = %uid, "the CRI store still lags the task service; the next full relist reads it");
            }
        }
        outcome
            .reread
            .into_iter()
            .map(|Reread { scope, hint, .. }| (scope, hint))
            .collect()
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
                if observation.source == TriggerSource::Ebpf {
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
    /// yet (the triggers still in the channel and those the scheduler holds) as one full
    /// relist's hints.
    fn stopped(mut self) -> Stopped<R> {
        let now = Instant::now();
        while let Ok(trigger) = self.triggers.triggers.try_recv() {
            let relister = &self.relister;
            self.scheduler.push(trigger, now, |c| relister.pod_of(c));
        }
        self.scheduler.request_full_relist(now);
        let pending = self
            .scheduler
            .next_due(now)
            .map(|batch| batch.hints)
            .unwrap_or_default();
        debug!(pending = pending.scopes().count(), "generator stopped");
        Stopped {
            relister: self.relister,
            pending,
        }
    }
}

/// The triggers that came while a relist ran, taken from the channel as the relist asks for
/// the queued hints, and handed to the scheduler after it. A kill -9'd container's death was
/// published as the relist's own, with no kernel observation, by a relist (a settling read)
/// that began just before the kernel's trigger came and read the death the trigger was about.
struct Arrivals<'a> {
    channel: &'a mut mpsc::Receiver<Trigger>,
    taken: Vec<Trigger>,
}

impl Arrivals<'_> {
    /// `queued` (the batch's) and what every trigger taken so far saw of a container.
    fn with_queued(&mut self, queued: &Hints) -> Hints {
        while let Ok(trigger) = self.channel.try_recv() {
            self.taken.push(trigger);
        }
        let seen = self.taken.iter().filter_map(|trigger| {
            let Scope::Container(id) = &trigger.scope else {
                return None;
            };
            let observations = trigger
                .observations
                .iter()
                .map(|o| (id.clone(), o.clone()))
                .collect();
            let hint = Hint::seen(trigger.source, trigger.observed_at, observations);
            Some((Scope::Container(id.clone()), hint))
        });
        queued
            .iter()
            .map(|(scope, hint)| (scope.clone(), hint.clone()))
            .chain(seen)
            .collect()
    }
}

#[cfg(test)]
mod tests;
