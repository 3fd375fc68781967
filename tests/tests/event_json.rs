//! What a consumer of `plegd watch --output json` gets, against the real containerd: each
//! event type made to happen, its identity fields filled (image, attempt, the kernel's cgroup
//! and the init's host pid, the pod labels and annotations `--pod-labels` and
//! `--pod-annotations` keep), and docs/consuming.md's example of each type showing exactly
//! the fields a real line has.

mod support;

use std::{collections::BTreeSet, time::Duration};

use k8s_cri::v1::ContainerState;
use plegd::{
    config::Mode,
    pleg::Source,
    runtime::{Keys, PodMetadata},
};
use plegd_tests::{
    Node,
    cri::{ContainerSpec, Cri, PidMode},
    native::Native,
};
use serde_json::Value;
use support::{RunningPlegd, SLOW, WatchLines, push_config};

const DEADLINE: Duration = Duration::from_secs(30);

/// The JSON examples of docs/consuming.md, each a ```json block.
fn documented() -> Vec<Value> {
    let page = include_str!("../../docs/consuming.md");
    page.split("```json\n")
        .skip(1)
        .map(|block| {
            let json = block.split("\n```").next().unwrap_or_default();
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"))
        })
        .collect()
}

fn keys(line: &Value) -> BTreeSet<&str> {
    line.as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_event_type_has_the_fields_consuming_md_shows() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let mut config = push_config(
        &containerd,
        &[Source::Ebpf, Source::Containerd],
        Mode::Auto,
        SLOW,
    );
    config.emit_changed = true;
    config.pod_metadata = PodMetadata {
        labels: Keys::from_list(&["app".to_owned()]),
        annotations: Keys::All,
        ..PodMetadata::default()
    };
    let (plegd, api) = RunningPlegd::start_serving_api(config).await;
    plegd.wait_sources_connected(2, DEADLINE).await;
    let mut watch = WatchLines::spawn(&api.socket, &["--from", "1", "--kernel-observations"]);

    let lines = lifecycle(&mut watch, &cri, &tasks).await;
    // app's, or (a created container's ContainerChanged) pending's; a kernel observation of
    // either.
    let of = |kind: &str| {
        lines
            .iter()
            .find(|l| {
                l["type"] == kind
                    && (l["container_name"] == "app" || kind == "ContainerChanged")
                    && l["container_name"] != ""
            })
            .unwrap_or_else(|| panic!("no {kind} among {lines:#?}"))
    };

    let started = of("ContainerStarted");
    assert!(
        started["image"]
            .as_str()
            .is_some_and(|i| i.contains("busybox")),
        "{started}"
    );
    assert_eq!(started["attempt"], 0);
    // The task service's `/tasks/start` confirms a start; the CRI store, where it showed the
    // container running by the time plegd first read it (it is read for who it is).
    assert!(
        matches!(started["confirmed_by"].as_str(), Some("task" | "cri")),
        "{started}"
    );
    assert_eq!(
        started["pod_labels"],
        serde_json::json!({"app": "web"}),
        "only the labels --pod-labels names: {started}"
    );
    assert_eq!(
        started["pod_annotations"]["example.com/owner"], "alice",
        "{started}"
    );
    let died = of("ContainerDied");
    assert_eq!(
        (&died["exit_code"], &died["reason"], &died["signal"]),
        (&Value::from(137), &Value::from("Error"), &Value::from(9)),
        "{died}"
    );
    assert_eq!(died["confirmed_by"], "task", "{died}");
    for field in ["cgroup_id", "cgroup_path", "init_pid"] {
        assert!(!died[field].is_null(), "{field} unknown: {died}");
    }
    assert_eq!(of("ContainerRemoved")["reason"], "Error");
    assert_eq!(
        of("ContainerChanged")["reason"],
        "",
        "news of a created container"
    );
    assert_eq!(of("KernelObservation")["sequence"], 0);

    let examples = documented();
    let mut shown = BTreeSet::new();
    for example in &examples {
        let kind = example["type"].as_str().expect("an example has a type");
        assert!(shown.insert(kind), "two examples of {kind}");
        assert_eq!(
            keys(example),
            keys(of(kind)),
            "docs/consuming.md's {kind} and a real one: {}",
            of(kind)
        );
    }
    // Only this pod's: the kernel's probes see every container on the machine, and a test
    // binary beside this one has containers this runtime does not (their hints end
    // unconfirmed).
    let pod_uid = &started["pod_uid"];
    let ours: BTreeSet<&str> = lines
        .iter()
        .filter(|l| &l["pod_uid"] == pod_uid)
        .filter_map(|l| l["container_id"].as_str())
        .collect();
    let made: BTreeSet<&str> = lines
        .iter()
        .filter(|l| {
            &l["pod_uid"] == pod_uid
                || l["container_id"]
                    .as_str()
                    .is_some_and(|id| ours.contains(id))
        })
        .filter_map(|l| l["type"].as_str())
        .collect();
    let others: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"].as_str().is_some_and(|t| !shown.contains(t)))
        .collect();
    assert_eq!(
        shown, made,
        "an example of each type, none of another; the others: {others:#?}"
    );
    drop(watch);
    plegd.stop().await;
    api.stopped();
}

/// A pod with labels and an annotation; its container app started, a second one created and
/// never started, app's init killed and app removed. Every line `watch` printed, until the
/// removal.
async fn lifecycle(watch: &mut WatchLines, cri: &Cri, tasks: &Native) -> Vec<Value> {
    let pod = cri
        .run_pod_with("web", PidMode::Container, |config| {
            for (key, value) in [("app", "web"), ("team", "core")] {
                config.labels.insert(key.into(), value.into());
            }
            config
                .annotations
                .insert("example.com/owner".into(), "alice".into());
        })
        .await
        .unwrap();
    let mut lines = Vec::new();
    let app = cri
        .run_container(&pod, &ContainerSpec::sleeper("app"))
        .await
        .unwrap();
    let mut read_until = async |lines: &mut Vec<Value>, kind: &str, id: &str| {
        watch
            .until(DEADLINE, |l| {
                lines.push(l.clone());
                l["type"] == kind && l["container_id"] == id
            })
            .await
    };
    // Live from here: the kernel's observations go only to watchers subscribed when they come.
    read_until(&mut lines, "ContainerStarted", &app).await;
    let pending = cri
        .create_container(&pod, &ContainerSpec::sleeper("pending"))
        .await
        .unwrap();
    read_until(&mut lines, "ContainerChanged", &pending).await;
    tasks.kill_init(&app).await.unwrap();
    read_until(&mut lines, "ContainerDied", &app).await;
    // The task service told the death; CRI refuses to remove a container it shows running.
    cri.wait_state(&app, ContainerState::ContainerExited, DEADLINE)
        .await
        .unwrap();
    cri.remove_container(&app).await.unwrap();
    read_until(&mut lines, "ContainerRemoved", &app).await;
    lines
}
