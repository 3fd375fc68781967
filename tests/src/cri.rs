//! Test support through CRI v1, as kubelet would drive containerd: pod sandboxes with host
//! networking and containers in them.

use std::{path::Path, time::Duration};

use anyhow::Context as _;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatus, ContainerStatusRequest,
    CreateContainerRequest, ExecSyncRequest, ImageSpec, LinuxContainerConfig,
    LinuxContainerResources, LinuxContainerSecurityContext, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, ListContainersRequest, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RemoveContainerRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
    runtime_service_client::RuntimeServiceClient,
};
use tonic::transport::Channel;

use crate::{
    PrivateContainerd, containerd::InstancePaths, image::BUSYBOX_IMAGE, unix_channel_with, wait,
};

/// How long a removal that met a killed container's closed shim is tried again.
const SHIM_GONE_RETRY: Duration = Duration::from_secs(3);

/// A CRI client of the harness's containerd.
#[derive(Clone)]
pub struct Cri {
    runtime: RuntimeServiceClient<Channel>,
    /// The harness's containerd, which records pod cgroups for its cleanup (none for a node's
    /// own runtime).
    instance: Option<InstancePaths>,
    driver: CgroupDriver,
}

/// How kubelet names a pod's cgroup parent, as its `--cgroup-driver` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupDriver {
    /// `/kubepods/besteffort/pod<uid>` (runc makes the cgroups).
    Cgroupfs,
    /// `kubepods-besteffort-pod<uid, dashes as underscores>.slice` (systemd makes the slices
    /// and the containers' `cri-containerd-<id>.scope`; containerd needs `SystemdCgroup = true`).
    Systemd,
}

impl CgroupDriver {
    /// The cgroup parent kubelet gives a best-effort pod's sandbox.
    pub fn pod_parent(self, uid: &str) -> String {
        match self {
            Self::Cgroupfs => format!("/kubepods/besteffort/pod{uid}"),
            Self::Systemd => format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_")),
        }
    }
}

/// A running pod sandbox.
#[derive(Clone, Debug)]
pub struct Pod {
    /// Sandbox id.
    pub id: String,
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub pid_mode: PidMode,
    config: PodSandboxConfig,
}

impl Pod {
    /// The sandbox's cgroup parent: the pod's cgroup, as kubelet names it for the driver.
    pub fn cgroup_parent(&self) -> &str {
        self.config
            .linux
            .as_ref()
            .map_or("", |linux| linux.cgroup_parent.as_str())
    }
}

/// Which pid namespace a pod's containers run in (CRI `NamespaceOption.pid`, as kubelet sets it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PidMode {
    /// Each container its own, its command pid 1 there (kubelet's default).
    Container,
    /// The pod's, whose pid 1 is the sandbox's pause (`shareProcessNamespace: true`).
    Pod,
    /// The host's (`hostPID: true`, as many DaemonSets run).
    Node,
}

impl PidMode {
    pub const ALL: [PidMode; 3] = [PidMode::Container, PidMode::Pod, PidMode::Node];

    fn cri(self) -> NamespaceMode {
        match self {
            Self::Container => NamespaceMode::Container,
            Self::Pod => NamespaceMode::Pod,
            Self::Node => NamespaceMode::Node,
        }
    }
}

/// What to run in a CRI container.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    pub name: String,
    pub command: Vec<String>,
    /// cgroup memory limit in bytes.
    pub memory_limit: Option<i64>,
    /// Restart count, as kubelet sets it when it recreates a container of the same name.
    pub attempt: u32,
}

impl ContainerSpec {
    /// Runs `sh -c script`.
    pub fn shell(name: &str, script: &str) -> Self {
        Self {
            name: name.to_owned(),
            command: vec!["sh".into(), "-c".into(), script.into()],
            memory_limit: None,
            attempt: 0,
        }
    }

    /// The same container, recreated by a restart (next attempt).
    pub fn restarted(mut self) -> Self {
        self.attempt += 1;
        self
    }

    /// Sleeps until killed.
    pub fn sleeper(name: &str) -> Self {
        Self::shell(name, "exec sleep 2147483647")
    }

    /// Exits with `code` at once.
    pub fn exiting(name: &str, code: u8) -> Self {
        Self::shell(name, &format!("exit {code}"))
    }

