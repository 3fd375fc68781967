//! Pod syncs (plegd.v1 `SyncPods`, `plegd watch --pod-syncs`): against the real containerd,
//! a real pod's whole status as it changes, its resyncs, its one `removed` sync, and the CLI's
//! JSON lines; against the fake runtime, through the API's socket, a watcher that stops
//! reading during a burst and then gets fewer, newer syncs.

mod support;

use std::time::Duration;

use plegd::{
    api::Listeners,
    config::{Config, RunArgs},
    daemon::{Daemon, PushSources},
    pleg::{ContainerState, Source},
    runtime::{
        RuntimeKind,
        testing::{FakeRuntime, container as fake_container},
    },
};
use plegd_proto::v1::{self as pb, pleg_client::PlegClient};
use plegd_tests::{Node, cri::ContainerSpec};
use support::{RunningPlegd, ServedApi, WatchLines, config};
use tokio_util::sync::CancellationToken;
use tonic::{
    Streaming,
    transport::{Channel, Endpoint},
};

const DEADLINE: Duration = Duration::from_secs(30);
const PERIOD: Duration = Duration::from_millis(100);
/// Resyncs this often, so that a test sees several.
const SYNC_FREQUENCY: Duration = Duration::from_secs(1);

async fn start(containerd: &plegd_tests::PrivateContainerd) -> (RunningPlegd, ServedApi) {
    let mut settings = config(RuntimeKind::Cri, &containerd.socket(), PERIOD);
    settings.sync_frequency = SYNC_FREQUENCY;
    RunningPlegd::start_serving_api(settings).await
}

async fn sync_pods(client: &mut PlegClient<Channel>, initial: bool) -> Streaming<pb::PodSync> {
    client
        .sync_pods(pb::SyncPodsRequest {
            initial,
            ..pb::SyncPodsRequest::default()
        })
        .await
        .expect("SyncPods starts")
        .into_inner()
}

/// Reads syncs until one satisfies `done`; returns all read.
async fn read_until(
    stream: &mut Streaming<pb::PodSync>,
    what: &str,
    mut done: impl FnMut(&pb::PodSync) -> bool,
) -> Vec<pb::PodSync> {
    let mut read = Vec::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let sync = tokio::time::timeout_at(deadline, stream.message())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}; read {read:#?}"))
            .expect("stream alive")
            .expect("stream open");
        let last = done(&sync);
        read.push(sync);
        if last {
            return read;
        }
    }
}

/// The named container of a sync's status.
fn container<'a>(sync: &'a pb::PodSync, name: &str) -> Option<&'a pb::ContainerStatus> {
    sync.status
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == name)
}

