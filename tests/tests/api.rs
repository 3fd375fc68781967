//! The plegd.v1 API through its real unix socket, against the real containerd: watching real
//! containers, resuming after a disconnect, the out-of-range error, a lagged subscriber,
//! health (in-process, /readyz, grpc.health.v1, GetHealth) following a runtime that hangs mid-churn, /metrics, the socket's permissions, and mTLS on TCP.

mod support;

use std::{collections::BTreeMap, os::unix::fs::PermissionsExt as _, path::Path, time::Duration};

use plegd::{config::Config, runtime::RuntimeKind};
use plegd_proto::v1::{self as pb, pleg_client::PlegClient};
use plegd_tests::{ContainerdOptions, Node, PrivateContainerd, cri::ContainerSpec, pki::Pki};
use serde_json::Value;
use support::{RunningPlegd, ServedApi, config};
use tonic::{Code, Streaming, transport::Channel};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

const DEADLINE: Duration = Duration::from_secs(30);
const PERIOD: Duration = Duration::from_millis(100);

async fn start(
    containerd: &PrivateContainerd,
    tune: impl FnOnce(&mut Config),
) -> (RunningPlegd, ServedApi) {
    let mut settings = config(RuntimeKind::Cri, &containerd.socket(), PERIOD);
    tune(&mut settings);
    RunningPlegd::start_serving_api(settings).await
}

