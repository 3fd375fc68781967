//! The pod cache: the latest inspected record of every pod, with the time it was read (kubelet's
//! `container.Cache`).
//!
//! Consumers (per-pod workers) call [`PodCache::get_newer_than`] with the time of the last state
//! they acted on, so they never act twice on the same stale data. The relist writes entries and,
//! after each full relist, raises a global timestamp that vouches for *every* pod, including the
//! ones that do not exist (a miss then means "no such pod", not "not read yet").

use std::{
    collections::{HashMap, hash_map},
    sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard},
};

use tokio::{sync::Notify, time::Instant};

use crate::pleg::model::record::{ContainerId, PodRecord, PodUid};

/// What the cache holds for one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachedPod {
    /// The inspected record; `None` (the default status) when the cache knows of no such pod.
    pub record: Option<Arc<PodRecord>>,
    /// When the record was read (taken just before the inspection, so the record is at least
    /// this fresh); `None` on a miss.
    pub modified: Option<Instant>,
}

/// Latest pod records, one lock for all of them.
#[derive(Debug, Default)]
pub struct PodCache {
    inner: Mutex<Inner>,
    /// Woken on every write, so `get_newer_than` re-checks instead of polling.
    changed: Notify,
    /// Taken by the relist while it writes a pod's entry and publishes the events the entry
    /// announces ([`PodCache::publishing`]), and by a listing while it reads the entries with
    /// the event stream's position ([`PodCache::listing`]): a listing then shows exactly what
    /// the events up to its position add up to, never an entry whose events follow it.
    steps: RwLock<()>,
}

#[derive(Debug, Default)]
struct Inner {
    pods: HashMap<PodUid, Entry>,
    /// Every entry is at least this fresh: the start of the last full relist.
    global: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    record: Option<Arc<PodRecord>>,
    modified: Instant,
}