/// A pod whose container exits with 3: its syncs carry the whole status (sandbox and
/// container, exit code, reason, confirmed_by, times) and the sequence of one of its events;
/// it is resynced while it stays; once removed it gets one `removed` sync and no more, while
/// another pod's resyncs go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_pods_syncs_carry_its_status_then_one_removed_sync() {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let (plegd, api) = start(&containerd).await;
    let mut client = api.client().await;
    let mut events = client
        .watch(pb::WatchRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut syncs = sync_pods(&mut client, false).await;

    let pod = cri.run_pod("synced").await.unwrap();
    let app = cri
        .run_container(&pod, &ContainerSpec::exiting("app", 3))
        .await
        .unwrap();
    let read = read_until(&mut syncs, "app exited 3", |s| {
        container(s, "app").is_some_and(|c| c.state() == pb::ContainerState::Exited)
    })
    .await;
    let exited = read.last().unwrap();
    assert_eq!(
        (exited.pod_uid.as_str(), exited.pod_name.as_str()),
        (pod.uid.as_str(), "synced")
    );
    assert_eq!(exited.reason(), pb::SyncReason::Event);
    let status = exited.status.as_ref().unwrap();
    assert!(status.timestamp.is_some());
    let c = container(exited, "app").unwrap();
    assert_eq!(c.id, app);
    assert!(c.has_exit_code);
    assert_eq!(c.exit_code, 3);
    assert_ne!(c.confirmed_by(), pb::Layer::Unspecified);
    assert!(c.started_at.is_some() && c.finished_at.is_some(), "{c:?}");
    let sandbox = status.containers.iter().find(|c| c.sandbox).unwrap();
    assert_eq!(sandbox.state(), pb::ContainerState::Running);
    // The sequence is one of the pod's events.
    let mut seen = Vec::new();
    while seen
        .last()
        .is_none_or(|e: &pb::Event| e.sequence < exited.sequence)
    {
        let event = tokio::time::timeout(DEADLINE, events.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push(event);
    }
    let reflected = seen.last().unwrap();
    assert_eq!(
        (reflected.sequence, reflected.pod_uid.as_str()),
        (exited.sequence, pod.uid.as_str())
    );

    // It stays: resyncs come, each the same level (the reason may have come since: the CRI
    // store catches up with the task service without an event).
    let resynced = read_until(&mut syncs, "a resync of the pod", |s| {
        s.pod_uid == pod.uid && s.reason() == pb::SyncReason::Resync
    })
    .await;
    let again = container(resynced.last().unwrap(), "app").unwrap();
    assert_eq!(
        (again.id.as_str(), again.state(), again.exit_code),
        (app.as_str(), pb::ContainerState::Exited, 3)
    );

    // Another pod, whose resyncs keep coming after the first one is gone.
    let other = cri.run_pod("stays").await.unwrap();
    cri.remove_pod(&pod).await.unwrap();
    let mut read = read_until(&mut syncs, "the removed sync", |s| {
        s.pod_uid == pod.uid && s.reason() == pb::SyncReason::Removed
    })
    .await;
    let removed = read.last().unwrap().clone();
    assert!(removed.status.is_none());
    assert_eq!(removed.pod_name, "synced");
    // Three of the other pod's resyncs (> 2 s: housekeeping ran since) and nothing more of
    // the removed one.
    let mut resyncs = 0;
    read.extend(
        read_until(&mut syncs, "three resyncs of the other pod", |s| {
            resyncs += usize::from(s.pod_uid == other.uid && s.reason() == pb::SyncReason::Resync);
            resyncs == 3
        })
        .await,
    );
    let after: Vec<_> = read
        .iter()
        .skip_while(|s| s.reason() != pb::SyncReason::Removed)
        .skip(1)
        .filter(|s| s.pod_uid == pod.uid)
        .collect();
    assert!(after.is_empty(), "syncs after removed: {after:#?}");
    let metrics = plegd.metrics();
    assert!(metrics["plegd_pod_syncs_total{reason=\"removed\"}"] >= 1.0);
    assert!(metrics["plegd_event_to_sync_seconds_count"] >= 1.0);
    plegd.stop().await;
    api.stopped();
}

/// `plegd watch --pod-syncs --initial --output json` prints one line per sync, the first the
/// initial resync of a pod that was already there, then its changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plegd_watch_pod_syncs_prints_json_lines() {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let (plegd, api) = start(&containerd).await;
    let pod = cri.run_pod("listed").await.unwrap();
    // In the cache before the watcher starts.
    let mut client = api.client().await;
    let mut syncs = sync_pods(&mut client, false).await;
    read_until(&mut syncs, "the pod cached", |s| s.pod_uid == pod.uid).await;

    let mut lines = WatchLines::spawn(&api.socket, &["--pod-syncs", "--initial"]);
    let first = lines.next(DEADLINE).await;
    assert_eq!(first["reason"], "resync", "{first}");
    assert_eq!(first["pod_uid"].as_str(), Some(pod.uid.as_str()));
    assert_eq!(
        first["status"]["containers"][0]["state"], "running",
        "{first}"
    );
    assert_eq!(first["status"]["containers"][0]["sandbox"], true);

    cri.remove_pod(&pod).await.unwrap();
    let removed = lines
        .until(DEADLINE, |line| line["reason"] == "removed")
        .await;
    assert_eq!(removed["pod_name"], "listed");
    assert!(removed["status"].is_null(), "{removed}");
    assert!(removed["sequence"].as_u64() > Some(0), "{removed}");
    plegd.stop().await;
    api.stopped();
}

