//! Pod syncs fanned out to consumers (the API's sync watchers): per consumer, per pod, the
//! latest sync wins.
//!
//! Each consumer has a [`Pending`] set: the newest sync not yet taken of each pod, in the
//! order the pods became pending. A sync of a pod already pending replaces it in place
//! ([`SyncReason::coalesce`]), so a consumer that reads slowly gets fewer, newer syncs, its
//! memory is bounded by the number of pods (never by the event rate), and it is never ended
//! for lagging. Offering a sync never blocks and never waits on a consumer.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::sync::Notify;

use super::{PodSync, SyncHandler};
use crate::pleg::model::record::PodUid;

/// Which syncs a consumer wants.
pub type SyncFilter = Box<dyn Fn(&PodSync) -> bool + Send + Sync>;

/// A consumer's syncs not taken yet: at most one per pod. Plain data, no I/O.
#[derive(Debug, Default)]
struct Pending {
    syncs: HashMap<PodUid, Arc<PodSync>>,
    /// The pods of `syncs`, oldest pending first; each once.
    order: VecDeque<PodUid>,
}

impl Pending {
    /// Adds `sync`, replacing the pod's pending one (which keeps its place in line).
    fn offer(&mut self, sync: Arc<PodSync>) {
        match self.syncs.get_mut(&sync.pod) {
            Some(pending) => {
                let reason = pending.reason.coalesce(sync.reason);
                *pending = if reason == sync.reason {
                    sync
                } else {
                    Arc::new(PodSync {
                        reason,
                        ..PodSync::clone(&sync)
                    })
                };
            }
            None => {
                self.order.push_back(sync.pod.clone());
                self.syncs.insert(sync.pod.clone(), sync);
            }
        }
    }

    /// The oldest pending pod's latest sync.
    fn take(&mut self) -> Option<Arc<PodSync>> {
        let pod = self.order.pop_front()?;
        self.syncs.remove(&pod)
    }

    /// How many pods have a sync pending.
    fn len(&self) -> usize {
        self.syncs.len()
    }
}

/// Fans syncs out to every subscribed consumer; a [`SyncHandler`]. Cheap to clone.
#[derive(Clone, Default)]
pub struct SyncFeed {
    inner: Arc<Mutex<Consumers>>,
}

#[derive(Default)]
struct Consumers {
    consumers: Vec<(u64, Arc<Consumer>)>,
    next_id: u64,
    closed: bool,
}

struct Consumer {
    pending: Mutex<Pending>,
    ready: Notify,
    filter: SyncFilter,
    closed: AtomicBool,
}

impl Consumer {
    fn offer(&self, sync: &Arc<PodSync>) {
        if (self.filter)(sync) {
            lock(&self.pending).offer(Arc::clone(sync));
            self.ready.notify_one();
        }
    }
}

impl std::fmt::Debug for SyncFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncFeed")
            .field("consumers", &lock(&self.inner).consumers.len())
            .finish()
    }
}

impl SyncFeed {
    pub fn new() -> Self {
        Self::default()
    }

    /// A consumer of the syncs `filter` keeps, from now on.
    pub fn subscribe(&self, filter: SyncFilter) -> SyncSubscription {
        let mut inner = lock(&self.inner);
        let consumer = Arc::new(Consumer {
            pending: Mutex::default(),
            ready: Notify::new(),
            filter,
            closed: inner.closed.into(),
        });
        let id = inner.next_id;
        inner.next_id += 1;
        if !inner.closed {
            inner.consumers.push((id, Arc::clone(&consumer)));
        }
        SyncSubscription {
            id,
            consumer,
            feed: Arc::clone(&self.inner),
        }
    }

    /// Hands `sync` to every consumer that wants it; never blocks.
    pub fn offer(&self, sync: PodSync) {
        let sync = Arc::new(sync);
        for (_, consumer) in &lock(&self.inner).consumers {
            consumer.offer(&sync);
        }
    }

    /// Ends every subscription once it has taken what is pending, and refuses new ones.
    pub fn close(&self) {
        let mut inner = lock(&self.inner);
        inner.closed = true;
        for (_, consumer) in inner.consumers.drain(..) {
            consumer.closed.store(true, Ordering::Release);
            consumer.ready.notify_one();
        }
    }
}

impl SyncHandler for SyncFeed {
    async fn sync_pod(&self, sync: &PodSync) {
        self.offer(sync.clone());
    }
}

/// One consumer's syncs.
pub struct SyncSubscription {
    id: u64,
    consumer: Arc<Consumer>,
    feed: Arc<Mutex<Consumers>>,
}

impl SyncSubscription {
    /// The oldest pending pod's latest sync; `None` once the feed is closed and nothing is
    /// pending.
    pub async fn next(&mut self) -> Option<Arc<PodSync>> {
        loop {
            if let Some(sync) = lock(&self.consumer.pending).take() {
                return Some(sync);
            }
            if self.consumer.closed.load(Ordering::Acquire) {
                return None;
            }
            self.consumer.ready.notified().await;
        }
    }

    /// Hands `sync` to this consumer alone, if its filter keeps it (its initial syncs).
    pub fn offer(&self, sync: PodSync) {
        self.consumer.offer(&Arc::new(sync));
    }

