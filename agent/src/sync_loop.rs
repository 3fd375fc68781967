//! The sync loop (kubelet's `syncLoop`/`syncLoopIteration`): selects over PLEG events, a sync
//! tick, housekeeping and health, and dispatches pods to per-pod workers that read the cache
//! with `get_newer_than` and call a [`SyncHandler`].

use std::{collections::HashMap, future::Future, sync::Arc, time::Duration};

use plegd_proto::v1 as pb;
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncReason {
    /// A lifecycle event arrived for the pod.
    Event,
    /// Its periodic resync came due.
    Resync,
}

/// kubelet's extension point: what to do with a pod's fresh status.
pub trait SyncHandler: Send + Sync + 'static {
    /// Called by the pod's worker with a status newer than the one of its previous call.
    fn sync_pod(
        &self,
        pod: &PodUid,
        status: &CachedPod,
        reason: SyncReason,
    ) -> impl Future<Output = ()> + Send;
}

/// The daemon's handler: logs each sync (plegd has no pods to act on; library users bring
/// their own handler). Keeps no state, so it costs nothing per pod ever seen.
#[derive(Debug, Default)]
pub struct LoggingSyncHandler;

impl SyncHandler for LoggingSyncHandler {
    async fn sync_pod(&self, pod: &PodUid, status: &CachedPod, reason: SyncReason) {
        let containers = status.record.as_ref().map_or(0, |r| r.containers.len());
        debug!(%pod, ?reason, containers, "pod synced");
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

/// One pod's worker: a task that syncs the pod each time it is poked, never twice on the same
/// cache state. Pokes while it is busy coalesce into one.
struct Worker {
    poke: watch::Sender<SyncReason>,
    last_dispatch: Instant,
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
    let mut workers: HashMap<PodUid, Worker> = HashMap::new();
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
                    dispatch(&mut workers, &uid, SyncReason::Event, &cache, &handler, &shutdown);
                }
                Err(Ended::Lagged { .. }) => {
                    events = subscribe();
                    let skipped = events.start().saturating_sub(handled + 1);
                    warn!(skipped, "the sync loop fell behind; resyncing every cached pod");
                    metrics.discarded_events(skipped);
                    handled = events.start().saturating_sub(1);
                    for (uid, _) in cache.pods() {
                        dispatch(&mut workers, &uid, SyncReason::Event, &cache, &handler, &shutdown);
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
                let now = Instant::now();
                let due: Vec<PodUid> = workers
                    .iter()
                    .filter(|(_, w)| now.saturating_duration_since(w.last_dispatch) >= config.resync_interval)
                    .map(|(uid, _)| uid.clone())
                    .collect();
                for uid in due {
                    dispatch(&mut workers, &uid, SyncReason::Resync, &cache, &handler, &shutdown);
                }
            }
            _ = housekeeping.tick() => {
                // Reap workers of pods the cache no longer holds, and adopt the pods it holds
                // without one: after a start that continued a saved run, an unchanged pod
                // brings no event.
                let cached = cache.pods();
                let known: std::collections::HashSet<&PodUid> =
                    cached.iter().map(|(uid, _)| uid).collect();
                workers.retain(|uid, _| known.contains(uid));
                if healthy {
                    for (uid, pod) in &cached {
                        if pod.record.is_some() && !workers.contains_key(uid) {
                            dispatch(&mut workers, uid, SyncReason::Resync, &cache, &handler, &shutdown);
                        }
                    }
                }
            }
        }
    }
}

fn dispatch<H: SyncHandler>(
    workers: &mut HashMap<PodUid, Worker>,
    uid: &PodUid,
    reason: SyncReason,
    cache: &Arc<PodCache>,
    handler: &Arc<H>,
    shutdown: &CancellationToken,
) {
    let now = Instant::now();
    if let Some(worker) = workers.get_mut(uid)
        && !worker.poke.is_closed()
    {
        worker.last_dispatch = now;
        worker.poke.send_replace(reason);
        return;
    }
    let (poke, pokes) = watch::channel(reason);
    tokio::spawn(pod_worker(
        uid.clone(),
        pokes,
        Arc::clone(cache),
        Arc::clone(handler),
        shutdown.clone(),
    ));
    workers.insert(
        uid.clone(),
        Worker {
            poke,
            last_dispatch: now,
        },
    );
}