    /// Allocates far beyond a 32 MiB memory limit, so the kernel OOM-kills it; the container
    /// exits with the killed process's status (137). The shell lingers a moment first:
    /// containerd 1.6 only reports OOMKilled if its OOM event is handled before the exit, and
    /// a container whose init is the killed process races the two.
    pub fn oom(name: &str) -> Self {
        Self {
            memory_limit: Some(32 << 20),
            ..Self::shell(
                name,
                "dd if=/dev/zero of=/dev/null bs=200M count=1; status=$?; sleep 1; exit $status",
            )
        }
    }

    /// A 32 MiB container whose init is the process the OOM killer kills.
    pub fn oom_init(name: &str) -> Self {
        Self {
            memory_limit: Some(32 << 20),
            ..Self::shell(name, "exec dd if=/dev/zero of=/dev/null bs=200M count=1")
        }
    }

    /// Its init execs itself `execs` times (each exec of a container's init is a kernel event
    /// plegd's eBPF probes report), then sleeps.
    pub fn exec_storm(name: &str, execs: u32) -> Self {
        let step = r#"if [ "$1" -gt 0 ]; then exec sh -c "$0" "$0" $(($1 - 1)); fi; exec sleep 2147483647"#;
        Self::shell(
            name,
            &format!("s='{step}'; exec sh -c \"$s\" \"$s\" {execs}"),
        )
    }
}

/// The longest a CRI call may take, as kubelet's `--runtime-request-timeout` (2 minutes): a
/// call a runtime never answers (containerd's CRI plugin stuck on a shim after a restart, seen
/// once in the soak) fails rather than hang the test.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A channel to the CRI runtime at `socket`, each call bounded by [`REQUEST_TIMEOUT`].
async fn cri_channel(socket: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let endpoint =
        tonic::transport::Endpoint::from_static("http://[::]:50051").timeout(REQUEST_TIMEOUT);
    unix_channel_with(socket, endpoint).await
}

impl Cri {
    pub async fn connect(containerd: &PrivateContainerd) -> anyhow::Result<Self> {
        let channel = cri_channel(&containerd.socket())
            .await
            .with_context(|| format!("connecting to {}", containerd.socket().display()))?;
        Ok(Self {
            runtime: RuntimeServiceClient::new(channel),
            instance: Some(containerd.paths().clone()),
            driver: CgroupDriver::Cgroupfs,
        })
    }

    /// A client of the runtime at `socket` (a node's own, not the harness's), making pods the
    /// way kubelet with `driver` does.
    pub async fn connect_socket(socket: &Path, driver: CgroupDriver) -> anyhow::Result<Self> {
        let channel = cri_channel(socket)
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?;
        Ok(Self {
            runtime: RuntimeServiceClient::new(channel),
            instance: None,
            driver,
        })
    }

    /// Runs a pod sandbox with host networking (no CNI here) in namespace `plegd-test`, under
    /// kubelet's layout for the client's cgroup driver ([`CgroupDriver::pod_parent`]), each
    /// container in its own pid namespace.
    pub async fn run_pod(&self, name: &str) -> anyhow::Result<Pod> {
        self.run_pod_in(name, PidMode::Container).await
    }

    /// [`Cri::run_pod`] with the containers' pid namespace chosen.
    pub async fn run_pod_in(&self, name: &str, pid_mode: PidMode) -> anyhow::Result<Pod> {
        self.run_pod_with(name, pid_mode, |_| {}).await
    }

