//! A Python grpcio client (C-core, Debian's python3-grpcio) on the unix socket with its
//! default channel settings: ListPods, a Watch that sees a `kill -9` of a real container,
//! SyncPods showing the container's pod with it exited, and grpc.health.v1 Check. Stubs are generated from plegd.proto at test time with Debian's
//! protoc and grpc_python_plugin (protobuf-compiler-grpc); google/protobuf/timestamp.proto
//! comes from python3-grpc-tools. All are installed by `cargo xtask setup`.

mod support;

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use plegd::runtime::RuntimeKind;
use plegd_tests::{Node, cri::ContainerSpec};
use support::{RunningPlegd, config};
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// Debian's Python, where its python3-grpcio lives (a `python3` earlier in PATH, such as a
/// pyenv shim, may not have it).
const PYTHON: &str = "/usr/bin/python3";
const GRPC_PYTHON_PLUGIN: &str = "/usr/bin/grpc_python_plugin";
const DEADLINE: Duration = Duration::from_secs(60);

/// Generates the Python stubs of plegd.v1 into `out`.
fn generate_stubs(out: &Path) {
    let well_known = Command::new(PYTHON)
        .args([
            "-c",
            "import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), '_proto'))",
        ])
        .output()
        .expect("running /usr/bin/python3");
    assert!(
        well_known.status.success(),
        "python3-grpc-tools missing (run `cargo xtask setup`): {}",
        String::from_utf8_lossy(&well_known.stderr)
    );
    let well_known = String::from_utf8(well_known.stdout).unwrap();
    let protos = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto");
    let generated = Command::new("protoc")
        .arg("-I")
        .arg(&protos)
        .arg("-I")
        .arg(well_known.trim())
        .arg(format!(
            "--plugin=protoc-gen-grpc_python={GRPC_PYTHON_PLUGIN}"
        ))
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpc_python_out={}", out.display()))
        .arg("plegd/v1/plegd.proto")
        .output()
        .expect("running protoc");
    assert!(
        generated.status.success(),
        "generating the Python stubs (protobuf-compiler-grpc missing? run `cargo xtask setup`): {}",
        String::from_utf8_lossy(&generated.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_grpcio_client_lists_watches_a_kill_syncs_and_checks_health() {
    let stubs = tempfile::tempdir().unwrap();
    generate_stubs(stubs.path());

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
    let pod = cri.run_pod("pythonic").await.unwrap();
    let app = cri
        .run_container(&pod, &ContainerSpec::sleeper("app"))
        .await
        .unwrap();
    plegd
        .wait_container(&app, &["ContainerStarted"], DEADLINE)
        .await;

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/plegd_client.py");
    let mut client = tokio::process::Command::new(PYTHON)
        .arg(&script)
        .arg(&api.socket)
        .arg(stubs.path())
        .arg(&app)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting the Python client");
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let mut said = Vec::new();
    let mut next_line = async || {
        let line = tokio::time::timeout(DEADLINE, lines.next_line())
            .await
            .expect("the Python client answers in time")
            .unwrap();
        said.push(line.clone());
        line
    };
    let listed = next_line().await;
    let ready = next_line().await;
    if ready.as_deref() != Some("ready") {
        let output = client.wait_with_output().await.unwrap();
        panic!(
            "the Python client failed after {listed:?}, {ready:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    tasks.kill_init(&app).await.unwrap();
    let died = next_line().await;
    let synced = next_line().await;
    let health = next_line().await;
    let output = tokio::time::timeout(DEADLINE, client.wait_with_output())
        .await
        .expect("the Python client exits")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said:?}\n{stderr}");
    eprintln!("Python client: {said:?}");

    let listed = listed.unwrap();
    let words: Vec<&str> = listed.split(' ').collect();
    assert_eq!(words[0], "listed", "{listed}");
    assert!(words[1].parse::<usize>().unwrap() >= 1, "{listed}");
    assert_eq!(words[2], plegd.shared.bus.run_id().to_string(), "{listed}");
    // SIGKILL: 137, confirmed at containerd's task record.
    let died = died.unwrap();
    let words: Vec<&str> = died.split(' ').collect();
    assert_eq!(words[0], "died", "{died}");
    assert_eq!(words[3], "137", "{died}");
    plegd
        .wait_container(&app, &["ContainerStarted", "ContainerDied"], DEADLINE)
        .await;
    assert_eq!(
        words[1],
        plegd.last_of(&app)["sequence"].to_string(),
        "the API and stdout number the death alike"
    );
    // The pod's level after the death: exited 137, reflecting the death's event or a later one.
    let synced = synced.unwrap();
    let level: Vec<&str> = synced.split(' ').collect();
    assert_eq!(level[0], "synced", "{synced}");
    assert!(["RESYNC", "EVENT"].contains(&level[1]), "{synced}");
    assert_eq!((level[2], level[3]), ("EXITED", "137"), "{synced}");
    assert!(
        level[4].parse::<u64>().unwrap() >= words[1].parse::<u64>().unwrap(),
        "{synced} after {died}"
    );
    assert_eq!(health.as_deref(), Some("health SERVING"));
    plegd.stop().await;
    api.stopped().await;
}