async fn watch(
    client: &mut PlegClient<Channel>,
    from_sequence: u64,
    run_id: u64,
) -> Result<Streaming<pb::Event>, tonic::Status> {
    client
        .watch(pb::WatchRequest {
            from_sequence,
            run_id,
            include_observations: true,
            ..pb::WatchRequest::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Reads events until one satisfies `done`; returns all read.
async fn read_until(
    stream: &mut Streaming<pb::Event>,
    what: &str,
    mut done: impl FnMut(&pb::Event) -> bool,
) -> Vec<pb::Event> {
    let mut read = Vec::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let event = tokio::time::timeout_at(deadline, stream.message())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}; read {read:#?}"))
            .expect("stream alive")
            .expect("stream open");
        let last = done(&event);
        read.push(event);
        if last {
            return read;
        }
    }
}

fn is(event: &pb::Event, container: &str, t: pb::EventType) -> bool {
    event.container_id == container && event.r#type() == t
}

/// (sequence, type, container) of stdout events, to compare with what the API streamed.
fn stdout_view(events: &[Value]) -> Vec<(u64, String, String)> {
    events
        .iter()
        .map(|e| {
            (
                e["sequence"].as_u64().unwrap(),
                e["type"].as_str().unwrap().to_owned(),
                e["container_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn api_view(events: &[pb::Event]) -> Vec<(u64, String, String)> {
    events
        .iter()
        .map(|e| {
            let t = match e.r#type() {
                pb::EventType::ContainerStarted => "ContainerStarted",
                pb::EventType::ContainerDied => "ContainerDied",
                pb::EventType::ContainerRemoved => "ContainerRemoved",
                other => panic!("unexpected type {other:?}"),
            };
            (e.sequence, t.to_owned(), e.container_id.clone())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_the_events_of_real_containers() {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let (mut plegd, api) = start(&containerd, |_| {}).await;
    let mut client = api.client().await;
    let mut stream = watch(&mut client, 0, 0).await.unwrap();

    let pod = cri.run_pod("watched").await.unwrap();
    let app = cri
        .run_container(&pod, &ContainerSpec::sleeper("app"))
        .await
        .unwrap();
    let started = read_until(&mut stream, "app started", |e| {
        is(e, &app, pb::EventType::ContainerStarted)
    })
    .await;
    let event = started.last().unwrap();
    assert_eq!(event.pod_uid, pod.uid);
    assert_eq!(event.pod_namespace, pod.namespace);
    assert_eq!(event.pod_name, pod.name);
    assert_eq!(event.container_name, "app");
    assert_eq!(event.sources, [pb::TriggerSource::Relist as i32]);
    assert_ne!(event.run_id, 0);
    let observed = event.observed_at.unwrap();
    let emitted = event.emitted_at.unwrap();
    assert!((observed.seconds, observed.nanos) <= (emitted.seconds, emitted.nanos));

    cri.remove_pod(&pod).await.unwrap();
    let mut streamed = started;
    streamed.extend(
        read_until(&mut stream, "app removed", |e| {
            is(e, &app, pb::EventType::ContainerRemoved)
        })
        .await,
    );
    // Exactly what `plegd run` printed, in order.
    let last = streamed.last().unwrap().sequence;
    plegd
        .read_until("stdout up to the last streamed event", DEADLINE, |events| {
            events
                .last()
                .is_some_and(|e| e["sequence"].as_u64() >= Some(last))
        })
        .await;
    let first = streamed[0].sequence;
    let printed: Vec<_> = stdout_view(&plegd.events)
        .into_iter()
        .filter(|(s, _, _)| (first..=last).contains(s))
        .collect();
    assert_eq!(api_view(&streamed), printed);
    assert!(
        streamed
            .iter()
            .any(|e| is(e, &app, pb::EventType::ContainerDied))
    );

    // GetPodStatus of a live pod and of a gone one.
    let pod2 = cri.run_pod("status").await.unwrap();
    read_until(&mut stream, "pod2 started", |e| {
        is(e, &pod2.id, pb::EventType::ContainerStarted)
    })
    .await;
    let status = client
        .get_pod_status(pb::GetPodStatusRequest {
            pod_uid: pod2.uid.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.name, pod2.name);
    assert!(status.timestamp.is_some());
    assert_eq!(status.containers[0].state(), pb::ContainerState::Running);
    let missing = client
        .get_pod_status(pb::GetPodStatusRequest {
            pod_uid: pod.uid.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    plegd.stop().await;
    // The daemon's shutdown ends the stream with UNAVAILABLE, then the API stops.
    let end = loop {
        match tokio::time::timeout(DEADLINE, stream.message())
            .await
            .unwrap()
        {
            Ok(Some(_)) => continue,
            other => break other,
        }
    };
    assert!(
        matches!(&end, Err(s) if s.code() == Code::Unavailable) || matches!(end, Ok(None)),
        "{end:?}"
    );
    let socket = api.socket.clone();
    api.stopped();
    assert!(!socket.exists(), "socket removed on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_after_a_disconnect_gets_exactly_the_missed_events() {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let (mut plegd, api) = start(&containerd, |_| {}).await;

    let mut client = api.client().await;
    let mut stream = watch(&mut client, 1, 0).await.unwrap();
    let pod = cri.run_pod("resume").await.unwrap();
    let seen = read_until(&mut stream, "sandbox started", |e| {
        is(e, &pod.id, pb::EventType::ContainerStarted)
    })
    .await;
    let last_seen = seen.last().unwrap();
    let (run_id, resume_at) = (last_seen.run_id, last_seen.sequence + 1);
    drop(stream);
    drop(client);

    // Missed while disconnected.
    let [a, b] = cri.run_sleepers(&pod, ["a", "b"]).await.unwrap();
    for id in [&a, &b] {
        plegd
            .wait_container(id, &["ContainerStarted"], DEADLINE)
            .await;
    }
    plegd.drain(PERIOD * 3).await;
    let missed: Vec<_> = stdout_view(&plegd.events)
        .into_iter()
        .filter(|(s, _, _)| *s >= resume_at)
        .collect();
    assert!(missed.len() >= 2, "{missed:?}");

    let mut client = api.client().await;
    let mut resumed = watch(&mut client, resume_at, run_id).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..missed.len() {
        got.push(
            tokio::time::timeout(DEADLINE, resumed.message())
                .await
                .expect("backlog in time")
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(
        api_view(&got),
        missed,
        "exactly the missed events, in order"
    );

    // Then live, without a gap.
    let c = cri
        .run_container(&pod, &ContainerSpec::sleeper("c"))
        .await
        .unwrap();
    let live = read_until(&mut resumed, "c started", |e| {
        is(e, &c, pb::EventType::ContainerStarted)
    })
    .await;
    assert_eq!(live[0].sequence, missed.last().unwrap().0 + 1);
    plegd.stop().await;
    api.stopped();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_from_too_old_a_sequence_or_another_run_is_out_of_range() {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let (mut plegd, api) = start(&containerd, |c| c.event_history = 2).await;
    let pod = cri.run_pod("old").await.unwrap();
    let a = cri
        .run_container(&pod, &ContainerSpec::sleeper("a"))
        .await
        .unwrap();
    for id in [&pod.id, &a] {
        plegd
            .wait_container(id, &["ContainerStarted"], DEADLINE)
            .await;
    }
    cri.stop_container(&a, Duration::from_secs(5))
        .await
        .unwrap();
    plegd
        .wait_container(&a, &["ContainerStarted", "ContainerDied"], DEADLINE)
        .await;

    let mut client = api.client().await;
    let too_old = watch(&mut client, 1, 0).await.unwrap_err();
    assert_eq!(too_old.code(), Code::OutOfRange, "{too_old:?}");
    assert!(
        too_old.message().contains("no longer kept"),
        "{}",
        too_old.message()
    );

    // The documented way out: list, then watch from the listing's position.
    let listing = client
        .list_pods(pb::ListPodsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(listing.pods.iter().any(|p| p.uid == pod.uid));
    assert!(listing.sequence >= 3);
    let other_run = watch(&mut client, listing.sequence + 1, listing.run_id ^ 1)
        .await
        .unwrap_err();
    assert_eq!(other_run.code(), Code::OutOfRange);
    assert!(
        other_run.message().contains("restarted"),
        "{}",
        other_run.message()
    );
    let ahead = watch(&mut client, listing.sequence + 100, listing.run_id)
        .await
        .unwrap_err();
    assert_eq!(ahead.code(), Code::OutOfRange);
    let mut fresh = watch(&mut client, listing.sequence + 1, listing.run_id)
        .await
        .unwrap();
    cri.remove_container(&a).await.unwrap();
    let removed = read_until(&mut fresh, "a removed", |e| {
        is(e, &a, pb::EventType::ContainerRemoved)
    })
    .await;
    assert_eq!(removed[0].sequence, listing.sequence + 1);
    plegd.stop().await;
    api.stopped();
}

/// A client whose HTTP/2 stream window is 256 bytes: once it stops reading, the server can
/// send it nothing more after an event or two. (hyper's default window, 2 MiB, would let a
/// stalled client absorb thousands of events before plegd sees it fall behind.)
async fn stingy_client(socket: &Path) -> PlegClient<Channel> {
    let endpoint = tonic::transport::Endpoint::from_static("http://plegd.local")
        .initial_stream_window_size(Some(256));
    let channel = plegd_tests::unix_channel_with(socket, endpoint)
        .await
        .expect("API socket answers");
    PlegClient::new(channel)
}

/// Every event until the stream ends, and how it ended.
async fn drain(stream: &mut Streaming<pb::Event>) -> (Vec<pb::Event>, tonic::Status) {
    let mut read = Vec::new();
    loop {
        match tokio::time::timeout(DEADLINE, stream.message())
            .await
            .expect("the stream answers")
        {
            Ok(Some(event)) => read.push(event),
            Ok(None) => panic!("stream ended without a status after {read:#?}"),
            Err(status) => return (read, status),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_is_ended_as_lagged_while_another_keeps_up() {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let (mut plegd, api) = start(&containerd, |c| c.watch_queue = 8).await;
    let bus = plegd.shared.pleg.events().clone();
    let mut fast_client = api.client().await;
    let mut fast = watch(&mut fast_client, 0, 0).await.unwrap();
    let mut stalled_client = stingy_client(&api.socket).await;
    let mut stalled = watch(&mut stalled_client, 0, 0).await.unwrap();
    // Never reads, not even at shutdown.
    let mut deaf_client = stingy_client(&api.socket).await;
    let mut deaf = watch(&mut deaf_client, 0, 0).await.unwrap();
    assert_eq!(bus.subscriber_count(), 3);

    // 3 events a container, one at a time: far more than the window and the queue of 8 hold.
    const CONTAINERS: usize = 10;
    let reader = tokio::spawn(async move {
        let mut removed = 0;
        let seen = read_until(&mut fast, "every container removed", |e| {
            removed += usize::from(e.r#type() == pb::EventType::ContainerRemoved);
            removed == CONTAINERS
        })
        .await;
        // Still subscribed: the one left when the stalled ones are dropped.
        (seen, fast)
    });
    let pod = cri.run_pod("busy").await.unwrap();
    for i in 0..CONTAINERS {
        let id = cri
            .run_container(&pod, &ContainerSpec::sleeper(&format!("c{i}")))
            .await
            .unwrap();
        plegd
            .wait_container(&id, &["ContainerStarted"], DEADLINE)
            .await;
        cri.stop_container(&id, Duration::ZERO).await.unwrap();
        cri.remove_container(&id).await.unwrap();
        plegd
            .wait_container(
                &id,
                &["ContainerStarted", "ContainerDied", "ContainerRemoved"],
                DEADLINE,
            )
            .await;
    }
    let (seen, _fast) = reader.await.unwrap();
    assert!(
        seen.windows(2).all(|w| w[1].sequence == w[0].sequence + 1),
        "the reader that keeps up misses nothing: {:?}",
        seen.iter().map(|e| e.sequence).collect::<Vec<_>>()
    );
    plegd_tests::wait::until("both stalled watchers dropped", DEADLINE, || async {
        anyhow::Ok((bus.subscriber_count() == 1).then_some(()))
    })
    .await
    .unwrap();

    // Reading again, the stalled one finds what it had been sent, then the verdict with the
    // exact point to resume from.
    let (got, status) = drain(&mut stalled).await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().starts_with("lagged: "),
        "{}",
        status.message()
    );
    let resume = got.last().map_or(seen[0].sequence, |e| e.sequence + 1);
    assert!(
        status
            .message()
            .ends_with(&format!("from_sequence={resume}")),
        "{} after {:?}",
        status.message(),
        got.iter().map(|e| e.sequence).collect::<Vec<_>>()
    );
    assert!(got.len() < seen.len(), "it did fall behind");
    let mut resumed = watch(&mut stalled_client, resume, bus.run_id())
        .await
        .expect("the history still holds the missed events");
    let last = seen.last().unwrap().sequence;
    let caught_up = read_until(&mut resumed, "caught up", |e| e.sequence == last).await;
    assert_eq!(caught_up.first().map(|e| e.sequence), Some(resume));
    drop(resumed);

    // The deaf one's final status sits behind events it never reads: shutdown must not wait
    // for it forever, but cut its connection after the grace period.
    plegd.stop().await;
    api.stopped();
    let (_, cut) = drain(&mut deaf).await;
    assert_ne!(
        cut.code(),
        Code::ResourceExhausted,
        "cut, not told: {cut:?}"
    );
}

async fn serving_status(
    client: &mut HealthClient<Channel>,
    service: &str,
) -> Option<ServingStatus> {
    let response = client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .ok()?;
    Some(response.into_inner().status())
}

/// Whether `service`'s grpc.health.v1 status becomes `want` within the deadline.
async fn serving_becomes(health: &HealthClient<Channel>, service: &str, want: ServingStatus) {
    plegd_tests::wait::until(&format!("{service:?} {want:?}"), DEADLINE, || {
        let mut health = health.clone();
        async move {
            anyhow::Ok((serving_status(&mut health, service).await == Some(want)).then_some(()))
        }
    })
    .await
    .unwrap();
}

/// containerd frozen (SIGSTOP) while containers live and die: past the threshold the PLEG is
/// unhealthy in kubelet's words (in-process, `/readyz` 503, grpc.health NOT_SERVING, GetHealth);
/// after SIGCONT everything recovers and every transition arrives once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_that_hangs_mid_churn_turns_health_off_then_recovers_losing_nothing() {
    const CONTAINERS: usize = 6;
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let (mut plegd, api) = start(&containerd, |c| {
        c.relist_threshold = Duration::from_secs(1);
        c.runtime_timeout = Duration::from_millis(300);
    })
    .await;
    let channel = plegd_tests::unix_channel(&api.socket).await.unwrap();
    let health = HealthClient::new(channel);
    let mut pleg = api.client().await;
    for service in ["", "plegd.v1.Pleg"] {
        serving_becomes(&health, service, ServingStatus::Serving).await;
    }
    let pod = cri.run_pod("hang").await.unwrap();
    let mut ids = Vec::new();
    for i in 0..CONTAINERS {
        let spec = ContainerSpec::sleeper(&format!("c{i}"));
        ids.push(cri.run_container(&pod, &spec).await.unwrap());
    }
    for id in &ids {
        plegd
            .wait_container(id, &["ContainerStarted"], DEADLINE)
            .await;
    }
    let mut pids = Vec::new();
    for id in &ids {
        pids.push(tasks.init_pid(id).await.unwrap());
    }

    let pid = nix::unistd::Pid::from_raw(containerd.pid().unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // Half the containers die while the runtime hangs: their shims reap them, containerd
    // hears of it only once it runs again.
    plegd_tests::process::kill_all(&pids[..CONTAINERS / 2], DEADLINE);
    let frozen = async {
        serving_becomes(&health, "plegd.v1.Pleg", ServingStatus::NotServing).await;
        let overall = serving_status(&mut health.clone(), "").await;
        let report = pleg
            .get_health(pb::GetHealthRequest {})
            .await
            .map(tonic::Response::into_inner);
        let in_process = plegd.shared.pleg.healthy().map_err(|e| e.to_string());
        let ready = support::http_get(api.metrics, "/readyz", None).await;
        (overall, report, in_process, ready)
    }
    .await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let (overall, report, in_process, ready) = frozen;
    assert_eq!(overall, Some(ServingStatus::NotServing));
    let report = report.unwrap();
    assert!(!report.healthy);
    let kubelets = |message: &str| {
        message.starts_with("pleg was last seen active ")
            && message.trim_end().ends_with("ago; threshold is 1s")
    };
    assert!(kubelets(&report.message), "{}", report.message);
    let message = in_process.unwrap_err();
    assert!(kubelets(&message), "{message}");
    assert_eq!(ready.code, 503, "{}", ready.body);
    let body = ready
        .body
        .strip_prefix("PLEG is not healthy: ")
        .unwrap_or_else(|| panic!("{}", ready.body));
    assert!(kubelets(body), "{}", ready.body);

    for service in ["", "plegd.v1.Pleg"] {
        serving_becomes(&health, service, ServingStatus::Serving).await;
    }
    assert!(
        pleg.get_health(pb::GetHealthRequest {})
            .await
            .unwrap()
            .into_inner()
            .healthy
    );
    assert_eq!(
        support::http_get(api.metrics, "/readyz", None).await.code,
        200
    );
    plegd.shared.pleg.healthy().unwrap();

    // The rest die after the thaw; every container then goes.
    for id in &ids[CONTAINERS / 2..] {
        cri.stop_container(id, Duration::ZERO).await.unwrap();
    }
    for id in &ids {
        cri.remove_container(id).await.unwrap();
    }
    for id in &ids {
        plegd
            .wait_container(
                id,
                &["ContainerStarted", "ContainerDied", "ContainerRemoved"],
                DEADLINE,
            )
            .await;
    }
    plegd.drain(PERIOD * 5).await;
    for id in &ids {
        assert_eq!(
            support::types_of(&plegd.events, id),
            ["ContainerStarted", "ContainerDied", "ContainerRemoved"],
            "{id}: exactly once each"
        );
    }
    cri.remove_pod(&pod).await.unwrap();
    plegd.stop().await;
    api.stopped();
}

async fn scrape(api: &ServedApi) -> BTreeMap<String, f64> {
    let support::HttpResponse { code, body, .. } =
        support::http_get(api.metrics, "/metrics", None).await;
    assert_eq!(code, 200, "{body}");
    support::parse_metrics(&body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_scraped_and_move() {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let (mut plegd, api) = start(&containerd, |_| {}).await;
    let first = scrape(&api).await;
    for name in [
        "kubelet_pleg_relist_duration_seconds_count",
        "kubelet_pleg_relist_interval_seconds_count",
        "kubelet_pleg_discard_events",
        "kubelet_pleg_last_seen_seconds",
        "plegd_trigger_to_event_seconds_count",
        "plegd_ringbuf_drops_total",
        "plegd_watch_subscribers",
        "plegd_pods",
    ] {
        assert!(first.contains_key(name), "{name} missing: {first:#?}");
    }
    assert!(first.contains_key("kubelet_pleg_relist_duration_seconds_bucket{le=\"0.005\"}"));
    assert!(first.contains_key("kubelet_pleg_relist_duration_seconds_bucket{le=\"10.0\"}"));

    let pod = cri.run_pod("metered").await.unwrap();
    plegd
        .wait_container(&pod.id, &["ContainerStarted"], DEADLINE)
        .await;
    let mut client = api.client().await;
    let _watching = watch(&mut client, 0, 0).await.unwrap();
    let full = "plegd_relists_total{scope=\"full\"}";
    let later = plegd_tests::wait::until("counters moved", DEADLINE, || async {
        let now = scrape(&api).await;
        let moved = now["kubelet_pleg_relist_duration_seconds_count"]
            > first["kubelet_pleg_relist_duration_seconds_count"]
            && now.get(full) > first.get(full)
            && now["plegd_pods"] >= 1.0
            && now["plegd_watch_subscribers"] == 1.0;
        anyhow::Ok(moved.then_some(now))
    })
    .await
    .unwrap();
    assert!(later["plegd_containers{state=\"running\"}"] >= 1.0);
    assert!(later["kubelet_pleg_last_seen_seconds"] > 1.7e9);
    assert!(later["kubelet_pleg_relist_interval_seconds_count"] >= 1.0);

    assert_eq!(
        support::http_get(api.metrics, "/healthz", None).await.code,
        200
    );
    assert_eq!(
        support::http_get(api.metrics, "/readyz", None).await.code,
        200
    );
    assert_eq!(
        support::http_get(api.metrics, "/nope", None).await.code,
        404
    );
    plegd.stop().await;
    api.stopped();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_is_0600_in_a_0700_directory_and_single_use() {
    let containerd = PrivateContainerd::start(&ContainerdOptions::unique())
        .await
        .unwrap();
    let (plegd, api) = start(&containerd, |_| {}).await;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&api.socket), 0o600);
    assert_eq!(mode(api.socket.parent().unwrap()), 0o700);
    // The API answers on it.
    let mut client = api.client().await;
    assert!(client.list_pods(pb::ListPodsRequest {}).await.is_ok());
    // A second daemon on the same socket is refused with a clear error.
    let mut second = config(RuntimeKind::Cri, &containerd.socket(), PERIOD);
    second.socket = api.socket.clone();
    let err = plegd::api::Listeners::bind(&second).unwrap_err();
    assert!(err.to_string().contains("in use"), "{err}");
    plegd.stop().await;
    api.stopped();
}

/// Whether `client`'s ListPods is served (for [`plegd_tests::wait::until`]).
async fn lists(mut client: PlegClient<Channel>) -> anyhow::Result<Option<()>> {
    Ok(client
        .list_pods(pb::ListPodsRequest {})
        .await
        .is_ok()
        .then_some(()))
}

/// A peer on the socket (a uid) holds its share and no more: past its streams an RPC is
/// RESOURCE_EXHAUSTED, past its connections a connection is closed at accept; both counted,
/// and the share comes back as they end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_on_the_socket_holds_its_share_of_connections_and_streams_and_no_more() {
    let containerd = PrivateContainerd::start(&ContainerdOptions::unique())
        .await
        .unwrap();
    let (plegd, api) = start(&containerd, |c| {
        c.api_limits.connections_per_peer = 2;
        c.api_limits.streams_per_peer = 2;
    })
    .await;
    let mut client = api.client().await;
    let first = watch(&mut client, 0, 0).await.unwrap();
    let second = watch(&mut client, 0, 0).await.unwrap();
    let refused = watch(&mut client, 0, 0).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let unary = client.list_pods(pb::ListPodsRequest {}).await.unwrap_err();
    assert_eq!(unary.code(), Code::ResourceExhausted, "{unary:?}");
    drop(second);
    plegd_tests::wait::until("a stream's share back", DEADLINE, || lists(client.clone()))
        .await
        .unwrap();

    let mut other = api.client().await;
    assert!(other.list_pods(pb::ListPodsRequest {}).await.is_ok());
    // Closed at accept: the dial itself or the first call fails, as the close races it.
    let third = match plegd::api::client::connect(&api.socket).await {
        Ok(mut third) => third.list_pods(pb::ListPodsRequest {}).await.err(),
        Err(e) => Some(tonic::Status::unavailable(e.to_string())),
    };
    assert!(third.is_some(), "a third connection was served");
    let metrics = scrape(&api).await;
    let refused = |what: &str| {
        metrics
            .get(&format!(
                "plegd_api_refused_total{{listener=\"unix\",what=\"{what}\",reason=\"peer-full\"}}"
            ))
            .copied()
            .unwrap_or_default()
    };
    assert!(refused("stream") >= 2.0, "{metrics:#?}");
    assert!(refused("connection") >= 1.0, "{metrics:#?}");
    drop(other);
    plegd_tests::wait::until("a connection's share back", DEADLINE, || {
        let socket = api.socket.clone();
        async move {
            match plegd::api::client::connect(&socket).await {
                Ok(third) => lists(third).await,
                Err(_) => Ok(None),
            }
        }
    })
    .await
    .unwrap();
    drop(first);
    plegd.stop().await;
    api.stopped();
}

/// ListPods over TLS to `address`, trusting `ca`, presenting `identity`; any failure (dial,
/// handshake, call) as text.
async fn list_pods_over_tls(
    address: std::net::SocketAddr,
    ca: &str,
    identity: Option<&(String, String)>,
) -> Result<pb::ListPodsResponse, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Endpoint::from_shared(format!("https://localhost:{}", address.port()))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .tls_config(tls)
        .map_err(|e| format!("{e:?}"))?
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut request = tonic::Request::new(pb::ListPodsRequest {});
    request.set_timeout(Duration::from_secs(5));
    PlegClient::new(channel)
        .list_pods(request)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| format!("call: {status:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_is_served_over_tls_to_clients_with_a_certificate_from_the_client_ca_only() {
    use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    let containerd = PrivateContainerd::start(&ContainerdOptions::unique())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (
        Pki::new("plegd test CA").unwrap(),
        Pki::new("someone else").unwrap(),
    );
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let (server_cert, server_key) = ours.leaf(&["localhost", "127.0.0.1"], ServerAuth).unwrap();
    let (cert, key, client_ca) = (
        write("server.pem", &server_cert),
        write("server.key", &server_key),
        write("ca.pem", &ours.ca_pem),
    );
    let (plegd, api) = start(&containerd, |c| {
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.tls_cert = Some(cert);
        c.tls_key = Some(key);
        c.tls_client_ca = Some(client_ca);
    })
    .await;
    let address = api.tcp.expect("TLS listener bound");

    let trusted = ours.leaf(&["watcher"], ClientAuth).unwrap();
    let listing = list_pods_over_tls(address, &ours.ca_pem, Some(&trusted))
        .await
        .expect("a client with a certificate from the client CA is served");
    assert_eq!(listing.run_id, plegd.shared.pleg.events().run_id());

    let stranger = theirs.leaf(&["watcher"], ClientAuth).unwrap();
    for (who, identity) in [("no certificate", None), ("another CA's", Some(&stranger))] {
        let refused = list_pods_over_tls(address, &ours.ca_pem, identity).await;
        assert!(
            refused.is_err(),
            "a client with {who} is refused: {refused:?}"
        );
    }
    // Nor does the server pass for anyone else's.
    let impostor = list_pods_over_tls(address, &theirs.ca_pem, Some(&trusted)).await;
    assert!(impostor.is_err(), "{impostor:?}");
    // Plain HTTP/2 gets no answer either.
    let mut plain = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map(PlegClient::new);
    if let Ok(client) = plain.as_mut() {
        let mut request = tonic::Request::new(pb::ListPodsRequest {});
        request.set_timeout(Duration::from_secs(5));
        assert!(client.list_pods(request).await.is_err());
    }
    plegd.stop().await;
    api.stopped();
}

/// A pipe whose reading end is kept and never read, holding one page: a process writing into
/// it stalls after a dozen event lines.
fn unread_pipe() -> (std::os::fd::OwnedFd, std::process::Stdio) {
    let (read, write) = nix::unistd::pipe().unwrap();
    nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_SETPIPE_SZ(4096)).unwrap();
    (read, std::process::Stdio::from(write))
}

/// The middle and the largest of `values`.
fn median_and_max(values: &[f64]) -> (f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    (sorted[sorted.len() / 2], sorted[sorted.len() - 1])
}

/// Under churn, a plegd process whose stdout nobody reads and one of whose watchers stops
/// reading: its resident memory stays within a bound, a `plegd watch` that keeps reading gets
/// each death as promptly as before the stalled watcher came, and the stalled watcher is told
/// it lagged and resumes where it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_consumers_keep_plegd_memory_bounded_and_other_watchers_timely() {
    use plegd_tests::bench::{self, Plegd};
    const BEFORE: usize = 10;
    const STALLED: usize = 30;
    /// Above the RSS before the churn. Its queues are bounded by events (16 for the stalled
    /// watcher, the history's 10,000 for all): a leak per event or an unbounded queue would show
    /// over the churn's hundreds of events, plegd's own growth does not reach it.
    const RSS_MARGIN: u64 = 24 << 20;
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_unread, stdout) = unread_pipe();
    let args = ["--watch-queue", "16"].map(str::to_owned);
    let plegd = Plegd::start_with_stdout(
        &plegd_tests::process::plegd_binary().expect("the plegd binary"),
        &containerd,
        dir.path(),
        &args,
        stdout,
    )
    .unwrap();
    let live = plegd.watch().unwrap();
    let exits = bench::containerd_events(&containerd).await.unwrap();
    let pod = cri.run_pod("stalled").await.unwrap();
    let baseline = bench::rss_bytes(plegd.pid());
    let mut peak = baseline;
    // kill -9 (containerd's exit time) to the live watcher's ContainerDied, in ms.
    let mut delays = Vec::new();
    let mut stalled = None;
    let mut last_id = String::new();
    for i in 0..BEFORE + STALLED {
        if i == BEFORE {
            let mut client = stingy_client(&plegd.socket).await;
            let stream = watch(&mut client, 0, 0).await.unwrap();
            stalled = Some((client, stream));
        }
        let id = cri
            .run_container(&pod, &ContainerSpec::sleeper(&format!("c{i}")))
            .await
            .unwrap();
        let arrived = |what: &'static str| {
            let (arrivals, id) = (live.arrivals.clone(), id.clone());
            async move {
                arrivals
                    .wait(&id, what, DEADLINE)
                    .await
                    .unwrap_or_else(|| panic!("{id}: no {what}"))
            }
        };
        arrived("ContainerStarted").await;
        tasks.kill_init(&id).await.unwrap();
        let died = arrived("ContainerDied").await;
        let exited = exits.wait(&id, "exit", DEADLINE).await.unwrap();
        delays.push(bench::ms_between(exited, died));
        // CRI refuses to remove it until its store has the exit too (plegd reports the task's,
        // ~40 ms before).
        bench::cri_exited(&cri, &id, DEADLINE).await.unwrap();
        cri.remove_container(&id).await.unwrap();
        arrived("ContainerRemoved").await;
        peak = peak.max(bench::rss_bytes(plegd.pid()));
        last_id = id;
    }
    let (before, after) = delays.split_at(BEFORE);
    let (before, after) = (median_and_max(before), median_and_max(after));
    eprintln!(
        "plegd RSS {:.1} MiB before the churn, peak {:.1} MiB; exit to ContainerDied at the live watcher: p50 {:.1} ms / max {:.1} ms alone, p50 {:.1} ms / max {:.1} ms beside a stalled watcher and stdout",
        baseline as f64 / f64::from(1 << 20),
        peak as f64 / f64::from(1 << 20),
        before.0,
        before.1,
        after.0,
        after.1,
    );
    assert!(
        peak <= baseline + RSS_MARGIN,
        "RSS grew from {baseline} to {peak} bytes"
    );
    // Same path, same load: the stalled consumers must not slow the live one down (a margin
    // for a shared, busy machine).
    assert!(
        after.0 <= before.0 * 2.0 + 50.0,
        "{before:?} then {after:?}"
    );

    let (mut client, mut stream) = stalled.unwrap();
    let (got, status) = drain(&mut stream).await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let resume: u64 = status
        .message()
        .rsplit_once("from_sequence=")
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", status.message()));
    if let Some(last) = got.last() {
        assert_eq!(resume, last.sequence + 1);
    }
    let mut resumed = watch(&mut client, resume, 0)
        .await
        .expect("the history still holds what it missed");
    let caught_up = read_until(&mut resumed, "the last container's removal", |e| {
        is(e, &last_id, pb::EventType::ContainerRemoved)
    })
    .await;
    assert_eq!(caught_up.first().map(|e| e.sequence), Some(resume));
    assert!(
        caught_up
            .windows(2)
            .all(|w| w[1].sequence == w[0].sequence + 1),
        "resumed without a gap"
    );
    drop(resumed);
    live.stop();
    plegd.stop();
    cri.remove_pod(&pod).await.unwrap();
}
