//! The generator loop: feeds triggers from every source to the scheduler and runs the relists
//! it hands out, one at a time, until shut down (kubelet's `GenericPLEG.Start` + `Relist`
//! ticker, with targeted relists beside the periodic one).

use std::{sync::Arc, time::Duration};

use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, trace, warn};

use crate::{
    metrics::Metrics,
    pleg::{
        event::{Scope, Trigger, TriggerSource},
        hints::{Hint, Hints, Target},
        reconcile::Again,
        relist::{Read, RelistError, RelistOutcome, Relister},
        scheduler::{Batch, Exhausted, RelistScheduler},
        sink::ObservationSink,
    },
    runtime::Runtime,
};

/// How soon after a relist failed on a runtime error the node is read whole (again while the
/// runtime keeps failing: a failed listing costs little).
pub const FULL_RELIST_AFTER_ERROR: Duration = Duration::from_secs(1);

/// Capacity of the trigger channel shared by every source. A full channel means the loop is
/// behind; sources then fall back to asking for a full relist (see [`TriggerSender`]).
pub const TRIGGER_CHANNEL_CAPACITY: usize = 4096;

/// How sources hand triggers to the generator. Never blocks a source: when the channel is
/// full, the trigger is dropped and a full relist is requested instead, so the change is still
/// found.
#[derive(Clone, Debug)]
pub struct TriggerSender {
    triggers: mpsc::Sender<Trigger>,
    full_relist: Arc<tokio::sync::Notify>,
    observations: Option<Arc<dyn ObservationSink>>,
    /// Whether a container's presence alone is news (`--emit-changed`: a created container's
    /// `ContainerChanged`).
    presence: bool,
    /// Start of the last relist that read the runtime ([`TriggerReceiver::runtime_answered`]).
    answered: watch::Receiver<Option<Instant>>,
}

impl TriggerSender {
    /// Hands a trigger to the generator; a kernel trigger's observations go to the
    /// observation sink first, ahead of any relist. A trigger that says only that containers
    /// exist is dropped unless presence is news: no event can come of it, and under churn
    /// such triggers were a third of all (a cgroup made, containerd's `/containers/create`
    /// and `/tasks/create` for every container).
    pub fn send(&self, trigger: Trigger) {
        if !self.presence && trigger.only_presence() {
            return;
        }
        if let Some(sink) = &self.observations
            && trigger.source == TriggerSource::Ebpf
            && !trigger.observations.is_empty()
        {
            sink.ahead(&trigger);
        }
        if self.triggers.try_send(trigger).is_err() {
            debug!("trigger channel full or closed: asking for a full relist instead");
            self.full_relist.notify_one();
        }
    }

    /// Asks for a full relist now (a source saw signs of loss: dropped kernel events, a stream
    /// reconnect).
    pub fn request_full_relist(&self) {
        self.full_relist.notify_one();
    }

    /// Returns once a relist that began after `since` has read the runtime: it answers
    /// again. Never, once the generator is gone.
    pub async fn runtime_answered_since(&self, since: Instant) {
        let mut answered = self.answered.clone();
        if answered
            .wait_for(|at| at.is_some_and(|at| at > since))
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }
}

/// The receiving half, owned by [`run`].
#[derive(Debug)]
pub struct TriggerReceiver {
    triggers: mpsc::Receiver<Trigger>,
    full_relist: Arc<tokio::sync::Notify>,
    observations: Option<Arc<dyn ObservationSink>>,
    answered: watch::Sender<Option<Instant>>,
}

impl TriggerReceiver {
    /// The next trigger, for driving a source without a generator (tests, tools).
    pub async fn recv(&mut self) -> Option<Trigger> {
        self.triggers.recv().await
    }

    /// Waits until a full relist is requested (at once if one is pending), for driving a
    /// source without a generator.
    pub async fn full_relist_requested(&self) {
        self.full_relist.notified().await;
    }

    /// A relist that began at `started` read the runtime: a source that lost the runtime
    /// waits no longer to reach it again ([`TriggerSender::runtime_answered_since`]).
    pub fn runtime_answered(&self, started: Instant) {
        self.answered.send_replace(Some(started));
    }
}

/// A trigger channel for the sources and the generator, passing every trigger.
pub fn trigger_channel() -> (TriggerSender, TriggerReceiver) {
    observed_trigger_channel(None, true)
}

