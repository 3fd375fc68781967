//! Prometheus metrics: kubelet's PLEG metrics under kubelet's names and buckets, plus plegd's
//! own. A leaf module: [`Metrics`] is a cheap `Clone` handle given to the generator, the sync
//! loop and the sources; [`Metrics::encode`] renders the text for `/metrics` in the
//! [`Format`] a scraper asks for: OpenMetrics (Prometheus 2.x, the default) or the classic
//! Prometheus text format (`promtool`, Prometheus 1.x, most other scrapers).
//!
//! kubelet's names and semantics: `kubelet_pleg_relist_duration_seconds` and
//! `kubelet_pleg_relist_interval_seconds` (histograms, Prometheus' default buckets as kubelet
//! uses) and `kubelet_pleg_last_seen_seconds` describe *full* relists (kubelet's only kind);
//! `kubelet_pleg_discard_events` counts events the sync loop skipped because it fell behind
//! (kubelet drops them on a full channel; plegd's relist never drops). It is exposed
//! without the `_total` suffix OpenMetrics gives counters, so kubelet dashboards find it, and
//! therefore with type `unknown` in OpenMetrics and `untyped` in the classic text (kubelet
//! types it `counter` there, which `promtool check metrics` rejects for the missing suffix;
//! PromQL's `rate()` does not look at the type).

use std::{
    collections::{BTreeMap, BTreeSet},
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

use crate::base::bus::LaggedLabel;

/// kubelet's buckets (`metrics.DefBuckets`, Prometheus' defaults).
const KUBELET_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Label of per-source metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

/// Label of the API's per-listener metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: &'static str,
}

/// Labels of `plegd_api_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    listener: &'static str,
    what: &'static str,
    reason: &'static str,
}

/// Labels of `plegd_api_closed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClosedLabels {
    listener: &'static str,
    reason: &'static str,
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

/// Label of `plegd_runtime_calls_total`: the runtime's gRPC method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabel {
    call: &'static str,
}

/// Counts what the runtime backends do: the calls plegd makes to the runtime, by method, and
/// the pods' labels and annotations they cut to `--pod-metadata-max-bytes`. The backends hold
/// one (from [`Metrics::runtime_calls`]; a default one counts for nobody).
#[derive(Clone, Debug, Default)]
pub struct RuntimeCalls {
    calls: Family<CallLabel, Counter>,
    metadata_truncated: Counter,
}

impl RuntimeCalls {
    /// One call of `call` was made (whatever its outcome).
    pub fn count(&self, call: &'static str) {
        self.calls.get_or_create(&CallLabel { call }).inc();
    }

    /// How many calls of `call` were made so far.
    #[cfg(any(test, feature = "testing"))]
    pub fn made(&self, call: &'static str) -> u64 {
        self.calls.get_or_create(&CallLabel { call }).get()
    }

    /// A pod's labels and annotations, as read once, lost entries to the byte budget.
    pub fn metadata_truncated(&self) {
        self.metadata_truncated.inc();
    }
}

/// Label of `plegd_pod_syncs_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Label of `plegd_containers`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// Labels of `plegd_container_starts_total`: the container, by its pod.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ContainerLabels {
    namespace: String,
    pod: String,
    container: String,
}

/// Labels of `plegd_container_terminations_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct TerminationLabels {
    namespace: String,
    pod: String,
    container: String,
    reason: String,
}

/// Label of `plegd_oom_kills_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OomScopeLabel {
    scope: &'static str,
}

/// Labels of `plegd_pod_oom_kills_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct PodOomLabels {
    namespace: String,
    pod: String,
    scope: &'static str,
}

/// The scopes of an OOM kill, as the metrics label them (`pleg::OomScope::name`).
pub const OOM_SCOPES: [&str; 5] = ["container", "pod", "ancestor", "node", "unknown"];

/// How long a pod's per-container series stay once the pod is gone: long enough for every
/// scraper to read the last counts (a few intervals), short enough that the series count stays
/// bounded by what the node runs.
pub const GONE_POD_SERIES_RETENTION: Duration = Duration::from_secs(5 * 60);

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
    kubelet: Kubelet,
    relists: Relists,
    syncs: Syncs,
    sources: Sources,
    gauges: Gauges,
    containers: ContainerCounters,
    api: Api,
    export: Export,
    /// Events the history's byte budget dropped.
    history_evictions: Counter,
    /// Subscribers the bus ended as lagged.
    lagged: Family<LaggedLabel, Counter>,
    /// Start of the last successful full relist, for the interval histogram.
    last_full_relist: Mutex<Option<Instant>>,
}

/// kubelet's PLEG metrics, under kubelet's names.
struct Kubelet {
    relist_duration: Histogram,
    relist_interval: Histogram,
    discard_events: BareCounter,
    last_seen: Gauge<f64, AtomicU64>,
}

