//! The PLEG started: its parts made and wired, its two tasks (the generator loop and the sync
//! loop) spawned, the handle its callers hold ([`Pleg`]) and the owner of its tasks
//! ([`Running`]), which stops them in order and hands back the run to save.

use std::{sync::Arc, time::Duration};

use tokio::{
    sync::{broadcast, watch},
    time::Instant,
};
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};
use tracing::warn;

use crate::{
    base::{
        bus::{DEFAULT_EVENT_HISTORY, DEFAULT_EVENT_HISTORY_BYTES, DEFAULT_WATCH_QUEUE, EventBus},
        metrics::Metrics,
    },
    pleg::{
        decide::scheduler::{DEFAULT_RELIST_PERIOD, RelistScheduler, SchedulerConfig},
        driver::{
            generator::{Generator, Stopped, Tuning, tuning},
            relist::{self, RelistConfig, Relister, STOP_CONFIRM},
            sink::{BusSink, Notices},
            triggers::{TriggerSender, observed_trigger_channel},
        },
        model::{
            event::{Notice, PodLifecycleEvent},
            record::PodRecords,
            runtime::Runtime,
        },
        shared::{
            cache::PodCache,
            health::{DEFAULT_RELIST_THRESHOLD, Health, HealthError},
        },
        sync_loop::{self, DEFAULT_EVENT_CHANNEL_CAPACITY, SyncConfig, SyncFeed, SyncHandler},
    },
};

/// How the PLEG runs.
#[derive(Clone, Debug)]
pub struct Options {
    pub relist: RelistConfig,
    pub relist_period: Duration,
    pub relist_threshold: Duration,
    /// Events kept for watchers that resume, the bytes they may hold, and the queue of each
    /// watcher.
    pub event_history: usize,
    pub event_history_bytes: usize,
    pub watch_queue: usize,
    /// The sync loop's queue of events.
    pub event_channel_capacity: usize,
    pub sync: SyncConfig,
    /// Relist once more at [`Running::stop`], for the run saved then.
    pub last_relist: bool,
}

/// kubelet's settings, and the bus's default sizes.
impl Default for Options {
    fn default() -> Self {
        Self {
            relist: RelistConfig::default(),
            relist_period: DEFAULT_RELIST_PERIOD,
            relist_threshold: DEFAULT_RELIST_THRESHOLD,
            event_history: DEFAULT_EVENT_HISTORY,
            event_history_bytes: DEFAULT_EVENT_HISTORY_BYTES,
            watch_queue: DEFAULT_WATCH_QUEUE,
            event_channel_capacity: DEFAULT_EVENT_CHANNEL_CAPACITY,
            sync: SyncConfig::default(),
            last_relist: false,
        }
    }
}

/// A run, as [`Running::stop`] leaves it at a clean stop and [`Pleg::start`] continues it: its
/// events keep their numbers, and only what changed since is an event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SavedRun {
    pub run_id: u64,
    /// The last event's sequence.
    pub sequence: u64,
    /// The last reading: the diff's old state at the next start.
    pub records: PodRecords,
    /// The events kept for resuming, oldest first.
    pub history: Vec<Arc<PodLifecycleEvent>>,
}

/// A running PLEG, as its callers see it; cheap to clone.
#[derive(Clone, Debug)]
pub struct Pleg {
    events: EventBus<PodLifecycleEvent>,
    cache: Arc<PodCache>,
    health: Arc<Health>,
    syncs: SyncFeed,
    notices: Notices,
    triggers: TriggerSender,
    tuning: Tuning,
    /// When the generator loop last turned.
    turns: watch::Receiver<Instant>,
    /// The first sequence of this start.
    first: u64,
}

/// The PLEG's tasks: the generator loop and the sync loop.
#[derive(Debug)]
pub struct Running {
    pleg: Pleg,
    generator: AbortOnDropHandle<(PodRecords, u64)>,
    sync_loop: AbortOnDropHandle<()>,
    stop: CancellationToken,
    /// However the PLEG ends, its events do: watchers and the API's graceful shutdown wait
    /// for that.
    _close: CloseOnDrop,
}