/// [`trigger_channel`] whose kernel observations also go to `observations` (ahead of their
/// relist), and whose unconfirmed ones are said there when the runtime never confirms them;
/// `presence`: whether triggers saying only that containers exist pass (see
/// [`TriggerSender::send`]).
pub fn observed_trigger_channel(
    observations: Option<Arc<dyn ObservationSink>>,
    presence: bool,
) -> (TriggerSender, TriggerReceiver) {
    let (tx, rx) = mpsc::channel(TRIGGER_CHANNEL_CAPACITY);
    let full_relist = Arc::new(tokio::sync::Notify::new());
    let (answered_tx, answered) = watch::channel(None);
    (
        TriggerSender {
            triggers: tx,
            full_relist: Arc::clone(&full_relist),
            observations: observations.clone(),
            presence,
            answered,
        },
        TriggerReceiver {
            triggers: rx,
            full_relist,
            observations,
            answered: answered_tx,
        },
    )
}

/// What a stopped generator hands back: the relister, whose reading is saved, and the hints of
/// every trigger not relisted yet, for the last relist before saving.
pub struct Stopped<R> {
    pub relister: Relister<R>,
    pub pending: Hints,
}

/// Runs relists until `shutdown` is cancelled, then hands the relister back with the triggers
/// still pending ([`Stopped`]). Every event is handed to the relister's sink, which never
/// blocks: no consumer can stall the relists or make them spin. The full relist period can be
/// changed while running through `period` (adaptive relist: long while push sources are
/// healthy, short otherwise), and kernel triggers' grace through `kernel_grace` (see
/// [`RelistScheduler::set_kernel_grace`]).
pub async fn run<R: Runtime>(
    mut relister: Relister<R>,
    mut scheduler: RelistScheduler,
    mut triggers: TriggerReceiver,
    mut period: watch::Receiver<Duration>,
    mut kernel_grace: watch::Receiver<Duration>,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> Stopped<R> {
    let accept = |scheduler: &mut RelistScheduler, relister: &Relister<R>, trigger: Trigger| {
        trace!(scope = ?trigger.scope, source = ?trigger.source, observations = ?trigger.observations, "trigger");
        metrics.trigger(trigger.source);
        scheduler.push(trigger, Instant::now(), |c| relister.pod_of(c));
    };
    while !shutdown.is_cancelled() {
        // One relist per turn of the loop, after the triggers that came meanwhile: under churn
        // many relists are due at once (retries of hints the runtime has not caught up with),
        // and draining them all first kept fresh triggers waiting in the channel for up to a
        // second, past the lives of short containers.
        while let Ok(trigger) = triggers.triggers.try_recv() {
            accept(&mut scheduler, &relister, trigger);
        }
        // What is due runs now, not through the timer: tokio's timer turns on millisecond
        // ticks, and a sleep until a deadline already past waited for the next one (half a
        // millisecond on average between containerd's `/tasks/exit` and the event).
        let now = Instant::now();
        if scheduler.next_deadline() <= now
            && let Some(batch) = scheduler.next_due(now)
        {
            let observations = triggers.observations.as_deref();
            let mut late = Late {
                channel: &mut triggers.triggers,
                taken: Vec::new(),
            };
            let answered = run_batch(
                &mut relister,
                &mut scheduler,
                &metrics,
                observations,
                batch,
                &mut late,
            )
            .await;
            for trigger in late.taken {
                accept(&mut scheduler, &relister, trigger);
            }
            if answered {
                triggers.runtime_answered(now);
            }
            continue;
        }
        let deadline = scheduler.next_deadline();
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some(trigger) = triggers.triggers.recv() => accept(&mut scheduler, &relister, trigger),
            () = triggers.full_relist.notified() => scheduler.request_full_relist(Instant::now()),
            Ok(()) = period.changed() => {
                let new = *period.borrow_and_update();
                info!(period = ?new, "full relist period changed");
                scheduler.set_full_relist_period(new);
            }
            Ok(()) = kernel_grace.changed() => {
                let grace = *kernel_grace.borrow_and_update();
                debug!(?grace, "kernel triggers' grace changed");
                scheduler.set_kernel_grace(grace);
                // A grace means the runtime's task events are on their way: a task status
                // need not be waited for long.
                relister.set_runtime_events(!grace.is_zero());
            }
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
    stopped(relister, scheduler, triggers)
}

/// What the generator hands back: with the relister, whatever was seen and not relisted yet
/// (the triggers still in the channel and those the scheduler holds) as one full relist's
/// hints.
fn stopped<R: Runtime>(
    relister: Relister<R>,
    mut scheduler: RelistScheduler,
    mut triggers: TriggerReceiver,
) -> Stopped<R> {
    let now = Instant::now();
    while let Ok(trigger) = triggers.triggers.try_recv() {
        scheduler.push(trigger, now, |c| relister.pod_of(c));
    }
    scheduler.request_full_relist(now);
    let pending = scheduler
        .next_due(now)
        .map(|batch| batch.hints)
        .unwrap_or_default();
    debug!(pending = pending.targets().count(), "generator stopped");
    Stopped { relister, pending }
}

/// The triggers that came while a relist ran, taken from the channel as the relist asks for
/// its riders, and handed to the scheduler after it. A kill -9'd container's death was
/// published as the relist's own, with no kernel observation, by a relist (a settling read)
/// that began just before the kernel's trigger came and read the death the trigger was about.
struct Late<'a> {
    channel: &'a mut mpsc::Receiver<Trigger>,
    taken: Vec<Trigger>,
}

impl Late<'_> {
    /// `queued` (the batch's riders) and what every trigger taken so far saw of a container.
    fn riders(&mut self, queued: &Hints) -> Hints {
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
            Some((Target::Container(id.clone()), hint))
        });
        queued
            .iter()
            .map(|(target, hint)| (target.clone(), hint.clone()))
            .chain(seen)
            .collect()
    }
}

