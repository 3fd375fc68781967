//! A Node client (@grpc/grpc-js from npm, with @grpc/proto-loader reading plegd.proto at run
//! time; `cargo xtask setup` installs both) on the unix socket with its default settings:
//! ListPods, GetHealth, and a Watch that sees a `kill -9` of a real container.

mod support;

use std::{path::Path, process::Stdio, time::Duration};

use plegd::runtime::RuntimeKind;
use plegd_tests::{Node, process::setup_tool};
use support::{RunningPlegd, config};
use tokio::io::{AsyncBufReadExt as _, BufReader};

const DEADLINE: Duration = Duration::from_secs(60);
/// Where google/protobuf/timestamp.proto comes from (python3-grpc-tools).
const WELL_KNOWN: &str = "/usr/lib/python3/dist-packages/grpc_tools/_proto";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_js_client_lists_checks_health_and_watches_a_kill() {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let modules = setup_tool("grpc-js/node_modules");
    setup_tool("grpc-js/node_modules/@grpc/grpc-js");
    let Node {
        containerd,
        cri,
        tasks,
    } = Node::start().await.unwrap();
    let settings = config(
        RuntimeKind::Cri,
        &containerd.socket(),
        Duration::from_millis(100),
    );
    let (mut plegd, api) = RunningPlegd::start_serving_api(settings).await;
    let pod = cri.run_pod("noded").await.unwrap();
    let app = support::started_sleeper(&mut plegd, &cri, &pod, "app", DEADLINE).await;

    let mut client = tokio::process::Command::new("node")
        .arg(repository.join("tests/tests/js/plegd_client.js"))
        .arg(&api.socket)
        .arg(repository.join("proto/proto"))
        .arg(WELL_KNOWN)
        .arg(&app)
        .env("NODE_PATH", &modules)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting node");
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let mut said = Vec::new();
    while said.last().map(String::as_str) != Some("watching") {
        match tokio::time::timeout(DEADLINE, lines.next_line()).await {
            Ok(Ok(Some(line))) => said.push(line),
            _ => {
                let output = client.wait_with_output().await.unwrap();
                panic!(
                    "the Node client stopped after {said:?}: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
    }
    assert_eq!(said[0], "listed 1", "{said:?}");
    assert_eq!(said[1], "healthy", "{said:?}");
    tasks.kill_init(&app).await.unwrap();
    let died = tokio::time::timeout(DEADLINE, lines.next_line())
        .await
        .expect("the Node client sees the death in time")
        .unwrap();
    assert_eq!(died.as_deref(), Some("died 137"));
    plegd.stop().await;
    api.stopped();
}
