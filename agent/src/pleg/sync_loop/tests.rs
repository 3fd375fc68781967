use std::sync::Mutex;

use super::*;
use crate::{
    pleg::model::record::{ContainerState, PodRecord},
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
    bus: EventBus<PodLifecycleEvent>,
    metrics: Metrics,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Looping {
    fn start(health: Arc<Health>, config: SyncConfig, queue: usize) -> Self {
        let cache = Arc::new(PodCache::new());
        let handler = Arc::new(RecordingSyncHandler::default());
        let feed = SyncFeed::new();
        let bus = EventBus::new(1, 100, 100);
        let metrics = Metrics::new();
        let shutdown = CancellationToken::new();
        let events = bus.consume(0, queue).unwrap();
        let task = tokio::spawn(run(
            Inputs {
                bus: bus.clone(),
                events,
                cache: Arc::clone(&cache),
                health,
                handler: Arc::new((feed.clone(), Arc::clone(&handler))),
                metrics: metrics.clone(),
                config,
            },
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
        self.bus
            .publish(Arc::new(crate::runtime::testing::event(sequence, pod)));
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