/// Runs one relist and feeds its outcome back to the scheduler; returns whether it read the
/// runtime.
async fn run_batch<R: Runtime>(
    relister: &mut Relister<R>,
    scheduler: &mut RelistScheduler,
    metrics: &Metrics,
    observations: Option<&dyn ObservationSink>,
    batch: Batch,
    late: &mut Late<'_>,
) -> bool {
    let started = Instant::now();
    let riders = || late.riders(&batch.riders);
    let result = relister
        .relist_crediting(&batch.scope, &batch.hints, riders, batch.required)
        .await;
    let read = match &result {
        Ok(outcome) => outcome.read,
        Err(_) if batch.scope == Scope::All => Read::Full,
        Err(_) => Read::Targeted,
    };
    match read {
        Read::Nothing => metrics.answered_by_records(),
        read => metrics.relisted(
            read == Read::Full,
            started.into_std(),
            started.elapsed(),
            result.is_ok(),
        ),
    }
    if read == Read::Full && !batch.required {
        scheduler.full_relisted(started);
    }
    let answered = read != Read::Nothing
        && result
            .as_ref()
            .is_ok_and(|outcome| outcome.failed_inspections == 0);
    let now = Instant::now();
    let retry = match result {
        Ok(outcome) => follow_up(scheduler, &batch, outcome, now),
        Err(RelistError::List(error)) => {
            // The hints it carried are retried, and the node is read whole once the runtime
            // answers again: what changed while it did not (a restart) may have no hint left
            // by then, and the periodic full relist can be minutes away (eBPF-only mode). The
            // soak lost a start that way: its hint's retries ran out during a containerd
            // restart. Health reports a runtime that keeps failing.
            warn!(scope = ?batch.scope, %error, "relist failed");
            scheduler.request_full_relist(now + FULL_RELIST_AFTER_ERROR);
            batch.hints.clone()
        }
    };
    if !retry.is_empty()
        && let Err(exhausted) = scheduler.retry(batch.with_hints(retry), now)
    {
        report_unconfirmed(&exhausted, metrics, observations);
    }
    answered
}

/// Hands a relist's outcome to the scheduler: which pods settled, which still await the CRI
/// store; returns the hints to retry.
fn follow_up(
    scheduler: &mut RelistScheduler,
    batch: &Batch,
    outcome: RelistOutcome,
    now: Instant,
) -> Hints {
    for uid in &outcome.inspected {
        if !outcome.settling.contains(uid) {
            scheduler.settled(uid);
        }
    }
    for uid in outcome.settling {
        if !scheduler.settle(batch, uid.clone(), now) {
            debug!(pod = %uid, "the CRI store still lags the task layer; the next full relist reads it");
        }
    }
    outcome
        .again
        .into_iter()
        .map(|Again { target, hint, .. }| (target, hint))
        .collect()
}

