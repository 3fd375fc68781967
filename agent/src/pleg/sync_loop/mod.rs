//! The sync loop (kubelet's `syncLoop`/`syncLoopIteration`): selects over PLEG events, a sync
//! tick, housekeeping and health, and dispatches pods to per-pod workers that read the cache
//! with `get_newer_than` and call a [`SyncHandler`] with a [`PodSync`].
//!
//! This is the level-triggered face of the PLEG: events are edges (numbered, resumable); a
//! sync is a pod's whole current status, coalesced per pod (latest wins), sent because the
//! pod had events ([`SyncReason::Event`]), because its periodic resync came due
//! ([`SyncReason::Resync`]), or once when housekeeping found it gone
//! ([`SyncReason::Removed`]). Per pod, at most one sync is in flight: pokes that arrive while
//! the pod's handler runs coalesce into one.
//!
//! # Bringing your own handler
//!
//! A program that embeds plegd implements [`SyncHandler`] and gives it to `Pleg::start`, which
//! calls it after [`SyncFeed`], the handler that feeds the API's `SyncPods` watchers. A handler that takes long delays only its own pod's next
//! sync, never the relist or other pods. `agent/examples/sync_handler.rs` runs one against
//! the fake runtime.

mod feed;

use std::{collections::HashMap, future::Future, sync::Arc, time::Duration};

pub use feed::{SyncFeed, SyncFilter, SyncSubscription};
use tokio::{sync::Notify, task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    base::{
        bus::{Ended, EventBus, Subscription},
        metrics::Metrics,
    },
    pleg::{
        model::{event::PodLifecycleEvent, record::PodUid},
        shared::{
            cache::{CachedPod, PodCache},
            health::Health,
        },
    },
};

/// Queue length of the PLEG's own consumers of its events (the sync loop, the daemon's
/// stdout); kubelet's `plegChannelCapacity` sizes its one channel the same.
pub const DEFAULT_EVENT_CHANNEL_CAPACITY: usize = 1000;

/// kubelet's `syncPeriod`: how often the loop looks for pods due for a resync.
pub const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(1);
/// kubelet's `housekeepingPeriod`: how often workers of vanished pods are reaped.
pub const DEFAULT_HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);
/// kubelet's default `--sync-frequency`: a pod is resynced at least this often.
pub const DEFAULT_RESYNC_INTERVAL: Duration = Duration::from_secs(60);

/// Why a pod is being synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncReason {
    /// The pod had lifecycle events.
    Event,
    /// Its periodic resync came due (or the loop adopted a cached pod it had no worker for).
    Resync,
    /// Housekeeping (or the pod's worker) found the pod gone from the cache: its last sync.
    Removed,
}

impl SyncReason {
    /// The lowercase name, as in the metrics and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Self::Event => "event",
            Self::Resync => "resync",
            Self::Removed => "removed",
        }
    }

    /// The reason of one sync standing for a sync of `self` not delivered yet and a `newer`
    /// one: the newer one's, except that a resync does not hide a change the consumer has not
    /// been told of.
    pub fn coalesce(self, newer: Self) -> Self {
        match (self, newer) {
            (Self::Event, Self::Resync) => Self::Event,
            (_, newer) => newer,
        }
    }
}

/// One pod's sync: its whole cached status, and why it is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSync {
    pub pod: PodUid,
    /// The pod's namespace and name (of its last record, for [`SyncReason::Removed`]).
    pub namespace: String,
    pub name: String,
    pub reason: SyncReason,
    /// The pod's cached status; no record for [`SyncReason::Removed`].
    pub status: CachedPod,
    /// The sequence of the pod's last event the sync loop had received when it read the
    /// status, which reflects it (and maybe later ones); after the loop fell behind the bus,
    /// the sequence it caught up at; 0 when it received none of the pod's events.
    pub sequence: u64,
}