    /// [`Cri::run_pod_in`] with the sandbox config changed by `customize` before it runs (a
    /// pod spec's security context, log directory, labels; the network stays the host's).
    pub async fn run_pod_with(
        &self,
        name: &str,
        pid_mode: PidMode,
        customize: impl FnOnce(&mut PodSandboxConfig),
    ) -> anyhow::Result<Pod> {
        let uid = pod_uid();
        let namespace = "plegd-test".to_owned();
        let cgroup_parent = self.driver.pod_parent(&uid);
        if let Some(instance) = &self.instance {
            instance
                .record_cgroup_parent(&cgroup_parent)
                .context("recording the pod cgroup for cleanup")?;
        }
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.to_owned(),
                uid: uid.clone(),
                namespace: namespace.clone(),
                attempt: 0,
            }),
            // CRI sets the hostname itself only with a pod network namespace.
            hostname: String::new(),
            labels: pod_labels(name, &namespace, &uid),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent,
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(pod_namespaces(pid_mode)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut config = config;
        customize(&mut config);
        let id = self
            .runtime
            .clone()
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await
            .with_context(|| format!("RunPodSandbox {name}"))?
            .into_inner()
            .pod_sandbox_id;
        Ok(Pod {
            id,
            uid,
            name: name.to_owned(),
            namespace,
            pid_mode,
            config,
        })
    }

    /// Creates a container in the pod (not started).
    pub async fn create_container(
        &self,
        pod: &Pod,
        spec: &ContainerSpec,
    ) -> anyhow::Result<String> {
        self.create_container_with(pod, spec, |_| {}).await
    }

    /// [`Cri::create_container`] with the config changed by `customize` before it is created
    /// (another image, arguments, mounts, a security context).
    pub async fn create_container_with(
        &self,
        pod: &Pod,
        spec: &ContainerSpec,
        customize: impl FnOnce(&mut ContainerConfig),
    ) -> anyhow::Result<String> {
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: spec.name.clone(),
                attempt: spec.attempt,
            }),
            image: Some(ImageSpec {
                image: BUSYBOX_IMAGE.into(),
                ..Default::default()
            }),
            command: spec.command.clone(),
            labels: {
                let mut labels = pod.config.labels.clone();
                labels.insert("io.kubernetes.container.name".into(), spec.name.clone());
                labels
            },
            linux: Some(LinuxContainerConfig {
                resources: spec.memory_limit.map(|limit| LinuxContainerResources {
                    memory_limit_in_bytes: limit,
                    ..Default::default()
                }),
                // As kubelet does: the pod's pid mode for each of its containers.
                security_context: Some(LinuxContainerSecurityContext {
                    namespace_options: Some(pod_namespaces(pod.pid_mode)),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let mut config = config;
        customize(&mut config);
        Ok(self
            .runtime
            .clone()
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.id.clone(),
                config: Some(config),
                sandbox_config: Some(pod.config.clone()),
            })
            .await
            .with_context(|| format!("CreateContainer {} in {}", spec.name, pod.name))?
            .into_inner()
            .container_id)
    }

    pub async fn start_container(&self, id: &str) -> anyhow::Result<()> {
        self.runtime
            .clone()
            .start_container(StartContainerRequest {
                container_id: id.to_owned(),
            })
            .await
            .with_context(|| format!("StartContainer {id}"))?;
        Ok(())
    }

    /// Creates and starts a container; returns its id.
    pub async fn run_container(&self, pod: &Pod, spec: &ContainerSpec) -> anyhow::Result<String> {
        let id = self.create_container(pod, spec).await?;
        self.start_container(&id).await?;
        Ok(id)
    }

    /// Runs a sleeper container per name in `pod`; returns their ids in the same order.
    pub async fn run_sleepers<const N: usize>(
        &self,
        pod: &Pod,
        names: [&str; N],
    ) -> anyhow::Result<[String; N]> {
        let mut ids = Vec::with_capacity(N);
        for name in names {
            ids.push(
                self.run_container(pod, &ContainerSpec::sleeper(name))
                    .await?,
            );
        }
        Ok(ids
            .try_into()
            .unwrap_or_else(|_| unreachable!("one id per name")))
    }

    /// Stops a container: SIGTERM, then SIGKILL after `timeout` (0: SIGKILL at once).
    pub async fn stop_container(&self, id: &str, timeout: Duration) -> anyhow::Result<()> {
        self.runtime
            .clone()
            .stop_container(StopContainerRequest {
                container_id: id.to_owned(),
                timeout: i64::try_from(timeout.as_secs())?,
            })
            .await
            .with_context(|| format!("StopContainer {id}"))?;
        Ok(())
    }

    /// Removes a container, stopping it first if the runtime holds it running. containerd 1.6
    /// sometimes fails that stop for a container just killed: its shim is gone and the kill
    /// finds the connection closed ("failed to kill container: ttrpc: closed", once in a
    /// 200-kill bench run); a moment later its CRI store has the exit and the removal goes
    /// through, so that error is tried again for up to [`SHIM_GONE_RETRY`].
    pub async fn remove_container(&self, id: &str) -> anyhow::Result<()> {
        // Ok(Some(outcome)): done, either way; Err: the shim's closed connection, again.
        let removed = wait::until("a removal past a closed shim", SHIM_GONE_RETRY, || async {
            let removed = self
                .runtime
                .clone()
                .remove_container(RemoveContainerRequest {
                    container_id: id.to_owned(),
                })
                .await;
            match removed {
                Err(status) if status.message().contains("ttrpc: closed") => Err(status),
                removed => Ok(Some(removed)),
            }
        })
        .await
        .with_context(|| format!("RemoveContainer {id}"))?;
        removed.with_context(|| format!("RemoveContainer {id}"))?;
        Ok(())
    }

    /// Stops the pod's sandbox and every container in it (CRI `StopPodSandbox`).
    pub async fn stop_pod(&self, pod: &Pod) -> anyhow::Result<()> {
        self.runtime
            .clone()
            .stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: pod.id.clone(),
            })
            .await
            .with_context(|| format!("StopPodSandbox {}", pod.name))?;
        Ok(())
    }

    /// Stops and removes the pod with all its containers.
    pub async fn remove_pod(&self, pod: &Pod) -> anyhow::Result<()> {
        self.stop_pod(pod).await?;
        let mut runtime = self.runtime.clone();
        runtime
            .remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: pod.id.clone(),
            })
            .await
            .with_context(|| format!("RemovePodSandbox {}", pod.name))?;
        Ok(())
    }

    /// Runs `command` in container `id` as kubelet runs an exec probe (CRI ExecSync, at most
    /// `timeout`); its exit code and what it wrote on stdout and stderr.
    pub async fn exec_sync(
        &self,
        id: &str,
        command: &[String],
        timeout: Duration,
    ) -> anyhow::Result<(i32, String)> {
        let response = self
            .runtime
            .clone()
            .exec_sync(ExecSyncRequest {
                container_id: id.to_owned(),
                cmd: command.to_vec(),
                timeout: timeout.as_secs().try_into()?,
            })
            .await
            .with_context(|| format!("ExecSync {command:?} in {id}"))?
            .into_inner();
        let output = format!(
            "{}{}",
            String::from_utf8_lossy(&response.stdout),
            String::from_utf8_lossy(&response.stderr)
        );
        Ok((response.exit_code, output))
    }

    pub async fn container_status(&self, id: &str) -> anyhow::Result<ContainerStatus> {
        self.runtime
            .clone()
            .container_status(ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            })
            .await
            .with_context(|| format!("ContainerStatus {id}"))?
            .into_inner()
            .status
            .with_context(|| format!("ContainerStatus {id}: empty status"))
    }

    /// Every container the runtime lists.
    pub async fn list_containers(&self) -> anyhow::Result<Vec<k8s_cri::v1::Container>> {
        Ok(self
            .runtime
            .clone()
            .list_containers(ListContainersRequest { filter: None })
            .await
            .context("ListContainers")?
            .into_inner()
            .containers)
    }

    /// Waits until the container is in `state`; returns its status then.
    pub async fn wait_state(
        &self,
        id: &str,
        state: ContainerState,
        timeout: Duration,
    ) -> anyhow::Result<ContainerStatus> {
        let what = format!("container {id} to be {state:?}");
        Ok(wait::until(&what, timeout, || async {
            let status = self.container_status(id).await?;
            anyhow::Ok((status.state == state as i32).then_some(status))
        })
        .await?)
    }
}

/// Host network (no CNI here), pid namespaces as `pid_mode` says, IPC shared in the pod.
fn pod_namespaces(pid_mode: PidMode) -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Node as i32,
        pid: pid_mode.cri() as i32,
        ipc: NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// The labels kubelet puts on every sandbox (and, with the container name, every container).
pub fn pod_labels(
    name: &str,
    namespace: &str,
    uid: &str,
) -> std::collections::HashMap<String, String> {
    [
        ("io.kubernetes.pod.name", name),
        ("io.kubernetes.pod.namespace", namespace),
        ("io.kubernetes.pod.uid", uid),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// A fresh pod uid shaped like kubelet's (a random UUID), so cgroup paths look real.
fn pod_uid() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    let (a, b) = (hasher.finish(), {
        hasher.write_u8(1);
        hasher.finish()
    });
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-4{}-8{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}
