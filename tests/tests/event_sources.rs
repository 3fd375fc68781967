//! The runtime's event streams as trigger sources: containerd's `Events.Subscribe` against the
//! real private containerd (kill -9 seen long before the slow full relist, a containerd restart
//! while containers churn loses nothing, an exec's exit is not the container's), and the CRI
//! events source itself against an in-process CRI server whose stream breaks mid-way (the real
//! runtime's CRI events are in cri_events.rs).

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
    config::{Confirm, SourceName},
    pleg::{
        event::{Trigger, TriggerSource},
        generator::{TriggerReceiver, trigger_channel},
        record::{ContainerId, Layer, PodUid},
    },
    runtime::Scope,
    sources::{
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
    process, unix_channel, wait,
};
use support::{RunningPlegd, status_of, stream_only, types_by_container, types_of, wait_state};
use tokio_util::sync::CancellationToken;
use tonic::Status;

const DEADLINE: Duration = Duration::from_secs(30);

/// A daemon with only containerd's event stream, whose full relists are a minute apart either
/// way.
async fn events_only(containerd: &PrivateContainerd) -> RunningPlegd {
    let plegd =
        RunningPlegd::start(stream_only(&containerd.socket(), SourceName::Containerd)).await;
    wait_state(&plegd.shared.sources, TriggerSource::Containerd, |s| {
        s.state == SourceState::Connected
    })
    .await;
    plegd
}

/// Whether containerd's CRI store recorded the exit of a container whose init died around
/// its restart, once it no longer shows it running. If not (unknown: its exit lost in the
/// restart, seen here about one run in five), kubelet's PLEG, as plegd's at the CRI layer,
/// turns it into a `ContainerChanged`, which neither sends by default; plegd may still have
/// confirmed the death at the task record before the restart.
async fn exit_recorded_after_restart(cri: &Cri, id: &str) -> bool {
    let state = wait::until("the runtime to record the exit", DEADLINE, || async {
        let state = cri.container_status(id).await?.state;
        anyhow::Ok((state != ContainerState::ContainerRunning as i32).then_some(state))
    })
    .await
    .unwrap();
    state == ContainerState::ContainerExited as i32
}

/// A container that runs until the test creates /tmp/go inside it, then exits with `code`.
fn exits_on_signal(name: &str, code: u8) -> ContainerSpec {
    ContainerSpec::shell(
        name,
        &format!("while [ ! -e /tmp/go ]; do sleep 0.05; done; exit {code}"),
    )
}

/// The `ContainerDied` of `container`, if any.
fn died_event<'a>(
    events: &'a [serde_json::Value],
    container: &str,
) -> Option<&'a serde_json::Value> {
    events
        .iter()
        .find(|e| e["container_id"] == container && e["type"] == "ContainerDied")
}