/// kubelet's extension point: what to do with a pod's fresh status.
///
/// Called by the pod's worker, one call at a time per pod, never twice on the same cache
/// state for [`SyncReason::Event`]. `()` is the handler that does nothing; a pair calls both
/// of its handlers in turn; an `Arc` of a handler is one.
pub trait SyncHandler: Send + Sync + 'static {
    fn sync_pod(&self, sync: &PodSync) -> impl Future<Output = ()> + Send;
}

impl SyncHandler for () {
    async fn sync_pod(&self, _sync: &PodSync) {}
}

/// A shared handler: keep a clone of the `Arc` to read what the handler gathers.
impl<H: SyncHandler> SyncHandler for Arc<H> {
    async fn sync_pod(&self, sync: &PodSync) {
        H::sync_pod(self, sync).await;
    }
}

impl<A: SyncHandler, B: SyncHandler> SyncHandler for (A, B) {
    async fn sync_pod(&self, sync: &PodSync) {
        self.0.sync_pod(sync).await;
        self.1.sync_pod(sync).await;
    }
}

/// Sync loop timings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncConfig {
    pub sync_period: Duration,
    pub housekeeping_period: Duration,
    pub resync_interval: Duration,
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            sync_period: DEFAULT_SYNC_PERIOD,
            housekeeping_period: DEFAULT_HOUSEKEEPING_PERIOD,
            resync_interval: DEFAULT_RESYNC_INTERVAL,
        }
    }
}

/// A request to sync a pod, held in its worker's mailbox until taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Poke {
    reason: SyncReason,
    /// The pod's last event received (see [`PodSync::sequence`]).
    sequence: u64,
    /// When the loop received the earliest event this poke stands for.
    since: Option<Instant>,
}

