//! What tenants and exports hand plegd (issue 53, items 6 and 7): a pod's annotations as large
//! as Kubernetes allows, an OTLP receiver that refuses everything, a stdout nobody reads at
//! SIGTERM. Each case but the last ends with [`Target::assert_held`]; those with a history
//! also check that the memory came back ([`came_back`]).

use std::{
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_cri::v1::ContainerState;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use plegd::runtime::{DEFAULT_POD_METADATA_MAX_BYTES, TRUNCATED_KEY};
use plegd_proto::v1::{self as pb, pleg_client::PlegClient};
use plegd_tests::{
    Node,
    bench::{Plegd, metric_at},
    cri::{ContainerSpec, Cri, PidMode, Pod},
    hostile::{Rss, Target},
    native::Native,
    otlp::Receiver,
    process::{is_alive, plegd_binary},
    wait,
};

const DEADLINE: Duration = Duration::from_secs(90);

/// Annotations of the tenant: 60 of 4,000 bytes, 240 KB (Kubernetes allows 256 KiB).
const ANNOTATIONS: usize = 60;
const ANNOTATION_BYTES: usize = 4_000;
/// Container lifecycles of the tenant, as in the issue.
const LIFECYCLES: usize = 64;

/// A pod carrying the tenant's annotations.
async fn tenant_pod(cri: &Cri, name: &str) -> Pod {
    cri.run_pod_with(name, PidMode::Container, |config| {
        for i in 0..ANNOTATIONS {
            config.annotations.insert(
                format!("tenant.example/a{i:02}"),
                "x".repeat(ANNOTATION_BYTES),
            );
        }
    })
    .await
    .unwrap()
}

/// `count` containers in `pod`, one after the other: started, killed, removed.
async fn lifecycles(cri: &Cri, tasks: &Native, pod: &Pod, count: usize) {
    for i in 0..count {
        let id = cri
            .run_container(pod, &ContainerSpec::sleeper(&format!("{}-{i}", pod.name)))
            .await
            .unwrap();
        cri.wait_state(&id, ContainerState::ContainerRunning, DEADLINE)
            .await
            .unwrap();
        tasks.kill_init(&id).await.unwrap();
        cri.wait_state(&id, ContainerState::ContainerExited, DEADLINE)
            .await
            .unwrap();
        cri.remove_container(&id).await.unwrap();
    }
}

/// Memory came back after the input: RSS within twice what it was before, plus what the
/// history legitimately holds (`history` bytes).
fn came_back(what: &str, rss: &Rss, history: u64) {
    assert!(
        rss.after <= 2 * rss.before + history,
        "{what}: {rss}; the history holds about {} MiB",
        history >> 20
    );
}

/// The first event of pod `name` a watcher from the first sequence gets.
async fn first_event_of(target: &Target, name: &str) -> pb::Event {
    let channel = plegd_tests::unix_channel(target.socket()).await.unwrap();
    let request = pb::WatchRequest {
        from_sequence: 1,
        ..Default::default()
    };
    let mut events = PlegClient::new(channel)
        .watch(request)
        .await
        .unwrap()
        .into_inner();
    let found = async {
        while let Some(event) = events.message().await.unwrap() {
            if event.pod_name == name {
                return event;
            }
        }
        panic!("the stream ended before an event of {name}")
    };
    tokio::time::timeout(DEADLINE, found)
        .await
        .expect("an event of the pod")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_annotations_cost_at_most_the_budget_per_event() {
    let target = Target::start(&["--pod-annotations", "*"]).await.unwrap();
    let (cri, tasks) = (&target.node.cri, &target.node.tasks);
    let rss = target
        .assert_held(
            &format!(
                "a pod with {ANNOTATIONS} annotations of {ANNOTATION_BYTES} bytes, \
                 {LIFECYCLES} lifecycles"
            ),
            async {
                let pod = tenant_pod(cri, "tenant").await;
                lifecycles(cri, tasks, &pod, LIFECYCLES).await;
                anyhow::Ok(pod)
            },
        )
        .await
        .unwrap();

    let event = first_event_of(&target, "tenant").await;
    let carried: usize = event
        .pod_labels
        .iter()
        .chain(&event.pod_annotations)
        .filter(|(key, _)| *key != TRUNCATED_KEY)
        .map(|(key, value)| key.len() + value.len())
        .sum();
    assert!(
        carried <= DEFAULT_POD_METADATA_MAX_BYTES,
        "{carried} bytes of labels and annotations"
    );
    let marker = &event.pod_annotations[TRUNCATED_KEY];
    assert!(
        marker.ends_with("left out: over pod-metadata-max-bytes (16384)"),
        "{marker}"
    );
    assert!(metric_at(target.metrics(), "plegd_pod_metadata_truncated_total").unwrap() > 0.0);
    // Three events a lifecycle and the sandbox's start, each with 16 KiB of annotations.
    let history = (3 * LIFECYCLES as u64 + 1) * (20 << 10);
    came_back("the tenant's annotations", &rss, history);
}

/// Waits until plegd at `metrics` counts the events up to `last` as refused by the receiver.
async fn all_refused(metrics: std::net::SocketAddr, last: u64) {
    wait::until(&format!("events 1..={last} refused"), DEADLINE, || {
        let refused = metric_at(metrics, "plegd_otlp_refused_total");
        async move { anyhow::Ok(refused.ok().filter(|r| *r >= last as f64).map(drop)) }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_refuses_every_batch_costs_each_event_one_call() {
    let receiver = Receiver::start_rejecting().await.unwrap();
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let target = Target::start(&["--otlp-endpoint", &endpoint])
        .await
        .unwrap();
    let (cri, tasks) = (&target.node.cri, &target.node.tasks);
    let metrics = target.metrics();
    let rss = target
        .assert_held("an OTLP receiver answering INVALID_ARGUMENT", async {
            let pod = cri.run_pod("refused").await?;
            lifecycles(cri, tasks, &pod, 10).await;
            all_refused(metrics, target.plegd.last_sequence()?).await;
            anyhow::Ok(pod)
        })
        .await
        .unwrap();
    // The check's own kill came after: its events are refused too, each once.
    let last = target.plegd.last_sequence().unwrap();
    all_refused(metrics, last).await;
    let calls = receiver.records();
    let sent: u64 = calls.iter().filter_map(|c| c["rejected"].as_u64()).sum();
    println!(
        "refusing receiver: {last} events, {} calls carrying {sent} records",
        calls.len()
    );
    assert_eq!(sent, last, "each event sent once, never retried");
    assert_eq!(
        metric_at(metrics, "plegd_otlp_export_failures_total").unwrap(),
        0.0
    );
    came_back("the refusing receiver", &rss, 0);
    receiver.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_stdout_nobody_reads_exits_within_5_s() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Never read: a few of the tenant's event lines fill it.
    let (_unread, writer) = std::io::pipe().unwrap();
    let args = [
        "--pod-annotations",
        "*",
        "--state-dir",
        &dir.path().join("state").display().to_string(),
    ]
    .map(str::to_owned);
    let plegd = Plegd::start_with_stdout(
        &plegd_binary().unwrap(),
        &containerd,
        dir.path(),
        &args,
        Stdio::from(writer),
    )
    .unwrap();
    let pod = tenant_pod(&cri, "stalled").await;
    lifecycles(&cri, &tasks, &pod, 8).await;
    // A watcher that stops reading too.
    let channel = plegd_tests::unix_channel(&plegd.socket).await.unwrap();
    let stalled = PlegClient::new(channel)
        .watch(pb::WatchRequest {
            from_sequence: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    // The sandbox's start and three events per lifecycle: enough lines to fill the pipe.
    wait::until("the lifecycles' 25 events", DEADLINE, || {
        let last = plegd.last_sequence();
        async move { anyhow::Ok(last?.ge(&25).then_some(())) }
    })
    .await
    .unwrap();

    let pid = plegd.pid();
    let signalled = Instant::now();
    kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
    let exited = Arc::new(std::sync::Mutex::new(None));
    wait::until("plegd gone", Duration::from_secs(30), || {
        let gone = !is_alive(pid);
        if gone {
            exited.lock().unwrap().get_or_insert(signalled.elapsed());
        }
        async move { anyhow::Ok(gone.then_some(())) }
    })
    .await
    .unwrap();
    let took = exited.lock().unwrap().unwrap();
    println!("SIGTERM with stdout and a watcher stalled: exited after {took:?}");
    assert!(took < Duration::from_secs(5), "exited after {took:?}");
    drop(stalled);
    plegd.stop();
    cri.remove_pod(&pod).await.unwrap();
}
