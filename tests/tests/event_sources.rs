//! The runtime's event streams as trigger sources: containerd's `Events.Subscribe` against the
//! real private containerd (kill -9 seen long before the slow full relist, an exec's exit is
//! not the container's; a containerd crash while containers churn is soak.rs's), and the CRI
//! events source itself against an in-process CRI server whose stream breaks mid-way (the real
//! runtime's CRI events are in cri_events.rs). A containerd stream that falls silent while
//! connected (a proxy stops forwarding containerd's bytes) is found by its heartbeat.

mod support;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_cri::v1::{
    ContainerEventResponse, ContainerEventType, ContainerState, ExecSyncRequest,
    runtime_service_client::RuntimeServiceClient,
};
use plegd::{
    pleg::{
        ContainerId, PodUid, Scope, Source, Store, Trigger,
        testing::{TriggerReceiver, trigger_channel},
    },
    sources::{
        containerd_events::{self, ContainerdEventsConfig},
        cri_events::{self, CriEventsConfig},
        status::{SourceRegistry, SourceState},
    },
};
use plegd_tests::{
    Node, PrivateContainerd,
    containerd::CRI_NAMESPACE,
    cri::{ContainerSpec, Cri},
    fake_cri::{self, FakeCri, Script},
    native::Native,
    process,
    proxy::{self, MutingProxy},
    unix_channel, wait,
};
use support::{RunningPlegd, status_of, stream_only, types_of, wait_state};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;

const DEADLINE: Duration = Duration::from_secs(30);

/// A daemon with only containerd's event stream, whose full relists are a minute apart either
/// way.
async fn events_only(containerd: &PrivateContainerd) -> RunningPlegd {
    let plegd = RunningPlegd::start(stream_only(&containerd.socket(), Source::Containerd)).await;
    wait_state(&plegd.shared.sources, Source::Containerd, |s| {
        s.state == SourceState::Connected
    })
    .await;
    plegd
}

/// containerd down for long (an upgrade): by the time it answers again, the event stream's
/// reconnect backoff waits seconds, but the first relist that reads containerd brings the
/// stream back, and with it millisecond events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_is_back_within_a_relist_of_containerd_answering_again() {
    const FAST: Duration = Duration::from_secs(1);
    // About five failed attempts by then: the backoff's next wait is up to 8 or 16 s.
    const OUTAGE: Duration = Duration::from_secs(10);
    let containerd = PrivateContainerd::start(&plegd_tests::ContainerdOptions::unique())
        .await
        .unwrap();
    let mut settings = stream_only(&containerd.socket(), Source::Containerd);
    // plegd's default: relists every second while no push source is connected.
    settings.relist_period = FAST;
    let plegd = RunningPlegd::start(settings).await;
    let registry = &plegd.shared.sources;
    let up = wait_state(registry, Source::Containerd, |s| {
        s.state == SourceState::Connected
    })
    .await;

    containerd.crash_for(OUTAGE).await.unwrap();
    let answering = Instant::now();
    let lost = status_of(registry, Source::Containerd).unwrap();
    assert_eq!(lost.state, SourceState::Reconnecting, "{lost:?}");
    let back = wait_state(registry, Source::Containerd, |s| {
        s.state == SourceState::Connected && s.reconnects > up.reconnects
    })
    .await;
    let took = answering.elapsed();
    eprintln!("event stream connected {took:?} after containerd answered again: {back:?}");
    // A relist within the fast period, then the stream's probe and settle.
    assert!(
        took <= FAST * 2,
        "the stream came back {took:?} after containerd did"
    );
    plegd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_is_seen_through_containerd_events_long_before_a_relist() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let mut plegd = events_only(&containerd).await;
    let pod = cri.run_pod("evented").await.unwrap();
    let killed = cri
        .run_container(&pod, &ContainerSpec::sleeper("killed"))
        .await
        .unwrap();
    // Started through the stream too: no relist is due for a minute.
    plegd
        .wait_container(&killed, &["ContainerStarted"], Duration::from_secs(5))
        .await;
    assert_eq!(
        plegd.last_of(&killed)["sources"],
        serde_json::json!(["containerd"])
    );

    let pid = tasks.init_pid(&killed).await.unwrap();
    let killed_at = Instant::now();
    process::kill_all(&[pid], DEADLINE);
    plegd
        .wait_container(
            &killed,
            &["ContainerStarted", "ContainerDied"],
            Duration::from_secs(5),
        )
        .await;
    let took = killed_at.elapsed();
    let died = plegd.last_of(&killed).clone();
    assert!(
        died["sources"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("containerd")),
        "{died}"
    );
    assert_eq!(died["exit_code"], 137);
    assert!(
        died["observations"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("containerd:exit_code=137")),
        "{died}"
    );
    eprintln!(
        "kill -9 to ContainerDied: {took:?} (latency_ms {})",
        died["latency_ms"]
    );
    assert!(
        status_of(&plegd.shared.sources, Source::Containerd)
            .unwrap()
            .last_delivered
            .is_some()
    );
    plegd.stop().await;
}

