//! plegd's events as OTLP log records: pure, so the mapping is tested by tables.
//!
//! Attributes follow OpenTelemetry's semantic conventions where they name the thing
//! (`k8s.namespace.name`, `k8s.pod.name`, `k8s.pod.uid`, `k8s.container.name`,
//! `k8s.container.restart_count`, `container.id`, `container.image.name` and `.tags`,
//! `k8s.pod.label.<key>` and `k8s.pod.annotation.<key>`), and are plegd's own (`plegd.*`) for
//! what only plegd knows: the event's type, sequence and run, exit code, reason, signal,
//! sources and confirming store. `plegd.run_id` and `plegd.sequence` together name an event
//! once: a receiver that must not count one twice keys on them.
//!
//! An OOM kill's account (the kernel's, on the death it caused) names its victim with the
//! conventions' `process.pid` and `process.executable.name` (the kernel's `comm`, which is
//! `/proc/<pid>/status`'s `Name`, as the conventions suggest), and the limit with plegd's own,
//! in the conventions' style as none exists: `plegd.oom.scope` (`container`, `pod`,
//! `ancestor`, `node`, `unknown`), `plegd.oom.cgroup` (the path of the cgroup whose limit was
//! hit), `plegd.oom.memory.limit` (that limit, in bytes, as `k8s.container.memory.limit`
//! names a limit) and `plegd.oom.victim.init` (whether the victim was the container's init).

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::{
    collector::logs::v1::ExportLogsServiceRequest,
    common::v1::{AnyValue, ArrayValue, InstrumentationScope, KeyValue, any_value::Value},
    logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber},
    resource::v1::Resource,
};

use crate::{
    output::{EventLine, oom_kill},
    pleg::{PodLifecycleEvent, PodLifecycleEventType},
};

/// What every record of this plegd shares: who sent it.
#[derive(Clone, Debug)]
pub struct Origin {
    resource: Resource,
    scope: InstrumentationScope,
}

impl Origin {
    /// plegd on the node `host_name`.
    pub fn new(host_name: &str) -> Self {
        let mut attributes = vec![
            string("service.name", "plegd"),
            string("service.version", env!("CARGO_PKG_VERSION")),
        ];
        if !host_name.is_empty() {
            attributes.push(string("host.name", host_name));
        }
        Self {
            resource: Resource {
                attributes,
                ..Resource::default()
            },
            scope: InstrumentationScope {
                name: "plegd".to_owned(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                ..InstrumentationScope::default()
            },
        }
    }

    /// One export request carrying `records`.
    pub fn request(&self, records: Vec<LogRecord>) -> ExportLogsServiceRequest {
        ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(self.resource.clone()),
                scope_logs: vec![ScopeLogs {
                    scope: Some(self.scope.clone()),
                    log_records: records,
                    ..ScopeLogs::default()
                }],
                ..ResourceLogs::default()
            }],
        }
    }
}

/// `event`, of run `run_id`, as a log record: timed when the change was first seen, observed
/// when plegd emitted it; its body the line `plegd run` prints for it.
pub fn record(event: &PodLifecycleEvent, run_id: u64) -> LogRecord {
    let line = EventLine::new(event, run_id);
    let failed = event.event_type == PodLifecycleEventType::ContainerDied
        && event.exit_code.is_some_and(|code| code != 0);
    let (severity, severity_text) = if failed {
        (SeverityNumber::Warn, "WARN")
    } else {
        (SeverityNumber::Info, "INFO")
    };
    LogRecord {
        time_unix_nano: unix_nanos(event.observed_at),
        observed_time_unix_nano: unix_nanos(event.emitted_at),
        severity_number: severity as i32,
        severity_text: severity_text.to_owned(),
        event_name: format!("plegd.{}", event.event_type.name()),
        body: Some(any(Value::StringValue(line.summary()))),
        attributes: attributes(event, run_id),
        ..LogRecord::default()
    }
}

