//! The files under deploy/ are read the way their consumers read them, so a typo fails here:
//! the systemd unit by `systemd-analyze verify`, the example config by `Config::load`, the
//! Kubernetes manifests by the API's own types (k8s-openapi), the alerts against the metrics
//! plegd really exports and by `promtool test rules` against the cases of alerts.test.yaml.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use clap::Args as _;
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Namespace, Service, ServiceAccount},
    networking::v1::NetworkPolicy,
};
use plegd::{
    config::{Config, DEFAULT_SOCKET, RunArgs},
    pleg::Source,
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `Key=value` settings of the unit, in order.
fn unit_settings(unit: &str) -> Vec<(String, String)> {
    unit.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn unit_setting(unit: &str, key: &str) -> String {
    unit_settings(unit)
        .into_iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("the unit has no {key}="))
        .1
}

#[test]
fn the_systemd_unit_verifies() {
    let unit_path = deploy("systemd/plegd.service");
    let unit = read(&unit_path);
    let Ok(version) = Command::new("systemd-analyze").arg("--version").output() else {
        println!("skipped: no systemd-analyze on this machine (install systemd to check the unit)");
        return;
    };
    assert!(version.status.success());
    // verify also checks that ExecStart's program exists: the unit names where it is
    // installed (/usr/local/bin/plegd), which this machine need not have; any executable
    // stands in for it.
    let stand_in = std::env::current_exe().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("plegd.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/plegd", &stand_in.display().to_string()),
    )
    .unwrap();
    let verify = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&copy)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success(),
        "systemd-analyze verify failed: {stderr}"
    );
    // Unknown keys and bad values are warnings: verify still succeeds, so none is allowed.
    assert!(stderr.trim().is_empty(), "systemd-analyze verify: {stderr}");
}

#[test]
fn the_systemd_unit_matches_plegds_defaults_and_the_daemonset() {
    let unit = read(&deploy("systemd/plegd.service"));
    assert_eq!(unit_setting(&unit, "Type"), "notify");
    // RuntimeDirectory= and StateDirectory= make plegd's default directories.
    assert_eq!(
        Path::new("/run").join(unit_setting(&unit, "RuntimeDirectory")),
        Path::new(DEFAULT_SOCKET).parent().unwrap()
    );
    let defaults = Config::load(&RunArgs::default()).unwrap();
    assert_eq!(
        Some(Path::new("/var/lib").join(unit_setting(&unit, "StateDirectory"))),
        defaults.state_dir
    );
    // One list of capabilities: the unit's are the DaemonSet's, which the pod test runs with.
    let daemonset: DaemonSet = kubernetes_object(&deploy("kubernetes/daemonset.yaml"));
    let container = &daemonset.spec.template.spec.unwrap().containers[0];
    let capabilities = container
        .security_context
        .as_ref()
        .and_then(|s| s.capabilities.clone())
        .unwrap();
    let pod_caps: BTreeSet<String> = capabilities
        .add
        .unwrap_or_default()
        .iter()
        .map(|c| format!("CAP_{c}"))
        .collect();
    for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        let unit_caps: BTreeSet<String> = unit_setting(&unit, key)
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        assert_eq!(unit_caps, pod_caps, "{key}");
    }
    assert_eq!(capabilities.drop, Some(vec!["ALL".to_owned()]));
    // The watchdog is fed each time the generator loop turns, which is at least every
    // LONGEST_WAIT (and a relist, whose calls each have a deadline): well above that.
    let watchdog = plegd::config::parse_duration(&unit_setting(&unit, "WatchdogSec")).unwrap();
    assert!(
        watchdog >= 10 * plegd::pleg::LONGEST_WAIT,
        "WatchdogSec={watchdog:?} is not well above the loop's longest wait"
    );
    assert!(watchdog >= 10 * defaults.runtime_timeout, "{watchdog:?}");
    // One memory bound: the unit's MemoryMax= (M: MiB) is the pod's limit (Mi), the one
    // tests/tests/memory_limit.rs runs plegd under.
    let limits = container
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    assert_eq!(
        limits.get("memory").map(|q| q.0.clone()),
        unit_setting(&unit, "MemoryMax")
            .strip_suffix('M')
            .map(|mib| format!("{mib}Mi")),
        "the DaemonSet's memory limit is the unit's MemoryMax="
    );
}

