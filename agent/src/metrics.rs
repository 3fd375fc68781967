//! Prometheus metrics: kubelet's PLEG metrics under kubelet's names and buckets, plus plegd's
//! own. A leaf module: [`Metrics`] is a cheap `Clone` handle given to the generator, the sync
//! loop and the sources; [`Metrics::encode`] renders the OpenMetrics text for `/metrics`.
//!
//! kubelet's names and semantics: `kubelet_pleg_relist_duration_seconds` and
//! `kubelet_pleg_relist_interval_seconds` (histograms, Prometheus' default buckets as kubelet
//! uses) and `kubelet_pleg_last_seen_seconds` describe *full* relists (kubelet's only kind);
//! `kubelet_pleg_discard_events` counts events the sync loop skipped because it fell behind
//! (kubelet drops them on a full channel; plegd's relist never drops). It is exposed
//! without the `_total` suffix OpenMetrics gives counters, so kubelet dashboards find it, and
//! therefore with type `unknown`.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder},
    metrics::{
        MetricType, TypedMetric,
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use crate::pleg::event::TriggerSource;

/// kubelet's buckets (`metrics.DefBuckets`, Prometheus' defaults).
const KUBELET_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Label of per-source metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

/// Label of `plegd_relists_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeLabel {
    scope: &'static str,
}

/// Label of `plegd_init_map_errors_total`: what userspace was doing to the map.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

/// Label of `plegd_containers`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// A counter exposed under its exact name (no `_total`), as kubelet's Prometheus text does.
#[derive(Clone, Debug, Default)]
struct BareCounter(Arc<AtomicU64>);

impl TypedMetric for BareCounter {
    const TYPE: MetricType = MetricType::Unknown;
}