impl PodCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The pod's cached record, or the default (no record, no timestamp) on a miss.
    pub fn get(&self, uid: &PodUid) -> CachedPod {
        self.lock()
            .pods
            .get(uid)
            .map(Entry::cached)
            .unwrap_or_default()
    }

    /// Waits until the cache holds data for `uid` newer than `min`: the pod's own entry was
    /// written after `min`, or a full relist that started after `min` has finished.
    pub async fn get_newer_than(&self, uid: &PodUid, min: Instant) -> CachedPod {
        loop {
            // Register before checking: a write between the check and the await still wakes us.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(pod) = self.get_if_newer_than(uid, min) {
                return pod;
            }
            notified.await;
        }
    }

    /// Stores a pod's record read at `modified` (`None` = the pod no longer exists). A write
    /// older than the current entry is ignored: inspections run concurrently and may finish out
    /// of order, and the cache must never go back in time.
    pub fn set(&self, uid: PodUid, record: Option<Arc<PodRecord>>, modified: Instant) {
        {
            let entry = Entry { record, modified };
            match self.lock().pods.entry(uid) {
                hash_map::Entry::Occupied(old) if old.get().modified > modified => return,
                hash_map::Entry::Occupied(mut old) => {
                    old.insert(entry);
                }
                hash_map::Entry::Vacant(new) => {
                    new.insert(entry);
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// Declares every entry at least as fresh as `at`; called after each full relist. Never
    /// moves back.
    pub fn update_time(&self, at: Instant) {
        {
            let mut inner = self.lock();
            inner.global = inner.global.max(Some(at));
        }
        self.changed.notify_waiters();
    }

    /// Waits until a full relist has vouched for the cache: before the first one, the cache
    /// holds only the pods read so far, and a pod it lacks may simply not be read yet.
    pub async fn await_first_full_relist(&self) {
        loop {
            // Register before checking, as in `get_newer_than`.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().global.is_some() {
                return;
            }
            notified.await;
        }
    }

    /// Held while a pod's entry is written and its events published: no listing sees one
    /// without the other.
    pub fn publishing(&self) -> RwLockWriteGuard<'_, ()> {
        // Guards no data: a poisoned lock is still a lock.
        self.steps
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Held while a listing reads the entries and the event stream's position together.
    pub fn listing(&self) -> RwLockReadGuard<'_, ()> {
        self.steps
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forgets a pod (it vanished from the runtime).
    pub fn delete(&self, uid: &PodUid) {
        self.lock().pods.remove(uid);
    }

    /// The cached pod that holds `container`: `uid`'s when it does (a kernel hint's cgroup
    /// path names the pod), else the first that does. A kernel hint asks this of every
    /// container it sees while a consumer takes kernel observations: the scan copies nothing.
    pub fn holding(&self, uid: Option<&PodUid>, container: &ContainerId) -> Option<Arc<PodRecord>> {
        let inner = self.lock();
        let holds = |entry: &Entry| {
            entry
                .record
                .as_ref()
                .filter(|pod| pod.containers.contains_key(container))
                .map(Arc::clone)
        };
        uid.and_then(|uid| inner.pods.get(uid))
            .and_then(holds)
            .or_else(|| inner.pods.values().find_map(holds))
    }

    /// Every cached pod's uid and entry, in no particular order.
    pub fn pods(&self) -> Vec<(PodUid, CachedPod)> {
        self.lock()
            .pods
            .iter()
            .map(|(uid, entry)| (uid.clone(), entry.cached()))
            .collect()
    }

    fn get_if_newer_than(&self, uid: &PodUid, min: Instant) -> Option<CachedPod> {
        let inner = self.lock();
        let global_is_newer = inner.global.is_some_and(|t| t > min);
        match inner.pods.get(uid) {
            Some(entry) if entry.modified > min || global_is_newer => Some(entry.cached()),
            // The full relist looked and found no such pod: the default status is the answer.
            None if global_is_newer => Some(CachedPod::default()),
            _ => None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The lock guards plain maps updated in single statements: a panic elsewhere while it
        // was held cannot leave them half-written, so a poisoned lock is still usable.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Entry {
    fn cached(&self) -> CachedPod {
        CachedPod {
            record: self.record.clone(),
            modified: Some(self.modified),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::pleg::model::record::Containers;

    fn uid(s: &str) -> PodUid {
        PodUid(s.to_owned())
    }

    fn record(s: &str) -> Arc<PodRecord> {
        Arc::new(PodRecord {
            uid: uid(s),
            namespace: "ns".to_owned(),
            name: s.to_owned(),
            containers: Containers::new(),
            labels: Default::default(),
            annotations: Default::default(),
        })
    }

    #[test]
    fn the_pod_holding_a_container_is_the_named_one_else_any_that_holds_it() {
        let cache = PodCache::new();
        let now = Instant::now();
        for (pod, container) in [("p1", "c"), ("p2", "d")] {
            let mut record = (*record(pod)).clone();
            let held = crate::runtime::testing::container(
                container,
                "app",
                crate::pleg::model::record::ContainerState::Running,
            );
            record.containers.insert(held.id.clone(), held);
            cache.set(uid(pod), Some(Arc::new(record)), now);
        }
        let c = ContainerId("c".into());
        let holder = |named: Option<&str>, id: &ContainerId| {
            let named = named.map(uid);
            cache
                .holding(named.as_ref(), id)
                .map(|pod| pod.uid.0.clone())
        };
        assert_eq!(holder(Some("p1"), &c).as_deref(), Some("p1"));
        // Named wrongly (or not yet holding it): the pod that does.
        assert_eq!(holder(Some("p2"), &c).as_deref(), Some("p1"));
        assert_eq!(holder(None, &c).as_deref(), Some("p1"));
        assert_eq!(holder(Some("p1"), &ContainerId("new".into())), None);
    }

    #[test]
    fn miss_returns_the_default_status() {
        let cache = PodCache::new();
        assert_eq!(cache.get(&uid("p")), CachedPod::default());
    }

    #[tokio::test]
    async fn set_then_get() {
        let cache = PodCache::new();
        let t = Instant::now();
        cache.set(uid("p"), Some(record("p")), t);
        assert_eq!(
            cache.get(&uid("p")),
            CachedPod {
                record: Some(record("p")),
                modified: Some(t)
            }
        );
        assert_eq!(cache.pods().len(), 1);
        cache.delete(&uid("p"));
        assert_eq!(cache.get(&uid("p")), CachedPod::default());
        assert!(cache.pods().is_empty());
    }

    #[tokio::test]
    async fn set_never_goes_back_in_time() {
        let cache = PodCache::new();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        cache.set(uid("p"), Some(record("new")), t1);
        cache.set(uid("p"), Some(record("old")), t0);
        assert_eq!(cache.get(&uid("p")).record, Some(record("new")));
        // Same time: the later write wins (it read the runtime no earlier).
        cache.set(uid("p"), None, t1);
        assert_eq!(cache.get(&uid("p")).record, None);
    }

    #[tokio::test]
    async fn get_newer_than_returns_at_once_when_data_is_newer() {
        let cache = PodCache::new();
        let t0 = Instant::now();
        cache.set(uid("p"), Some(record("p")), t0 + Duration::from_millis(1));
        assert_eq!(
            cache.get_newer_than(&uid("p"), t0).await.record,
            Some(record("p"))
        );
    }

    #[tokio::test]
    async fn get_newer_than_waits_for_a_newer_entry() {
        let cache = Arc::new(PodCache::new());
        let t0 = Instant::now();
        cache.set(uid("p"), Some(record("old")), t0);
        let waiter = tokio::spawn({
            let cache = Arc::clone(&cache);
            async move { cache.get_newer_than(&uid("p"), t0).await }
        });
        // Let the waiter register, then check that an equal timestamp does not release it.
        tokio::task::yield_now().await;
        cache.set(uid("p"), Some(record("same")), t0);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        // Another pod's update does not release it either.
        cache.set(uid("q"), Some(record("q")), t0 + Duration::from_secs(1));
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        cache.set(uid("p"), Some(record("new")), t0 + Duration::from_secs(1));
        let got = waiter.await.expect("waiter panicked");
        assert_eq!(got.record, Some(record("new")));
    }

    #[tokio::test]
    async fn global_timestamp_releases_waiters_of_unchanged_and_missing_pods() {
        let cache = Arc::new(PodCache::new());
        let t0 = Instant::now();
        cache.set(uid("p"), Some(record("p")), t0);
        let present = tokio::spawn({
            let cache = Arc::clone(&cache);
            async move { cache.get_newer_than(&uid("p"), t0).await }
        });
        let missing = tokio::spawn({
            let cache = Arc::clone(&cache);
            async move { cache.get_newer_than(&uid("gone"), t0).await }
        });
        tokio::task::yield_now().await;
        // A global timestamp that is not newer releases nobody.
        cache.update_time(t0);
        tokio::task::yield_now().await;
        assert!(!present.is_finished() && !missing.is_finished());
        cache.update_time(t0 + Duration::from_secs(1));
        assert_eq!(
            present.await.expect("waiter panicked").record,
            Some(record("p"))
        );
        assert_eq!(
            missing.await.expect("waiter panicked"),
            CachedPod::default()
        );
    }

    #[tokio::test]
    async fn the_first_full_relist_releases_waiters_and_pod_writes_do_not() {
        let cache = Arc::new(PodCache::new());
        let waiter = tokio::spawn({
            let cache = Arc::clone(&cache);
            async move { cache.await_first_full_relist().await }
        });
        tokio::task::yield_now().await;
        // A pod read by the first relist, before it finished.
        cache.set(uid("p"), Some(record("p")), Instant::now());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        cache.update_time(Instant::now());
        waiter.await.expect("waiter panicked");
        // Once vouched for, it answers at once.
        cache.await_first_full_relist().await;
    }

    /// A pod's entry and its events move together: a relist step waits for a listing.
    #[test]
    fn a_listing_holds_off_a_publishing_step() {
        let cache = Arc::new(PodCache::new());
        let listing = cache.listing();
        let (done, stepped) = std::sync::mpsc::channel();
        let step = std::thread::spawn({
            let cache = Arc::clone(&cache);
            move || {
                let _publishing = cache.publishing();
                cache.set(uid("p"), Some(record("p")), Instant::now());
                let _ = done.send(());
            }
        });
        // A bounded wait for something that must not happen while the listing reads.
        assert!(stepped.recv_timeout(Duration::from_millis(200)).is_err());
        assert_eq!(cache.get(&uid("p")), CachedPod::default());
        drop(listing);
        stepped
            .recv_timeout(Duration::from_secs(10))
            .expect("the step goes on once the listing is done");
        step.join().expect("step panicked");
        assert!(cache.get(&uid("p")).record.is_some());
    }

    #[tokio::test]
    async fn global_timestamp_never_goes_back() {
        let cache = PodCache::new();
        let t0 = Instant::now();
        cache.update_time(t0 + Duration::from_secs(2));
        cache.update_time(t0);
        // Still vouches for data newer than t0 + 1s.
        let got = cache
            .get_newer_than(&uid("p"), t0 + Duration::from_secs(1))
            .await;
        assert_eq!(got, CachedPod::default());
    }
}