/// What the relists cost and what asked for them.
struct Relists {
    triggers: Family<SourceLabel, Counter>,
    relists: Family<ScopeLabel, Counter>,
    answered_by_records: Counter,
    runtime_calls: RuntimeCalls,
    trigger_to_event: Histogram,
}

/// The sync loop's syncs.
struct Syncs {
    pod_syncs: Family<ReasonLabel, Counter>,
    event_to_sync: Histogram,
}

/// The push sources' losses and false alarms.
struct Sources {
    ringbuf_drops: Counter,
    untracked_cgroups: Counter,
    init_map_errors: Family<OpLabel, Counter>,
    stream_reconnects: Family<SourceLabel, Counter>,
    silent_streams: Family<SourceLabel, Counter>,
    unconfirmed_hints: Family<SourceLabel, Counter>,
}

/// Each container's starts and terminations, exact: incremented once per event plegd emits.
struct ContainerCounters {
    starts: Family<ContainerLabels, Counter>,
    terminations: Family<TerminationLabels, Counter>,
    corrections: Counter,
    oom_kills: Family<OomScopeLabel, Counter>,
    pod_oom_kills: Family<PodOomLabels, Counter>,
    /// Each pod's series, by (namespace, name), and since when the pod is gone.
    series: Mutex<BTreeMap<(String, String), PodSeries>>,
}

/// The series of one pod.
#[derive(Debug, Default)]
struct PodSeries {
    starts: BTreeSet<ContainerLabels>,
    terminations: BTreeSet<TerminationLabels>,
    oom_kills: BTreeSet<PodOomLabels>,
    gone_since: Option<Instant>,
}

/// What the API's peers hold and were refused.
struct Api {
    connections: Family<ListenerLabel, Gauge>,
    refused: Family<RefusedLabels, Counter>,
    closed: Family<ClosedLabels, Counter>,
}

impl Api {
    fn register(registry: &mut Registry) -> Self {
        let connections = Family::<ListenerLabel, Gauge>::default();
        registry.register(
            "plegd_api_connections",
            "Connections the API's listeners hold, by listener (unix, tls, metrics)",
            connections.clone(),
        );
        let refused = Family::<RefusedLabels, Counter>::default();
        registry.register(
            "plegd_api_refused",
            "API input refused, by listener, what (connection, stream, frame, header-block, request) and reason: listener-full (api-max-connections), peer-full (api-max-connections-per-peer, api-max-streams-per-peer), descriptors (the open-file limit less plegd's reserve), accept-error (the accept itself failed), not-allowed (a unix socket peer outside api-allow-uids and api-allow-gids), too-large (a frame past 16 KiB or a header block past 16 KiB: the connection ended; a request message past 4 KiB: RESOURCE_EXHAUSTED), too-many (a request's repeated field past its bound: INVALID_ARGUMENT). Connections are closed at accept, streams answered RESOURCE_EXHAUSTED",
            refused.clone(),
        );
        let closed = Family::<ClosedLabels, Counter>::default();
        registry.register(
            "plegd_api_closed",
            "API connections that ended without a call in flight, by listener and reason: no-call (ended before its first call: a TLS handshake failed or past its 5 s deadline, an HTTP/2 preface refused, a peer gone), no-first-stream (closed by plegd: no call 10 s after the accept, e.g. a preface never finished), idle (closed by plegd: no call for 5 minutes), header-deadline (metrics listener: a request's headers not sent within 5 s)",
            closed.clone(),
        );
        Self {
            connections,
            refused,
            closed,
        }
    }
}

/// The OTLP export's deliveries and losses: every event is exported, refused, dropped or
/// still kept.
struct Export {
    exported: Counter,
    rejected: Counter,
    refused: Counter,
    dropped: Counter,
    failures: Counter,
}

impl Export {
    fn register(registry: &mut Registry) -> Self {
        let exported = Counter::default();
        registry.register(
            "plegd_otlp_exported",
            "Events the OTLP receiver acknowledged (those it said it rejected included)",
            exported.clone(),
        );
        let rejected = Counter::default();
        registry.register(
            "plegd_otlp_rejected",
            "Events the OTLP receiver acknowledged as rejected (a partial success): not retried",
            rejected.clone(),
        );
        let refused = Counter::default();
        registry.register(
            "plegd_otlp_refused",
            "Events in batches the OTLP receiver refused for good (INVALID_ARGUMENT, or RESOURCE_EXHAUSTED without RetryInfo: a request it will never take, such as one over its size limit): dropped, not retried",
            refused.clone(),
        );
        let dropped = Counter::default();
        registry.register(
            "plegd_otlp_dropped",
            "Events never sent to the OTLP receiver: they fell out of the event history (--event-history) while it was out of reach or slower than plegd",
            dropped.clone(),
        );
        let failures = Counter::default();
        registry.register(
            "plegd_otlp_export_failures",
            "OTLP export calls that failed (receiver unreachable, failing or past the 10 s deadline) and are retried until the receiver acknowledges the batch; batches refused for good are not retried and not counted here (plegd_otlp_refused_total)",
            failures.clone(),
        );
        Self {
            exported,
            rejected,
            refused,
            dropped,
            failures,
        }
    }
}