/// Never silent: a hint the runtime never confirmed is either a source's false alarm or a
/// runtime that lags badly, and either is worth knowing.
fn report_unconfirmed(
    exhausted: &Exhausted,
    metrics: &Metrics,
    observations: Option<&dyn ObservationSink>,
) {
    let targets: Vec<&Target> = exhausted.hints.targets().collect();
    let sources = exhausted.hints.sources();
    warn!(?targets, ?sources, %exhausted, "hint not confirmed by the runtime");
    for source in sources {
        metrics.unconfirmed_hint(source);
    }
    if let Some(sink) = observations {
        for (container, observation) in exhausted.hints.observations() {
            if observation.source == TriggerSource::Ebpf {
                sink.unconfirmed(container, std::slice::from_ref(observation));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::{
        pleg::{
            cache::PodCache,
            event::{
                Observation, ObservationKind, PodLifecycleEvent, PodLifecycleEventType,
                TriggerSource,
            },
            health::Health,
            record::{ContainerId, ContainerState, PodUid},
            relist::RelistConfig,
            scheduler::{DEFAULT_MAX_RETRIES, SchedulerConfig},
        },
        runtime::testing::{FakeRuntime, container},
    };

    struct Harness {
        runtime: FakeRuntime,
        triggers: TriggerSender,
        events: mpsc::UnboundedReceiver<PodLifecycleEvent>,
        period: watch::Sender<Duration>,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<Stopped<FakeRuntime>>,
        metrics: Metrics,
    }

    fn start(period: Duration) -> Harness {
        start_observed(period, None)
    }

    fn start_observed(period: Duration, sink: Option<Arc<dyn ObservationSink>>) -> Harness {
        let runtime = FakeRuntime::new();
        let health = Arc::new(Health::new(Duration::from_secs(180)));
        let (tx, events) = mpsc::unbounded_channel();
        let relister = Relister::new(
            runtime.clone(),
            Arc::new(PodCache::new()),
            health,
            Arc::new(tx),
            RelistConfig::default(),
        );
        let metrics = Metrics::new();
        let scheduler = RelistScheduler::new(
            SchedulerConfig {
                full_relist_period: period,
                ..SchedulerConfig::default()
            },
            Instant::now(),
        );
        let (triggers, receiver) = observed_trigger_channel(sink, true);
        let (period_tx, period_rx) = watch::channel(period);
        let (_, grace_rx) = watch::channel(Duration::ZERO);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(
            relister,
            scheduler,
            receiver,
            period_rx,
            grace_rx,
            metrics.clone(),
            shutdown.clone(),
        ));
        Harness {
            runtime,
            triggers,
            events,
            period: period_tx,
            shutdown,
            task,
            metrics,
        }
    }

    fn add_running(runtime: &FakeRuntime, pod: &str, id: &str) {
        runtime.add_pod(pod, "ns", pod);
        runtime.set_container(pod, container(id, "app", ContainerState::Running));
    }

    fn trigger(id: &str) -> Trigger {
        Trigger {
            scope: Scope::Container(ContainerId(id.into())),
            source: TriggerSource::Containerd,
            observed_at: SystemTime::now(),
            observations: Vec::new(),
        }
    }

    #[tokio::test]
    async fn triggers_saying_only_presence_pass_only_where_presence_is_news() {
        let with = |kinds: &[ObservationKind]| Trigger {
            observations: kinds
                .iter()
                .map(|kind| Observation {
                    source: TriggerSource::Containerd,
                    kind: kind.clone(),
                })
                .collect(),
            ..trigger("c")
        };
        let started = ObservationKind::TaskStarted {
            at: SystemTime::now(),
        };
        let cases = [
            ("presence alone", vec![ObservationKind::Present], false),
            (
                "presence and a start",
                vec![ObservationKind::Present, started],
                true,
            ),
            ("no observation: something changed", vec![], true),
        ];
        for (name, kinds, passes) in cases {
            for presence in [false, true] {
                let (tx, mut rx) = observed_trigger_channel(None, presence);
                tx.send(with(&kinds));
                drop(tx);
                let passed = rx.recv().await.is_some();
                assert_eq!(
                    passed,
                    passes || presence,
                    "{name}, presence news: {presence}"
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_runtime_that_failed_is_read_whole_once_it_answers_again() {
        let mut h = start(Duration::from_secs(3600));
        // The first full relist, and every one while the runtime keeps failing, fails.
        h.runtime.fail_lists(true);
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(h.events.try_recv().is_err());
        // Sources that lost the runtime are not told it answers.
        let answered = h.triggers.runtime_answered_since(t0);
        let mut answered = std::pin::pin!(answered);
        assert!(futures::poll!(&mut answered).is_pending());
        // It answers again, with a container no hint is left about.
        h.runtime.fail_lists(false);
        add_running(&h.runtime, "p", "c");
        let event = tokio::time::timeout(2 * FULL_RELIST_AFTER_ERROR, h.events.recv())
            .await
            .expect("a full relist soon after the runtime answers, not at the next period")
            .unwrap();
        assert_eq!(event.container_id, Some(ContainerId("c".into())));
        assert_eq!(event.sources, vec![TriggerSource::Relist]);
        // Now they are.
        tokio::time::timeout(Duration::from_millis(1), answered)
            .await
            .expect("the sources are told the runtime answers");
        h.shutdown.cancel();
        h.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_read_by_a_relist_is_credited_to_a_trigger_that_came_while_it_ran() {
        let mut h = start(Duration::from_secs(1));
        add_running(&h.runtime, "p", "c");
        let started = h.events.recv().await.unwrap();
        assert_eq!(started.event_type, PodLifecycleEventType::ContainerStarted);
        // The next full relist (no hint of its own) waits on a slow runtime; meanwhile the
        // container is killed and the kernel's trigger comes.
        h.runtime.set_delay(Some(Duration::from_millis(50)));
        tokio::time::sleep(Duration::from_millis(1010)).await;
        h.runtime
            .set_state("p", "c", ContainerState::Exited, Some(137));
        let signal = Observation {
            source: TriggerSource::Ebpf,
            kind: ObservationKind::Signal(9),
        };
        h.triggers.send(Trigger {
            source: TriggerSource::Ebpf,
            observations: vec![signal.clone()],
            ..trigger("c")
        });
        let died = h.events.recv().await.unwrap();
        assert_eq!(died.event_type, PodLifecycleEventType::ContainerDied);
        assert_eq!(died.sources, vec![TriggerSource::Ebpf]);
        assert_eq!(died.observations, vec![signal]);
        h.shutdown.cancel();
        h.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn periodic_full_relist_finds_changes() {
        let mut h = start(Duration::from_secs(1));
        add_running(&h.runtime, "p", "c");
        let event = h.events.recv().await.unwrap();
        assert_eq!(event.event_type, PodLifecycleEventType::ContainerStarted);
        assert_eq!(event.sources, vec![TriggerSource::Relist]);
        h.shutdown.cancel();
        // Stopped, it hands back the reading to save.
        let (records, sequence) = h.task.await.unwrap().relister.into_saved();
        assert_eq!(sequence, 1);
        assert!(records.contains_key(&PodUid("p".into())));
    }

    /// A trigger not relisted when the generator stops is handed back with its hints, for
    /// the last relist before saving; with none pending, nothing is.
    #[tokio::test(start_paused = true)]
    async fn triggers_not_relisted_at_the_stop_are_handed_back() {
        let mut h = start(Duration::from_secs(3600));
        add_running(&h.runtime, "p", "c");
        h.events.recv().await.unwrap();
        // Sent and stopped before the loop runs again: it sees the stop first.
        h.triggers.send(trigger("c"));
        h.shutdown.cancel();
        let stopped = h.task.await.unwrap();
        assert_eq!(
            stopped.pending.targets().collect::<Vec<_>>(),
            [&Target::Pod(PodUid("p".into()))]
        );

        let h = start(Duration::from_secs(3600));
        h.shutdown.cancel();
        assert!(h.task.await.unwrap().pending.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_trigger_relists_long_before_the_period() {
        let mut h = start(Duration::from_secs(3600));
        add_running(&h.runtime, "p", "c");
        // The first full relist (due at start) sees the pod.
        assert_eq!(
            h.events.recv().await.unwrap().event_type,
            PodLifecycleEventType::ContainerStarted
        );
        let before = tokio::time::Instant::now();
        h.runtime
            .set_state("p", "c", ContainerState::Exited, Some(137));
        h.triggers.send(trigger("c"));
        let event = h.events.recv().await.unwrap();
        assert_eq!(event.event_type, PodLifecycleEventType::ContainerDied);
        assert_eq!(event.sources, vec![TriggerSource::Containerd]);
        assert!(tokio::time::Instant::now() - before < Duration::from_secs(1));
        h.shutdown.cancel();
        h.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_trigger_ahead_of_the_runtime_is_retried_until_reflected() {
        let mut h = start(Duration::from_secs(3600));
        // Let the first (empty) full relist run.
        tokio::time::sleep(Duration::from_millis(1)).await;
        // The task service started it: the CRI store must come to show it.
        let mut started = trigger("late");
        started.observations = vec![Observation {
            source: TriggerSource::Containerd,
            kind: ObservationKind::TaskStarted {
                at: SystemTime::now(),
            },
        }];
        h.triggers.send(started);
        // The runtime learns of the container only after the first targeted relist.
        tokio::time::sleep(Duration::from_millis(15)).await;
        add_running(&h.runtime, "p", "late");
        let event = h.events.recv().await.unwrap();
        assert_eq!(event.container_id, Some(ContainerId("late".into())));
        assert_eq!(event.sources, vec![TriggerSource::Containerd]);
        assert_eq!(event.pod, PodUid("p".into()));
        h.shutdown.cancel();
        h.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_hint_the_runtime_never_confirms_is_retried_then_counted() {
        let mut h = start(Duration::from_secs(3600));
        add_running(&h.runtime, "p", "c");
        h.events.recv().await.unwrap();
        let counted = "plegd_unconfirmed_hints_total{source=\"containerd\"} 1";
        assert!(!h.metrics.encode().contains(counted));
        // A source says c died; the runtime keeps showing it running.
        let reads_before = h.runtime.read_calls().len();
        h.triggers.send(Trigger {
            observations: vec![Observation {
                source: TriggerSource::Containerd,
                kind: ObservationKind::ExitCode(1),
            }],
            ..trigger("c")
        });
        // Well past the whole retry budget (about 4.5 s), in paused time.
        tokio::time::sleep(Duration::from_secs(30)).await;
        let retries = h.runtime.read_calls().len() - reads_before;
        assert_eq!(retries, 1 + DEFAULT_MAX_RETRIES as usize);
        assert!(
            h.metrics.encode().contains(counted),
            "{}",
            h.metrics.encode()
        );
        assert!(h.events.try_recv().is_err(), "no event: nothing changed");
        h.shutdown.cancel();
        h.task.await.unwrap();
    }

    /// What an observation sink was told, in order.
    #[derive(Debug, Default)]
    struct RecordingSink(std::sync::Mutex<Vec<String>>);

    impl ObservationSink for RecordingSink {
        fn ahead(&self, trigger: &Trigger) {
            self.0
                .lock()
                .unwrap()
                .push(format!("ahead {:?}", trigger.scope));
        }

        fn unconfirmed(&self, container: &ContainerId, observations: &[Observation]) {
            let kinds: Vec<_> = observations.iter().map(|o| &o.kind).collect();
            self.0
                .lock()
                .unwrap()
                .push(format!("unconfirmed {container} {kinds:?}"));
        }
    }

    /// A kernel observation goes to the sink as the source hands it over, and is said
    /// unconfirmed once the relists that looked for it give up.
    #[tokio::test(start_paused = true)]
    async fn kernel_observations_are_previewed_then_said_unconfirmed() {
        let sink = Arc::new(RecordingSink::default());
        let mut h = start_observed(Duration::from_secs(3600), Some(sink.clone()));
        add_running(&h.runtime, "p", "c");
        h.events.recv().await.unwrap();
        // Not a kernel trigger: no preview.
        h.triggers.send(trigger("c"));
        h.triggers.send(Trigger {
            source: TriggerSource::Ebpf,
            observations: vec![Observation {
                source: TriggerSource::Ebpf,
                kind: ObservationKind::Signal(9),
            }],
            ..trigger("c")
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(
            *sink.0.lock().unwrap(),
            [
                "ahead Container(ContainerId(\"c\"))",
                "unconfirmed c [Signal(9)]"
            ]
        );
        assert!(h.events.try_recv().is_err(), "no event: nothing changed");
        h.shutdown.cancel();
        h.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn shortening_the_period_takes_effect_at_once() {
        let mut h = start(Duration::from_secs(3600));
        tokio::time::sleep(Duration::from_millis(1)).await;
        add_running(&h.runtime, "p", "c");
        h.period.send(Duration::from_secs(1)).unwrap();
        let started = tokio::time::Instant::now();
        h.events.recv().await.unwrap();
        assert!(tokio::time::Instant::now() - started <= Duration::from_secs(1));
        h.shutdown.cancel();
        h.task.await.unwrap();
    }
}
