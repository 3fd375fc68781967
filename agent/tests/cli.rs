//! The `plegd` binary end to end: `plegd run` against a private containerd, and `plegd watch`,
//! `plegd pods` and `plegd health` talking to it through its socket, across a clean restart
//! (the run continues) and a crash (a new run).

// The 80-line ceiling (clippy.toml) is for the daemon's code: a scenario reads best whole.
#![allow(clippy::too_many_lines)]

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use k8s_cri::v1::ContainerState;
use plegd_tests::{
    ContainerdOptions, PrivateContainerd,
    containerd::CRI_NAMESPACE,
    cri::{ContainerSpec, Cri},
    native::Native,
    process::Terminating,
};
use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt as _, AsyncRead, BufReader},
    sync::mpsc,
};

const PLEGD: &str = env!("CARGO_BIN_EXE_plegd");
const DEADLINE: Duration = Duration::from_secs(30);

/// `plegd run` on `socket`, its state in `socket`'s directory, its logs in `log`.
fn start_daemon(containerd: &PrivateContainerd, socket: &Path, log: &Path) -> Terminating {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("daemon log file");
    let child = std::process::Command::new(PLEGD)
        .args(["run", "--relist-period", "200ms", "--runtime-endpoint"])
        .arg(containerd.socket())
        .arg("--socket")
        .arg(socket)
        .arg("--state-dir")
        .arg(socket.with_file_name("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("plegd run starts");
    Terminating(child)
}

/// A one-shot subcommand: (exit code, stdout, stderr).
async fn plegd(args: &[&str], socket: &Path) -> (i32, String, String) {
    let output = tokio::time::timeout(
        DEADLINE,
        tokio::process::Command::new(PLEGD)
            .args(args)
            .arg("--socket")
            .arg(socket)
            .output(),
    )
    .await
    .expect("the command finishes")
    .expect("the command runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn wait_healthy(socket: &Path) -> String {
    plegd_tests::wait::until("plegd health says healthy", DEADLINE, || async {
        let (code, out, err) = plegd(&["health"], socket).await;
        match code {
            0 => Ok(Some(out)),
            _ => Err(format!("exit code {code}: {out}{err}")),
        }
    })
    .await
    .unwrap()
}

/// `plegd pods`' whole output and the row of `container`.
async fn pods_row(socket: &Path, container: &str) -> (String, String) {
    let (code, pods, err) = plegd(&["pods"], socket).await;
    assert_eq!(code, 0, "{err}");
    let row = pods
        .lines()
        .find(|l| l.contains(&container[..12]))
        .unwrap_or_else(|| panic!("no row for {container} in\n{pods}"))
        .to_owned();
    (pods, row)
}

/// A line of `plegd watch`: an event on stdout or a note on stderr.
#[derive(Debug)]
enum Line {
    Event(Value),
    Note(String),
}

/// A running `plegd watch --output json`.
struct Watch {
    _child: Terminating,
    lines: mpsc::UnboundedReceiver<Line>,
    read: Vec<Line>,
}

impl Watch {
    fn start(socket: &Path) -> Self {
        let mut child = std::process::Command::new(PLEGD)
            .args(["watch", "--output", "json", "--from", "1", "--socket"])
            .arg(socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("plegd watch starts");
        let (tx, lines) = mpsc::unbounded_channel();
        let stdout = tokio::process::ChildStdout::from_std(child.stdout.take().unwrap()).unwrap();
        let stderr = tokio::process::ChildStderr::from_std(child.stderr.take().unwrap()).unwrap();
        forward(stdout, tx.clone(), |line| {
            Line::Event(serde_json::from_str(&line).expect("stdout lines are JSON"))
        });
        forward(stderr, tx, Line::Note);
        Self {
            _child: Terminating(child),
            lines,
            read: Vec::new(),
        }
    }

    /// Reads lines until one satisfies `wanted`, which it returns.
    async fn until(&mut self, what: &str, wanted: impl Fn(&Line) -> bool) -> &Line {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.recv())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting for {what}; read {:#?}", self.read))
                .unwrap_or_else(|| {
                    panic!("plegd watch ended before {what}; read {:#?}", self.read)
                });
            let done = wanted(&line);
            self.read.push(line);
            if done {
                return self.read.last().unwrap();
            }
        }
    }

    async fn event(&mut self, container: &str, event_type: &str) -> Value {
        let what = format!("{event_type} of {container}");
        match self
            .until(&what, |line| {
                matches!(line, Line::Event(e)
                    if e["container_id"] == container && e["type"] == event_type)
            })
            .await
        {
            Line::Event(e) => e.clone(),
            Line::Note(_) => unreachable!(),
        }
    }

    /// The events read so far.
    fn events(&self) -> impl Iterator<Item = &Value> {
        self.read.iter().filter_map(|line| match line {
            Line::Event(e) => Some(e),
            Line::Note(_) => None,
        })
    }

    async fn note(&mut self, containing: &str) {
        self.until(
            containing,
            |line| matches!(line, Line::Note(n) if n.contains(containing)),
        )
        .await;
    }
}

fn forward<R: AsyncRead + Unpin + Send + 'static>(
    from: R,
    to: mpsc::UnboundedSender<Line>,
    line: impl Fn(String) -> Line + Send + 'static,
) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(from).lines();
        while let Ok(Some(text)) = lines.next_line().await {
            if to.send(line(text)).is_err() {
                return;
            }
        }
    });
}

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("run/plegd.sock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_pods_and_health_follow_a_live_daemon_across_a_restart() {
    let containerd = PrivateContainerd::start(&ContainerdOptions::unique())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let log = dir.path().join("plegd.log");

    // Nobody there yet: a clear message and exit code 2 (unreachable).
    let (code, _, err) = plegd(&["health"], &socket).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("cannot reach plegd at") && err.contains("No such file or directory"),
        "{err}"
    );

    let daemon = start_daemon(&containerd, &socket, &log);
    let health = wait_healthy(&socket).await;
    assert!(health.starts_with("pleg: healthy (run "), "{health}");
    for source in ["ebpf: ", "containerd: ", "cri-events: "] {
        assert!(health.contains(source), "{health}");
    }
    let (code, health, err) = plegd(&["health", "--output", "json"], &socket).await;
    assert_eq!(code, 0, "{err}");
    let health: Value = serde_json::from_str(&health).expect("one JSON object");
    assert_eq!(health["healthy"], true);
    let sources: Vec<&str> = health["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, ["ebpf", "containerd", "cri-events"], "{health}");

    let mut watch = Watch::start(&socket);
    let cri = Cri::connect(&containerd).await.unwrap();
    let pod = cri.run_pod("cli").await.unwrap();
    let app = cri
        .run_container(&pod, &ContainerSpec::sleeper("app"))
        .await
        .unwrap();
    let started = watch.event(&app, "ContainerStarted").await;
    assert_eq!(started["pod_name"], "cli");
    assert_eq!(started["container_name"], "app");
    let first_run = started["run_id"].as_str().unwrap().to_owned();

    let (pods, app_row) = pods_row(&socket, &app).await;
    assert!(
        app_row.contains("/cli ") && app_row.contains(" app "),
        "{app_row}"
    );
    assert!(app_row.contains("running"), "{app_row}");
    assert!(
        pods.lines()
            .last()
            .unwrap()
            .contains(&format!("run {first_run}")),
        "{pods}"
    );
    // The sandbox's start can be told after the app's: the kernel and containerd see it
    // while the CRI plugin is still making it, and its reading is tried again later. Its
    // event, once told, is in the listing (the cache is written before events go out).
    let sandbox_seen = |watch: &Watch| {
        watch
            .events()
            .any(|e| e["container_id"] == pod.id.as_str() && e["type"] == "ContainerStarted")
    };
    if !sandbox_seen(&watch) {
        watch.event(&pod.id, "ContainerStarted").await;
    }
    let (code, pods, err) = plegd(&["pods", "--output", "json"], &socket).await;
    assert_eq!(code, 0, "{err}");
    let pods: Value = serde_json::from_str(&pods).expect("one JSON object");
    assert_eq!(pods["run_id"], first_run.as_str());
    let cli = pods["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "cli")
        .unwrap_or_else(|| panic!("pod cli in {pods}"));
    let containers = cli["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 2, "{cli}");
    let app_json = containers.iter().find(|c| c["id"] == app.as_str()).unwrap();
    assert_eq!(
        (
            &app_json["name"],
            &app_json["state"],
            &app_json["exit_code"]
        ),
        (&Value::from("app"), &Value::from("running"), &Value::Null)
    );
    assert!(containers.iter().any(|c| c["sandbox"] == true), "{cli}");

    // The daemon stops: watch says so and keeps trying.
    let status = daemon.stop(Duration::from_secs(10)).unwrap();
    assert!(status.success(), "plegd run exited with {status}");
    watch.note("retrying").await;
    let (code, _, _) = plegd(&["health"], &socket).await;
    assert_eq!(code, 2);

    // While it is down the container dies (containerd records the exit on its own time; the
    // test waits for that so the new run's first listing must show it).
    Native::connect_in(&containerd, CRI_NAMESPACE)
        .await
        .unwrap()
        .kill_init(&app)
        .await
        .unwrap();
    cri.wait_state(&app, ContainerState::ContainerExited, DEADLINE)
        .await
        .expect("containerd's CRI records the exit");

    // Started again, plegd continues the run it saved: the death is the one new event, right
    // after the last one watch printed, and nothing else of the unchanged pod is repeated.
    let mut daemon = start_daemon(&containerd, &socket, &log);
    let died = watch.event(&app, "ContainerDied").await;
    assert_eq!(died["run_id"], first_run.as_str());
    assert_eq!(died["exit_code"], 137);
    let printed: Vec<&Value> = watch.events().collect();
    let sequences: Vec<u64> = printed
        .iter()
        .map(|e| e["sequence"].as_u64().unwrap())
        .collect();
    assert!(
        sequences.windows(2).all(|w| w[1] == w[0] + 1),
        "no gap, no repeat across the restart: {sequences:?}"
    );
    assert_eq!(
        printed
            .iter()
            .filter(|e| e["type"] == "ContainerStarted")
            .count(),
        2,
        "the sandbox and app started once: {printed:#?}"
    );
    let (_, app_row) = pods_row(&socket, &app).await;
    assert!(
        app_row.contains("exited") && app_row.contains("137"),
        "{app_row}"
    );

    // A crash saves nothing: the next start is a new run, and watch resyncs to it.
    daemon.0.kill().unwrap();
    daemon.0.wait().unwrap();
    let _daemon = start_daemon(&containerd, &socket, &log);
    watch.note("resynced").await;
    let sidecar = cri
        .run_container(&pod, &ContainerSpec::sleeper("sidecar"))
        .await
        .unwrap();
    let started = watch.event(&sidecar, "ContainerStarted").await;
    assert_ne!(started["run_id"], first_run.as_str());
}