/// Read at scrape time.
struct Gauges {
    watch_subscribers: Gauge,
    pods: Gauge,
    containers: Family<StateLabel, Gauge>,
}

impl Kubelet {
    fn register(registry: &mut Registry) -> Self {
        let relist_duration = Histogram::new(KUBELET_BUCKETS);
        registry.register(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG (full relists)",
            relist_duration.clone(),
        );
        let relist_interval = Histogram::new(KUBELET_BUCKETS);
        registry.register(
            "kubelet_pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG (between successful full relists)",
            relist_interval.clone(),
        );
        let discard_events = BareCounter::default();
        registry.register(
            "kubelet_pleg_discard_events",
            "The number of discard events in PLEG (a counter)",
            discard_events.clone(),
        );
        let last_seen = Gauge::<f64, AtomicU64>::default();
        registry.register(
        "kubelet_pleg_last_seen_seconds",
        "Timestamp in seconds when PLEG was last seen active (start of the last successful full relist)",
        last_seen.clone(),
    );
        Self {
            relist_duration,
            relist_interval,
            discard_events,
            last_seen,
        }
    }
}

impl Relists {
    fn register(registry: &mut Registry, runtime_calls: RuntimeCalls) -> Self {
        let triggers = Family::<SourceLabel, Counter>::default();
        registry.register(
            "plegd_triggers",
            "Triggers received by the relist scheduler, by source",
            triggers.clone(),
        );
        let relists = Family::<ScopeLabel, Counter>::default();
        registry.register(
            "plegd_relists",
            "Relists that read the runtime, by scope (full or targeted)",
            relists.clone(),
        );
        let answered_by_records = Counter::default();
        registry.register(
        "plegd_answered_by_records",
        "Batches of triggers the runtime's own records they carried (containerd's /tasks/exit, /tasks/start, /containers/delete) answered in full, without reading the runtime",
        answered_by_records.clone(),
    );
        registry.register(
        "plegd_runtime_calls",
        "Calls made to the container runtime (CRI or containerd API), by method; event streams not included",
        runtime_calls.calls.clone(),
    );
        registry.register(
        "plegd_pod_metadata_truncated",
        "Readings of a pod's labels and annotations (those --pod-labels and --pod-annotations keep) that left entries out to stay within --pod-metadata-max-bytes; every listing of the pod counts, so a pod over the budget adds about one per full relist",
        runtime_calls.metadata_truncated.clone(),
    );
        // 100µs .. ~10s, doubling.
        let trigger_to_event = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        registry.register(
        "plegd_trigger_to_event_seconds",
        "Time from a push source's observation to the event's emission (events some source pointed at)",
        trigger_to_event.clone(),
    );
        Self {
            triggers,
            relists,
            answered_by_records,
            runtime_calls,
            trigger_to_event,
        }
    }
}

impl Syncs {
    fn register(registry: &mut Registry) -> Self {
        let pod_syncs = Family::<ReasonLabel, Counter>::default();
        registry.register(
        "plegd_pod_syncs",
        "Pod syncs the sync loop handed to its handler (the API's sync watchers), by reason: event, resync or removed",
        pod_syncs.clone(),
    );
        let event_to_sync = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        registry.register(
        "plegd_event_to_sync_seconds",
        "Time from a pod's event reaching the sync loop to the pod's sync handed to its handler (for the API: queued for every sync watcher, which takes it when it reads)",
        event_to_sync.clone(),
    );
        Self {
            pod_syncs,
            event_to_sync,
        }
    }
}

impl Sources {
    fn register(registry: &mut Registry) -> Self {
        let ringbuf_drops = Counter::default();
        registry.register(
            "plegd_ringbuf_drops",
            "Kernel events lost because the eBPF ring buffer was full",
            ringbuf_drops.clone(),
        );
        let untracked_cgroups = Counter::default();
        registry.register(
        "plegd_untracked_cgroups",
        "Container cgroups the eBPF init map could not take: no process hints for them (the relist still finds their changes)",
        untracked_cgroups.clone(),
    );
        let init_map_errors = Family::<OpLabel, Counter>::default();
        registry.register(
        "plegd_init_map_errors",
        "Failed updates of the eBPF init map from userspace, by operation: seed (a running container's init not given to the probes: no process hints for it) or untrack (a non-container cgroup left in the map, holding a slot until evicted)",
        init_map_errors.clone(),
    );
        let stream_reconnects = Family::<SourceLabel, Counter>::default();
        registry.register(
            "plegd_stream_reconnects",
            "Reconnections of runtime event streams, by source",
            stream_reconnects.clone(),
        );
        let silent_streams = Family::<SourceLabel, Counter>::default();
        registry.register(
        "plegd_silent_streams",
        "Runtime event streams declared silent, by source: connected, but plegd's heartbeat published through the runtime did not come back on them in time (each is then reconnected)",
        silent_streams.clone(),
    );
        let unconfirmed_hints = Family::<SourceLabel, Counter>::default();
        registry.register(
        "plegd_unconfirmed_hints",
        "Targeted relists whose runtime reading still did not show what their hint implied after every retry, by source (the next full relist is the safety net)",
        unconfirmed_hints.clone(),
    );
        Self {
            ringbuf_drops,
            untracked_cgroups,
            init_map_errors,
            stream_reconnects,
            silent_streams,
            unconfirmed_hints,
        }
    }
}