fn attributes(event: &PodLifecycleEvent, run_id: u64) -> Vec<KeyValue> {
    let mut attributes = Vec::with_capacity(16);
    let mut text = |key: &str, value: &str| {
        if !value.is_empty() {
            attributes.push(string(key, value));
        }
    };
    text("k8s.namespace.name", &event.pod_namespace);
    text("k8s.pod.name", &event.pod_name);
    text("k8s.pod.uid", &event.pod.0);
    text("k8s.container.name", &event.container_name);
    text("container.id", &event.container_id.0);
    let (image, tag) = image_name_and_tag(&event.image);
    text("container.image.name", image);
    text("plegd.event.type", event.event_type.name());
    text("plegd.reason", &event.reason);
    text("plegd.run_id", &run_id.to_string());
    text(
        "plegd.confirmed_by",
        event.confirmed_by.map_or("", |store| store.name()),
    );
    for (key, value) in &event.pod_labels {
        text(&format!("k8s.pod.label.{key}"), value);
    }
    for (key, value) in &event.pod_annotations {
        text(&format!("k8s.pod.annotation.{key}"), value);
    }
    if let Some(tag) = tag {
        attributes.push(strings("container.image.tags", [tag]));
    }
    // Sandboxes have no restart count of their own.
    if !event.container_name.is_empty() {
        attributes.push(int("k8s.container.restart_count", event.attempt.into()));
    }
    attributes.push(int(
        "plegd.sequence",
        i64::try_from(event.sequence).unwrap_or(i64::MAX),
    ));
    if let Some(code) = event.exit_code {
        attributes.push(int("plegd.exit_code", code.into()));
    }
    if let Some(signal) = event.signal {
        attributes.push(int("plegd.signal", signal.into()));
    }
    attributes.push(strings(
        "plegd.sources",
        event.sources.iter().map(|source| source.name()),
    ));
    if let Some(kill) = oom_kill(&event.observations) {
        attributes.push(string("plegd.oom.scope", kill.scope.name()));
        if let Some(cgroup) = &kill.cgroup {
            attributes.push(string("plegd.oom.cgroup", cgroup));
        }
        if let Some(limit) = kill.limit_bytes {
            attributes.push(int(
                "plegd.oom.memory.limit",
                i64::try_from(limit).unwrap_or(i64::MAX),
            ));
        }
        attributes.push(int("process.pid", kill.victim_pid.into()));
        if !kill.victim_comm.is_empty() {
            attributes.push(string("process.executable.name", &kill.victim_comm));
        }
        attributes.push(key_value(
            "plegd.oom.victim.init",
            Value::BoolValue(kill.victim_init),
        ));
    }
    attributes
}

/// An image reference's name and tag, as `container.image.name` and `.tags` want them:
/// `registry/repo:tag@digest` is `registry/repo` and `tag`; a registry's port is no tag.
fn image_name_and_tag(image: &str) -> (&str, Option<&str>) {
    let without_digest = image.split_once('@').map_or(image, |(name, _)| name);
    let last_slash = without_digest.rfind('/').map_or(0, |i| i + 1);
    match without_digest[last_slash..].rfind(':') {
        Some(colon) => {
            let colon = last_slash + colon;
            (
                &without_digest[..colon],
                Some(&without_digest[colon + 1..]).filter(|tag| !tag.is_empty()),
            )
        }
        None => (without_digest, None),
    }
}

fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    })
}

fn any(value: Value) -> AnyValue {
    AnyValue { value: Some(value) }
}

fn key_value(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(any(value)),
        ..KeyValue::default()
    }
}

fn string(key: &str, value: &str) -> KeyValue {
    key_value(key, Value::StringValue(value.to_owned()))
}

fn int(key: &str, value: i64) -> KeyValue {
    key_value(key, Value::IntValue(value))
}