/// The `plegd run` file keys: the flags' long names, less `config` (not a file key).
fn file_keys() -> BTreeSet<String> {
    RunArgs::augment_args(clap::Command::new("run"))
        .get_arguments()
        .filter_map(|arg| arg.get_long().map(str::to_owned))
        .filter(|long| long != "config")
        .collect()
}

#[test]
fn the_example_config_loads_and_shows_every_key_with_its_default() {
    let path = deploy("plegd.toml");
    let defaults = Config::load(&RunArgs::default()).unwrap();
    let load = |path: &Path| {
        Config::load(&RunArgs {
            config: Some(path.to_owned()),
            ..RunArgs::default()
        })
        .unwrap_or_else(|e| panic!("{e}"))
    };
    // As shipped, everything commented out: the defaults.
    assert_eq!(load(&path), defaults);

    // Every `# key = value` line uncommented: each key is a real one, with a value of its
    // type, and the value shown is the default (or, for settings off by default, an example).
    let text = read(&path);
    let is_setting = |line: &str| {
        line.strip_prefix("# ").is_some_and(|rest| {
            rest.split_once(" = ").is_some_and(|(key, _)| {
                !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '-')
            })
        })
    };
    let uncommented: String = text
        .lines()
        .map(|line| if is_setting(line) { &line[2..] } else { line })
        .collect::<Vec<_>>()
        .join("\n");
    let keys: BTreeSet<String> = uncommented
        .lines()
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k.to_owned()))
        .filter(|k| !k.starts_with('#'))
        .collect();
    assert_eq!(keys, file_keys(), "the example shows every key, once");
    let dir = tempfile::tempdir().unwrap();
    let all = dir.path().join("plegd.toml");
    std::fs::write(&all, &uncommented).unwrap();
    let mut loaded = load(&all);
    // The settings that are off by default show an example: set them aside.
    assert_eq!(
        loaded.runtime_endpoint.take().as_deref(),
        Some("unix:///run/containerd/containerd.sock")
    );
    assert_eq!(std::mem::take(&mut loaded.api_allow_gids), [1000]);
    // The sources shown are what the default comes to on containerd, asked for by name.
    assert_eq!(
        std::mem::replace(&mut loaded.sources, defaults.sources.clone()),
        [Source::Ebpf, Source::Containerd].into()
    );
    assert!(std::mem::take(&mut loaded.sources_given));
    for example in [
        loaded.listen.take().map(|a| a.to_string()),
        loaded.metrics_address.take().map(|a| a.to_string()),
        loaded.tls_cert.take().map(|p| p.display().to_string()),
        loaded.tls_key.take().map(|p| p.display().to_string()),
        loaded.tls_client_ca.take().map(|p| p.display().to_string()),
        loaded.otlp.take().map(|o| o.endpoint),
    ] {
        assert!(example.is_some());
    }
    assert_eq!(loaded, defaults, "every value shown is the default");
}