impl Gauges {
    fn register(registry: &mut Registry) -> Self {
        let watch_subscribers = Gauge::default();
        registry.register(
            "plegd_watch_subscribers",
            "Watch streams currently open",
            watch_subscribers.clone(),
        );
        let pods = Gauge::default();
        registry.register("plegd_pods", "Pods in the cache", pods.clone());
        let containers = Family::<StateLabel, Gauge>::default();
        registry.register(
            "plegd_containers",
            "Containers (sandboxes included) in the cache, by state",
            containers.clone(),
        );
        Self {
            watch_subscribers,
            pods,
            containers,
        }
    }
}

impl ContainerCounters {
    fn register(registry: &mut Registry) -> Self {
        let starts = Family::<ContainerLabels, Counter>::default();
        registry.register(
            "plegd_container_starts",
            "Container starts plegd emitted (ContainerStarted), by container; sandboxes not counted. Exact: one per event, whatever falls between two scrapes",
            starts.clone(),
        );
        let terminations = Family::<TerminationLabels, Counter>::default();
        registry.register(
            "plegd_container_terminations",
            "Container deaths plegd emitted (ContainerDied), by container and the reason on the event (OOMKilled, Completed, Error, ...); sandboxes not counted. Exact: one per event",
            terminations.clone(),
        );
        let corrections = Counter::default();
        registry.register(
            "plegd_reason_corrections",
            "Deaths whose reason the CRI store, catching up, showed other than the one their event told (the pod's status takes the store's), or that containerd's /tasks/oom changed, coming after the /tasks/exit that told it",
            corrections.clone(),
        );
        let oom_kills = Family::<OomScopeLabel, Counter>::default();
        registry.register(
            "plegd_oom_kills",
            "OOM kills the kernel made in containers on this node, by which limit they came from: container (its own), pod (its pod's cgroup), ancestor (a cgroup above the pod), node (no limit: the node ran out of memory), unknown. One per process the OOM killer chose, whether or not its container died; needs the eBPF source",
            oom_kills.clone(),
        );
        // Every scope from the start: an alert's increase() sees the first kill.
        for scope in OOM_SCOPES {
            let _made = oom_kills.get_or_create(&OomScopeLabel { scope });
        }
        let pod_oom_kills = Family::<PodOomLabels, Counter>::default();
        registry.register(
            "plegd_pod_oom_kills",
            "OOM kills the kernel made in a pod's containers, by pod and by which limit they came from (as plegd_oom_kills): its pod-level kills, and the kills of processes other than a container's init, which no termination shows. One per process the OOM killer chose; needs the eBPF source",
            pod_oom_kills.clone(),
        );
        Self {
            starts,
            terminations,
            corrections,
            oom_kills,
            pod_oom_kills,
            series: Mutex::default(),
        }
    }

    /// Notes a series of pod `namespace`/`pod` with `note`; the pod is live (again).
    fn note(&self, namespace: &str, pod: &str, note: impl FnOnce(&mut PodSeries)) {
        let mut series = self.series();
        let of_pod = series
            .entry((namespace.to_owned(), pod.to_owned()))
            .or_default();
        of_pod.gone_since = None;
        note(of_pod);
    }

    fn series(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), PodSeries>> {
        // Sets updated in single statements: a poisoned lock is still consistent.
        self.series.lock().unwrap_or_else(|p| p.into_inner())
    }
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
    /// A fresh set of metrics, all registered. (prometheus-client ends each help text with a
    /// period: the texts here have none.)
    pub fn new() -> Self {
        Self::counting(RuntimeCalls::default())
    }

