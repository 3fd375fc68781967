//! plegd in polling mode against the real containerd, through both backends: the exact
//! per-container event sequences of start, kill -9, exit code, restart and removal; health
//! when the runtime hangs; start-up while the runtime is not there yet.

mod support;

use std::time::Duration;

use k8s_cri::v1::ContainerState;
use plegd::{daemon, runtime::RuntimeKind};
use plegd_tests::{
    ContainerdOptions, Node, PrivateContainerd,
    cri::{ContainerSpec, Cri},
    native::{Native, NativeSpec},
};
use support::{RunningPlegd, config, types_by_container};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(30);
const PERIOD: Duration = Duration::from_millis(100);

/// A container that runs until the test creates /tmp/go inside it, then exits with 3.
fn exits_3_on_signal(name: &str) -> ContainerSpec {
    ContainerSpec::shell(name, "while [ ! -e /tmp/go ]; do sleep 0.05; done; exit 3")
}

async fn lifecycle(kind: RuntimeKind) {
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let mut plegd = RunningPlegd::start(config(kind, &containerd.socket(), PERIOD)).await;

    let pod = cri.run_pod("life").await.unwrap();
    let killed = cri
        .run_container(&pod, &ContainerSpec::sleeper("killed"))
        .await
        .unwrap();
    let exits = cri
        .run_container(&pod, &exits_3_on_signal("exits"))
        .await
        .unwrap();
    for id in [&pod.id, &killed, &exits] {
        plegd
            .wait_container(id, &["ContainerStarted"], DEADLINE)
            .await;
    }
    let started = plegd.last_of(&killed);
    assert_eq!(started["pod_uid"], pod.uid);
    assert_eq!(started["pod_namespace"], pod.namespace);
    assert_eq!(started["pod_name"], pod.name);
    assert_eq!(started["container_name"], "killed");
    assert_eq!(started["sources"], serde_json::json!(["relist"]));
    assert_eq!(plegd.last_of(&pod.id)["container_name"], "");

    // kill -9 of the init process.
    tasks.kill_init(&killed).await.unwrap();
    plegd
        .wait_container(&killed, &["ContainerStarted", "ContainerDied"], DEADLINE)
        .await;
    assert_eq!(plegd.last_of(&killed)["exit_code"], 137);

    // A chosen exit code.
    let pid = tasks.init_pid(&exits).await.unwrap();
    std::fs::write(format!("/proc/{pid}/root/tmp/go"), "").unwrap();
    plegd
        .wait_container(&exits, &["ContainerStarted", "ContainerDied"], DEADLINE)
        .await;
    assert_eq!(plegd.last_of(&exits)["exit_code"], 3);

    // kubelet's restart: a new container of the same name, next attempt; the old one removed.
    let restarted = cri
        .run_container(&pod, &ContainerSpec::sleeper("killed").restarted())
        .await
        .unwrap();
    plegd
        .wait_container(&restarted, &["ContainerStarted"], DEADLINE)
        .await;
    cri.remove_container(&killed).await.unwrap();
    plegd
        .wait_container(
            &killed,
            &["ContainerStarted", "ContainerDied", "ContainerRemoved"],
            DEADLINE,
        )
        .await;

    // The pod goes: running containers die then go, the exited one just goes.
    cri.remove_pod(&pod).await.unwrap();
    for (id, expected) in [
        (
            &pod.id,
            &["ContainerStarted", "ContainerDied", "ContainerRemoved"][..],
        ),
        (
            &restarted,
            &["ContainerStarted", "ContainerDied", "ContainerRemoved"][..],
        ),
        (
            &exits,
            &["ContainerStarted", "ContainerDied", "ContainerRemoved"][..],
        ),
    ] {
        plegd.wait_container(id, expected, DEADLINE).await;
    }

    // Nothing else, nothing twice, in sequence order.
    plegd.drain(PERIOD * 5).await;
    let by_container = types_by_container(&plegd.events);
    assert_eq!(by_container.len(), 4, "{by_container:#?}");
    assert_eq!(
        by_container[&killed],
        ["ContainerStarted", "ContainerDied", "ContainerRemoved"]
    );
    for id in [&pod.id, &restarted, &exits] {
        assert_eq!(
            by_container[id.as_str()],
            ["ContainerStarted", "ContainerDied", "ContainerRemoved"]
        );
    }
    let sequences: Vec<u64> = plegd
        .events
        .iter()
        .map(|e| e["sequence"].as_u64().unwrap())
        .collect();
    assert!(
        sequences.windows(2).all(|w| w[1] == w[0] + 1),
        "{sequences:?}"
    );
    plegd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_backend_emits_kubelet_event_sequences() {
    lifecycle(RuntimeKind::Cri).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_backend_emits_kubelet_event_sequences() {
    lifecycle(RuntimeKind::Containerd).await;
}

/// Containers made through containerd's own API are pods of their own for the containerd
/// backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_backend_sees_native_containers_as_pods() {
    let containerd = PrivateContainerd::start(&ContainerdOptions::unique())
        .await
        .unwrap();
    let mut plegd = RunningPlegd::start(config(
        RuntimeKind::Containerd,
        &containerd.socket(),
        PERIOD,
    ))
    .await;
    let native = Native::connect(&containerd).await.unwrap();
    native
        .run("solo", &NativeSpec::shell("exec sleep 2147483647"))
        .await
        .unwrap();
    plegd
        .wait_container("solo", &["ContainerStarted"], DEADLINE)
        .await;
    assert_eq!(plegd.last_of("solo")["pod_uid"], "plegd-native/solo");

    native.kill("solo", 9).await.unwrap();
    assert_eq!(native.wait("solo").await.unwrap(), 137);
    plegd
        .wait_container("solo", &["ContainerStarted", "ContainerDied"], DEADLINE)
        .await;
    assert_eq!(plegd.last_of("solo")["exit_code"], 137);
    native.remove("solo").await.unwrap();
    plegd
        .wait_container(
            "solo",
            &["ContainerStarted", "ContainerDied", "ContainerRemoved"],
            DEADLINE,
        )
        .await;
    plegd.stop().await;
}

/// Started before the runtime, plegd keeps trying and connects once the socket answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_before_the_runtime_retries_until_it_answers() {
    let options = ContainerdOptions::unique();
    let socket = options.base_dir.join(&options.name).join("containerd.sock");
    let settings = config(RuntimeKind::Cri, &socket, PERIOD);
    let shutdown = CancellationToken::new();
    let connecting = tokio::spawn({
        let (settings, shutdown) = (settings.clone(), shutdown.clone());
        async move { daemon::connect(&settings, &shutdown).await }
    });
    // Long enough for a failed first attempt (there is no socket at all yet).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !connecting.is_finished(),
        "connect gave up or succeeded without a runtime"
    );

    let containerd = PrivateContainerd::start(&options).await.unwrap();
    let runtime = tokio::time::timeout(DEADLINE, connecting)
        .await
        .expect("connected once the runtime is up")
        .unwrap()
        .expect("no fatal error")
        .expect("not shut down");
    let mut plegd = RunningPlegd::start_with(runtime, settings, shutdown).await;
    let cri = Cri::connect(&containerd).await.unwrap();
    let pod = cri.run_pod("late").await.unwrap();
    plegd
        .wait_container(&pod.id, &["ContainerStarted"], DEADLINE)
        .await;
    let state = cri.list_containers().await.unwrap();
    assert!(
        state
            .iter()
            .all(|c| c.state != ContainerState::ContainerUnknown as i32)
    );
    plegd.stop().await;
}
