//! What each push source (eBPF, containerd events, CRI events) is doing, for health, the API
//! and the adaptive full relist: while at least one push source is connected, full relists
//! slow down; the moment none is, they return to the fast period.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use tokio::sync::watch;

use crate::{api::Metrics, pleg::event::TriggerSource};

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
    /// When it last delivered a trigger.
    pub last_delivered: Option<SystemTime>,
}

/// Shared registry of source states; cheap to clone.
#[derive(Clone, Debug)]
pub struct SourceRegistry {
    sources: Arc<Mutex<BTreeMap<TriggerSource, SourceStatus>>>,
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
    pub fn set(&self, source: TriggerSource, state: SourceState, detail: impl Into<String>) {
        let detail = detail.into();
        let changed = {
            let mut sources = self.lock();
            let entry = sources.entry(source).or_insert_with(|| SourceStatus {
                state,
                detail: String::new(),
                last_delivered: None,
            });
            let changed = entry.state != state || entry.detail != detail;
            if state == SourceState::Reconnecting
                && entry.state != SourceState::Reconnecting
                && let Some(metrics) = &self.metrics
            {
                metrics.stream_reconnect(source);
            }
            entry.state = state;
            entry.detail = detail;
            changed
        };
        if changed {
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// Records that a source delivered a trigger at `at`.
    pub fn delivered(&self, source: TriggerSource, at: SystemTime) {
        if let Some(status) = self.lock().get_mut(&source) {
            status.last_delivered = Some(at);
        }
    }

    /// Every registered source and its status.
    pub fn snapshot(&self) -> Vec<(TriggerSource, SourceStatus)> {
        self.lock().iter().map(|(s, st)| (*s, st.clone())).collect()
    }

    /// Whether at least one push source is delivering.
    pub fn any_connected(&self) -> bool {
        self.lock()
            .values()
            .any(|s| s.state == SourceState::Connected)
    }

    /// Keeps `period` at `slow` while a push source is connected and at `fast` otherwise,
    /// until the registry is dropped.
    pub async fn drive_relist_period(
        self,
        period: watch::Sender<Duration>,
        fast: Duration,
        slow: Duration,
    ) {
        let mut changes = self.changed.subscribe();
        loop {
            let want = if self.any_connected() { slow } else { fast };
            period.send_if_modified(|current| {
                let differs = *current != want;
                *current = want;
                differs
            });
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<TriggerSource, SourceStatus>> {
        // Plain map updates: a poisoned lock still holds consistent data.
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_period_follows_push_source_health() {
        let registry = SourceRegistry::new();
        let (period_tx, mut period) = watch::channel(Duration::from_secs(1));
        let driver = tokio::spawn(registry.clone().drive_relist_period(
            period_tx,
            Duration::from_secs(1),
            Duration::from_secs(30),
        ));
        registry.set(TriggerSource::Containerd, SourceState::Connecting, "");
        registry.set(TriggerSource::Containerd, SourceState::Connected, "");
        period
            .wait_for(|p| *p == Duration::from_secs(30))
            .await
            .unwrap();
        registry.set(
            TriggerSource::Containerd,
            SourceState::Reconnecting,
            "stream broke",
        );
        period
            .wait_for(|p| *p == Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(registry.snapshot()[0].1.detail, "stream broke");
        driver.abort();
    }

    #[test]
    fn deliveries_are_recorded_for_registered_sources_only() {
        let registry = SourceRegistry::new();
        registry.delivered(TriggerSource::Ebpf, SystemTime::UNIX_EPOCH);
        assert!(registry.snapshot().is_empty());
        registry.set(TriggerSource::Ebpf, SourceState::Connected, "");
        registry.delivered(TriggerSource::Ebpf, SystemTime::UNIX_EPOCH);
        assert_eq!(
            registry.snapshot()[0].1.last_delivered,
            Some(SystemTime::UNIX_EPOCH)
        );
        assert!(registry.any_connected());
    }
}
