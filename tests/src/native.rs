//! Test support through containerd's own API (no CRI): containers, snapshots and tasks in the
//! harness's plain namespace.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};
use containerd_client::{
    services::v1::{
        Container, CreateContainerRequest, CreateTaskRequest, DeleteContainerRequest,
        DeleteTaskRequest, GetRequest, KillRequest, ListTasksRequest, StartRequest, WaitRequest,
        container::Runtime,
        containers_client::ContainersClient,
        snapshots::{
            PrepareSnapshotRequest, RemoveSnapshotRequest, snapshots_client::SnapshotsClient,
        },
        tasks_client::TasksClient,
    },
    types::v1::{Process, Status},
};
use prost_types::Any;
use serde_json::json;
use tonic::{Request, transport::Channel};

use crate::{
    PrivateContainerd,
    containerd::{InstancePaths, NATIVE_NAMESPACE},
    image::BUSYBOX_IMAGE,
    process, unix_channel,
};

const SNAPSHOTTER: &str = "overlayfs";
const SPEC_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";

/// runc shim options (`containerd.runc.v1.Options`); only `root` is needed: containers made
/// through the plain API must keep their runc state inside the harness, like CRI's.
#[derive(Clone, PartialEq, prost::Message)]
struct RuncOptions {
    #[prost(string, tag = "7")]
    root: String,
}

/// A client of the harness's containerd for one namespace.
#[derive(Clone)]
pub struct Native {
    channel: Channel,
    namespace: String,
    instance: InstancePaths,
    snapshot_parent: String,
}

/// What to run in a container made through the plain API.
#[derive(Clone, Debug, Default)]
pub struct NativeSpec {
    pub args: Vec<String>,
    /// cgroup memory limit in bytes.
    pub memory_limit: Option<i64>,
    /// Container labels, e.g. the CRI pod labels to make a container look like part of a pod.
    pub labels: HashMap<String, String>,
}

impl NativeSpec {
    /// Runs `sh -c script`.
    pub fn shell(script: &str) -> Self {
        Self {
            args: vec!["sh".into(), "-c".into(), script.into()],
            ..Self::default()
        }
    }
}

impl Native {
    /// Connects to the harness's containerd, in the harness's plain namespace.
    pub async fn connect(containerd: &PrivateContainerd) -> anyhow::Result<Self> {
        Self::connect_in(containerd, NATIVE_NAMESPACE).await
    }

    /// A client of the containerd at `socket` (a node's own, not the harness's) in `namespace`,
    /// for its tasks (init pids, kills); it cannot create containers (no harness image or runc
    /// root there).
    pub async fn connect_socket(socket: &Path, namespace: &str) -> anyhow::Result<Self> {
        let channel = unix_channel(socket)
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?;
        Ok(Self {
            channel,
            namespace: namespace.to_owned(),
            instance: InstancePaths::new(PathBuf::new()),
            snapshot_parent: String::new(),
        })
    }

    /// Connects in another namespace (e.g. `k8s.io` to look at CRI-made containers).
    pub async fn connect_in(
        containerd: &PrivateContainerd,
        namespace: &str,
    ) -> anyhow::Result<Self> {
        let channel = unix_channel(&containerd.socket())
            .await
            .with_context(|| format!("connecting to {}", containerd.socket().display()))?;
        Ok(Self {
            channel,
            namespace: namespace.to_owned(),
            instance: containerd.paths().clone(),
            snapshot_parent: containerd.images().layer_diff_id.clone(),
        })
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.metadata_mut().insert(
            "containerd-namespace",
            self.namespace.parse().expect("namespace names are ASCII"),
        );
        request
    }

    fn tasks(&self) -> TasksClient<Channel> {
        TasksClient::new(self.channel.clone())
    }

    /// Creates and starts a container; returns its init pid.
    pub async fn run(&self, id: &str, spec: &NativeSpec) -> anyhow::Result<u32> {
        self.create(id, spec).await?;
        let mounts = SnapshotsClient::new(self.channel.clone())
            .prepare(self.request(PrepareSnapshotRequest {
                snapshotter: SNAPSHOTTER.into(),
                key: id.to_owned(),
                parent: self.snapshot_parent.clone(),
                ..Default::default()
            }))
            .await
            .with_context(|| format!("preparing snapshot {id}"))?
            .into_inner()
            .mounts;
        let pid = self
            .tasks()
            .create(self.request(CreateTaskRequest {
                container_id: id.to_owned(),
                rootfs: mounts,
                ..Default::default()
            }))
            .await
            .with_context(|| format!("creating task {id}"))?
            .into_inner()
            .pid;
        self.tasks()
            .start(self.request(StartRequest {
                container_id: id.to_owned(),
                exec_id: String::new(),
            }))
            .await
            .with_context(|| format!("starting task {id}"))?;
        Ok(pid)
    }

