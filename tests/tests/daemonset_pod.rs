//! plegd run as deploy/kubernetes/daemonset.yaml runs it, through CRI on the harness's
//! containerd: its image built locally and imported, its pod's host namespaces, security
//! context (capabilities, read-only root, no new privileges, seccomp), resources, arguments and
//! hostPath mounts all read from the manifest, never restated here. From the host, through the
//! socket of its /run/plegd mount and its metrics port, the test checks that it is ready (its
//! probes, run as kubelet runs them, pass, also while the metrics port is held by a crowd of
//! unended requests) and reports another pod's container starting and dying of a kill -9
//! that its eBPF probes saw.
//!
//! What differs from a cluster, and why: the harness has no CNI, so the pod runs on the host's
//! network (the manifest uses the pod network; plegd only listens on its metrics port); three
//! hostPaths point at the harness's instance instead of the node's: /run/containerd (the
//! harness's containerd socket directory), /run/plegd and /var/lib/plegd (temp dirs, so the
//! node's own plegd, if any, is left alone). Probes are kubelet's job: the test runs the
//! manifest's probe commands in the container through CRI ExecSync, as kubelet does.

mod support;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use k8s_cri::v1::{
    Capability, ContainerConfig, Int64Value, LinuxContainerResources, Mount, MountPropagation,
    PodSandboxConfig, SecurityProfile, security_profile::ProfileType,
};
use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{Container, PodSpec},
    },
    apimachinery::pkg::api::resource::Quantity,
};
use plegd_proto::v1::{
    EventType, GetHealthRequest, SourceState, TriggerSource, WatchRequest, observation,
};
use plegd_tests::{
    Node,
    containerd::CRI_NAMESPACE,
    cri::{ContainerSpec, PidMode},
    image, wait,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_stream::StreamExt as _;

const MANIFEST: &str = "kubernetes/daemonset.yaml";
/// How long plegd may take from its container's start to ready (eBPF loaded, first relist).
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// How long an event may take to reach the watcher.
const EVENT_DEADLINE: Duration = Duration::from_secs(20);

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path)
}

/// The DaemonSet's pod spec and its (only) container.
fn daemonset_pod() -> (PodSpec, Container) {
    let path = deploy(MANIFEST);
    let text = std::fs::read_to_string(&path).unwrap();
    let daemonset: DaemonSet = serde_yaml::from_str(&text).unwrap();
    let pod = daemonset
        .spec
        .template
        .spec
        .expect("the DaemonSet has a pod spec");
    assert_eq!(pod.containers.len(), 1, "one container: plegd");
    let container = pod.containers[0].clone();
    (pod, container)
}

/// kubelet's conversion of a quantity: CPU in millicores, memory in bytes.
fn milli_cpu(quantity: &Quantity) -> i64 {
    let text = quantity.0.as_str();
    match text.strip_suffix('m') {
        Some(milli) => milli.parse().unwrap(),
        None => (text.parse::<f64>().unwrap() * 1000.0) as i64,
    }
}

fn bytes(quantity: &Quantity) -> i64 {
    let text = quantity.0.as_str();
    let units = [("Ki", 1i64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)];
    for (suffix, unit) in units {
        if let Some(n) = text.strip_suffix(suffix) {
            return n.parse::<i64>().unwrap() * unit;
        }
    }
    text.parse().unwrap()
}

/// The container's resources as kubelet gives them to CRI (cgroup v1 shares and quota).
fn cri_resources(container: &Container) -> LinuxContainerResources {
    let resources = container.resources.clone().unwrap_or_default();
    let requests = resources.requests.unwrap_or_default();
    let limits = resources.limits.unwrap_or_default();
    let period = 100_000;
    LinuxContainerResources {
        cpu_period: period,
        cpu_quota: limits
            .get("cpu")
            .map_or(0, |q| milli_cpu(q) * period / 1000),
        cpu_shares: requests
            .get("cpu")
            .map_or(2, |q| (milli_cpu(q) * 1024 / 1000).max(2)),
        memory_limit_in_bytes: limits.get("memory").map_or(0, bytes),
        ..Default::default()
    }
}