async fn pod_worker<H: SyncHandler>(
    uid: PodUid,
    mut pokes: watch::Receiver<SyncReason>,
    cache: Arc<PodCache>,
    handler: Arc<H>,
    shutdown: CancellationToken,
) {
    // The first poke is the channel's initial value.
    pokes.mark_changed();
    let mut last_seen: Option<Instant> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = pokes.changed() => if changed.is_err() { return },
        }
        let reason = *pokes.borrow_and_update();
        let status = match last_seen {
            // Wait for data newer than what the last sync acted on (kubelet's GetNewerThan).
            Some(seen) => tokio::select! {
                () = shutdown.cancelled() => return,
                status = cache.get_newer_than(&uid, seen) => status,
            },
            None => cache.get(&uid),
        };
        last_seen = status.modified.or(last_seen);
        handler.sync_pod(&uid, &status, reason).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::pleg::record::PodRecord;

    /// Keeps the last status synced per pod and how many syncs it had.
    #[derive(Debug, Default)]
    struct RecordingSyncHandler {
        synced: Mutex<HashMap<PodUid, (CachedPod, u64)>>,
    }

    impl RecordingSyncHandler {
        /// The last status synced for `pod` and how many syncs it had.
        fn last(&self, pod: &PodUid) -> Option<(CachedPod, u64)> {
            self.lock().get(pod).cloned()
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PodUid, (CachedPod, u64)>> {
            self.synced.lock().unwrap_or_else(|p| p.into_inner())
        }
    }

    impl SyncHandler for RecordingSyncHandler {
        async fn sync_pod(&self, pod: &PodUid, status: &CachedPod, _reason: SyncReason) {
            let mut synced = self.lock();
            let entry = synced
                .entry(pod.clone())
                .or_insert_with(|| (CachedPod::default(), 0));
            *entry = (status.clone(), entry.1 + 1);
        }
    }

    /// Publishes an event about `pod` with the next sequence.
    fn publish(bus: &ApiBus, pod: &str) {
        bus.publish(Arc::new(pb::Event {
            sequence: bus.last_sequence() + 1,
            pod_uid: pod.into(),
            ..pb::Event::default()
        }));
    }

    fn record(pod: &str) -> PodRecord {
        PodRecord {
            uid: PodUid(pod.into()),
            namespace: "ns".into(),
            name: pod.into(),
            containers: Default::default(),
        }
    }

    /// A running sync loop and its ends.
    struct Looping {
        cache: Arc<PodCache>,
        handler: Arc<RecordingSyncHandler>,
        bus: ApiBus,
        metrics: Metrics,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    impl Looping {
        fn start(health: Arc<Health>, config: SyncConfig) -> Self {
            let cache = Arc::new(PodCache::new());
            let handler = Arc::new(RecordingSyncHandler::default());
            let bus = ApiBus::new(1, 100, 100);
            let metrics = Metrics::new();
            let shutdown = CancellationToken::new();
            let events = bus.consume(0, 4).unwrap();
            let task = tokio::spawn(run(
                bus.clone(),
                events,
                Arc::clone(&cache),
                health,
                Arc::clone(&handler),
                metrics.clone(),
                config,
                shutdown.clone(),
            ));
            Self {
                cache,
                handler,
                bus,
                metrics,
                shutdown,
                task,
            }
        }

        /// A loop whose PLEG is healthy.
        fn healthy() -> Self {
            let health = Arc::new(Health::new(Duration::from_secs(180)));
            health.relist_succeeded(Instant::now());
            Self::start(health, SyncConfig::default())
        }

        async fn stop(self) {
            self.shutdown.cancel();
            self.task.await.unwrap();
        }

        /// Waits (in paused time) until `pod` has been synced `count` times.
        async fn synced(&self, pod: &PodUid, count: u64) -> CachedPod {
            loop {
                if let Some((status, n)) = self.handler.last(pod)
                    && n >= count
                {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn events_have_their_pods_synced_with_cached_status() {
        let l = Looping::healthy();
        let (cache, handler) = (Arc::clone(&l.cache), Arc::clone(&l.handler));
        cache.set(PodUid("p".into()), Some(record("p")), Instant::now());
        publish(&l.bus, "p");
        let uid = PodUid("p".into());
        let synced = l.synced(&uid, 1).await;
        assert_eq!(synced.record, Some(record("p")));
        assert_eq!(handler.last(&uid).unwrap().1, 1);

        // A second event with no newer cache data waits for the cache (get_newer_than).
        publish(&l.bus, "p");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            handler.last(&uid).unwrap().1,
            1,
            "synced again on stale data"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.set(uid.clone(), Some(record("p")), Instant::now());
        l.synced(&uid, 2).await;
        assert_eq!(handler.last(&uid).unwrap().1, 2);
        l.stop().await;
    }

    /// A sync loop that falls behind the bus does not slow the publisher: it skips, counts the
    /// skipped events as discarded, and resyncs every cached pod.
    #[tokio::test(start_paused = true)]
    async fn a_loop_that_falls_behind_resyncs_every_cached_pod() {
        let l = Looping::healthy();
        for pod in ["a", "b"] {
            l.cache
                .set(PodUid(pod.into()), Some(record(pod)), Instant::now());
        }
        // Far more than its queue of 4, published before it can run.
        for _ in 0..20 {
            publish(&l.bus, "a");
        }
        // b had no event, yet is synced: the resync after the lag.
        l.synced(&PodUid("b".into()), 1).await;
        l.synced(&PodUid("a".into()), 1).await;
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

    #[tokio::test(start_paused = true)]
    async fn cached_pods_without_events_are_adopted_at_housekeeping() {
        let l = Looping::healthy();
        let (cache, handler) = (&l.cache, &l.handler);
        let uid = PodUid("quiet".into());
        cache.set(uid.clone(), Some(record("quiet")), Instant::now());
        tokio::time::sleep(DEFAULT_HOUSEKEEPING_PERIOD / 2).await;
        assert!(handler.last(&uid).is_none(), "not before housekeeping");
        tokio::time::sleep(DEFAULT_HOUSEKEEPING_PERIOD).await;
        let (synced, count) = handler.last(&uid).expect("adopted and synced");
        assert_eq!((synced.record, count), (Some(record("quiet")), 1));
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
        let l = Looping::start(Arc::clone(&health), config);
        let (cache, handler) = (Arc::clone(&l.cache), Arc::clone(&l.handler));
        let uid = PodUid("p".into());
        cache.set(uid.clone(), Some(record("p")), Instant::now());
        publish(&l.bus, "p");
        l.synced(&uid, 1).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        // Only the event's sync: resyncs were skipped while unhealthy.
        assert_eq!(handler.last(&uid).unwrap().1, 1);

        health.relist_succeeded(Instant::now());
        cache.set(uid.clone(), Some(record("p")), Instant::now());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            handler.last(&uid).unwrap().1,
            2,
            "resync resumed once healthy"
        );
        l.stop().await;
    }
}
