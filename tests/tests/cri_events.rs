//! CRI `GetContainerEvents` as plegd's trigger source against the real containerd the run
//! chose (`PLEGD_TEST_CONTAINERD`): 1.6 answers `Unimplemented` and plegd's health says the
//! source is unsupported; 1.7 and 2.x stream container events, which alone (no other source,
//! full relists a minute apart) bring a start, a kill -9 and a removal to plegd's events; and
//! plegd keeps reading the stream while its own event consumer stalls, so containerd goes on
//! handling exits and calls. On 2.x that matters: each subscriber has a 100-event queue whose
//! publisher waits for the reader, and a control test shows an unread subscriber stalling it.
//! Tests that need the events print why they skip on 1.6.

mod support;

use std::time::{Duration, Instant, SystemTime};

use k8s_cri::v1::ContainerState;
use plegd::{pleg::Source, sources::status::SourceState};
use plegd_tests::{
    ContainerdOptions, Node, PrivateContainerd,
    containerd::CRI_NAMESPACE,
    cri::{ContainerSpec, Cri},
    native::Native,
    process,
};
use support::{RunningPlegd, has_cri_events, skip, status_of, stream_only, wait_state};

const DEADLINE: Duration = Duration::from_secs(30);
/// Containers of a storm: each brings created, started, stopped and deleted events, together
/// well over containerd 2.x's 100-event queue per subscriber (with 2.1.9, an unread subscriber
/// stalls the first removal).
const STORM_CONTAINERS: usize = 50;
/// How long one step of a storm may take before it counts as stalled.
const STALL: Duration = Duration::from_secs(10);
/// plegd's output room in the stalled-consumer test: less than one event line, so its output
/// writer blocks on the first event.
const STALLED_OUTPUT: usize = 64;

async fn start() -> PrivateContainerd {
    PrivateContainerd::start(&ContainerdOptions::unique())
        .await
        .expect("private containerd starts")
}

/// A daemon with only the CRI events source, once the source is connected.
async fn cri_events_only(containerd: &PrivateContainerd) -> RunningPlegd {
    let plegd = RunningPlegd::start(stream_only(&containerd.socket(), Source::CriEvents)).await;
    wait_connected(&plegd).await;
    plegd
}