    /// A fresh set of metrics whose `plegd_runtime_calls_total` reads `runtime_calls` (the
    /// counter a connected runtime counts on: the `Runtime` port's `calls`).
    pub fn counting(runtime_calls: RuntimeCalls) -> Self {
        let mut registry = Registry::default();
        Self {
            inner: Arc::new(Inner {
                kubelet: Kubelet::register(&mut registry),
                relists: Relists::register(&mut registry, runtime_calls),
                syncs: Syncs::register(&mut registry),
                sources: Sources::register(&mut registry),
                gauges: Gauges::register(&mut registry),
                containers: ContainerCounters::register(&mut registry),
                api: Api::register(&mut registry),
                export: Export::register(&mut registry),
                history_evictions: {
                    let evictions = Counter::default();
                    registry.register(
                        "plegd_event_history_byte_evictions",
                        "Events dropped from the event history to keep it within --event-history-bytes while it held fewer than --event-history events: watchers and the OTLP export can resume from fewer events back",
                        evictions.clone(),
                    );
                    evictions
                },
                lagged: {
                    let lagged = Family::<LaggedLabel, Counter>::default();
                    registry.register(
                        "plegd_subscribers_lagged",
                        "Subscribers of the event bus ended because their queue was full, by kind: watcher (a Watch that fell --watch-queue events behind: it ends RESOURCE_EXHAUSTED and resumes), internal (stdout, the sync loop or the OTLP export, --event-channel-capacity behind: each catches up from the history or resyncs)",
                        lagged.clone(),
                    );
                    lagged
                },
                registry,
                last_full_relist: Mutex::new(None),
            }),
        }
    }

    /// The counter the event bus counts the subscribers it ended as lagged on.
    pub fn lagged_subscribers(&self) -> Family<LaggedLabel, Counter> {
        self.inner.lagged.clone()
    }

    /// The counter the event history counts the events its byte budget dropped on.
    pub fn history_evictions(&self) -> Counter {
        self.inner.history_evictions.clone()
    }

    /// The counter the runtime backends count their calls on.
    pub fn runtime_calls(&self) -> RuntimeCalls {
        self.inner.relists.runtime_calls.clone()
    }

    /// The sync loop fell behind the bus and skipped `count` events (it resyncs every pod
    /// instead): kubelet's discarded events, which it drops on a full channel.
    pub fn discarded_events(&self, count: u64) {
        self.inner
            .kubelet
            .discard_events
            .0
            .fetch_add(count, Ordering::Relaxed);
    }

    /// A hint from `source` was never confirmed by the runtime within the retry budget.
    pub fn unconfirmed_hint(&self, source: &'static str) {
        self.inner
            .sources
            .unconfirmed_hints
            .get_or_create(&SourceLabel { source })
            .inc();
    }

    /// A trigger from `source` reached the scheduler.
    pub fn trigger(&self, source: &'static str) {
        self.inner
            .relists
            .triggers
            .get_or_create(&SourceLabel { source })
            .inc();
    }

    /// A batch of triggers was answered by the runtime's records alone.
    pub fn answered_by_records(&self) {
        self.inner.relists.answered_by_records.inc();
    }

