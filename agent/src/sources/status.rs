//! What each push source (eBPF, containerd events, CRI events) is doing, for health, the API
//! and the adaptive full relist: while at least one push source is connected, full relists
//! slow down; the moment none is, they return to the fast period.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use tokio::{sync::watch, time::Instant};

use crate::{base::metrics::Metrics, pleg::Source};

/// Fast periods that full relists stay fast after a push source (re)connects. A change in
/// flight at that moment (published before the subscription, or a process exit before the
/// probes attached, and not yet in the runtime's listing) is neither delivered nor seen by the
/// relist made at connect; without this, only the slow safety net would find it.
const SETTLE_PERIODS: u32 = 3;

/// A push source's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceState {
    /// Turned off by configuration.
    Disabled,
    /// Starting, not delivering yet.
    Connecting,
    /// Delivering.
    Connected,
    /// Lost; trying again.
    Reconnecting,
    /// This node or runtime cannot offer it (no BTF, Unimplemented, ...).
    Unsupported,
}

/// One source's state as last reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceStatus {
    pub state: SourceState,
    /// Why it is in that state, for humans ("Unimplemented: GetContainerEvents", ...).
    pub detail: String,
    /// Why plegd runs it or not: the choice made at start from the runtime and `--sources`
    /// (empty where none was made).
    pub chosen: String,
    /// When it last delivered a trigger.
    pub last_delivered: Option<SystemTime>,
    /// How many times it was lost and went back to reconnecting.
    pub reconnects: u64,
}

/// Shared registry of source states; cheap to clone.
#[derive(Clone, Debug)]
pub struct SourceRegistry {
    sources: Arc<Mutex<BTreeMap<Source, SourceStatus>>>,
    /// Bumped on every state change (not on deliveries), for the adaptive period.
    changed: Arc<watch::Sender<u64>>,
    /// Counts reconnects: every move into Reconnecting, whichever source.
    metrics: Option<Metrics>,
}

impl Default for SourceRegistry {
    fn default() -> Self {
        Self {
            sources: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
            metrics: None,
        }
    }
}