    /// How many pods have a sync pending for this consumer (its whole backlog).
    pub fn pending(&self) -> usize {
        lock(&self.consumer.pending).len()
    }
}

impl Drop for SyncSubscription {
    fn drop(&mut self) {
        let id = self.id;
        lock(&self.feed).consumers.retain(|(other, _)| *other != id);
    }
}

impl std::fmt::Debug for SyncSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncSubscription")
            .field("id", &self.id)
            .field("pending", &self.pending())
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain collections updated in single statements: a poisoned lock is still consistent.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pleg::{shared::cache::CachedPod, sync_loop::SyncReason},
        runtime::testing::pod as record,
    };

    fn sync(pod: &str, reason: SyncReason, sequence: u64) -> PodSync {
        PodSync {
            pod: PodUid(pod.into()),
            namespace: "ns".into(),
            name: pod.into(),
            reason,
            status: CachedPod {
                record: (reason != SyncReason::Removed).then(|| Arc::new(record(pod, pod, []))),
                modified: None,
            },
            sequence,
        }
    }

    /// What a consumer that reads only after `offered` takes, as (pod, reason, sequence).
    fn taken(offered: &[(&str, SyncReason, u64)]) -> Vec<(String, SyncReason, u64)> {
        let mut pending = Pending::default();
        for (pod, reason, sequence) in offered {
            pending.offer(Arc::new(sync(pod, *reason, *sequence)));
        }
        std::iter::from_fn(|| pending.take())
            .map(|s| (s.pod.0.clone(), s.reason, s.sequence))
            .collect()
    }

    /// Syncs as (pod, reason, sequence).
    type Rows<'a> = &'a [(&'a str, SyncReason, u64)];

    #[test]
    fn a_consumer_takes_the_latest_sync_of_each_pod_in_the_order_pods_became_pending() {
        use SyncReason::{Event, Removed, Resync};
        let own = |rows: &[(&str, SyncReason, u64)]| -> Vec<(String, SyncReason, u64)> {
            rows.iter()
                .map(|(p, r, s)| (p.to_string(), *r, *s))
                .collect()
        };
        let table: &[(Rows, Rows)] = &[
            (&[], &[]),
            (&[("a", Event, 1)], &[("a", Event, 1)]),
            // Latest wins; the pod keeps its place in line.
            (
                &[("a", Event, 1), ("b", Event, 2), ("a", Event, 3)],
                &[("a", Event, 3), ("b", Event, 2)],
            ),
            // A resync does not hide a change the consumer has not been told of.
            (&[("a", Event, 1), ("a", Resync, 1)], &[("a", Event, 1)]),
            (&[("a", Resync, 1), ("a", Event, 2)], &[("a", Event, 2)]),
            (&[("a", Resync, 1), ("a", Resync, 1)], &[("a", Resync, 1)]),
            // Removed is the last word.
            (&[("a", Event, 1), ("a", Removed, 2)], &[("a", Removed, 2)]),
            (&[("a", Resync, 1), ("a", Removed, 1)], &[("a", Removed, 1)]),
        ];
        for (offered, want) in table {
            assert_eq!(taken(offered), own(want), "offered {offered:?}");
        }
    }

    #[test]
    fn a_burst_costs_one_pending_sync_per_pod() {
        let mut pending = Pending::default();
        for sequence in 1..=10_000 {
            let pod = format!("p{}", sequence % 7);
            pending.offer(Arc::new(sync(&pod, SyncReason::Event, sequence)));
        }
        assert_eq!(pending.len(), 7);
        let last = std::iter::from_fn(|| pending.take())
            .map(|s| s.sequence)
            .max();
        assert_eq!(last, Some(10_000));
        assert_eq!(pending.len(), 0);
    }

    #[tokio::test]
    async fn consumers_are_filtered_independent_and_end_after_what_is_pending() {
        let feed = SyncFeed::new();
        let mut all = feed.subscribe(Box::new(|_| true));
        let mut only_b = feed.subscribe(Box::new(|s| s.pod.0 == "b"));
        feed.offer(sync("a", SyncReason::Event, 1));
        feed.offer(sync("b", SyncReason::Event, 2));
        // Its own syncs: to this consumer alone, filtered.
        only_b.offer(sync("a", SyncReason::Resync, 2));
        assert_eq!((all.pending(), only_b.pending()), (2, 1));
        assert_eq!(only_b.next().await.unwrap().sequence, 2);
        // One consumer reading does not take from another.
        assert_eq!(all.pending(), 2);
        feed.close();
        assert_eq!(all.next().await.unwrap().pod.0, "a");
        assert_eq!(all.next().await.unwrap().pod.0, "b");
        assert!(all.next().await.is_none());
        assert!(only_b.next().await.is_none());
        // A closed feed refuses new consumers.
        assert!(feed.subscribe(Box::new(|_| true)).next().await.is_none());
        drop(all);
        assert!(lock(&feed.inner).consumers.is_empty());
    }

    #[tokio::test]
    async fn a_dropped_subscription_leaves_the_feed() {
        let feed = SyncFeed::new();
        let subscription = feed.subscribe(Box::new(|_| true));
        assert_eq!(lock(&feed.inner).consumers.len(), 1);
        drop(subscription);
        feed.offer(sync("a", SyncReason::Event, 1));
        assert!(lock(&feed.inner).consumers.is_empty());
    }
}