/// The container's hostPath mounts as CRI mounts, each host path through `host`.
fn cri_mounts(pod: &PodSpec, container: &Container, host: &BTreeMap<&str, PathBuf>) -> Vec<Mount> {
    let volumes = pod.volumes.clone().unwrap_or_default();
    container
        .volume_mounts
        .iter()
        .flatten()
        .map(|mount| {
            let volume = volumes
                .iter()
                .find(|v| v.name == mount.name)
                .unwrap_or_else(|| panic!("no volume {}", mount.name));
            let path = &volume
                .host_path
                .as_ref()
                .unwrap_or_else(|| {
                    panic!("volume {}: only hostPath volumes are mapped", volume.name)
                })
                .path;
            let host_path = host
                .get(path.as_str())
                .cloned()
                .unwrap_or_else(|| PathBuf::from(path));
            Mount {
                container_path: mount.mount_path.clone(),
                host_path: host_path.display().to_string(),
                readonly: mount.read_only.unwrap_or(false),
                propagation: MountPropagation::PropagationPrivate as i32,
                ..Default::default()
            }
        })
        .collect()
}

/// The container's securityContext as kubelet gives it to CRI.
fn cri_container(
    config: &mut ContainerConfig,
    pod: &PodSpec,
    container: &Container,
    mounts: Vec<Mount>,
) {
    let security = container.security_context.clone().unwrap_or_default();
    let capabilities = security.capabilities.clone().unwrap_or_default();
    let seccomp = security
        .seccomp_profile
        .as_ref()
        .or(pod
            .security_context
            .as_ref()
            .and_then(|s| s.seccomp_profile.as_ref()))
        .map(|profile| SecurityProfile {
            profile_type: match profile.type_.as_str() {
                "RuntimeDefault" => ProfileType::RuntimeDefault,
                "Unconfined" => ProfileType::Unconfined,
                other => panic!("seccomp profile {other} not mapped"),
            } as i32,
            localhost_ref: String::new(),
        })
        // kubelet's default without a profile.
        .or(Some(SecurityProfile {
            profile_type: ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        }));
    config.image.as_mut().unwrap().image = container.image.clone().unwrap();
    config.command = container.command.clone().unwrap_or_default();
    config.args = container.args.clone().unwrap_or_default();
    config.mounts = mounts;
    config.log_path = "plegd.log".into();
    let linux = config.linux.as_mut().unwrap();
    linux.resources = Some(cri_resources(container));
    let context = linux.security_context.as_mut().unwrap();
    context.privileged = security.privileged.unwrap_or(false);
    context.readonly_rootfs = security.read_only_root_filesystem.unwrap_or(false);
    context.no_new_privs = !security.allow_privilege_escalation.unwrap_or(true);
    context.run_as_user = security.run_as_user.map(|value| Int64Value { value });
    context.run_as_group = security.run_as_group.map(|value| Int64Value { value });
    context.capabilities = Some(Capability {
        add_capabilities: capabilities.add.unwrap_or_default(),
        drop_capabilities: capabilities.drop.unwrap_or_default(),
        add_ambient_capabilities: Vec::new(),
    });
    context.seccomp = seccomp;
}