    /// A relist started at `started` took `duration`; `succeeded` says whether it listed.
    pub fn relisted(&self, full: bool, started: Instant, duration: Duration, succeeded: bool) {
        let scope = if full { "full" } else { "targeted" };
        self.inner
            .relists
            .relists
            .get_or_create(&ScopeLabel { scope })
            .inc();
        if !full {
            return;
        }
        self.inner
            .kubelet
            .relist_duration
            .observe(duration.as_secs_f64());
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
                .kubelet
                .relist_interval
                .observe(started.saturating_duration_since(previous).as_secs_f64());
        }
        let wall = SystemTime::now()
            .checked_sub(started.elapsed())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let unix = wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.inner.kubelet.last_seen.set(unix.as_secs_f64());
    }

    /// An event was emitted `latency` after a push source observed its change.
    pub fn trigger_to_event(&self, latency: Duration) {
        self.inner
            .relists
            .trigger_to_event
            .observe(latency.as_secs_f64());
    }

    /// The sync loop synced a pod for `reason`, `latency` after the earliest event it stands
    /// for reached the loop (`None`: a sync no event asked for).
    pub fn pod_synced(&self, reason: &'static str, latency: Option<Duration>) {
        self.inner
            .syncs
            .pod_syncs
            .get_or_create(&ReasonLabel { reason })
            .inc();
        if let Some(latency) = latency {
            self.inner
                .syncs
                .event_to_sync
                .observe(latency.as_secs_f64());
        }
    }

    /// The eBPF ring buffer lost `count` kernel events.
    pub fn ringbuf_drops(&self, count: u64) {
        self.inner.sources.ringbuf_drops.inc_by(count);
    }

    /// `count` container cgroups could not be tracked in the eBPF init map.
    pub fn untracked_cgroups(&self, count: u64) {
        self.inner.sources.untracked_cgroups.inc_by(count);
    }

    /// `count` updates of the eBPF init map failed while userspace did `op` (`seed`, `untrack`).
    pub fn init_map_errors(&self, op: &'static str, count: u64) {
        self.inner
            .sources
            .init_map_errors
            .get_or_create(&OpLabel { op })
            .inc_by(count);
    }

    /// `source`'s event stream was declared silent (its heartbeat did not come back).
    pub fn silent_stream(&self, source: &'static str) {
        self.inner
            .sources
            .silent_streams
            .get_or_create(&SourceLabel { source })
            .inc();
    }

    /// A runtime event stream of `source` reconnected.
    pub fn stream_reconnect(&self, source: &'static str) {
        self.inner
            .sources
            .stream_reconnects
            .get_or_create(&SourceLabel { source })
            .inc();
    }

    /// A container of pod `namespace`/`pod` started. Its terminations by OOM kill and by
    /// error are made too, at 0: an alert on their `increase()` sees the first one (a series
    /// that appears at 1 shows no increase).
    pub fn container_started(&self, namespace: &str, pod: &str, container: &str) {
        let labels = ContainerLabels {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
            container: container.to_owned(),
        };
        let counters = &self.inner.containers;
        counters.starts.get_or_create(&labels).inc();
        let mut series = counters.series();
        let of_pod = series
            .entry((labels.namespace.clone(), labels.pod.clone()))
            .or_default();
        of_pod.gone_since = None;
        for reason in ["OOMKilled", "Error"] {
            let termination = TerminationLabels {
                namespace: labels.namespace.clone(),
                pod: labels.pod.clone(),
                container: labels.container.clone(),
                reason: reason.to_owned(),
            };
            let _made = counters.terminations.get_or_create(&termination);
            of_pod.terminations.insert(termination);
        }
        // The scopes a pod's own limits cause, made at 0 likewise.
        for scope in ["container", "pod"] {
            let kills = PodOomLabels {
                namespace: labels.namespace.clone(),
                pod: labels.pod.clone(),
                scope,
            };
            let _made = counters.pod_oom_kills.get_or_create(&kills);
            of_pod.oom_kills.insert(kills);
        }
        of_pod.starts.insert(labels);
    }

    /// The kernel's OOM killer killed a process in a container, for a limit of `scope`.
    pub fn oom_kill(&self, scope: &'static str) {
        self.inner
            .containers
            .oom_kills
            .get_or_create(&OomScopeLabel { scope })
            .inc();
    }

    /// ... in a container of pod `namespace`/`pod`.
    pub fn pod_oom_kill(&self, namespace: &str, pod: &str, scope: &'static str) {
        let labels = PodOomLabels {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
            scope,
        };
        let counters = &self.inner.containers;
        counters.pod_oom_kills.get_or_create(&labels).inc();
        counters.note(namespace, pod, |of_pod| {
            of_pod.oom_kills.insert(labels);
        });
    }

    /// A container of pod `namespace`/`pod` died, for `reason`.
    pub fn container_terminated(&self, namespace: &str, pod: &str, container: &str, reason: &str) {
        let labels = TerminationLabels {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
            container: container.to_owned(),
            reason: reason.to_owned(),
        };
        let counters = &self.inner.containers;
        counters.terminations.get_or_create(&labels).inc();
        counters.note(namespace, pod, |of_pod| {
            of_pod.terminations.insert(labels);
        });
    }

    /// An API listener admitted a connection.
    pub fn api_connection_opened(&self, listener: &'static str) {
        self.inner
            .api
            .connections
            .get_or_create(&ListenerLabel { listener })
            .inc();
    }

    /// An admitted API connection went.
    pub fn api_connection_closed(&self, listener: &'static str) {
        self.inner
            .api
            .connections
            .get_or_create(&ListenerLabel { listener })
            .dec();
    }

    /// An API connection or stream was refused (`what`), for `reason`.
    pub fn api_refused(&self, listener: &'static str, what: &'static str, reason: &'static str) {
        self.inner
            .api
            .refused
            .get_or_create(&RefusedLabels {
                listener,
                what,
                reason,
            })
            .inc();
    }

    /// plegd closed an API connection that had no stream past its deadline.
    pub fn api_closed(&self, listener: &'static str, reason: &'static str) {
        self.inner
            .api
            .closed
            .get_or_create(&ClosedLabels { listener, reason })
            .inc();
    }

    /// The OTLP receiver acknowledged `count` events, `rejected` of them as rejected.
    pub fn otlp_exported(&self, count: u64, rejected: u64) {
        let export = &self.inner.export;
        export.exported.inc_by(count);
        export.rejected.inc_by(rejected);
    }

    /// The OTLP receiver refused a batch of `count` events for good.
    pub fn otlp_refused(&self, count: u64) {
        self.inner.export.refused.inc_by(count);
    }

    /// `count` events fell out of the history before the OTLP exporter sent them.
    pub fn otlp_dropped(&self, count: u64) {
        self.inner.export.dropped.inc_by(count);
    }

    /// An OTLP export call failed.
    pub fn otlp_export_failed(&self) {
        self.inner.export.failures.inc();
    }

    /// The CRI store showed a death's reason other than the one its event told.
    pub fn reason_corrected(&self) {
        self.inner.containers.corrections.inc();
    }

    /// Drops the per-container series of pods gone from `live` (by namespace and name) for
    /// [`GONE_POD_SERIES_RETENTION`] by `now`; notes since when the others are gone.
    pub fn forget_gone_pods(&self, live: &BTreeSet<(&str, &str)>, now: Instant) {
        let counters = &self.inner.containers;
        let mut series = counters.series();
        series.retain(|(namespace, name), of_pod| {
            if live.contains(&(namespace.as_str(), name.as_str())) {
                of_pod.gone_since = None;
                return true;
            }
            let since = *of_pod.gone_since.get_or_insert(now);
            if now.saturating_duration_since(since) < GONE_POD_SERIES_RETENTION {
                return true;
            }
            for labels in &of_pod.starts {
                counters.starts.remove(labels);
            }
            for labels in &of_pod.terminations {
                counters.terminations.remove(labels);
            }
            for labels in &of_pod.oom_kills {
                counters.pod_oom_kills.remove(labels);
            }
            false
        });
    }

    /// Sets the gauges read at scrape time: watchers, pods, containers by state.
    pub fn set_snapshot(
        &self,
        subscribers: usize,
        pods: usize,
        containers: &BTreeMap<&'static str, usize>,
    ) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.inner.gauges.watch_subscribers.set(gauge(subscribers));
        self.inner.gauges.pods.set(gauge(pods));
        for state in ["created", "running", "exited", "unknown"] {
            self.inner
                .gauges
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

    /// Every metric in `format`.
    pub fn encode_as(&self, format: Format) -> String {
        match format {
            Format::OpenMetrics => self.encode(),
            Format::Text => to_classic_text(&self.encode()),
        }
    }
}