/// Closes the events when dropped.
#[derive(Debug)]
struct CloseOnDrop(EventBus<PodLifecycleEvent>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl Pleg {
    /// Starts the PLEG on `runtime`, continuing `saved` (or a new run `run_id`): the first
    /// full relist runs at once; `handler` gets every pod sync after the API's watchers.
    pub fn start<R: Runtime, H: SyncHandler>(
        runtime: R,
        handler: H,
        options: Options,
        saved: Option<SavedRun>,
        run_id: u64,
        metrics: &Metrics,
    ) -> (Self, Running) {
        let cache = Arc::new(PodCache::new());
        let (history, queue) = (options.event_history, options.watch_queue);
        let events = match &saved {
            Some(s) => EventBus::resumed(s.run_id, history, queue, s.sequence, s.history.clone()),
            None => EventBus::new(run_id, history, queue),
        }
        .with_history_bytes(options.event_history_bytes, metrics.history_evictions())
        .counting_lagged(metrics.lagged_subscribers());
        let notices = Notices::new(Arc::clone(&cache));
        let (triggers, receiver) =
            observed_trigger_channel(Some(notices.clone()), options.relist.emit_changed);
        let (tuning, tuned) = tuning(options.relist_period);
        let (turned, turns) = watch::channel(Instant::now());
        let pleg = Self {
            turns,
            first: events.last_sequence() + 1,
            events,
            cache,
            health: Arc::new(Health::new(options.relist_threshold)),
            syncs: SyncFeed::new(),
            notices,
            triggers,
            tuning,
        };
        let stop = CancellationToken::new();
        let sync_loop = pleg.sync_loop(handler, &options, metrics, &stop);
        let mut relister = Relister::new(
            runtime,
            Arc::clone(&pleg.cache),
            Arc::clone(&pleg.health),
            Arc::new(BusSink {
                bus: pleg.events.clone(),
                metrics: metrics.clone(),
            }),
            options.relist.clone(),
        );
        if let Some(saved) = saved {
            relister.restore(saved.records, saved.sequence);
        }
        let scheduler = RelistScheduler::new(
            SchedulerConfig {
                full_relist_period: options.relist_period,
                ..SchedulerConfig::default()
            },
            Instant::now(),
        );
        let generator = Generator {
            relister,
            scheduler,
            triggers: receiver,
            tuned,
            metrics: metrics.clone(),
            turns: turned,
        };
        let generating = generate(generator, options.last_relist, stop.clone());
        let running = Running {
            _close: CloseOnDrop(pleg.events.clone()),
            pleg: pleg.clone(),
            sync_loop: AbortOnDropHandle::new(tokio::spawn(sync_loop)),
            generator: AbortOnDropHandle::new(tokio::spawn(generating)),
            stop,
        };
        (pleg, running)
    }

    /// The sync loop, its handler after the API's feed; subscribed now, before the first
    /// relist, so it sees every event of the start.
    fn sync_loop<H: SyncHandler>(
        &self,
        handler: H,
        options: &Options,
        metrics: &Metrics,
        stop: &CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static {
        let inputs = sync_loop::Inputs {
            bus: self.events.clone(),
            events: self
                .events
                .consume(0, options.event_channel_capacity)
                .expect("a live-only subscription always starts"),
            cache: Arc::clone(&self.cache),
            health: Arc::clone(&self.health),
            handler: Arc::new((self.syncs.clone(), handler)),
            metrics: metrics.clone(),
            config: options.sync.clone(),
        };
        sync_loop::run(inputs, stop.clone())
    }

    /// Where sources hand their triggers.
    pub fn triggers(&self) -> &TriggerSender {
        &self.triggers
    }

    /// Asks for a full relist now.
    pub fn relist(&self) {
        self.triggers.request_full_relist();
    }

    /// Every event of the run, numbered: subscribe from a sequence to resume.
    pub fn events(&self) -> &EventBus<PodLifecycleEvent> {
        &self.events
    }

    /// The first sequence of this start: a consumer subscribed from it sees every event the
    /// start publishes, however late it subscribes (within the history).
    pub fn first_sequence(&self) -> u64 {
        self.first
    }

    /// Each pod's whole status whenever it changes (level-triggered).
    pub fn syncs(&self) -> &SyncFeed {
        &self.syncs
    }

    /// Kernel observations, ahead of the runtime's word and when it never comes.
    pub fn notices(&self) -> broadcast::Receiver<Arc<Notice>> {
        self.notices.subscribe()
    }

    /// The pod status cache.
    pub fn cache(&self) -> &Arc<PodCache> {
        &self.cache
    }

    /// kubelet's health check: the age of the last successful full relist.
    pub fn healthy(&self) -> Result<(), HealthError> {
        self.health.check()
    }

    /// The health check itself, for who waits on its changes.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// The settings changed while it runs.
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    /// When the generator loop last turned: it turns at least every
    /// [`LONGEST_WAIT`](super::generator::LONGEST_WAIT) whatever the runtime answers (a relist
    /// that fails is a turn too), so a loop stuck (or gone: the watch then ends) is told from
    /// an idle one. The watchdog's pulse.
    pub fn turns(&self) -> watch::Receiver<Instant> {
        self.turns.clone()
    }
}

impl Running {
    /// Stops the PLEG: the generator (after its last relist, if asked for at start), then the
    /// events (each consumer ends after what it has queued) and the sync loop. `None` when the
    /// generator ended abnormally: nothing is fit to save.
    pub async fn stop(self) -> Option<SavedRun> {
        self.stop.cancel();
        let generated = self.generator.await;
        let events = &self.pleg.events;
        events.close();
        if let Err(error) = self.sync_loop.await {
            warn!(%error, "the sync loop ended abnormally");
        }
        self.pleg.syncs.close();
        match generated {
            Ok((records, sequence)) => Some(SavedRun {
                run_id: events.run_id(),
                sequence,
                records,
                history: events.history(),
            }),
            Err(error) => {
                warn!(%error, "the generator ended abnormally");
                None
            }
        }
    }
}

/// Runs the generator until `stop`, then relists once more if `last_relist`; hands back the
/// committed records and the last sequence.
async fn generate<R: Runtime>(
    generator: Generator<R>,
    last_relist: bool,
    stop: CancellationToken,
) -> (PodRecords, u64) {
    let Stopped {
        mut relister,
        pending,
    } = generator.run(stop).await;
    if last_relist {
        relist::last_relist(&mut relister, &pending, STOP_CONFIRM).await;
    }
    relister.into_saved()
}