/// `GET path` on `address`: the status code and body, or why not.
async fn http_get(address: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: plegd\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .context("no status line")?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plegd_runs_as_the_daemonsets_pod_and_reports_a_kill_its_probes_saw() {
    let started = Instant::now();
    let (pod_spec, container) = daemonset_pod();
    assert_eq!(pod_spec.host_pid, Some(true), "the test maps hostPID");
    let plegd = plegd_tests::process::plegd_binary().expect("the plegd binary");
    let node = Node::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tarball = dir.path().join("plegd.oci.tar");
    let image_name = container.image.clone().unwrap();
    // The debug binary's debug info (150 MiB) only slows hashing and importing: stripped with
    // binutils' strip (gcc's dependency) when it is there.
    let stripped = dir.path().join("plegd");
    let plegd = match Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&stripped)
        .arg(&plegd)
        .status()
    {
        Ok(status) if status.success() => stripped,
        _ => plegd,
    };
    let built = image::build_plegd_image(&plegd, &image_name, &tarball).unwrap();
    node.containerd
        .import_image(CRI_NAMESPACE, &built.tarball)
        .unwrap();
    println!(
        "image {image_name}: {:.1} MiB, imported in {:.1?} since start",
        built.size as f64 / f64::from(1 << 20),
        started.elapsed()
    );

    let (run, state, logs) = (
        dir.path().join("run"),
        dir.path().join("state"),
        dir.path().join("logs"),
    );
    for d in [&run, &state, &logs] {
        std::fs::create_dir_all(d).unwrap();
    }
    let runtime_dir = node.containerd.socket().parent().unwrap().to_owned();
    let host = BTreeMap::from([
        ("/run/containerd", runtime_dir),
        ("/run/plegd", run.clone()),
        ("/var/lib/plegd", state.clone()),
    ]);
    let mounts = cri_mounts(&pod_spec, &container, &host);
    let metrics = container
        .args
        .iter()
        .flatten()
        .find_map(|a| a.strip_prefix("--metrics-address="))
        .expect("the DaemonSet serves metrics")
        .replace("0.0.0.0", "127.0.0.1");
    if http_get(&metrics, "/healthz").await.is_ok() {
        panic!("{metrics} already answers: another plegd runs on this machine's network");
    }

    let result = async {
        let pod = node
            .cri
            .run_pod_with("plegd", PidMode::Node, |config: &mut PodSandboxConfig| {
                config.log_directory = logs.display().to_string();
                let security = config
                    .linux
                    .as_mut()
                    .unwrap()
                    .security_context
                    .as_mut()
                    .unwrap();
                let pod_security = pod_spec.security_context.clone().unwrap_or_default();
                security.run_as_user = pod_security.run_as_user.map(|value| Int64Value { value });
            })
            .await?;
        let spec = ContainerSpec::shell(&container.name, "");
        let id = node
            .cri
            .create_container_with(&pod, &spec, |config| {
                cri_container(config, &pod_spec, &container, mounts.clone());
            })
            .await?;
        node.cri.start_container(&id).await?;

        // Ready as kubelet's probes see it, and the API on the mounted socket.
        let socket = run.join("plegd.sock");
        let probe = |probe: &Option<k8s_openapi::api::core::v1::Probe>| {
            let probe = probe.clone().expect("the DaemonSet's probe");
            let command = probe.exec.and_then(|e| e.command).expect("an exec probe");
            let timeout =
                Duration::from_secs(probe.timeout_seconds.unwrap_or(1).try_into().unwrap());
            (command, timeout)
        };
        let (readiness, liveness) = (
            probe(&container.readiness_probe),
            probe(&container.liveness_probe),
        );
        wait::until(
            "plegd ready by its readiness probe",
            READY_DEADLINE,
            || async {
                let (code, _) = node.cri.exec_sync(&id, &readiness.0, readiness.1).await?;
                Ok::<_, anyhow::Error>((code == 0).then_some(()))
            },
        )
        .await?;
        let ready_at = started.elapsed();
        let (status, _) = http_get(&metrics, "/readyz").await?;
        ensure!(status == 200, "/readyz: {status}");
        // Another pod fills the metrics port (here on the host's loopback: 64 addresses, 8
        // requests each that never end their headers): the probes still pass.
        let mut crowd = Vec::new();
        for n in 0..64u8 {
            let from = std::net::IpAddr::from([127, 0, 4, n + 1]);
            let to: std::net::SocketAddr = metrics.parse()?;
            crowd.extend(
                plegd_tests::hostile::on_tcp(from, to, 8, b"GET /metrics HTTP/1.1\r\n").await?,
            );
        }
        for (what, (command, timeout)) in [("readiness", &readiness), ("liveness", &liveness)] {
            let (code, output) = node.cri.exec_sync(&id, command, *timeout).await?;
            ensure!(
                code == 0,
                "the {what} probe with the metrics port full: {code}: {output}"
            );
        }
        drop(crowd);
        let mut client = plegd::api::client::connect(&socket).await?;
        let health = client.get_health(GetHealthRequest {}).await?.into_inner();
        ensure!(health.healthy, "unhealthy: {}", health.message);
        let ebpf = health
            .sources
            .iter()
            .find(|s| s.source == TriggerSource::Ebpf as i32)
            .context("no eBPF source")?;
        if ebpf.state != SourceState::Connected as i32 {
            bail!(
                "the eBPF source is {:?} in the pod: {}",
                SourceState::try_from(ebpf.state),
                ebpf.detail
            );
        }

        // Another pod's container starts, then its init is killed with SIGKILL.
        let workload = node.cri.run_pod("workload").await?;
        let mut events = client
            .watch(WatchRequest {
                pod_uid: workload.uid.clone(),
                include_kernel_observations: true,
                include_observations: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        let victim = node
            .cri
            .run_container(&workload, &ContainerSpec::sleeper("victim"))
            .await?;
        let deadline = tokio::time::Instant::now() + EVENT_DEADLINE;
        let mut next = async || -> anyhow::Result<plegd_proto::v1::Event> {
            loop {
                let event = tokio::time::timeout_at(deadline, events.next())
                    .await
                    .with_context(|| format!("no event of {victim} within {EVENT_DEADLINE:?}"))?
                    .context("watch ended")??;
                if event.container_id == victim {
                    return Ok(event);
                }
            }
        };
        while next().await?.r#type != EventType::ContainerStarted as i32 {}
        node.tasks.kill_init(&victim).await?;
        // The kernel's account of the kill and containerd's /tasks/exit race to plegd: the
        // death names the eBPF source only when the probes' record came first (or in the
        // same batch), which a starved pod (100m of CPU on a busy node) does not promise. The
        // kernel's observation is streamed to this watcher whichever comes first.
        let (mut died, mut kernel_signal) = (None, None);
        while died.is_none() || kernel_signal.is_none() {
            let event = next().await.with_context(|| {
                format!("died: {}, the probes saw: {kernel_signal:?}", died.is_some())
            })?;
            if event.r#type == EventType::ContainerDied as i32 {
                died = Some(event);
            } else if event.r#type == EventType::KernelObservation as i32 {
                kernel_signal = kernel_signal.or(event.observations.iter().find_map(|o| {
                    match o.kind {
                        Some(observation::Kind::Signal(signal)) => Some(signal),
                        _ => None,
                    }
                }));
            }
        }
        let died = died.context("no ContainerDied")?;
        let sources: Vec<_> = died
            .sources
            .iter()
            .map(|s| TriggerSource::try_from(*s))
            .collect();
        ensure!(
            kernel_signal == Some(9),
            "the probes saw the killed container's init end by signal {kernel_signal:?}"
        );
        ensure!(
            died.exit_code == Some(137),
            "exit code {:?}",
            died.exit_code
        );
        println!(
            "ready after {ready_at:.1?}; the probes saw signal 9; ContainerDied from {sources:?}, exit code 137, at {:.1?}",
            started.elapsed()
        );

        // The pod stops as kubelet stops it (SIGTERM, SIGKILL after the grace period): plegd
        // saves its run in /var/lib/plegd.
        // Only tidying up the workload: containerd 1.6 once failed to stop the killed
        // container here ("failed to kill container: ttrpc: closed", its shim gone); the
        // harness's teardown removes it anyway, and it says nothing about plegd.
        if let Err(e) = node.cri.remove_pod(&workload).await {
            eprintln!("workload pod not removed: {e:#}");
        }
        let grace = pod_spec.termination_grace_period_seconds.unwrap_or(30);
        let stopping = Instant::now();
        node.cri
            .stop_container(&id, Duration::from_secs(grace.try_into()?))
            .await?;
        ensure!(
            stopping.elapsed() < Duration::from_secs(10),
            "plegd took {:.1?} to stop on SIGTERM",
            stopping.elapsed()
        );
        node.cri.remove_pod(&pod).await?;
        ensure!(
            std::fs::read_dir(&state)?.next().is_some(),
            "nothing saved in the state directory at shutdown"
        );
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = result {
        let log = std::fs::read_to_string(logs.join("plegd.log")).unwrap_or_default();
        panic!("{e:#}\nplegd's log:\n{log}");
    }
    println!("took {:.1?}", started.elapsed());
}