/// An exposition format of `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0, what Prometheus 2.x asks for first.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4, what `promtool check metrics`, Prometheus 1.x
    /// and most other scrapers read.
    Text,
}

impl Format {
    /// The `Content-Type` of a response in this format.
    pub const fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Self::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }

    /// The format an HTTP `Accept` header prefers: the media type with the higher `q` of
    /// `application/openmetrics-text` and `text/plain`; OpenMetrics on a tie, without the
    /// header, or when it names neither (`*/*`), as before content negotiation existed.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Self::OpenMetrics;
        };
        let (mut openmetrics, mut text) = (None::<f32>, None::<f32>);
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .and_then(|(_, v)| v.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            let slot = match media.as_str() {
                "application/openmetrics-text" => &mut openmetrics,
                "text/plain" => &mut text,
                _ => continue,
            };
            *slot = Some(slot.map_or(q, |old| old.max(q)));
        }
        match (openmetrics.filter(|q| *q > 0.0), text.filter(|q| *q > 0.0)) {
            (Some(o), Some(t)) if t > o => Self::Text,
            (None, Some(_)) => Self::Text,
            _ => Self::OpenMetrics,
        }
    }
}

/// The classic Prometheus text of the OpenMetrics text `openmetrics`: counter families named
/// with their `_total` samples' name, `unknown` typed `untyped`, no `# UNIT`, `_created`
/// samples, exemplars or `# EOF`.
fn to_classic_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP comes before its TYPE, which decides its classic name.
    let mut help: Option<(&str, String)> = None;
    let mut counter: Option<&str> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            // OpenMetrics escapes `"` in HELP; the classic text does not.
            help = Some((name, text.replace("\\\"", "\"")));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (family, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
                _ => (name.to_owned(), "untyped"),
            };
            counter = (kind == "counter").then_some(name);
            if let Some((_, text)) = help.take().filter(|(n, _)| *n == name) {
                out.push_str(&format!("# HELP {family} {text}\n"));
            }
            out.push_str(&format!("# TYPE {family} {kind}\n"));
        } else if line.starts_with('#') {
            // `# UNIT`, `# EOF`: no classic equivalent.
        } else if !line.is_empty() {
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            if counter.is_some_and(|c| line[..name_end] == format!("{c}_created")) {
                continue;
            }
            // Exemplars (`value # {labels} value`) are OpenMetrics only.
            let sample = line.split_once(" # ").map_or(line, |(sample, _)| sample);
            out.push_str(sample);
            out.push('\n');
        }
    }
    out
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
        metrics.trigger("containerd");
        metrics.trigger_to_event(Duration::from_micros(350));
        metrics.pod_synced("event", Some(Duration::from_micros(200)));
        metrics.pod_synced("resync", None);
        metrics.ringbuf_drops(3);
        metrics.untracked_cgroups(4);
        metrics.init_map_errors("untrack", 5);
        metrics.stream_reconnect("cri-events");
        metrics.unconfirmed_hint("ebpf");
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
        assert_eq!(
            value(&text, "plegd_pod_syncs_total{reason=\"resync\"}"),
            1.0
        );
        assert_eq!(value(&text, "plegd_event_to_sync_seconds_count"), 1.0);
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

    #[test]
    fn the_classic_text_has_classic_types_and_counter_names() {
        let metrics = Metrics::new();
        metrics.discarded_events(2);
        metrics.trigger("containerd");
        metrics.ringbuf_drops(3);
        let text = metrics.encode_as(Format::Text);
        // No OpenMetrics type (the OOM scope `unknown` is a label value, not a type).
        assert!(
            !text.contains("# EOF")
                && !text
                    .lines()
                    .any(|l| l.starts_with("# TYPE") && l.ends_with(" unknown")),
            "{text}"
        );
        for expected in [
            "# TYPE kubelet_pleg_discard_events untyped\nkubelet_pleg_discard_events 2.0\n",
            "# HELP plegd_ringbuf_drops_total Kernel events lost",
            "# TYPE plegd_ringbuf_drops_total counter\nplegd_ringbuf_drops_total 3\n",
            "# TYPE plegd_triggers_total counter\nplegd_triggers_total{source=\"containerd\"} 1\n",
            "# TYPE kubelet_pleg_relist_duration_seconds histogram\n",
            "# TYPE plegd_pods gauge\nplegd_pods 0\n",
        ] {
            assert!(text.contains(expected), "{expected:?} not in\n{text}");
        }
        // Every sample follows the TYPE line of its family.
        let mut family = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap().to_owned();
            } else if !line.starts_with('#') {
                assert!(line.starts_with(&family), "{line:?} outside {family}");
            }
        }
    }

    #[test]
    fn to_classic_drops_what_openmetrics_alone_has() {
        let openmetrics = "# HELP c A \\\"quoted\\\" help.\n# TYPE c counter\n# UNIT c seconds\n\
                           c_total 1 # {trace_id=\"x\"} 1\nc_created 17\n# TYPE u unknown\nu 2\n# EOF\n";
        assert_eq!(
            to_classic_text(openmetrics),
            "# HELP c_total A \"quoted\" help.\n# TYPE c_total counter\nc_total 1\n\
             # TYPE u untyped\nu 2\n"
        );
    }

    #[test]
    fn the_format_follows_the_accept_header() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let cases = [
            (None, Format::OpenMetrics),
            (Some("*/*"), Format::OpenMetrics),
            (Some(prometheus), Format::OpenMetrics),
            (Some("text/plain; version=0.0.4"), Format::Text),
            (Some("text/plain;version=0.0.4;q=1,*/*;q=0.1"), Format::Text),
            (
                Some("application/openmetrics-text;q=0.3, text/plain"),
                Format::Text,
            ),
            (Some("text/plain;q=0, */*"), Format::OpenMetrics),
            (Some("application/json"), Format::OpenMetrics),
        ];
        for (accept, expected) in cases {
            assert_eq!(Format::negotiate(accept), expected, "{accept:?}");
        }
    }

    /// Every start and death counts once, whatever falls between two scrapes; a pod's series go
    /// a while after the pod, not before.
    #[test]
    fn container_counters_are_exact_and_forgotten_after_their_pod() {
        let metrics = Metrics::new();
        for _ in 0..3 {
            metrics.container_started("ns", "web", "app");
            metrics.container_terminated("ns", "web", "app", "OOMKilled");
        }
        metrics.container_terminated("ns", "web", "app", "Completed");
        metrics.container_started("ns", "db", "pg");
        let text = metrics.encode();
        let series = |name: &str, labels: &str| format!("{name}_total{{{labels}}}");
        let web = r#"namespace="ns",pod="web",container="app""#;
        assert_eq!(value(&text, &series("plegd_container_starts", web)), 3.0);
        let oom = format!(r#"{web},reason="OOMKilled""#);
        assert_eq!(
            value(&text, &series("plegd_container_terminations", &oom)),
            3.0
        );
        let completed = format!(r#"{web},reason="Completed""#);
        assert_eq!(
            value(&text, &series("plegd_container_terminations", &completed)),
            1.0
        );
        // Made at the start, at 0: the first error is an increase.
        let error = format!(r#"{web},reason="Error""#);
        assert_eq!(
            value(&text, &series("plegd_container_terminations", &error)),
            0.0
        );

        // web is gone, db lives on.
        let t0 = Instant::now();
        let live = BTreeSet::from([("ns", "db")]);
        metrics.forget_gone_pods(&live, t0);
        metrics.forget_gone_pods(&live, t0 + GONE_POD_SERIES_RETENTION / 2);
        assert!(
            metrics
                .encode()
                .contains(&series("plegd_container_starts", web))
        );
        metrics.forget_gone_pods(&live, t0 + GONE_POD_SERIES_RETENTION);
        let text = metrics.encode();
        assert!(!text.contains(r#"pod="web""#), "{text}");
        assert!(text.contains(r#"pod="db""#), "{text}");
    }
}