/// The single object in a manifest, read with the Kubernetes API's own type; a field that
/// type does not have (a typo) fails: what was read, written back, must be the whole file.
fn kubernetes_object<T: DeserializeOwned + Serialize>(path: &Path) -> T {
    let text = read(path);
    let value: serde_yaml::Value =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let object: T =
        serde_yaml::from_value(value.clone()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let written: serde_json::Value = serde_json::to_value(&object).unwrap();
    let original: serde_json::Value = serde_json::to_value(&value).unwrap();
    assert_eq!(
        written,
        original,
        "{}: fields the API type does not know (typos?) were dropped",
        path.display()
    );
    object
}

#[test]
fn every_kubernetes_manifest_is_a_valid_api_object() {
    let namespace: Namespace = kubernetes_object(&deploy("kubernetes/namespace.yaml"));
    let name = namespace.metadata.name.unwrap();
    let account: ServiceAccount = kubernetes_object(&deploy("kubernetes/serviceaccount.yaml"));
    let service: Service = kubernetes_object(&deploy("kubernetes/service.yaml"));
    let daemonset: DaemonSet = kubernetes_object(&deploy("kubernetes/daemonset.yaml"));
    let policy: NetworkPolicy = kubernetes_object(&deploy("kubernetes/networkpolicy.yaml"));
    for namespace in [
        &account.metadata.namespace,
        &service.metadata.namespace,
        &daemonset.metadata.namespace,
        &policy.metadata.namespace,
    ] {
        assert_eq!(namespace.as_deref(), Some(name.as_str()));
    }
    let spec = daemonset.spec;
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name, account.metadata.name);
    assert_eq!(pod.host_pid, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let tolerations = pod.tolerations.unwrap();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "tolerates every taint"
    );
    let labels = spec.template.metadata.unwrap().labels.unwrap();
    let selector = service.spec.as_ref().unwrap().selector.clone().unwrap();
    assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)));
    assert_eq!(service.spec.unwrap().cluster_ip.as_deref(), Some("None"));
    let annotations = service.metadata.annotations.unwrap();
    assert_eq!(annotations["prometheus.io/scrape"], "true");

    let container = &pod.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some(plegd_tests::image::PLEGD_IMAGE),
        "the DaemonSet runs the image `cargo xtask image` builds"
    );
    let port = container.ports.as_ref().unwrap()[0].container_port;
    assert_eq!(annotations["prometheus.io/port"], port.to_string());
    let args = container.args.clone().unwrap();
    assert!(
        args.iter()
            .any(|a| a == &format!("--metrics-address=0.0.0.0:{port}")),
        "plegd serves the probes' and the Service's port: {args:?}"
    );
    // The probes run `plegd health` over the socket, out of other pods' reach.
    for (probe, command) in [
        (&container.liveness_probe, &["health", "--live"][..]),
        (&container.readiness_probe, &["health"]),
    ] {
        let probe = probe.as_ref().unwrap();
        assert!(probe.http_get.is_none() && probe.tcp_socket.is_none());
        let exec = probe.exec.as_ref().unwrap().command.clone().unwrap();
        assert_eq!(exec[0], plegd_tests::image::PLEGD_IN_IMAGE);
        assert_eq!(exec[1..], *command);
    }
    // Only a namespace's pods (Prometheus) reach the metrics port, and nothing else.
    let policy = policy.spec.unwrap();
    let selected = policy.pod_selector.unwrap().match_labels.unwrap();
    assert!(selected.iter().all(|(k, v)| labels.get(k) == Some(v)));
    assert_eq!(policy.policy_types.unwrap(), ["Ingress"]);
    let ingress = policy.ingress.unwrap();
    assert_eq!(ingress.len(), 1);
    let ports = ingress[0].ports.as_ref().unwrap();
    let named = container.ports.as_ref().unwrap()[0].name.clone().unwrap();
    assert_eq!(
        ports
            .iter()
            .map(|p| p.port.clone().unwrap())
            .collect::<Vec<_>>(),
        [k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(named)]
    );
    let from = ingress[0].from.as_ref().unwrap();
    assert!(
        from.iter()
            .all(|peer| peer.namespace_selector.is_some() && peer.ip_block.is_none()),
        "{from:?}"
    );
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(security.privileged, Some(false));
    let mounted: BTreeSet<&str> = container
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    let volumes: BTreeSet<&str> = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(mounted, volumes, "every volume mounted, none missing");
}

/// A Prometheus Operator `PrometheusRule`, only the fields used (unknown ones refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PrometheusRule {
    api_version: String,
    kind: String,
    metadata: serde_yaml::Value,
    spec: RuleSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    groups: Vec<RuleGroup>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleGroup {
    name: String,
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    alert: String,
    expr: String,
    #[serde(default, rename = "for")]
    for_: Option<String>,
    labels: std::collections::BTreeMap<String, String>,
    annotations: std::collections::BTreeMap<String, String>,
}

