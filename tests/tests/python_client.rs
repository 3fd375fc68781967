//! A Python grpcio client (C-core, Debian's python3-grpcio) on the unix socket with its
//! default channel settings: ListPods, a Watch that sees a `kill -9` of a real container,
//! SyncPods showing the container's pod with it exited, and grpc.health.v1 Check. Stubs are generated from plegd.proto at test time with Debian's
//! protoc and grpc_python_plugin (protobuf-compiler-grpc); google/protobuf/timestamp.proto
//! comes from python3-grpc-tools. All are installed by `cargo xtask setup`.
//!
//! README's snippet ("Clients in other languages") runs too, unchanged but for the socket's
//! path, with Debian's grpcio and with the current grpcio from PyPI, installed by pip into a
//! venv under the target directory (kept: reruns reuse it). Without the registry that run is
//! skipped, and says so.

mod support;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use plegd::runtime::RuntimeKind;
use plegd_tests::{Node, cri::ContainerSpec};
use support::{RunningPlegd, config};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};

/// Debian's Python, where its python3-grpcio lives (a `python3` earlier in PATH, such as a
/// pyenv shim, may not have it).
const PYTHON: &str = "/usr/bin/python3";
const GRPC_PYTHON_PLUGIN: &str = "/usr/bin/grpc_python_plugin";
const DEADLINE: Duration = Duration::from_secs(60);

/// The venv holding PyPI's grpcio, kept across runs.
const PYPI_VENV: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/python-grpcio-venv");
/// The socket path README's snippet dials; the test's own replaces it.
const README_SOCKET: &str = "/run/plegd/plegd.sock";

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
    let app = support::started_sleeper(&mut plegd, &cri, &pod, "app", DEADLINE).await;

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
    assert_eq!(
        words[2],
        plegd.shared.pleg.events().run_id().to_string(),
        "{listed}"
    );
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
    api.stopped();
}

/// The venv's Python with PyPI's current grpcio and grpcio-tools: made, and pip-installed,
/// once; pip's error output when it cannot install them.
fn pypi_grpcio() -> Result<PathBuf, String> {
    let venv = Path::new(PYPI_VENV);
    let python = venv.join("bin/python");
    let ready = || {
        Command::new(&python)
            .args(["-c", "import grpc, grpc_tools"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready() {
        return Ok(python);
    }
    let made = Command::new(PYTHON)
        .args(["-m", "venv", "--clear"])
        .arg(venv)
        .output()
        .expect("running python3 -m venv");
    assert!(
        made.status.success(),
        "python3 -m venv failed (python3-venv missing? run `cargo xtask setup`): {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let installed = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--upgrade", "grpcio", "grpcio-tools"])
        .output()
        .expect("running the venv's pip");
    if !installed.status.success() {
        return Err(String::from_utf8_lossy(&installed.stderr).into_owned());
    }
    assert!(
        ready(),
        "grpcio installed but not importable in {}",
        venv.display()
    );
    Ok(python)
}

/// Generates the stubs with `python`'s own grpcio-tools (stubs from Debian's protoc may be
/// older than a current protobuf runtime accepts).
fn generate_stubs_with(python: &Path, out: &Path) {
    let protos = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto");
    let generated = Command::new(python)
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(&protos)
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpc_python_out={}", out.display()))
        .arg("plegd/v1/plegd.proto")
        .output()
        .expect("running grpc_tools.protoc");
    assert!(
        generated.status.success(),
        "generating the Python stubs with grpc_tools.protoc: {}",
        String::from_utf8_lossy(&generated.stderr)
    );
}

/// README's Python snippet, as README has it.
fn readme_snippet() -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let section = readme
        .split_once("### Clients in other languages")
        .expect("README has a section \"Clients in other languages\"")
        .1;
    let code = section
        .split_once("```python\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the section has a Python snippet")
        .0;
    assert!(
        code.contains(README_SOCKET),
        "README's snippet dials {README_SOCKET}"
    );
    code.to_owned()
}

fn grpcio_version(python: &Path) -> String {
    let output = Command::new(python)
        .args(["-c", "import grpc; print(grpc.__version__)"])
        .output()
        .expect("running python");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// README's snippet under `python` (stubs in `stubs`) against a plegd on the harness: it must
/// print the ContainerStarted of a container started after the snippet did. Containers are
/// started one after another until one is printed: one started before the snippet's
/// ListPods answered is in the listing, not in the watch.
async fn readme_snippet_prints_events(python: &Path, stubs: &Path) {
    let Node {
        containerd, cri, ..
    } = Node::start().await.unwrap();
    let settings = config(
        RuntimeKind::Cri,
        &containerd.socket(),
        Duration::from_millis(100),
    );
    let (plegd, api) = RunningPlegd::start_serving_api(settings).await;
    let program = format!(
        "import sys\nsys.path.insert(0, {stubs:?})\nimport grpc\n\
         from plegd.v1 import plegd_pb2, plegd_pb2_grpc\n{}",
        readme_snippet().replace(README_SOCKET, &api.socket.display().to_string()),
        stubs = stubs.display().to_string(),
    );
    let mut client = tokio::process::Command::new(python)
        .args(["-u", "-c", &program])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting README's snippet");
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let (mut printed, mut event) = (String::new(), String::new());
    let pod = cri.run_pod("snippet").await.unwrap();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut n = 0;
    'containers: loop {
        let id = cri
            .run_container(&pod, &ContainerSpec::sleeper(&format!("app-{n}")))
            .await
            .unwrap();
        n += 1;
        let this_one = (tokio::time::Instant::now() + Duration::from_secs(3)).min(deadline);
        while let Ok(line) = tokio::time::timeout_at(this_one, lines.next_line()).await {
            let Some(line) = line.unwrap() else {
                let mut stderr = String::new();
                client
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut stderr)
                    .await
                    .unwrap();
                panic!(
                    "README's snippet (grpcio {}) ended: {stderr}",
                    grpcio_version(python)
                );
            };
            printed.push_str(&line);
            printed.push('\n');
            // print(event) ends each event with an empty line.
            if line.is_empty() && event.contains(&id) {
                break 'containers;
            }
            if line.is_empty() {
                event.clear();
            } else {
                event.push_str(&line);
                event.push('\n');
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "README's snippet (grpcio {}) printed no event of {n} containers started after \
             it: {printed}",
            grpcio_version(python)
        );
    }
    eprintln!(
        "README's snippet with grpcio {} printed: {printed}",
        grpcio_version(python)
    );
    assert!(event.contains("type: CONTAINER_STARTED"), "{event}");
    client.kill().await.unwrap();
    plegd.stop().await;
    api.stopped();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readmes_python_snippet_works_with_debians_grpcio() {
    let stubs = tempfile::tempdir().unwrap();
    generate_stubs(stubs.path());
    readme_snippet_prints_events(Path::new(PYTHON), stubs.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readmes_python_snippet_works_with_current_grpcio_from_pypi() {
    let python = match pypi_grpcio() {
        Ok(python) => python,
        Err(pip) => {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "skipping the PyPI grpcio run: pip cannot install grpcio from the registry: \
                 {pip}"
            );
            return;
        }
    };
    let stubs = tempfile::tempdir().unwrap();
    generate_stubs_with(&python, stubs.path());
    readme_snippet_prints_events(&python, stubs.path()).await;
}