fn strings<'a>(key: &str, values: impl IntoIterator<Item = &'a str>) -> KeyValue {
    let values = values
        .into_iter()
        .map(|value| any(Value::StringValue(value.to_owned())))
        .collect();
    key_value(key, Value::ArrayValue(ArrayValue { values }))
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, time::Duration};

    use super::*;
    use crate::pleg::{ContainerId, PodUid, Source, Store};

    fn died() -> PodLifecycleEvent {
        let observed_at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        PodLifecycleEvent {
            sequence: 42,
            pod: PodUid("0c1d-uid".into()),
            pod_namespace: "shop".into(),
            pod_name: "web-7f9".into(),
            container_id: ContainerId("3f2a9c".into()),
            container_name: "app".into(),
            event_type: PodLifecycleEventType::ContainerDied,
            observed_at,
            emitted_at: observed_at + Duration::from_millis(3),
            sources: vec![Source::Ebpf, Source::Containerd],
            observations: Vec::new(),
            exit_code: Some(137),
            reason: "OOMKilled".into(),
            confirmed_by: Some(Store::Task),
            signal: Some(9),
            image: "registry.local:5000/shop/web:1.4@sha256:ab12".into(),
            attempt: 2,
            host: None,
            pod_labels: BTreeMap::from([("app".into(), "web".into())]),
            pod_annotations: BTreeMap::new(),
        }
    }

    /// Each attribute as `key=value`, arrays joined by `,`.
    fn flat(record: &LogRecord) -> Vec<String> {
        fn show(value: &Option<AnyValue>) -> String {
            match value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::ArrayValue(a)) => a
                    .values
                    .iter()
                    .map(|v| show(&Some(v.clone())))
                    .collect::<Vec<_>>()
                    .join(","),
                other => format!("{other:?}"),
            }
        }
        record
            .attributes
            .iter()
            .map(|kv| format!("{}={}", kv.key, show(&kv.value)))
            .collect()
    }

    #[test]
    fn a_death_carries_the_conventions_names_and_plegds_own() {
        let record = record(&died(), 7);
        assert_eq!(
            flat(&record),
            [
                "k8s.namespace.name=shop",
                "k8s.pod.name=web-7f9",
                "k8s.pod.uid=0c1d-uid",
                "k8s.container.name=app",
                "container.id=3f2a9c",
                "container.image.name=registry.local:5000/shop/web",
                "plegd.event.type=ContainerDied",
                "plegd.reason=OOMKilled",
                "plegd.run_id=7",
                "plegd.confirmed_by=task",
                "k8s.pod.label.app=web",
                "container.image.tags=1.4",
                "k8s.container.restart_count=2",
                "plegd.sequence=42",
                "plegd.exit_code=137",
                "plegd.signal=9",
                "plegd.sources=ebpf,containerd",
            ]
        );
        assert_eq!(record.time_unix_nano, 1_800_000_000_000_000_000);
        assert_eq!(record.observed_time_unix_nano, 1_800_000_000_003_000_000);
        assert_eq!(record.severity_number, SeverityNumber::Warn as i32);
        assert_eq!(record.event_name, "plegd.ContainerDied");
        let Some(Value::StringValue(body)) = record.body.and_then(|b| b.value) else {
            panic!("no text body");
        };
        assert!(
            body.starts_with("ContainerDied shop/web-7f9 app 3f2a9c via ebpf+containerd"),
            "{body}"
        );
        assert!(
            body.ends_with("exit=137 reason=OOMKilled confirmed_by=task"),
            "{body}"
        );
    }

    #[test]
    fn an_oom_kills_account_names_its_limit_and_its_victim() {
        use crate::pleg::{Observation, ObservationKind, OomKill, OomScope};
        let kill = OomKill {
            scope: OomScope::Pod,
            cgroup: Some("/kubepods/besteffort/pod0c1d-uid".into()),
            limit_bytes: Some(48 << 20),
            victim_pid: 4242,
            victim_comm: "dd".into(),
            victim_init: true,
        };
        let event = PodLifecycleEvent {
            observations: vec![Observation {
                source: Source::Ebpf,
                kind: ObservationKind::OomKill(std::sync::Arc::new(kill)),
            }],
            ..died()
        };
        let record = record(&event, 7);
        let flat = flat(&record);
        let from = flat
            .iter()
            .position(|a| a.starts_with("plegd.oom."))
            .unwrap();
        assert_eq!(
            flat[from..],
            [
                "plegd.oom.scope=pod",
                "plegd.oom.cgroup=/kubepods/besteffort/pod0c1d-uid",
                "plegd.oom.memory.limit=50331648",
                "process.pid=4242",
                "process.executable.name=dd",
                "plegd.oom.victim.init=Some(BoolValue(true))",
            ]
        );
        let Some(Value::StringValue(body)) = record.body.and_then(|b| b.value) else {
            panic!("no text body");
        };
        assert!(
            body.ends_with(
                "ebpf:oom_scope=pod(/kubepods/besteffort/pod0c1d-uid,limit=50331648,victim=4242/dd,init)"
            ),
            "{body}"
        );
    }

    #[test]
    fn a_sandbox_start_says_only_what_it_knows() {
        let started = PodLifecycleEvent {
            event_type: PodLifecycleEventType::ContainerStarted,
            container_name: String::new(),
            exit_code: None,
            reason: String::new(),
            confirmed_by: Some(Store::Cri),
            signal: None,
            image: String::new(),
            sources: vec![Source::Relist],
            pod_labels: BTreeMap::new(),
            ..died()
        };
        let record = record(&started, 7);
        assert_eq!(
            flat(&record),
            [
                "k8s.namespace.name=shop",
                "k8s.pod.name=web-7f9",
                "k8s.pod.uid=0c1d-uid",
                "container.id=3f2a9c",
                "plegd.event.type=ContainerStarted",
                "plegd.run_id=7",
                "plegd.confirmed_by=cri",
                "plegd.sequence=42",
                "plegd.sources=relist",
            ]
        );
        assert_eq!(record.severity_number, SeverityNumber::Info as i32);
    }

    #[test]
    fn a_clean_exit_is_no_warning() {
        let exited = PodLifecycleEvent {
            exit_code: Some(0),
            reason: "Completed".into(),
            ..died()
        };
        assert_eq!(
            record(&exited, 1).severity_number,
            SeverityNumber::Info as i32
        );
    }

    #[test]
    fn image_references_split_into_name_and_tag() {
        let cases = [
            ("busybox", ("busybox", None)),
            ("busybox:1.36", ("busybox", Some("1.36"))),
            (
                "docker.io/library/busybox:latest",
                ("docker.io/library/busybox", Some("latest")),
            ),
            ("registry:5000/app", ("registry:5000/app", None)),
            ("registry:5000/app:v2", ("registry:5000/app", Some("v2"))),
            ("app@sha256:00ff", ("app", None)),
            ("app:v1@sha256:00ff", ("app", Some("v1"))),
            ("app:", ("app", None)),
            ("", ("", None)),
        ];
        for (image, want) in cases {
            assert_eq!(image_name_and_tag(image), want, "{image}");
        }
    }

    #[test]
    fn one_request_holds_the_records_under_plegds_resource() {
        let origin = Origin::new("node-1");
        let request = origin.request(vec![record(&died(), 7), record(&died(), 7)]);
        let [resource_logs] = request.resource_logs.as_slice() else {
            panic!("one resource");
        };
        let resource = resource_logs.resource.as_ref().unwrap();
        let keys: Vec<&str> = resource
            .attributes
            .iter()
            .map(|kv| kv.key.as_str())
            .collect();
        assert_eq!(keys, ["service.name", "service.version", "host.name"]);
        assert_eq!(resource_logs.scope_logs[0].log_records.len(), 2);
        assert_eq!(
            resource_logs.scope_logs[0].scope.as_ref().unwrap().name,
            "plegd"
        );
    }
}