impl EncodeMetric for BareCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // Counts stay far below 2^53: exact as f64.
        encoder.encode_gauge(&(self.0.load(Ordering::Relaxed) as f64))
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The daemon's metrics; cheap to clone, every clone updates the same values.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    relist_duration: Histogram,
    relist_interval: Histogram,
    discard_events: BareCounter,
    last_seen: Gauge<f64, AtomicU64>,
    triggers: Family<SourceLabel, Counter>,
    relists: Family<ScopeLabel, Counter>,
    trigger_to_event: Histogram,
    ringbuf_drops: Counter,
    untracked_cgroups: Counter,
    init_map_errors: Family<OpLabel, Counter>,
    stream_reconnects: Family<SourceLabel, Counter>,
    unconfirmed_hints: Family<SourceLabel, Counter>,
    watch_subscribers: Gauge,
    pods: Gauge,
    containers: Family<StateLabel, Gauge>,
    /// Start of the last successful full relist, for the interval histogram.
    last_full_relist: Mutex<Option<Instant>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A fresh set of metrics, all registered.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let relist_duration = Histogram::new(KUBELET_BUCKETS);
        registry.register(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG (full relists).",
            relist_duration.clone(),
        );
        let relist_interval = Histogram::new(KUBELET_BUCKETS);
        registry.register(
            "kubelet_pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG (between successful full relists).",
            relist_interval.clone(),
        );
        let discard_events = BareCounter::default();
        registry.register(
            "kubelet_pleg_discard_events",
            "The number of discard events in PLEG (a counter).",
            discard_events.clone(),
        );
        let last_seen = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "kubelet_pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active (start of the last successful full relist).",
            last_seen.clone(),
        );
        let triggers = Family::<SourceLabel, Counter>::default();
        registry.register(
            "plegd_triggers",
            "Triggers received by the relist scheduler, by source.",
            triggers.clone(),
        );
        let relists = Family::<ScopeLabel, Counter>::default();
        registry.register(
            "plegd_relists",
            "Relists run, by scope (full or targeted).",
            relists.clone(),
        );
        // 100µs .. ~10s, doubling.
        let trigger_to_event = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        registry.register(
            "plegd_trigger_to_event_seconds",
            "Time from a push source's observation to the event's emission (events some source pointed at).",
            trigger_to_event.clone(),
        );
        let ringbuf_drops = Counter::default();
        registry.register(
            "plegd_ringbuf_drops",
            "Kernel events lost because the eBPF ring buffer was full.",
            ringbuf_drops.clone(),
        );
        let untracked_cgroups = Counter::default();
        registry.register(
            "plegd_untracked_cgroups",
            "Container cgroups the eBPF init map could not take: no process hints for them (the relist still finds their changes).",
            untracked_cgroups.clone(),
        );
        let init_map_errors = Family::<OpLabel, Counter>::default();
        registry.register(
            "plegd_init_map_errors",
            "Failed updates of the eBPF init map from userspace, by operation: seed (a running container's init not given to the probes: no process hints for it) or untrack (a non-container cgroup left in the map, holding a slot until evicted).",
            init_map_errors.clone(),
        );
        let stream_reconnects = Family::<SourceLabel, Counter>::default();
        registry.register(
            "plegd_stream_reconnects",
            "Reconnections of runtime event streams, by source.",
            stream_reconnects.clone(),
        );
        let unconfirmed_hints = Family::<SourceLabel, Counter>::default();
        registry.register(
            "plegd_unconfirmed_hints",
            "Targeted relists whose runtime reading still did not show what their hint implied after every retry, by source (the next full relist is the safety net).",
            unconfirmed_hints.clone(),
        );
        let watch_subscribers = Gauge::default();
        registry.register(
            "plegd_watch_subscribers",
            "Watch streams currently open.",
            watch_subscribers.clone(),
        );
        let pods = Gauge::default();
        registry.register("plegd_pods", "Pods in the cache.", pods.clone());
        let containers = Family::<StateLabel, Gauge>::default();
        registry.register(
            "plegd_containers",
            "Containers (sandboxes included) in the cache, by state.",
            containers.clone(),
        );
        Self {
            inner: Arc::new(Inner {
                registry,
                relist_duration,
                relist_interval,
                discard_events,
                last_seen,
                triggers,
                relists,
                trigger_to_event,
                ringbuf_drops,
                untracked_cgroups,
                init_map_errors,
                stream_reconnects,
                unconfirmed_hints,
                watch_subscribers,
                pods,
                containers,
                last_full_relist: Mutex::new(None),
            }),
        }
    }

    /// The sync loop fell behind the bus and skipped `count` events (it resyncs every pod
    /// instead): kubelet's discarded events, which it drops on a full channel.
    pub fn discarded_events(&self, count: u64) {
        self.inner
            .discard_events
            .0
            .fetch_add(count, Ordering::Relaxed);
    }

    /// A hint from `source` was never confirmed by the runtime within the retry budget.
    pub fn unconfirmed_hint(&self, source: TriggerSource) {
        self.inner
            .unconfirmed_hints
            .get_or_create(&SourceLabel {
                source: source.name(),
            })
            .inc();
    }

    /// A trigger from `source` reached the scheduler.
    pub fn trigger(&self, source: TriggerSource) {
        self.inner
            .triggers
            .get_or_create(&SourceLabel {
                source: source.name(),
            })
            .inc();
    }

    /// A relist started at `started` took `duration`; `succeeded` says whether it listed.
    pub fn relisted(&self, full: bool, started: Instant, duration: Duration, succeeded: bool) {
        let scope = if full { "full" } else { "targeted" };
        self.inner
            .relists
            .get_or_create(&ScopeLabel { scope })
            .inc();
        if !full {
            return;
        }
        self.inner.relist_duration.observe(duration.as_secs_f64());
        if !succeeded {
            return;
        }
        let mut last = self
            .inner
            .last_full_relist
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(previous) = last.replace(started) {
            self.inner
                .relist_interval
                .observe(started.saturating_duration_since(previous).as_secs_f64());
        }
        let wall = SystemTime::now()
            .checked_sub(started.elapsed())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let unix = wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.inner.last_seen.set(unix.as_secs_f64());
    }

    /// An event was emitted `latency` after a push source observed its change.
    pub fn trigger_to_event(&self, latency: Duration) {
        self.inner.trigger_to_event.observe(latency.as_secs_f64());
    }

    /// The eBPF ring buffer lost `count` kernel events.
    pub fn ringbuf_drops(&self, count: u64) {
        self.inner.ringbuf_drops.inc_by(count);
    }

    /// `count` container cgroups could not be tracked in the eBPF init map.
    pub fn untracked_cgroups(&self, count: u64) {
        self.inner.untracked_cgroups.inc_by(count);
    }

    /// `count` updates of the eBPF init map failed while userspace did `op` (`seed`, `untrack`).
    pub fn init_map_errors(&self, op: &'static str, count: u64) {
        self.inner
            .init_map_errors
            .get_or_create(&OpLabel { op })
            .inc_by(count);
    }

    /// A runtime event stream of `source` reconnected.
    pub fn stream_reconnect(&self, source: TriggerSource) {
        self.inner
            .stream_reconnects
            .get_or_create(&SourceLabel {
                source: source.name(),
            })
            .inc();
    }

    /// Sets the gauges read at scrape time: watchers, pods, containers by state.
    pub fn set_snapshot(
        &self,
        subscribers: usize,
        pods: usize,
        containers: &BTreeMap<&'static str, usize>,
    ) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.inner.watch_subscribers.set(gauge(subscribers));
        self.inner.pods.set(gauge(pods));
        for state in ["created", "running", "exited", "unknown"] {
            self.inner
                .containers
                .get_or_create(&StateLabel { state })
                .set(gauge(containers.get(state).copied().unwrap_or(0)));
        }
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.inner.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    #[test]
    fn kubelet_names_and_plegd_metrics_are_exposed() {
        let metrics = Metrics::new();
        let t0 = Instant::now();
        metrics.relisted(true, t0, Duration::from_millis(3), true);
        metrics.relisted(
            true,
            t0 + Duration::from_secs(1),
            Duration::from_millis(7),
            true,
        );
        metrics.relisted(false, t0, Duration::from_millis(1), true);
        metrics.discarded_events(2);
        metrics.trigger(TriggerSource::Containerd);
        metrics.trigger_to_event(Duration::from_micros(350));
        metrics.ringbuf_drops(3);
        metrics.untracked_cgroups(4);
        metrics.init_map_errors("untrack", 5);
        metrics.stream_reconnect(TriggerSource::CriEvents);
        metrics.unconfirmed_hint(TriggerSource::Ebpf);
        metrics.set_snapshot(2, 1, &BTreeMap::from([("running", 3)]));
        let text = metrics.encode();
        assert_eq!(
            value(&text, "kubelet_pleg_relist_duration_seconds_count"),
            2.0
        );
        assert_eq!(
            value(&text, "kubelet_pleg_relist_interval_seconds_count"),
            1.0
        );
        assert_eq!(
            value(
                &text,
                "kubelet_pleg_relist_duration_seconds_bucket{le=\"0.005\"}"
            ),
            1.0
        );
        assert_eq!(value(&text, "kubelet_pleg_discard_events"), 2.0);
        assert!(value(&text, "kubelet_pleg_last_seen_seconds") > 1.7e9);
        assert_eq!(value(&text, "plegd_relists_total{scope=\"full\"}"), 2.0);
        assert_eq!(value(&text, "plegd_relists_total{scope=\"targeted\"}"), 1.0);
        assert_eq!(
            value(&text, "plegd_triggers_total{source=\"containerd\"}"),
            1.0
        );
        assert_eq!(value(&text, "plegd_trigger_to_event_seconds_count"), 1.0);
        assert_eq!(value(&text, "plegd_ringbuf_drops_total"), 3.0);
        assert_eq!(value(&text, "plegd_untracked_cgroups_total"), 4.0);
        assert_eq!(
            value(&text, "plegd_init_map_errors_total{op=\"untrack\"}"),
            5.0
        );
        assert_eq!(
            value(
                &text,
                "plegd_stream_reconnects_total{source=\"cri-events\"}"
            ),
            1.0
        );
        assert_eq!(
            value(&text, "plegd_unconfirmed_hints_total{source=\"ebpf\"}"),
            1.0
        );
        assert_eq!(value(&text, "plegd_watch_subscribers"), 2.0);
        assert_eq!(value(&text, "plegd_pods"), 1.0);
        assert_eq!(value(&text, "plegd_containers{state=\"running\"}"), 3.0);
        assert_eq!(value(&text, "plegd_containers{state=\"exited\"}"), 0.0);
        assert!(text.ends_with("# EOF\n"));
    }
}
