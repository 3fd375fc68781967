//! The demo behind `cargo xtask demo`: plegd runs against a private containerd while real
//! containers start, get killed, exit, run out of memory, restart and go. plegd's events go to
//! stdout, and so do the pod syncs a `plegd watch --pod-syncs` beside it receives; the
//! narration goes to stderr.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::Context as _;
use k8s_cri::v1::ContainerState;

use crate::{
    ContainerdOptions, PrivateContainerd,
    containerd::CRI_NAMESPACE,
    cri::{ContainerSpec, Cri},
    native::Native,
    process,
};

const STEP_TIMEOUT: Duration = Duration::from_secs(30);

fn say(text: &str) {
    eprintln!("\n### {text}");
}

/// Runs the demo with the plegd binary at `plegd`; `pause` is how long to let plegd catch up
/// between steps (a relist period plus margin).
pub async fn run(plegd: &Path, pause: Duration) -> anyhow::Result<()> {
    say("starting a private containerd (config, state and sockets in $TMPDIR/plegd-harness)");
    let containerd = PrivateContainerd::start(&ContainerdOptions::named("demo")).await?;
    let socket = containerd.socket();
    eprintln!("    socket {}", socket.display());

    say(&format!(
        "starting plegd run --runtime-endpoint {} (auto mode: eBPF and containerd events say \
         where to look; a full relist every 1s, slowed to 30s while they are connected)",
        socket.display()
    ));
    // The API on a socket of the demo's own, beside the private containerd's, not the node's.
    let api = socket.with_file_name("plegd.sock");
    let _plegd = process::Terminating(
        Command::new(plegd)
            // Each demo starts afresh: no run saved by the last one.
            .args(["run", "--relist-period", "1s", "--state-dir", "none"])
            .arg("--runtime-endpoint")
            .arg(&socket)
            .arg("--socket")
            .arg(&api)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", plegd.display()))?,
    );
    let cri = Cri::connect(&containerd).await?;
    let tasks = Native::connect_in(&containerd, CRI_NAMESPACE).await?;
    tokio::time::sleep(pause).await;

    say(
        "starting plegd watch --pod-syncs beside it: each pod's whole status when it changed \
         (READ AT ... REASON event), every minute (resync), and once when it is gone (removed)",
    );
    let _syncs = process::Terminating(
        Command::new(plegd)
            .args(["watch", "--pod-syncs", "--socket"])
            .arg(&api)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} watch", plegd.display()))?,
    );

    say("pod web: sandbox + containers app and sidecar start");
    let pod = cri.run_pod("web").await?;
    let app = cri
        .run_container(&pod, &ContainerSpec::sleeper("app"))
        .await?;
    cri.run_container(&pod, &ContainerSpec::sleeper("sidecar"))
        .await?;
    cri.wait_state(&app, ContainerState::ContainerRunning, STEP_TIMEOUT)
        .await?;
    tokio::time::sleep(pause).await;

    say("kill -9 of app's init process: ContainerDied, exit 137");
    tasks.kill_init(&app).await?;
    cri.wait_state(&app, ContainerState::ContainerExited, STEP_TIMEOUT)
        .await?;
    tokio::time::sleep(pause).await;

    say("kubelet would restart it: app, attempt 1, starts");
    cri.run_container(&pod, &ContainerSpec::sleeper("app").restarted())
        .await?;
    tokio::time::sleep(pause).await;

    say("container job runs `sleep 1.5; exit 3`: ContainerStarted, then ContainerDied exit 3");
    let job = cri
        .run_container(&pod, &ContainerSpec::shell("job", "sleep 1.5; exit 3"))
        .await?;
    cri.wait_state(&job, ContainerState::ContainerExited, STEP_TIMEOUT)
        .await?;
    tokio::time::sleep(pause).await;

    say("container hog's init allocates past its 32 MiB limit: ContainerDied, OOMKilled");
    let hog = cri
        .run_container(&pod, &ContainerSpec::oom_init("hog"))
        .await?;
    cri.wait_state(&hog, ContainerState::ContainerExited, STEP_TIMEOUT)
        .await?;
    tokio::time::sleep(pause).await;

    say("the exited containers are removed: ContainerRemoved");
    for id in [&app, &job, &hog] {
        cri.remove_container(id).await?;
    }
    tokio::time::sleep(pause).await;

    say("pod web is stopped and removed: every container and the sandbox die and go");
    cri.remove_pod(&pod).await?;
    tokio::time::sleep(pause).await;

    say("done: stopping plegd and the private containerd");
    Ok(())
}