fn signal_exit(pid: i32) {
    std::fs::write(format!("/proc/{pid}/root/tmp/go"), "").unwrap();
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
        status_of(&plegd.shared.sources, TriggerSource::Containerd)
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
                .cache
                .get(&PodUid(died["pod_uid"].as_str().unwrap().to_owned()))
                .record
                .and_then(|pod| pod.containers.get(&ContainerId(id.clone())).cloned());
            Ok::<_, String>(container.filter(|c| {
                c.confirmed_by == Layer::Cri && c.reason == "Error" && c.exit_code == Some(137)
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

    let mut config = stream_only(&containerd.socket(), SourceName::Containerd);
    config.confirm = Confirm::Cri;
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
async fn a_containerd_restart_while_containers_churn_loses_no_transition() {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let mut plegd = events_only(&containerd).await;
    let pod = cri.run_pod("churn").await.unwrap();
    let mut ids = Vec::new();
    for i in 0..6u8 {
        let id = cri
            .run_container(&pod, &exits_on_signal(&format!("c{i}"), 10 + i))
            .await
            .unwrap();
        ids.push(id);
    }
    for id in std::iter::once(&pod.id).chain(&ids) {
        plegd
            .wait_container(id, &["ContainerStarted"], DEADLINE)
            .await;
    }
    let mut pids = Vec::new();
    for id in &ids {
        pids.push(tasks.init_pid(id).await.unwrap());
    }

    let reconnects = status_of(&plegd.shared.sources, TriggerSource::Containerd)
        .unwrap()
        .reconnects;
    // Exits racing the daemon's shutdown, and one while it is down: whatever the stream misses
    // the reconnect's full relist finds.
    process::kill_all(&[pids[0], pids[1]], DEADLINE);
    let restarting = containerd.restart();
    let exit_while_down = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        signal_exit(pids[2]);
    };
    let (restarted, ()) = tokio::join!(restarting, exit_while_down);
    restarted.unwrap();
    wait_state(&plegd.shared.sources, TriggerSource::Containerd, |s| {
        s.reconnects > reconnects && s.state == SourceState::Connected
    })
    .await;

    // After the restart: more churn, through the stream.
    let cri = Cri::connect(&containerd).await.unwrap();
    let tasks = Native::connect_in(&containerd, CRI_NAMESPACE)
        .await
        .unwrap();
    process::kill_all(&[pids[3]], DEADLINE);
    let c6 = cri
        .run_container(&pod, &exits_on_signal("c6", 16))
        .await
        .unwrap();
    let c7 = cri
        .run_container(&pod, &exits_on_signal("c7", 17))
        .await
        .unwrap();
    plegd
        .wait_container(&c7, &["ContainerStarted"], DEADLINE)
        .await;
    signal_exit(tasks.init_pid(&c7).await.unwrap());
    // Exits around the restart, with the code each was given: the runtime's own records say
    // whether each must have a death (below).
    let around_restart = [(&ids[0], 137), (&ids[1], 137), (&ids[2], 12)];
    let mut recorded = Vec::new();
    for (id, _) in around_restart {
        recorded.push(exit_recorded_after_restart(&cri, id).await);
    }
    cri.remove_container(&ids[0]).await.unwrap();

    let died = ["ContainerStarted", "ContainerDied"];
    let expected: Vec<(&str, &[&str], Option<i64>)> = vec![
        (&pod.id, &["ContainerStarted"], None),
        (&ids[3], &died, Some(137)),
        (&ids[4], &["ContainerStarted"], None),
        (&ids[5], &["ContainerStarted"], None),
        (&c6, &["ContainerStarted"], None),
        (&c7, &died, Some(17)),
    ];
    // Well within the minute-long relist period: streams and the reconnect relist only.
    for (id, types, _) in &expected {
        plegd.wait_container(id, types, DEADLINE).await;
    }
    let removed = &ids[0];
    plegd
        .read_until(removed, DEADLINE, |events| {
            types_of(events, removed)
                .iter()
                .any(|t| t == "ContainerRemoved")
        })
        .await;
    for ((id, _), recorded) in around_restart.iter().zip(&recorded) {
        // CRI may record an exit it first showed unknown: then it must be reported too.
        let exited_now = *id != &ids[0]
            && cri.container_status(id).await.unwrap().state
                == ContainerState::ContainerExited as i32;
        if *recorded || exited_now {
            plegd
                .read_until(id, DEADLINE, |events| {
                    types_of(events, id).iter().any(|t| t == "ContainerDied")
                })
                .await;
        }
    }
    plegd.drain(Duration::from_secs(1)).await;
    let by_container = types_by_container(&plegd.events);
    assert_eq!(by_container.len(), 9, "{by_container:#?}");
    for (id, types, exit_code) in &expected {
        assert_eq!(types_of(&plegd.events, id), *types, "{id}");
        if let (Some(code), Some(died)) = (exit_code, died_event(&plegd.events, id)) {
            assert_eq!(died["exit_code"], *code, "{died}");
        }
    }
    for ((id, code), recorded) in around_restart.into_iter().zip(recorded) {
        let died = died_event(&plegd.events, id);
        let mut want = vec!["ContainerStarted"];
        match died {
            // Confirmed at the task record: the code the container exited with.
            Some(died) if died["confirmed_by"] == "task" => {
                assert_eq!(died["exit_code"], code, "{died}");
                want.push("ContainerDied");
            }
            // Confirmed by the CRI store (which may have said unknown for a while after the
            // restart): what it recorded, 255 where it lost the exit.
            Some(died) if died["confirmed_by"] == "cri" => {
                if id != &ids[0] {
                    let truth = cri.container_status(id).await.unwrap().exit_code;
                    assert_eq!(died["exit_code"], truth, "{died}");
                }
                want.push("ContainerDied");
            }
            // A container removed while CRI showed it unknown dies with its removal, as in
            // kubelet's PLEG: no status left to confirm it by.
            Some(died) => {
                assert_eq!(id, &ids[0], "{died}");
                want.push("ContainerDied");
            }
            // Only where CRI never recorded the exit, and still does not.
            None => {
                assert!(!recorded, "{id}: the death CRI recorded is missing");
                let state = cri.container_status(id).await.unwrap().state;
                assert_ne!(state, ContainerState::ContainerExited as i32, "{id}");
            }
        }
        if id == &ids[0] {
            want.push("ContainerRemoved");
        }
        assert_eq!(types_of(&plegd.events, id), want, "{id}");
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
    let delivered_before = status_of(&plegd.shared.sources, TriggerSource::Containerd)
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
    let delivered_after = status_of(&plegd.shared.sources, TriggerSource::Containerd)
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
        assert_eq!(trigger.source, TriggerSource::CriEvents);
    }
    let down = wait_state(&registry, TriggerSource::CriEvents, |s| {
        s.state == SourceState::Reconnecting
    })
    .await;
    assert!(down.detail.contains("stream broke"), "{down:?}");
    assert!(down.last_delivered.is_some());
    assert!(!registry.any_connected());

    // Second connection (held until now): another full relist, then the new stream's events.
    gate.add_permits(2);
    wait_state(&registry, TriggerSource::CriEvents, |s| {
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
    let status = wait_state(&registry, TriggerSource::CriEvents, |s| {
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