async fn wait_connected(plegd: &RunningPlegd) {
    wait_state(&plegd.shared.sources, Source::CriEvents, |s| {
        s.state == SourceState::Connected
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_whether_the_runtime_streams_cri_events() {
    let containerd = start().await;
    let plegd = RunningPlegd::start(stream_only(&containerd.socket(), Source::CriEvents)).await;
    let sources = &plegd.shared.sources;
    if containerd.version().has_cri_container_events() {
        wait_state(sources, Source::CriEvents, |s| {
            s.state == SourceState::Connected
        })
        .await;
        assert!(sources.any_connected());
    } else {
        // containerd 1.6.
        let status = wait_state(sources, Source::CriEvents, |s| {
            s.state == SourceState::Unsupported
        })
        .await;
        assert!(status.detail.contains("Unimplemented"), "{status:?}");
        assert!(!sources.any_connected());
    }
    assert_eq!(
        status_of(sources, Source::Containerd).unwrap().state,
        SourceState::Disabled
    );
    plegd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_kill_and_removal_are_triggered_by_cri_events_alone() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    if !has_cri_events(
        &containerd,
        "start_kill_and_removal_are_triggered_by_cri_events_alone",
    ) {
        return;
    }
    let mut plegd = cri_events_only(&containerd).await;
    let pod = cri.run_pod("cri-events").await.unwrap();
    let id = cri
        .run_container(&pod, &ContainerSpec::sleeper("app"))
        .await
        .unwrap();
    // No relist is due for a minute: only the stream can bring these in time.
    plegd
        .wait_container(&id, &["ContainerStarted"], Duration::from_secs(5))
        .await;
    assert_eq!(
        plegd.last_of(&id)["sources"],
        serde_json::json!(["cri-events"])
    );

    let pid = tasks.init_pid(&id).await.unwrap();
    let killed_at = Instant::now();
    process::kill_all(&[pid], DEADLINE);
    plegd
        .wait_container(
            &id,
            &["ContainerStarted", "ContainerDied"],
            Duration::from_secs(5),
        )
        .await;
    let took = killed_at.elapsed();
    let died = plegd.last_of(&id).clone();
    assert_eq!(died["sources"], serde_json::json!(["cri-events"]), "{died}");
    assert_eq!(died["exit_code"], 137, "{died}");
    assert!(
        died["observations"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("cri-events:exit_code=137")),
        "{died}"
    );
    eprintln!(
        "containerd {}: kill -9 to ContainerDied through CRI events: {took:?} (latency_ms {})",
        containerd.version(),
        died["latency_ms"]
    );

    cri.remove_container(&id).await.unwrap();
    plegd
        .wait_container(
            &id,
            &["ContainerStarted", "ContainerDied", "ContainerRemoved"],
            Duration::from_secs(5),
        )
        .await;
    assert_eq!(
        plegd.last_of(&id)["sources"],
        serde_json::json!(["cri-events"])
    );
    assert!(
        status_of(&plegd.shared.sources, Source::CriEvents)
            .unwrap()
            .last_delivered
            .is_some()
    );
    plegd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_event_consumer_does_not_stall_containerd() {
    let containerd = start().await;
    if !has_cri_events(
        &containerd,
        "a_stalled_event_consumer_does_not_stall_containerd",
    ) {
        return;
    }
    // Nobody reads this daemon's output: it blocks on its first event line, and the channels
    // behind it (a one-event capacity) fill at once.
    let mut settings = stream_only(&containerd.socket(), Source::CriEvents);
    settings.event_channel_capacity = 1;
    let plegd = RunningPlegd::start_with_output_buffer(settings, STALLED_OUTPUT).await;
    wait_connected(&plegd).await;

    let killed_at = storm(&containerd)
        .await
        .unwrap_or_else(|e| panic!("containerd stalled: {e}"));
    let status = status_of(&plegd.shared.sources, Source::CriEvents).unwrap();
    assert_eq!(status.state, SourceState::Connected, "{status:?}");
    assert!(
        status.last_delivered.is_some_and(|at| at >= killed_at),
        "the source delivered nothing after the kills: {status:?}"
    );
    plegd.stop().await;
}

/// [`STORM_CONTAINERS`] containers started, killed with SIGKILL, seen EXITED through CRI and
/// removed; returns when the kills were sent. Every step publishes a CRI event to every
/// subscriber: on 2.x a subscriber whose queue is full stalls the publisher, which for an exit
/// is the container's exit handler (after its status update, so EXITED may still show) and for
/// a call the call itself. Any one step taking [`STALL`] is a stall (they take well under a
/// second, even on a busy machine); the error says which.
async fn storm(containerd: &PrivateContainerd) -> Result<SystemTime, String> {
    async fn step<T>(
        what: String,
        call: impl Future<Output = anyhow::Result<T>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(STALL, call).await {
            Ok(result) => Ok(result.unwrap_or_else(|e| panic!("{what}: {e:#}"))),
            Err(_) => Err(format!("stuck {STALL:?} {what}")),
        }
    }
    let cri = Cri::connect(containerd).await.unwrap();
    let tasks = Native::connect_in(containerd, CRI_NAMESPACE).await.unwrap();
    let pod = step("running the pod".into(), cri.run_pod("storm")).await?;
    let mut ids = Vec::new();
    for i in 0..STORM_CONTAINERS {
        let spec = ContainerSpec::sleeper(&format!("c{i}"));
        ids.push(
            step(
                format!("creating container {i}"),
                cri.run_container(&pod, &spec),
            )
            .await?,
        );
    }
    let mut pids = Vec::new();
    for id in &ids {
        pids.push(tasks.init_pid(id).await.unwrap());
    }
    let killed_at = SystemTime::now();
    process::kill_all(&pids, DEADLINE);
    for (i, id) in ids.iter().enumerate() {
        step(
            format!("waiting for container {i} to be EXITED in CRI"),
            cri.wait_state(id, ContainerState::ContainerExited, DEADLINE),
        )
        .await?;
    }
    for (i, id) in ids.iter().enumerate() {
        step(format!("removing container {i}"), cri.remove_container(id)).await?;
    }
    Ok(killed_at)
}

/// The control of [`a_stalled_event_consumer_does_not_stall_containerd`]: the same storm with
/// a subscriber that never reads does stall containerd 2.x. If a later 2.x stops blocking
/// here, this fails and the stalled-consumer test no longer proves anything on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_an_unread_cri_events_subscriber_stalls_containerd_2() {
    let containerd = start().await;
    if containerd.version().major < 2 {
        skip(
            "control_an_unread_cri_events_subscriber_stalls_containerd_2",
            &format!(
                "only containerd 2.x has a per-subscriber CRI events queue that blocks, this is \
                 {} (1.7 has one shared queue that drops)",
                containerd.version()
            ),
        );
        return;
    }
    let endpoint = tonic::transport::Endpoint::from_static("http://cri.local")
        .initial_stream_window_size(Some(256));
    let channel = plegd_tests::unix_channel_with(&containerd.socket(), endpoint)
        .await
        .unwrap();
    let mut client = k8s_cri::v1::runtime_service_client::RuntimeServiceClient::new(channel);
    // containerd answers the call with its first event: hold the stream, never read it. Its
    // HTTP/2 window of 256 bytes leaves containerd no room to send ahead.
    let unread = tokio::spawn(async move {
        let _stream = client
            .get_container_events(k8s_cri::v1::GetEventsRequest {})
            .await;
        std::future::pending::<()>().await;
    });
    let result = storm(&containerd).await;
    unread.abort();
    eprintln!("storm with an unread subscriber: {result:?}");
    assert!(
        result.is_err(),
        "containerd {} handled the storm with an unread CRI events subscriber",
        containerd.version()
    );
}