/// The series names plegd's `/metrics` can hold, from the `# TYPE` lines of its registry once
/// every labelled family has a series (a family without one is not written at all).
fn exported_series() -> BTreeSet<String> {
    use plegd::pleg::Source;
    let metrics = plegd::base::metrics::Metrics::new();
    let now = std::time::Instant::now();
    metrics.relisted(true, now, std::time::Duration::from_millis(1), true);
    metrics.relisted(false, now, std::time::Duration::from_millis(1), true);
    metrics.discarded_events(1);
    for source in [Source::Ebpf, Source::Containerd, Source::CriEvents] {
        metrics.trigger(source.name());
        metrics.unconfirmed_hint(source.name());
        metrics.stream_reconnect(source.name());
    }
    metrics.init_map_errors("seed", 1);
    metrics.set_snapshot(0, 0, &std::collections::BTreeMap::new());
    metrics.container_started("default", "web", "app");
    metrics.container_terminated("default", "web", "app", "OOMKilled");
    let text = metrics.encode();
    let mut series = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        series.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    series
}

#[test]
fn every_alert_names_metrics_plegd_exports() {
    let path = deploy("kubernetes/alerts.yaml");
    let rule: PrometheusRule = serde_yaml::from_str(&read(&path)).unwrap();
    assert_eq!(rule.api_version, "monitoring.coreos.com/v1");
    assert_eq!(rule.kind, "PrometheusRule");
    assert!(rule.metadata.get("name").is_some());
    let exported = exported_series();
    assert!(
        exported.contains("kubelet_pleg_relist_duration_seconds_bucket"),
        "{exported:?}"
    );
    let mut alerts = BTreeSet::new();
    for group in &rule.spec.groups {
        assert!(!group.name.is_empty());
        for rule in &group.rules {
            assert!(alerts.insert(rule.alert.clone()), "{} twice", rule.alert);
            assert!(rule.labels.contains_key("severity"), "{}", rule.alert);
            assert!(rule.annotations.contains_key("summary"), "{}", rule.alert);
            if let Some(wait) = &rule.for_ {
                plegd::config::parse_duration(wait).unwrap();
            }
            let names: Vec<&str> = rule
                .expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .filter(|word| word.starts_with("kubelet_pleg_") || word.starts_with("plegd_"))
                .collect();
            assert!(!names.is_empty(), "{}: names no plegd metric", rule.alert);
            for name in names {
                assert!(
                    exported.contains(name),
                    "{}: {name} is not a series plegd exports ({exported:?})",
                    rule.alert
                );
            }
        }
    }
    for wanted in [
        "PlegdPLEGNotHealthy",
        "PlegdRelistDurationHigh",
        "PlegdDiscardedEvents",
        "PlegdPushSourceDisconnected",
    ] {
        assert!(alerts.contains(wanted), "{wanted} missing");
    }
}

/// The alerts fire, and stay quiet, as alerts.test.yaml's cases say: `promtool test rules` on
/// the rules of alerts.yaml's `spec.groups`.
#[test]
fn alerts_fire_as_their_cases_say() {
    let promtool = plegd_tests::process::promtool()
        .expect("promtool (`cargo xtask setup` unpacks it under .xtask/prometheus)");
    let rule: serde_yaml::Value =
        serde_yaml::from_str(&read(&deploy("kubernetes/alerts.yaml"))).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    let groups =
        serde_yaml::Mapping::from_iter([("groups".into(), rule["spec"]["groups"].clone())]);
    std::fs::write(&rules, serde_yaml::to_string(&groups).unwrap()).unwrap();
    let mut cases: serde_yaml::Value =
        serde_yaml::from_str(&read(&deploy("kubernetes/alerts.test.yaml"))).unwrap();
    cases["rule_files"] = vec![serde_yaml::Value::from(rules.display().to_string())].into();
    let test = dir.path().join("alerts.test.yaml");
    std::fs::write(&test, serde_yaml::to_string(&cases).unwrap()).unwrap();
    let output = Command::new(&promtool)
        .args(["test", "rules"])
        .arg(&test)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool test rules:\n{said}");
    assert!(said.contains("SUCCESS"), "{said}");
}
