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
//! A program that embeds plegd implements [`SyncHandler`] and gives it to
//! [`crate::daemon::serve`]; the daemon calls it beside [`SyncFeed`], the handler that feeds
//! the API's `SyncPods` watchers. A handler that takes long delays only its own pod's next
//! sync, never the relist or other pods. `agent/examples/sync_handler.rs` runs one against
//! the fake runtime.

mod feed;

use std::{collections::HashMap, future::Future, sync::Arc, time::Duration};

pub use feed::{SyncFeed, SyncFilter, SyncSubscription};
use plegd_proto::v1 as pb;
use tokio::{sync::Notify, task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    bus::{ApiBus, Ended, Subscription},
    metrics::Metrics,
    pleg::{
        cache::{CachedPod, PodCache},
        health::Health,
        record::PodUid,
    },
};

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

/// Runs the sync loop on `events`, a subscription to `bus`, until `shutdown` or until the bus
/// closes. When it falls a whole queue behind it skips what it missed, counts it as
/// discarded, and resyncs every cached pod (the cache, not the events, carries the state a
/// sync acts on), so a slow handler never delays the relist or other consumers.
#[expect(
    clippy::too_many_arguments,
    reason = "the loop's inputs, each distinct"
)]
pub async fn run<H: SyncHandler>(
    bus: ApiBus,
    mut events: Subscription<pb::Event>,
    cache: Arc<PodCache>,
    health: Arc<Health>,
    handler: Arc<H>,
    metrics: Metrics,
    config: SyncConfig,
    shutdown: CancellationToken,
) {
    let queue = events.queue();
    let subscribe = || {
        bus.consume(0, queue)
            .expect("a live-only subscription always starts")
    };
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
                    let uid = PodUid(event.pod_uid.clone());
                    workers.dispatch(&uid, SyncReason::Event, Some(event.sequence));
                }
                Err(Ended::Lagged { .. }) => {
                    events = subscribe();
                    let skipped = events.start().saturating_sub(handled + 1);
                    warn!(skipped, "the sync loop fell behind; resyncing every cached pod");
                    metrics.discarded_events(skipped);
                    handled = events.start().saturating_sub(1);
                    for (uid, _) in cache.pods() {
                        workers.dispatch(&uid, SyncReason::Event, Some(handled));
                    }
                }
                Err(Ended::Closed) => break,
            },
            _ = sync_tick.tick() => {
                // kubelet skips pod syncs while the PLEG is unhealthy: their statuses would be
                // stale.
                match health.check() {
                    Ok(()) => {
                        if !healthy {
                            info!("PLEG healthy again; resuming pod synchronization");
                        }
                        healthy = true;
                    }
                    Err(e) => {
                        if healthy {
                            warn!(error = %e, "skipping pod synchronization - PLEG is not healthy");
                        }
                        healthy = false;
                        continue;
                    }
                }
                for uid in workers.due(Instant::now(), config.resync_interval) {
                    workers.dispatch(&uid, SyncReason::Resync, None);
                }
            }
            _ = housekeeping.tick() => workers.housekeep(healthy),
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
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{
        pleg::record::{ContainerState, PodRecord},
        runtime::testing::{container, pod},
    };

    /// Records every sync.
    #[derive(Debug, Default)]
    struct RecordingSyncHandler {
        synced: Mutex<Vec<PodSync>>,
    }

    impl RecordingSyncHandler {
        /// The syncs of `pod` so far.
        fn of(&self, pod: &str) -> Vec<PodSync> {
            self.lock()
                .iter()
                .filter(|s| s.pod.0 == pod)
                .cloned()
                .collect()
        }

        /// The last status synced for `pod` and how many syncs it had.
        fn last(&self, pod: &str) -> Option<(CachedPod, u64)> {
            let syncs = self.of(pod);
            Some((syncs.last()?.status.clone(), syncs.len() as u64))
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PodSync>> {
            self.synced.lock().unwrap_or_else(|p| p.into_inner())
        }
    }

    impl SyncHandler for RecordingSyncHandler {
        async fn sync_pod(&self, sync: &PodSync) {
            self.lock().push(sync.clone());
        }
    }

    fn record(name: &str) -> Arc<PodRecord> {
        Arc::new(pod(name, name, []))
    }

    /// A running sync loop and its ends; its handler is the API's feed and a recorder.
    struct Looping {
        cache: Arc<PodCache>,
        handler: Arc<RecordingSyncHandler>,
        feed: SyncFeed,
        bus: ApiBus,
        metrics: Metrics,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    impl Looping {
        fn start(health: Arc<Health>, config: SyncConfig, queue: usize) -> Self {
            let cache = Arc::new(PodCache::new());
            let handler = Arc::new(RecordingSyncHandler::default());
            let feed = SyncFeed::new();
            let bus = ApiBus::new(1, 100, 100);
            let metrics = Metrics::new();
            let shutdown = CancellationToken::new();
            let events = bus.consume(0, queue).unwrap();
            let task = tokio::spawn(run(
                bus.clone(),
                events,
                Arc::clone(&cache),
                health,
                Arc::new((feed.clone(), Arc::clone(&handler))),
                metrics.clone(),
                config,
                shutdown.clone(),
            ));
            Self {
                cache,
                handler,
                feed,
                bus,
                metrics,
                shutdown,
                task,
            }
        }

        /// A loop whose PLEG is healthy.
        fn healthy(queue: usize) -> Self {
            let health = Arc::new(Health::new(Duration::from_secs(180)));
            health.relist_succeeded(Instant::now());
            Self::start(health, SyncConfig::default(), queue)
        }

        /// Publishes an event about `pod` with the next sequence; returns the sequence.
        fn publish(&self, pod: &str) -> u64 {
            let sequence = self.bus.last_sequence() + 1;
            self.bus.publish(Arc::new(pb::Event {
                sequence,
                pod_uid: pod.into(),
                ..pb::Event::default()
            }));
            sequence
        }

        async fn stop(self) {
            self.shutdown.cancel();
            self.task.await.unwrap();
        }

        /// Waits (in paused time) until `pod` has been synced `count` times.
        async fn synced(&self, pod: &str, count: u64) -> CachedPod {
            loop {
                if let Some((status, n)) = self.handler.last(pod)
                    && n >= count
                {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    #[test]
    fn pokes_coalesce_into_the_latest_reason_that_still_tells_of_a_change() {
        use SyncReason::{Event, Removed, Resync};
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(1);
        let poke = |reason, sequence, since| Poke {
            reason,
            sequence,
            since,
        };
        let table = [
            (
                poke(Event, 1, Some(t0)),
                poke(Event, 2, Some(t1)),
                poke(Event, 2, Some(t0)),
            ),
            (
                poke(Event, 3, Some(t1)),
                poke(Resync, 3, None),
                poke(Event, 3, Some(t1)),
            ),
            (
                poke(Resync, 3, None),
                poke(Event, 4, Some(t1)),
                poke(Event, 4, Some(t1)),
            ),
            (
                poke(Resync, 3, None),
                poke(Resync, 3, None),
                poke(Resync, 3, None),
            ),
            (
                poke(Event, 3, Some(t0)),
                poke(Removed, 3, None),
                poke(Removed, 3, Some(t0)),
            ),
            (
                poke(Resync, 0, None),
                poke(Removed, 5, None),
                poke(Removed, 5, None),
            ),
        ];
        for (older, newer, want) in table {
            assert_eq!(older.coalesce(newer), want, "{older:?} then {newer:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn events_have_their_pods_synced_with_cached_status() {
        let l = Looping::healthy(4);
        let (cache, handler) = (Arc::clone(&l.cache), Arc::clone(&l.handler));
        cache.set(PodUid("p".into()), Some(record("p")), Instant::now());
        let first = l.publish("p");
        let synced = l.synced("p", 1).await;
        assert_eq!(synced.record, Some(record("p")));
        let sync = handler.of("p")[0].clone();
        assert_eq!(
            (sync.reason, sync.sequence, sync.namespace.as_str()),
            (SyncReason::Event, first, "ns")
        );

        // A second event with no newer cache data waits for the cache (get_newer_than).
        l.publish("p");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            handler.last("p").unwrap().1,
            1,
            "synced again on stale data"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.set(PodUid("p".into()), Some(record("p")), Instant::now());
        l.synced("p", 2).await;
        assert_eq!(handler.last("p").unwrap().1, 2);
        assert!(
            l.metrics
                .encode()
                .contains("plegd_pod_syncs_total{reason=\"event\"} 2"),
            "{}",
            l.metrics.encode()
        );
        assert!(
            l.metrics
                .encode()
                .contains("plegd_event_to_sync_seconds_count 2"),
        );
        l.stop().await;
    }

    /// A sync loop that falls behind the bus does not slow the publisher: it skips, counts the
    /// skipped events as discarded, and resyncs every cached pod.
    #[tokio::test(start_paused = true)]
    async fn a_loop_that_falls_behind_resyncs_every_cached_pod() {
        let l = Looping::healthy(4);
        for pod in ["a", "b"] {
            l.cache
                .set(PodUid(pod.into()), Some(record(pod)), Instant::now());
        }
        // Far more than its queue of 4, published before it can run.
        for _ in 0..20 {
            l.publish("a");
        }
        // b had no event, yet is synced: the resync after the lag.
        l.synced("b", 1).await;
        l.synced("a", 1).await;
        // Lagged before it read any: all 20 skipped.
        assert!(
            l.metrics
                .encode()
                .contains("kubelet_pleg_discard_events 20"),
            "{}",
            l.metrics.encode()
        );
        l.stop().await;
    }

    /// A cached pod that brings no event (a start that continued a saved run) is adopted at
    /// housekeeping without a sync: no burst of every pod; its first sync is its resync, and
    /// when it goes it gets its `removed` sync.
    #[tokio::test(start_paused = true)]
    async fn cached_pods_without_events_are_adopted_at_housekeeping_without_a_burst() {
        let l = Looping::healthy(4);
        let start = Instant::now();
        let (cache, handler) = (&l.cache, &l.handler);
        let uid = PodUid("quiet".into());
        cache.set(uid.clone(), Some(record("quiet")), Instant::now());
        tokio::time::sleep(DEFAULT_HOUSEKEEPING_PERIOD * 2).await;
        assert!(handler.last("quiet").is_none(), "synced at adoption");
        let synced = l.synced("quiet", 1).await;
        assert_eq!(synced.record, Some(record("quiet")));
        assert_eq!(handler.of("quiet")[0].reason, SyncReason::Resync);
        assert!(
            start.elapsed() >= DEFAULT_RESYNC_INTERVAL,
            "{:?}",
            start.elapsed()
        );

        // Another one, adopted, goes before any sync: consumers knew it, it gets `removed`.
        let gone = PodUid("gone".into());
        cache.set(gone.clone(), Some(record("gone")), Instant::now());
        tokio::time::sleep(DEFAULT_HOUSEKEEPING_PERIOD * 2).await;
        cache.delete(&gone);
        let removed = l.synced("gone", 1).await;
        assert_eq!(removed.record, None);
        assert_eq!(handler.of("gone")[0].reason, SyncReason::Removed);
        l.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_unhealthy_pleg_pauses_resyncs() {
        // Never succeeded: unhealthy.
        let health = Arc::new(Health::new(Duration::from_secs(1)));
        let config = SyncConfig {
            resync_interval: Duration::from_secs(2),
            ..SyncConfig::default()
        };
        let l = Looping::start(Arc::clone(&health), config, 4);
        let (cache, handler) = (Arc::clone(&l.cache), Arc::clone(&l.handler));
        let uid = PodUid("p".into());
        cache.set(uid.clone(), Some(record("p")), Instant::now());
        l.publish("p");
        l.synced("p", 1).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        // Only the event's sync: resyncs were skipped while unhealthy.
        assert_eq!(handler.last("p").unwrap().1, 1);

        health.relist_succeeded(Instant::now());
        cache.set(uid.clone(), Some(record("p")), Instant::now());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            handler.last("p").unwrap().1,
            2,
            "resync resumed once healthy"
        );
        l.stop().await;
    }

    /// A pod with no more events is resynced every resync interval (within a sync period),
    /// not before; each resync carries the pod's last event.
    #[tokio::test(start_paused = true)]
    async fn resyncs_come_at_the_interval() {
        let l = Looping::healthy(4);
        let start = Instant::now();
        l.cache
            .set(PodUid("p".into()), Some(record("p")), Instant::now());
        let sequence = l.publish("p");
        l.synced("p", 1).await;
        let mut resynced_at = Vec::new();
        for n in 2..=4 {
            l.synced("p", n).await;
            resynced_at.push(start.elapsed());
        }
        let interval = DEFAULT_RESYNC_INTERVAL;
        for (k, at) in resynced_at.iter().enumerate() {
            let due = interval * (k as u32 + 1);
            assert!(
                *at >= due && *at <= due + DEFAULT_SYNC_PERIOD + Duration::from_millis(20),
                "resync {k} at {at:?}, due at {due:?}"
            );
        }
        let syncs = l.handler.of("p");
        assert!(
            syncs[1..]
                .iter()
                .all(|s| (s.reason, s.sequence) == (SyncReason::Resync, sequence)),
            "{syncs:?}"
        );
        l.stop().await;
    }

    /// A pod that leaves the cache gets exactly one `removed` sync, after its last event and
    /// with its sequence, and then no more, resyncs included.
    #[tokio::test(start_paused = true)]
    async fn a_removed_pod_gets_exactly_one_removed_sync() {
        let l = Looping::healthy(16);
        let uid = PodUid("gone".into());
        l.cache
            .set(uid.clone(), Some(record("gone")), Instant::now());
        l.publish("gone");
        l.synced("gone", 1).await;
        // The relist deletes it and publishes its last events (ContainerDied, Removed).
        l.cache.delete(&uid);
        l.publish("gone");
        let last = l.publish("gone");
        l.synced("gone", 2).await;
        // Long enough for every housekeeping and resync to have had its chance.
        tokio::time::sleep(DEFAULT_RESYNC_INTERVAL * 3).await;
        let syncs = l.handler.of("gone");
        let removed: Vec<_> = syncs
            .iter()
            .filter(|s| s.reason == SyncReason::Removed)
            .collect();
        assert_eq!(removed.len(), 1, "{syncs:?}");
        assert_eq!(syncs.last().unwrap().reason, SyncReason::Removed);
        let removed = removed[0];
        assert_eq!(
            (
                removed.sequence,
                removed.status.record.as_ref(),
                removed.name.as_str()
            ),
            (last, None, "gone")
        );
        assert_eq!(syncs.len(), 2, "{syncs:?}");
        l.stop().await;
    }

    /// A burst on several pods while one consumer does not read: that consumer then gets one
    /// sync per pod, each the pod's last state, and held only one per pod meanwhile; a
    /// consumer that reads along gets more, never stale ones out of order.
    #[tokio::test(start_paused = true)]
    async fn a_consumer_that_stops_reading_gets_each_pods_last_state_in_fewer_syncs() {
        const PODS: usize = 5;
        const EVENTS: usize = 100;
        let l = Looping::healthy(4 * PODS * EVENTS);
        let mut slow = l.feed.subscribe(Box::new(|_| true));
        let mut fast = l.feed.subscribe(Box::new(|_| true));
        let name = |p: usize| format!("p{p}");
        let state = |i: usize| {
            if i.is_multiple_of(2) {
                ContainerState::Running
            } else {
                ContainerState::Exited
            }
        };
        let base = Instant::now();
        let mut last = HashMap::new();
        let mut fast_got = HashMap::<String, Vec<u64>>::new();
        for i in 0..EVENTS {
            for p in 0..PODS {
                let mut pod = pod(&name(p), &name(p), []);
                let c = container("c", "app", state(i + p));
                pod.containers.insert(c.id.clone(), c);
                let at = base + Duration::from_micros((i * PODS + p) as u64 + 1);
                l.cache
                    .set(pod.uid.clone(), Some(Arc::new(pod.clone())), at);
                last.insert(name(p), (l.publish(&name(p)), pod));
            }
            // The fast consumer reads what is there every few events.
            if i % 10 == 9 {
                tokio::time::sleep(Duration::from_millis(1)).await;
                while fast.pending() > 0 {
                    let sync = fast.next().await.unwrap();
                    fast_got
                        .entry(sync.pod.0.clone())
                        .or_default()
                        .push(sync.sequence);
                }
            }
        }
        // Every pod's last event synced: the fast consumer sees each pod's last sequence.
        let caught_up = |got: &HashMap<String, Vec<u64>>| {
            (0..PODS).all(|p| got.get(&name(p)).and_then(|s| s.last()) == Some(&last[&name(p)].0))
        };
        while !caught_up(&fast_got) {
            let sync = fast.next().await.unwrap();
            fast_got
                .entry(sync.pod.0.clone())
                .or_default()
                .push(sync.sequence);
        }
        assert_eq!(
            slow.pending(),
            PODS,
            "one pending sync per pod, whatever the burst"
        );
        let mut slow_got = HashMap::new();
        while slow.pending() > 0 {
            let sync = slow.next().await.unwrap();
            assert!(slow_got.insert(sync.pod.0.clone(), sync).is_none());
        }
        for p in 0..PODS {
            let (sequence, pod) = &last[&name(p)];
            let sync = &slow_got[&name(p)];
            assert_eq!(
                (sync.sequence, sync.status.record.as_deref()),
                (*sequence, Some(pod))
            );
            let fast = &fast_got[&name(p)];
            assert!(fast.windows(2).all(|w| w[0] < w[1]), "{fast:?}");
            assert!(fast.len() > 1 && fast.len() < EVENTS, "{fast:?}");
        }
        l.stop().await;
    }
}