/// Kills `count` sleepers of a fresh pod one after the other; returns, per kill, the Died
/// event as it arrived and what CRI said of the container right after it arrived.
async fn kill_and_read(
    plegd: &mut RunningPlegd,
    node: (&Cri, &Native),
    pod: &str,
    count: usize,
) -> Vec<(String, serde_json::Value, i32)> {
    let (cri, tasks) = node;
    let pod = cri.run_pod(pod).await.unwrap();
    let mut seen = Vec::new();
    for i in 0..count {
        let id = cri
            .run_container(&pod, &ContainerSpec::sleeper(&format!("k{i}")))
            .await
            .unwrap();
        plegd
            .wait_container(&id, &["ContainerStarted"], DEADLINE)
            .await;
        tasks.kill_init(&id).await.unwrap();
        plegd
            .wait_container(&id, &["ContainerStarted", "ContainerDied"], DEADLINE)
            .await;
        let cri_state = cri.container_status(&id).await.unwrap().state;
        seen.push((id.clone(), plegd.last_of(&id).clone(), cri_state));
    }
    seen
}

/// By default a death is confirmed at containerd's task record, ahead of its CRI store: the
/// event carries the task's exit code, and once the store catches up its reason reaches the
/// cache with no second event. With `--confirm cri` an event never announces what CRI does
/// not show yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deaths_are_confirmed_at_the_task_record_or_at_cri_as_configured() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let mut plegd = events_only(&containerd).await;
    let seen = kill_and_read(&mut plegd, (&cri, &tasks), "by-task", 4).await;
    for (id, died, _) in &seen {
        assert_eq!(died["exit_code"], 137, "{died}");
        // Once the store caught up, the pod is read again for the cache: CRI's reason.
        wait::until("CRI's status in the cache", DEADLINE, || async {
            let container = plegd
                .shared
                .pleg
                .cache()
                .get(&PodUid(died["pod_uid"].as_str().unwrap().to_owned()))
                .record
                .and_then(|pod| pod.containers.get(&ContainerId(id.clone())).cloned());
            Ok::<_, String>(container.filter(|c| {
                c.confirmed_by == Store::Cri && c.reason == "Error" && c.exit_code == Some(137)
            }))
        })
        .await
        .unwrap();
    }
    // CRI's store lags the task service by tens of ms: a confirmation that never beats it
    // is no task-level confirmation at all.
    let by_task = seen
        .iter()
        .filter(|(_, died, _)| died["confirmed_by"] == "task")
        .count();
    assert!(by_task > 0, "{seen:#?}");
    plegd.drain(Duration::from_millis(300)).await;
    for (id, _, _) in &seen {
        assert_eq!(
            types_of(&plegd.events, id),
            ["ContainerStarted", "ContainerDied"]
        );
    }
    plegd.stop().await;

    let mut config = stream_only(&containerd.socket(), Source::Containerd);
    config.confirm = Store::Cri;
    let mut plegd = RunningPlegd::start(config).await;
    plegd.wait_sources_connected(1, DEADLINE).await;
    for (_, died, cri_state) in kill_and_read(&mut plegd, (&cri, &tasks), "by-cri", 2).await {
        assert_eq!(died["confirmed_by"], "cri", "{died}");
        assert_eq!(died["reason"], "Error", "{died}");
        assert_eq!(cri_state, ContainerState::ContainerExited as i32, "{died}");
    }
    plegd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_exit_is_not_the_containers_death() {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let mut plegd = events_only(&containerd).await;
    let pod = cri.run_pod("exec").await.unwrap();
    let id = cri
        .run_container(&pod, &ContainerSpec::sleeper("app"))
        .await
        .unwrap();
    plegd
        .wait_container(&id, &["ContainerStarted"], DEADLINE)
        .await;

    let mut runtime = RuntimeServiceClient::new(unix_channel(&containerd.socket()).await.unwrap());
    let delivered_before = status_of(&plegd.shared.sources, Source::Containerd)
        .unwrap()
        .last_delivered;
    let exec = runtime
        .exec_sync(ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["sh".into(), "-c".into(), "exit 5".into()],
            timeout: 10,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(exec.exit_code, 5);

    // Absence over a bounded window: several targeted relists' worth.
    plegd.drain(Duration::from_secs(2)).await;
    assert_eq!(types_of(&plegd.events, &id), ["ContainerStarted"]);
    assert_eq!(
        cri.container_status(&id).await.unwrap().state,
        ContainerState::ContainerRunning as i32
    );
    // Not even a trigger came of the exec's exit.
    let delivered_after = status_of(&plegd.shared.sources, Source::Containerd)
        .unwrap()
        .last_delivered;
    assert_eq!(
        delivered_before, delivered_after,
        "an exec event became a trigger"
    );
    plegd.stop().await;
}

fn event(id: &str, kind: ContainerEventType) -> ContainerEventResponse {
    ContainerEventResponse {
        container_id: id.into(),
        container_event_type: kind as i32,
        created_at: 1,
        ..ContainerEventResponse::default()
    }
}

async fn next_trigger(triggers: &mut TriggerReceiver) -> Trigger {
    tokio::time::timeout(DEADLINE, triggers.recv())
        .await
        .expect("a trigger in time")
        .expect("channel open")
}

async fn full_relist_requested(triggers: &TriggerReceiver) {
    tokio::time::timeout(DEADLINE, triggers.full_relist_requested())
        .await
        .expect("a full relist requested in time");
}

fn container(trigger: &Trigger) -> &str {
    match &trigger.scope {
        Scope::Container(ContainerId(id)) => id,
        other => panic!("not a container trigger: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_events_reconnect_after_a_broken_stream_and_relist_everything() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (socket, _server) = fake_cri::serve(
        dir.path(),
        Arc::new(FakeCri::new(
            vec![
                Script {
                    events: vec![
                        event("c1", ContainerEventType::ContainerStartedEvent),
                        event("c2", ContainerEventType::ContainerStoppedEvent),
                    ],
                    then_break: Some(Status::internal("stream broke")),
                },
                Script {
                    events: vec![event("c3", ContainerEventType::ContainerCreatedEvent)],
                    then_break: None,
                },
            ],
            Arc::clone(&gate),
        )),
    )
    .unwrap();
    let (sender, mut triggers) = trigger_channel();
    let registry = SourceRegistry::new();
    let shutdown = CancellationToken::new();
    let source = tokio::spawn(cri_events::run(
        CriEventsConfig {
            socket,
            timeout: DEADLINE,
        },
        sender,
        registry.clone(),
        shutdown.clone(),
    ));

    // First connection: a full relist, then its events, then it breaks.
    full_relist_requested(&triggers).await;
    for id in ["c1", "c2"] {
        let trigger = next_trigger(&mut triggers).await;
        assert_eq!(container(&trigger), id);
        assert_eq!(trigger.source, Source::CriEvents);
    }
    let down = wait_state(&registry, Source::CriEvents, |s| {
        s.state == SourceState::Reconnecting
    })
    .await;
    assert!(down.detail.contains("stream broke"), "{down:?}");
    assert!(down.last_delivered.is_some());
    assert!(!registry.any_connected());

    // Second connection (held until now): another full relist, then the new stream's events.
    gate.add_permits(2);
    wait_state(&registry, Source::CriEvents, |s| {
        s.state == SourceState::Connected
    })
    .await;
    full_relist_requested(&triggers).await;
    assert_eq!(container(&next_trigger(&mut triggers).await), "c3");

    shutdown.cancel();
    tokio::time::timeout(DEADLINE, source)
        .await
        .expect("source stops on shutdown")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_events_refused_for_now_are_retried_not_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    // No scripts: every GetContainerEvents answers Unavailable, which is not Unimplemented
    // (cri_events.rs covers that against the real containerd 1.6).
    let (socket, _server) = fake_cri::serve(
        dir.path(),
        Arc::new(FakeCri::new(
            Vec::new(),
            Arc::new(tokio::sync::Semaphore::new(100)),
        )),
    )
    .unwrap();
    let (sender, _triggers) = trigger_channel();
    let registry = SourceRegistry::new();
    let shutdown = CancellationToken::new();
    let source = tokio::spawn(cri_events::run(
        CriEventsConfig {
            socket,
            timeout: DEADLINE,
        },
        sender,
        registry.clone(),
        shutdown.clone(),
    ));
    let status = wait_state(&registry, Source::CriEvents, |s| {
        s.state == SourceState::Reconnecting
    })
    .await;
    assert!(status.detail.contains("no more scripts"), "{status:?}");
    shutdown.cancel();
    tokio::time::timeout(DEADLINE, source)
        .await
        .expect("source stops on shutdown")
        .unwrap();
}

/// The relist period in `period` once it is `want`, within the deadline.
async fn period_becomes(period: &mut watch::Receiver<Duration>, want: Duration) {
    let reached = tokio::time::timeout(DEADLINE, period.wait_for(|p| *p == want))
        .await
        .map(|seen| seen.map(drop));
    assert!(
        matches!(reached, Ok(Ok(()))),
        "relist period not {want:?} in time: {:?}",
        *period.borrow()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_containerd_stream_is_found_by_its_heartbeat_and_relists_go_fast() {
    const HEARTBEAT: Duration = Duration::from_millis(500);
    // Far longer than a heartbeat: a publish that gets no answer must not hold up the verdict.
    const TIMEOUT: Duration = Duration::from_secs(5);
    const FAST: Duration = Duration::from_millis(100);
    RunningPlegd::log_to_test_output();
    let containerd = PrivateContainerd::start(&plegd_tests::ContainerdOptions::unique())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The soak's silent-stream fault finds plegd's event connection by the same topic.
    assert_eq!(
        proxy::EVENT_STREAM,
        containerd_events::HEARTBEAT_TOPIC.as_bytes()
    );
    let proxy = MutingProxy::start(dir.path(), containerd.socket(), proxy::EVENT_STREAM).unwrap();
    let (sender, mut triggers) = trigger_channel();
    let registry = SourceRegistry::new();
    let (period_tx, mut period) = watch::channel(FAST);
    tokio::spawn(
        registry
            .clone()
            .drive_relist_period(period_tx, FAST, support::SLOW),
    );
    let shutdown = CancellationToken::new();
    let source = tokio::spawn(containerd_events::run(
        ContainerdEventsConfig {
            socket: proxy.socket.clone(),
            namespaces: vec![CRI_NAMESPACE.into()],
            timeout: TIMEOUT,
            heartbeat: HEARTBEAT,
            presence: false,
        },
        sender,
        registry.clone(),
        shutdown.clone(),
    ));
    wait_state(&registry, Source::Containerd, |s| {
        s.state == SourceState::Connected
    })
    .await;
    full_relist_requested(&triggers).await;
    period_becomes(&mut period, support::SLOW).await;
    // An idle stream whose heartbeats come back is not declared silent: absence over a few
    // heartbeat periods.
    tokio::time::sleep(HEARTBEAT * 4).await;
    let idle = status_of(&registry, Source::Containerd).unwrap();
    assert_eq!(
        (idle.state, idle.reconnects),
        (SourceState::Connected, 0),
        "{idle:?}"
    );

    proxy.mute(true);
    let muted_at = Instant::now();
    let silent = wait_state(&registry, Source::Containerd, |s| {
        s.state == SourceState::Reconnecting
    })
    .await;
    let detected_in = muted_at.elapsed();
    eprintln!("silent stream detected in {detected_in:?} (heartbeat {HEARTBEAT:?})");
    assert!(silent.detail.contains("declared silent"), "{silent:?}");
    // A beat not back before the next is due: at most two periods after the silence began,
    // plus a margin for scheduling and the registry's update.
    assert!(
        detected_in <= HEARTBEAT * 3,
        "detected after {detected_in:?}"
    );
    period_becomes(&mut period, FAST).await;
    // Still muted: the next attempt fails too. Either its probe gets no answer, or (when the
    // probe's answer got through before the subscribe's body marked the connection for the
    // proxy) it connects and is found silent again. Both end reconnecting, relisting fast.
    let still = wait_state(&registry, Source::Containerd, |s| {
        s.state == SourceState::Reconnecting
            && (!s.detail.contains("declared silent") || s.reconnects >= 2)
    })
    .await;
    eprintln!("the next attempt, still muted: {still:?}");
    period_becomes(&mut period, FAST).await;

    proxy.mute(false);
    wait_state(&registry, Source::Containerd, |s| {
        s.state == SourceState::Connected
    })
    .await;
    full_relist_requested(&triggers).await;
    let cri = Cri::connect(&containerd).await.unwrap();
    let pod = cri.run_pod("after-silence").await.unwrap();
    let delivered = tokio::time::timeout(DEADLINE, async {
        loop {
            let trigger = next_trigger(&mut triggers).await;
            if matches!(&trigger.scope, Scope::Container(ContainerId(id)) if *id == pod.id) {
                return trigger;
            }
        }
    })
    .await
    .expect("the reconnected stream delivers the new pod's events");
    assert_eq!(delivered.source, Source::Containerd);
    period_becomes(&mut period, support::SLOW).await;

    shutdown.cancel();
    tokio::time::timeout(DEADLINE, source)
        .await
        .expect("source stops on shutdown")
        .unwrap();
    cri.remove_pod(&pod).await.unwrap();
}
