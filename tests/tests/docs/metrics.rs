//! docs/metrics.md: every metric of the registry, with its types in both exposition formats.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    time::{Duration, Instant},
};

use plegd::{
    base::metrics::{Format, Metrics},
    pleg::Source,
};

/// One metric family as an exposition text declares it.
struct Family {
    name: String,
    kind: String,
    help: String,
    /// Label names of its samples (`le` of histogram buckets aside).
    labels: BTreeSet<String>,
}

/// The families of an exposition text, in order.
fn families(text: &str) -> Vec<Family> {
    let mut families: Vec<Family> = Vec::new();
    let mut help = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = rest.split_once(' ').map_or("", |(_, h)| h).to_owned();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            families.push(Family {
                name: name.to_owned(),
                kind: kind.to_owned(),
                help: std::mem::take(&mut help),
                labels: BTreeSet::new(),
            });
        } else if let (Some(family), Some((_, labels))) =
            (families.last_mut(), line.split_once('{'))
        {
            let labels = labels.split('}').next().unwrap_or_default();
            family.labels.extend(
                labels
                    .split(',')
                    .filter_map(|l| l.split_once('=').map(|(name, _)| name.to_owned()))
                    .filter(|name| name != "le"),
            );
        }
    }
    families
}

/// Metrics with a series in every family: prometheus-client leaves out of the text a labelled
/// family that has none yet.
fn every_family() -> Metrics {
    let metrics = Metrics::new();
    metrics.trigger(Source::Ebpf.name());
    metrics.relisted(false, Instant::now(), Duration::ZERO, true);
    metrics.answered_by_records();
    metrics.runtime_calls().count("ListContainers");
    metrics.init_map_errors("seed", 1);
    metrics.stream_reconnect(Source::Containerd.name());
    metrics.silent_stream(Source::Containerd.name());
    metrics.unconfirmed_hint(Source::Ebpf.name());
    metrics.pod_synced("event", None);
    metrics.set_snapshot(0, 0, &BTreeMap::new());
    metrics.container_started("default", "web", "app");
    metrics.container_terminated("default", "web", "app", "OOMKilled");
    metrics.api_connection_opened("unix");
    metrics.api_refused("tls", "connection", "peer-full");
    metrics.api_closed("tls", "no-first-stream");
    metrics
        .lagged_subscribers()
        .get_or_create(&plegd::base::bus::LaggedLabel { kind: "watcher" })
        .inc();
    metrics
}

/// The sample names a family exposes, given its type and name in the classic text.
fn samples(family: &Family) -> String {
    match family.kind.as_str() {
        "histogram" => ["_bucket{le}", "_sum", "_count"]
            .map(|s| format!("`{}{s}`", family.name))
            .join(", "),
        _ => format!("`{}`", family.name),
    }
}

/// Example PromQL over the container counters, as docs/metrics.md shows them: what each
/// answers, and the query (`promtool check rules` parses each, below).
const EXAMPLES: &[(&str, &str)] = &[
    (
        "OOM kills per namespace in the last hour",
        r#"sum by (namespace) (increase(plegd_container_terminations_total{reason="OOMKilled"}[1h]))"#,
    ),
    (
        "Container deaths (kubelet restarts most of them) in the last hour, by reason",
        "sum by (reason) (increase(plegd_container_terminations_total[1h]))",
    ),
    (
        "The ten containers that died most often in the last hour, other than by completing",
        r#"topk(10, sum by (namespace, pod, container) (increase(plegd_container_terminations_total{reason!="Completed"}[1h])))"#,
    ),
    (
        "Container starts per node in the last 5 minutes",
        "sum by (instance) (increase(plegd_container_starts_total[5m]))",
    ),
    (
        "Deaths whose reason the CRI store corrected after their event (should stay 0)",
        "increase(plegd_reason_corrections_total[1d])",
    ),
    (
        "OOM kills in the last hour by which limit they came from (container, pod, ancestor, node)",
        "sum by (scope) (increase(plegd_oom_kills_total[1h]))",
    ),
    (
        "Pods whose shared (pod-level) memory limit killed processes in the last hour",
        r#"sum by (namespace, pod) (increase(plegd_pod_oom_kills_total{scope="pod"}[1h])) > 0"#,
    ),
];