/// A burst of `PODS * ROUNDS` events (every pod's container flips between running and exited,
/// each flip seen by an event watcher) while one sync watcher does not read (a 256-byte
/// HTTP/2 window: plegd sends it nothing more after a sync or two) and another reads along.
/// Once it reads again, the stalled one gets a few syncs per pod, each pod's last one its
/// final state, far fewer than the events; it was never ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_watcher_that_stops_reading_gets_fewer_newer_syncs() {
    const PODS: usize = 20;
    /// Odd: the last round leaves every container exited with code ROUNDS.
    const ROUNDS: usize = 21;
    let dir = tempfile::tempdir().unwrap();
    let config = Config::load(&RunArgs {
        runtime_endpoint: Some("unused".into()),
        sources: Some(vec![Source::Relist]),
        relist_period: Some(Duration::from_millis(10)),
        state_dir: Some("none".into()),
        socket: Some(dir.path().join("plegd.sock")),
        ..RunArgs::default()
    })
    .unwrap();
    let runtime = FakeRuntime::new();
    let pod = |p: usize| format!("p{p}");
    for p in 0..PODS {
        runtime.add_pod(&pod(p), "burst", &pod(p));
        runtime.set_container(
            &pod(p),
            fake_container(&format!("c{p}"), "app", ContainerState::Running),
        );
    }
    let listeners = Listeners::bind(&config).unwrap();
    let shutdown = CancellationToken::new();
    let daemon = Daemon::start(
        runtime.clone(),
        PushSources::none(),
        Some(listeners),
        &config,
        tokio::io::sink(),
        (),
    )
    .unwrap();
    let daemon = tokio::spawn(daemon.run(shutdown.clone()));
    let client = async |window: Option<u32>| {
        let endpoint =
            Endpoint::from_static("http://plegd.local").initial_stream_window_size(window);
        PlegClient::new(
            plegd_tests::unix_channel_with(&config.socket, endpoint)
                .await
                .unwrap(),
        )
    };
    let mut events = client(None)
        .await
        .watch(pb::WatchRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut stalled = sync_pods(&mut client(Some(256)).await, true).await;
    let mut fast = sync_pods(&mut client(None).await, true).await;
    // The fast watcher reads along, counting what it gets per pod.
    let reading = tokio::spawn(async move {
        let mut got = std::collections::HashMap::<String, usize>::new();
        while let Ok(Some(sync)) = fast.message().await {
            *got.entry(sync.pod_uid).or_default() += 1;
        }
        got
    });

    // Each round flips every pod and waits for its events: each flip is an event.
    let mut burst = 0;
    for round in 1..=ROUNDS {
        let (state, code) = if round % 2 == 1 {
            (ContainerState::Exited, Some(round as i32))
        } else {
            (ContainerState::Running, None)
        };
        for p in 0..PODS {
            runtime.set_state(&pod(p), &format!("c{p}"), state, code);
        }
        let want = if round % 2 == 1 {
            pb::EventType::ContainerDied
        } else {
            pb::EventType::ContainerStarted
        };
        let mut flipped = 0;
        while flipped < PODS {
            let event = tokio::time::timeout(DEADLINE, events.message())
                .await
                .expect("the round's events in time")
                .unwrap()
                .unwrap();
            flipped += usize::from(event.r#type() == want);
        }
        burst += flipped;
    }
    let mut got = std::collections::HashMap::<String, Vec<pb::PodSync>>::new();
    let settled = |got: &std::collections::HashMap<String, Vec<pb::PodSync>>| {
        (0..PODS).all(|p| {
            got.get(&pod(p))
                .and_then(|syncs| syncs.last())
                .and_then(|s| container(s, "app"))
                .is_some_and(|c| {
                    c.state() == pb::ContainerState::Exited && c.exit_code == ROUNDS as i32
                })
                && got[&pod(p)].last().unwrap().sequence > 0
        })
    };
    let mut read = 0;
    while !settled(&got) {
        let sync = tokio::time::timeout(DEADLINE, stalled.message())
            .await
            .unwrap_or_else(|_| panic!("the stalled watcher's syncs in time; read {read}"))
            .expect("never ended as lagged")
            .unwrap();
        read += 1;
        got.entry(sync.pod_uid.clone()).or_default().push(sync);
    }
    shutdown.cancel();
    daemon.await.unwrap().unwrap();
    let fast: usize = reading.await.unwrap().values().sum();
    eprintln!(
        "burst of {burst} events on {PODS} pods: the stalled watcher read {read} syncs, the \
         fast one {fast}"
    );
    assert!(read < burst / 4, "{read} syncs for {burst} events");
    for (p, syncs) in &got {
        assert!(syncs.len() <= 3, "{p}: {syncs:#?}");
    }
    assert!(
        fast > read,
        "the fast watcher got {fast}, the stalled one {read}"
    );
}