    /// Creates the container's record alone (no snapshot, no task): what a runtime has made
    /// so far while it is still making one.
    pub async fn create(&self, id: &str, spec: &NativeSpec) -> anyhow::Result<()> {
        let runtime_options = Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: prost::Message::encode_to_vec(&RuncOptions {
                root: self.instance.runc_root().display().to_string(),
            }),
        };
        let container = Container {
            id: id.to_owned(),
            labels: spec.labels.clone(),
            image: BUSYBOX_IMAGE.into(),
            runtime: Some(Runtime {
                name: "io.containerd.runc.v2".into(),
                options: Some(runtime_options),
            }),
            spec: Some(Any {
                type_url: SPEC_TYPE_URL.into(),
                value: serde_json::to_vec(&self.oci_spec(id, spec))?,
            }),
            snapshotter: SNAPSHOTTER.into(),
            snapshot_key: id.to_owned(),
            ..Default::default()
        };
        ContainersClient::new(self.channel.clone())
            .create(self.request(CreateContainerRequest {
                container: Some(container),
            }))
            .await
            .with_context(|| format!("creating container {id}"))?;
        Ok(())
    }

    /// A minimal OCI runtime spec: busybox rootfs, own pid/ipc/uts/mount namespaces, host
    /// network, cgroup `/<namespace>/<id>` like containerd's own default.
    fn oci_spec(&self, id: &str, spec: &NativeSpec) -> serde_json::Value {
        let mut resources = json!({});
        if let Some(limit) = spec.memory_limit {
            resources["memory"] = json!({ "limit": limit, "swap": limit });
        }
        json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": { "uid": 0, "gid": 0 },
                "args": spec.args,
                "env": ["PATH=/bin"],
                "cwd": "/",
                "noNewPrivileges": true,
            },
            "root": { "path": "rootfs", "readonly": false },
            "mounts": [
                { "destination": "/proc", "type": "proc", "source": "proc" },
                { "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                  "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
                { "destination": "/sys", "type": "sysfs", "source": "sysfs",
                  "options": ["nosuid", "noexec", "nodev", "ro"] },
            ],
            "linux": {
                "namespaces": [
                    { "type": "pid" }, { "type": "ipc" }, { "type": "uts" }, { "type": "mount" },
                ],
                "cgroupsPath": format!("/{}/{id}", self.namespace),
                "resources": resources,
            },
        })
    }

    /// The task's init process (pid, status, exit status), if it has a task.
    pub async fn task(&self, id: &str) -> anyhow::Result<Option<Process>> {
        match self
            .tasks()
            .get(self.request(GetRequest {
                container_id: id.to_owned(),
                exec_id: String::new(),
            }))
            .await
        {
            Ok(response) => Ok(response.into_inner().process),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
            Err(status) => Err(status).with_context(|| format!("getting task {id}")),
        }
    }

    /// Every task in the namespace (`Process::id` is the container id).
    pub async fn list_tasks(&self) -> anyhow::Result<Vec<Process>> {
        Ok(self
            .tasks()
            .list(self.request(ListTasksRequest::default()))
            .await
            .context("listing tasks")?
            .into_inner()
            .tasks)
    }

    /// The init pid of a running task.
    pub async fn init_pid(&self, id: &str) -> anyhow::Result<i32> {
        match self.task(id).await? {
            Some(p) if p.status == Status::Running as i32 => Ok(i32::try_from(p.pid)?),
            Some(p) => bail!("task {id} is not running (status {})", p.status),
            None => bail!("container {id} has no task"),
        }
    }

    /// `kill -9` of the task's init process from outside containerd, as the OOM killer or an
    /// operator would; returns once it is gone (bounded).
    pub async fn kill_init(&self, id: &str) -> anyhow::Result<()> {
        let pid = self.init_pid(id).await?;
        process::kill_all(&[pid], Duration::from_secs(30));
        anyhow::ensure!(
            !process::is_alive(pid),
            "init {pid} of {id} survived SIGKILL"
        );
        Ok(())
    }

    /// Sends a signal to the task's init process.
    pub async fn kill(&self, id: &str, signal: u32) -> anyhow::Result<()> {
        self.tasks()
            .kill(self.request(KillRequest {
                container_id: id.to_owned(),
                exec_id: String::new(),
                signal,
                all: false,
            }))
            .await
            .with_context(|| format!("killing task {id}"))?;
        Ok(())
    }

    /// Waits for the task to exit; returns its exit status.
    pub async fn wait(&self, id: &str) -> anyhow::Result<u32> {
        Ok(self
            .tasks()
            .wait(self.request(WaitRequest {
                container_id: id.to_owned(),
                exec_id: String::new(),
            }))
            .await
            .with_context(|| format!("waiting for task {id}"))?
            .into_inner()
            .exit_status)
    }

    /// Deletes the (stopped) task, the container and its snapshot.
    pub async fn remove(&self, id: &str) -> anyhow::Result<()> {
        match self
            .tasks()
            .delete(self.request(DeleteTaskRequest {
                container_id: id.to_owned(),
            }))
            .await
        {
            Ok(_) => {}
            Err(status) if status.code() == tonic::Code::NotFound => {}
            Err(status) => return Err(status).with_context(|| format!("deleting task {id}")),
        }
        ContainersClient::new(self.channel.clone())
            .delete(self.request(DeleteContainerRequest { id: id.to_owned() }))
            .await
            .with_context(|| format!("deleting container {id}"))?;
        // containerd's garbage collector may remove the snapshot of a deleted container first.
        match SnapshotsClient::new(self.channel.clone())
            .remove(self.request(RemoveSnapshotRequest {
                snapshotter: SNAPSHOTTER.into(),
                key: id.to_owned(),
            }))
            .await
        {
            Ok(_) => Ok(()),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
            Err(status) => Err(status).with_context(|| format!("removing snapshot {id}")),
        }
    }
}