pub fn reference() -> String {
    let metrics = every_family();
    let openmetrics = families(&metrics.encode_as(Format::OpenMetrics));
    let classic = families(&metrics.encode_as(Format::Text));
    assert_eq!(
        openmetrics.len(),
        classic.len(),
        "one classic family per OpenMetrics family"
    );
    let registered = include_str!("../../../agent/src/base/metrics.rs")
        .matches("registry.register(")
        .count();
    assert_eq!(
        classic.len(),
        registered,
        "a metric family has no series: give it one in every_family() (tests/tests/docs/metrics.rs)"
    );
    let mut out = super::banner("the registry in agent/src/base/metrics.rs (`Metrics::new()`)");
    out.push_str(&format!(
        "\n# Metrics\n\n\
         `plegd run --metrics-address ADDR:PORT` serves them at `/metrics`. The format follows \
         the request's `Accept` header: OpenMetrics 1.0.0 (`{}`) when it prefers \
         `application/openmetrics-text`, names neither, or is absent (Prometheus 2.x asks for \
         it first); the classic Prometheus text format (`{}`) when it prefers `text/plain`, \
         as `promtool`, Prometheus 1.x and most other scrapers do:\n\n\
         ```sh\ncurl -s -H 'Accept: text/plain; version=0.0.4' http://127.0.0.1:9809/metrics \
         | promtool check metrics\n```\n\n\
         The two differ in counter names: OpenMetrics names a counter family without `_total` \
         and its sample with it; the classic text names both with it. \
         `kubelet_pleg_discard_events` keeps kubelet's name without `_total`, so it is \
         `unknown` in OpenMetrics and `untyped` in the classic text (kubelet types it \
         `counter`, which `promtool check metrics` rejects for the missing suffix; PromQL's \
         `rate()` works on it all the same). \
         The `kubelet_pleg_*` metrics have kubelet's names, buckets and meaning; full relists \
         are kubelet's relists.\n\n\
         | Metric (classic text) | Type (classic / OpenMetrics) | Labels | Samples | Help |\n\
         |---|---|---|---|---|\n",
        Format::OpenMetrics.content_type(),
        Format::Text.content_type(),
    ));
    for (classic, open) in classic.iter().zip(&openmetrics) {
        let _ = writeln!(
            out,
            "| `{}` | {} / {} | {} | {} | {} |",
            classic.name,
            classic.kind,
            open.kind,
            classic
                .labels
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", "),
            samples(classic),
            super::cell(&classic.help),
        );
    }
    out.push_str(
        "\n## Example queries\n\n\
         The container counters rise by exactly one per event plegd emits, so `increase()` over \
         them counts every start and death, however many fall between two scrapes (a \
         container's series are made at 0 at its start, so its first death is an increase \
         too). A removed pod's series are dropped 5 to 6 minutes after its removal (scraped or not): the count of \
         series follows what the node runs.\n\n",
    );
    for (what, query) in EXAMPLES {
        let _ = writeln!(out, "{what}:\n\n```promql\n{query}\n```\n");
    }
    out.push_str(
        "`deploy/kubernetes/alerts.yaml` alerts on them: `PlegdContainerOOMKilled`, \
         `PlegdContainerCrashLooping`, `PlegdPodMemoryLimitOOMKills` (kills at a pod's shared \
         limit) and `PlegdNodeOutOfMemory` (the global OOM killer, no limit hit) (unit-tested \
         by `promtool test rules` in the suite).\n\n\
         ## OOM kills, by which limit\n\n\
         `plegd_oom_kills_total{scope}` and `plegd_pod_oom_kills_total{namespace, pod, scope}` \
         count each process the kernel's OOM killer chose in a container, told by the eBPF \
         probe at the kill (docs/design.md, \"Which limit an OOM kill came from\"): `container` \
         (its own limit), `pod` (the pod cgroup's, a pod-level limit), `ancestor` (a cgroup \
         above the pod: its QoS class's, `kubepods`, a slice), `node` (no limit: the node ran \
         out), `unknown`. Unlike `plegd_container_terminations_total{reason=\"OOMKilled\"}` \
         they count the kills of processes that left their container running, and no death \
         that was not an OOM kill. The node's series are made at 0 for every scope at start; a \
         pod's, for `container` and `pod` at its first container's start.\n\n\
         kubelet counts pod-level kills as `kubelet_oom_kills_total{scope, resource}` (KEP-2837's \
         instrumentation, kubernetes/enhancements#6180): `scope` is `pod` or `container`, \
         `resource` is always `memory`, and it has no pod label: a node's count, from what \
         kubelet learns after the fact. `sum by (scope) (plegd_oom_kills_total)` is the same \
         count at the kill, with `ancestor` and `node` besides; `plegd_pod_oom_kills_total` \
         names the pod.\n",
    );
    out
}

#[test]
fn example_queries_are_promql() {
    let promtool = plegd_tests::process::promtool()
        .expect("promtool (`cargo xtask setup` unpacks it under .xtask/prometheus)");
    let rules: String = EXAMPLES
        .iter()
        .enumerate()
        .map(|(n, (_, query))| format!("      - record: example:{n}\n        expr: '{query}'\n"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("examples.yaml");
    std::fs::write(
        &file,
        format!("groups:\n  - name: examples\n    rules:\n{rules}"),
    )
    .unwrap();
    let output = std::process::Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "promtool check rules:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