impl SourceRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry that counts reconnects in `metrics`.
    pub fn with_metrics(metrics: Metrics) -> Self {
        Self {
            metrics: Some(metrics),
            ..Self::default()
        }
    }

    /// Records a source's new state.
    pub fn set(&self, source: Source, state: SourceState, detail: impl Into<String>) {
        let detail = detail.into();
        let changed = {
            let mut sources = self.lock();
            let mut new = false;
            let entry = sources.entry(source).or_insert_with(|| {
                new = true;
                SourceStatus {
                    state,
                    detail: String::new(),
                    chosen: String::new(),
                    last_delivered: None,
                    reconnects: 0,
                }
            });
            let changed = new || entry.state != state || entry.detail != detail;
            if state == SourceState::Reconnecting && entry.state != SourceState::Reconnecting {
                entry.reconnects += 1;
                if let Some(metrics) = &self.metrics {
                    metrics.stream_reconnect(source.name());
                }
            }
            entry.state = state;
            entry.detail = detail;
            changed
        };
        if changed {
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// Records why `source` runs or not (registering it as connecting if it is not there
    /// yet).
    pub fn chose(&self, source: Source, why: impl Into<String>) {
        let why = why.into();
        self.lock()
            .entry(source)
            .or_insert_with(|| SourceStatus {
                state: SourceState::Connecting,
                detail: String::new(),
                chosen: String::new(),
                last_delivered: None,
                reconnects: 0,
            })
            .chosen = why;
        self.changed.send_modify(|n| *n += 1);
    }

    /// Counts that `source`'s stream was declared silent while connected (the state change
    /// that follows is reported with [`Self::set`]).
    pub fn silent(&self, source: Source) {
        if let Some(metrics) = &self.metrics {
            metrics.silent_stream(source.name());
        }
    }

    /// Records that a source delivered a trigger at `at`.
    pub fn delivered(&self, source: Source, at: SystemTime) {
        if let Some(status) = self.lock().get_mut(&source) {
            status.last_delivered = Some(at);
        }
    }

    /// Changes whenever a source's state or detail does (not on deliveries). States in
    /// between two looks may be missed: [`SourceStatus::reconnects`] counts the losses.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Every registered source and its status.
    pub fn snapshot(&self) -> Vec<(Source, SourceStatus)> {
        self.lock().iter().map(|(s, st)| (*s, st.clone())).collect()
    }

    /// Whether at least one push source is delivering.
    pub fn any_connected(&self) -> bool {
        !self.connected().is_empty()
    }

    /// Keeps `period` at `slow` while a push source is connected and at `fast` otherwise, and
    /// for [`SETTLE_PERIODS`] fast periods after any source (re)connects; until the registry
    /// is dropped.
    pub async fn drive_relist_period(
        self,
        period: watch::Sender<Duration>,
        fast: Duration,
        slow: Duration,
    ) {
        let mut changes = self.changes();
        let mut connected = BTreeSet::new();
        let mut settled_at = Instant::now();
        loop {
            let now_connected = self.connected();
            if now_connected.difference(&connected).next().is_some() {
                settled_at = Instant::now() + fast * SETTLE_PERIODS;
            }
            connected = now_connected;
            let settling = Instant::now() < settled_at;
            let want = if connected.is_empty() || settling {
                fast
            } else {
                slow
            };
            period.send_if_modified(|current| {
                let differs = *current != want;
                *current = want;
                differs
            });
            tokio::select! {
                changed = changes.changed() => if changed.is_err() {
                    return;
                },
                () = tokio::time::sleep_until(settled_at), if settling => {}
            }
        }
    }

    /// Keeps `grace` at `connected_grace` while `source` (the runtime's event stream whose
    /// task events answer kernel triggers) is connected, and at zero otherwise; until the
    /// registry is dropped.
    pub async fn drive_kernel_grace(
        self,
        grace: watch::Sender<Duration>,
        source: Source,
        connected_grace: Duration,
    ) {
        let mut changes = self.changes();
        loop {
            changes.borrow_and_update();
            let want = if self.connected().contains(&source) {
                connected_grace
            } else {
                Duration::ZERO
            };
            grace.send_if_modified(|current| std::mem::replace(current, want) != want);
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    fn connected(&self) -> BTreeSet<Source> {
        self.lock()
            .iter()
            .filter(|(_, s)| s.state == SourceState::Connected)
            .map(|(source, _)| *source)
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<Source, SourceStatus>> {
        // Plain map updates: a poisoned lock still holds consistent data.
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_period_follows_push_source_health_after_settling() {
        const FAST: Duration = Duration::from_secs(1);
        const SLOW: Duration = Duration::from_secs(30);
        let registry = SourceRegistry::new();
        let (period_tx, mut period) = watch::channel(FAST);
        let driver = tokio::spawn(registry.clone().drive_relist_period(period_tx, FAST, SLOW));
        registry.set(Source::Containerd, SourceState::Connecting, "");
        let connected_at = Instant::now();
        registry.set(Source::Containerd, SourceState::Connected, "");
        period.wait_for(|p| *p == SLOW).await.unwrap();
        assert_eq!(connected_at.elapsed(), FAST * SETTLE_PERIODS);

        // Another source connecting is another chance of missed changes: fast again, a while.
        let connected_at = Instant::now();
        registry.set(Source::Ebpf, SourceState::Connected, "");
        period.wait_for(|p| *p == FAST).await.unwrap();
        period.wait_for(|p| *p == SLOW).await.unwrap();
        assert_eq!(connected_at.elapsed(), FAST * SETTLE_PERIODS);

        // Losing one while the other delivers changes nothing; losing both, fast at once.
        registry.set(Source::Ebpf, SourceState::Reconnecting, "");
        tokio::time::sleep(FAST * 10).await;
        assert_eq!(*period.borrow(), SLOW);
        let lost_at = Instant::now();
        registry.set(
            Source::Containerd,
            SourceState::Reconnecting,
            "stream broke",
        );
        period.wait_for(|p| *p == FAST).await.unwrap();
        assert_eq!(lost_at.elapsed(), Duration::ZERO);
        assert_eq!(registry.snapshot()[1].1.detail, "stream broke");
        driver.abort();
    }

    #[test]
    fn deliveries_are_recorded_for_registered_sources_only() {
        let registry = SourceRegistry::new();
        registry.delivered(Source::Ebpf, SystemTime::UNIX_EPOCH);
        assert!(registry.snapshot().is_empty());
        registry.set(Source::Ebpf, SourceState::Connected, "");
        registry.delivered(Source::Ebpf, SystemTime::UNIX_EPOCH);
        assert_eq!(
            registry.snapshot()[0].1.last_delivered,
            Some(SystemTime::UNIX_EPOCH)
        );
        assert!(registry.any_connected());
    }

    #[test]
    fn each_loss_counts_one_reconnect_whatever_is_said_while_reconnecting() {
        let registry = SourceRegistry::new();
        let changes = registry.changes();
        let steps = [
            (SourceState::Connecting, ""),
            (SourceState::Connected, ""),
            (SourceState::Reconnecting, "stream broke"),
            (SourceState::Reconnecting, "connection refused"),
            (SourceState::Connected, ""),
            (SourceState::Reconnecting, "stream broke"),
        ];
        for (state, detail) in steps {
            registry.set(Source::Containerd, state, detail);
        }
        assert!(changes.has_changed().unwrap());
        let status = &registry.snapshot()[0].1;
        assert_eq!(
            (status.state, status.reconnects),
            (SourceState::Reconnecting, 2)
        );
    }
}