impl Poke {
    /// One poke standing for `self` and a `newer` one, neither acted on yet.
    fn coalesce(self, newer: Self) -> Self {
        Self {
            reason: self.reason.coalesce(newer.reason),
            sequence: self.sequence.max(newer.sequence),
            since: match (self.since, newer.since) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

/// A worker's pending poke: pokes posted before the worker takes one coalesce.
#[derive(Debug, Default)]
struct Mailbox {
    poke: std::sync::Mutex<Option<Poke>>,
    posted: Notify,
}

impl Mailbox {
    fn post(&self, poke: Poke) {
        {
            let mut slot = self.lock();
            *slot = Some(slot.take().map_or(poke, |older| older.coalesce(poke)));
        }
        self.posted.notify_one();
    }

    /// Puts back a poke taken but not acted on, ahead of any posted since.
    fn put_back(&self, poke: Poke) {
        let mut slot = self.lock();
        *slot = Some(slot.take().map_or(poke, |newer| poke.coalesce(newer)));
    }

    async fn take(&self) -> Poke {
        loop {
            if let Some(poke) = self.lock().take() {
                return poke;
            }
            self.posted.notified().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Poke>> {
        // One value replaced in single statements: a poisoned lock is still consistent.
        self.poke.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One pod's worker, as the loop sees it.
struct Worker {
    mailbox: Arc<Mailbox>,
    task: JoinHandle<()>,
    last_dispatch: Instant,
    /// The pod's last event the loop received.
    last_event: u64,
}

/// The per-pod workers and what they share.
struct Workers<H> {
    pods: HashMap<PodUid, Worker>,
    cache: Arc<PodCache>,
    handler: Arc<H>,
    metrics: Metrics,
    shutdown: CancellationToken,
}

impl<H: SyncHandler> Workers<H> {
    /// The pod's live worker, started if it has none (or its last one ended); `known`: the
    /// pod as consumers already know it, for a worker started without a sync.
    fn worker(&mut self, uid: &PodUid, known: Option<Known>) -> &mut Worker {
        if self.pods.get(uid).is_none_or(|w| w.task.is_finished()) {
            let mailbox = Arc::new(Mailbox::default());
            let task = tokio::spawn(pod_worker(
                uid.clone(),
                known,
                Arc::clone(&mailbox),
                Arc::clone(&self.cache),
                Arc::clone(&self.handler),
                self.metrics.clone(),
                self.shutdown.clone(),
            ));
            let worker = Worker {
                mailbox,
                task,
                last_dispatch: Instant::now(),
                last_event: 0,
            };
            self.pods.insert(uid.clone(), worker);
        }
        self.pods.get_mut(uid).expect("inserted above")
    }

    /// Pokes the pod's worker. `event`: the sequence of the event that asks, if one does.
    fn dispatch(&mut self, uid: &PodUid, reason: SyncReason, event: Option<u64>) {
        let now = Instant::now();
        let worker = self.worker(uid, None);
        worker.last_event = worker.last_event.max(event.unwrap_or_default());
        worker.last_dispatch = now;
        worker.mailbox.post(Poke {
            reason,
            sequence: worker.last_event,
            since: (reason == SyncReason::Event).then_some(now),
        });
    }

    /// The loop fell behind the bus and resubscribed at `start`, after `handled`: what it
    /// skipped is counted as discarded, and every cached pod resynced. Returns the last event
    /// handled now.
    fn caught_up(&mut self, start: u64, handled: u64) -> u64 {
        let skipped = start.saturating_sub(handled + 1);
        warn!(
            skipped,
            "the sync loop fell behind; resyncing every cached pod"
        );
        self.metrics.discarded_events(skipped);
        let handled = start.saturating_sub(1);
        for (uid, _) in self.cache.pods() {
            self.dispatch(&uid, SyncReason::Event, Some(handled));
        }
        handled
    }

    /// Pods whose worker has not synced them for `interval`.
    fn due(&self, now: Instant, interval: Duration) -> Vec<PodUid> {
        self.pods
            .iter()
            .filter(|(_, w)| now.saturating_duration_since(w.last_dispatch) >= interval)
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// kubelet's housekeeping: the workers of pods the cache no longer holds send their last
    /// sync and are reaped; with `adopt`, cached pods without a (live) worker get one, for
    /// their resyncs and their `removed` sync: after a start that continued a saved run, an
    /// unchanged pod brings no event.
    fn housekeep(&mut self, adopt: bool) {
        let cached = self.cache.pods();
        let known: std::collections::HashSet<&PodUid> = cached
            .iter()
            .filter(|(_, pod)| pod.record.is_some())
            .map(|(uid, _)| uid)
            .collect();
        for (_, gone) in self.pods.extract_if(|uid, _| !known.contains(uid)) {
            gone.mailbox.post(Poke {
                reason: SyncReason::Removed,
                sequence: gone.last_event,
                since: None,
            });
        }
        if adopt {
            // Without a sync: its first comes at its resync, so a restart costs consumers no
            // burst of every pod (they ask for `initial` syncs when they want one).
            for (uid, pod) in &cached {
                if let Some(record) = &pod.record {
                    self.worker(
                        uid,
                        Some(Known {
                            seen: pod.modified,
                            namespace: record.namespace.clone(),
                            name: record.name.clone(),
                        }),
                    );
                }
            }
        }
    }
}

/// What the sync loop runs on.
pub struct Inputs<H> {
    /// The PLEG's events, and a subscription to them taken before its first relist.
    pub bus: EventBus<PodLifecycleEvent>,
    pub events: Subscription<PodLifecycleEvent>,
    pub cache: Arc<PodCache>,
    pub health: Arc<Health>,
    pub handler: Arc<H>,
    pub metrics: Metrics,
    pub config: SyncConfig,
}

/// Runs the sync loop until `shutdown` or until the bus closes. When it falls a whole queue
/// behind it skips what it missed, counts it as discarded, and resyncs every cached pod (the
/// cache, not the events, carries the state a sync acts on), so a slow handler never delays
/// the relist or other consumers.
pub async fn run<H: SyncHandler>(inputs: Inputs<H>, shutdown: CancellationToken) {
    let Inputs {
        bus,
        mut events,
        cache,
        health,
        handler,
        metrics,
        config,
    } = inputs;
    let mut workers = Workers {
        pods: HashMap::new(),
        cache: Arc::clone(&cache),
        handler,
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
    };
    // First ticks one period in: the first relist has a chance to succeed before health is
    // looked at.
    let start = Instant::now();
    let mut sync_tick = tokio::time::interval_at(start + config.sync_period, config.sync_period);
    let mut housekeeping = tokio::time::interval_at(
        start + config.housekeeping_period,
        config.housekeeping_period,
    );
    let mut healthy = true;
    let mut handled = events.start().saturating_sub(1);
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            event = events.next() => match event {
                Ok(event) => {
                    handled = event.sequence;
                    workers.dispatch(&event.pod, SyncReason::Event, Some(event.sequence));
                }
                Err(Ended::Lagged { .. }) => {
                    events = bus
                        .consume(0, events.queue())
                        .expect("a live-only subscription always starts");
                    handled = workers.caught_up(events.start(), handled);
                }
                Err(Ended::Closed) => break,
            },
            _ = sync_tick.tick() => {
                healthy = still_healthy(&health, healthy);
                if healthy {
                    for uid in workers.due(Instant::now(), config.resync_interval) {
                        workers.dispatch(&uid, SyncReason::Resync, None);
                    }
                }
            }
            _ = housekeeping.tick() => workers.housekeep(healthy),
        }
    }
}

/// kubelet skips pod syncs while the PLEG is unhealthy: their statuses would be stale. Says
/// when that starts and ends; returns whether it is healthy now.
fn still_healthy(health: &Health, was: bool) -> bool {
    match health.check() {
        Ok(()) => {
            if !was {
                info!("PLEG healthy again; resuming pod synchronization");
            }
            true
        }
        Err(e) => {
            if was {
                warn!(error = %e, "skipping pod synchronization - PLEG is not healthy");
            }
            false
        }
    }
}

/// A pod as its consumers know it: from its last sync, or from the cache when its worker was
/// adopted.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Known {
    /// The cache time of that status.
    seen: Option<Instant>,
    namespace: String,
    name: String,
}

/// Syncs one pod each time it is poked, until it is gone (after its one `Removed` sync, if
/// consumers know it) or shutdown.
async fn pod_worker<H: SyncHandler>(
    uid: PodUid,
    mut last: Option<Known>,
    mailbox: Arc<Mailbox>,
    cache: Arc<PodCache>,
    handler: Arc<H>,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    loop {
        let poke = tokio::select! {
            () = shutdown.cancelled() => return,
            poke = mailbox.take() => poke,
        };
        let status = match (poke.reason, &last) {
            (SyncReason::Removed, _) => CachedPod::default(),
            // Wait for data newer than what the last sync acted on (kubelet's GetNewerThan),
            // unless another poke (housekeeping's `Removed`) comes first.
            (
                SyncReason::Event,
                Some(Known {
                    seen: Some(seen), ..
                }),
            ) => tokio::select! {
                () = shutdown.cancelled() => return,
                status = cache.get_newer_than(&uid, *seen) => status,
                () = mailbox.posted.notified() => {
                    mailbox.put_back(poke);
                    continue;
                }
            },
            _ => cache.get(&uid),
        };
        let (reason, namespace, name) = match (&status.record, last.take()) {
            (Some(record), previous) => {
                last = Some(Known {
                    seen: status.modified.or(previous.and_then(|known| known.seen)),
                    namespace: record.namespace.clone(),
                    name: record.name.clone(),
                });
                (poke.reason, record.namespace.clone(), record.name.clone())
            }
            (
                None,
                Some(Known {
                    namespace, name, ..
                }),
            ) => (SyncReason::Removed, namespace, name),
            // Unknown to consumers: nothing to remove.
            (None, None) => return,
        };
        let sync = PodSync {
            pod: uid.clone(),
            namespace,
            name,
            reason,
            status,
            sequence: poke.sequence,
        };
        handler.sync_pod(&sync).await;
        metrics.pod_synced(reason.name(), poke.since.map(|since| since.elapsed()));
        if reason == SyncReason::Removed {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
