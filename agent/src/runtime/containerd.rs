//! The containerd backend: containers and tasks through containerd's own API, in one or more
//! namespaces, so containers made without CRI (ctr, nerdctl, buildkit) are seen too.
//!
//! Pod identity comes from kubelet's labels, else from the OCI spec annotations containerd's CRI
//! plugin writes (`io.kubernetes.cri.sandbox-uid`, ...: set even when the CRI client adds no
//! labels), else a container is its own pod: uid `<namespace>/<id>`, name `<id>`.
//!
//! State comes from the container's task: no task or a created one is Created,
//! running/paused/pausing is Running, stopped is Exited. One exception: the CRI plugin deletes
//! the task of a CRI container (or sandbox) as soon as it exits (stops), so a task-less CRI
//! one is either not started yet or exited, and its exit code survives only in the CRI
//! plugin's own store. For those (few) the backend asks CRI on the same socket. containerd
//! keeps no start time: `started_at` is always `None` in a listing.
//!
//! A container read by its id (a hint names it) is read through CRI when the CRI plugin made
//! it: its status and kubelet's labels in one call, where containerd's own API takes two (the
//! container, its task) and a third once the task is deleted. A listing of the CRI plugin's
//! namespace takes the state of the plugin's containers from its store too (two calls for them
//! all), and asks a task only of the others there: containerd lists tasks by asking each
//! task's shim in turn.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::Path,
    sync::{Arc, Mutex},
    time::SystemTime,
};

use containerd_client::{
    services::v1::{
        Container, ListContainersRequest, ListTasksRequest, containers_client::ContainersClient,
        tasks_client::TasksClient, version_client::VersionClient,
    },
    types::v1::{Process, Status},
};
use futures::future::{try_join, try_join_all};
use tonic::transport::Channel;

use crate::{
    base::metrics::RuntimeCalls,
    pleg::{
        ContainerId, ContainerRead, ContainerRecord, ContainerState, Containers, ExitWatch,
        PodRecord, PodUid, Runtime, RuntimeError, Scope, Store, TaskRecord, exit_reason,
    },
    runtime::{
        Keys, MetadataKeeper, PodMetadata, RuntimeOptions, RuntimeVersion,
        cri::{CriRuntime, apply_status, container_state, sandbox_state},
        labels::{
            CONTAINER_NAME_ANNOTATION, CONTAINER_NAME_LABEL, KIND_LABEL, POD_NAME_LABEL,
            POD_NAMESPACE_LABEL, POD_UID_LABEL, SANDBOX_NAME_ANNOTATION,
            SANDBOX_NAMESPACE_ANNOTATION, SANDBOX_UID_ANNOTATION,
        },
        tasks::{CRI_NAMESPACE, InvalidNamespace, Namespace, get_process, time_from_timestamp},
        transport::{Caller, MAX_MESSAGE_SIZE, connect_unix, endpoint_name},
    },
};

/// Why a backend could not be set up. Defined with the containerd backend, the only one that
/// can fail before dialling (on a namespace name).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Namespace(#[from] InvalidNamespace),
}

/// containerd's own API over a unix socket, for a set of namespaces.
#[derive(Clone, Debug)]
pub struct ContainerdRuntime {
    caller: Caller,
    channel: Channel,
    namespaces: Vec<Namespace>,
    /// The CRI plugin on the same socket, for CRI containers whose task it has deleted.
    cri: CriRuntime,
    /// Which of a pod's labels its record keeps: the CRI plugin writes the pod's labels on its
    /// sandbox container (its annotations it keeps to itself).
    pod_labels: MetadataKeeper,
    ran: Arc<RunMemory>,
}

/// Non-CRI containers seen with a task, by (namespace, id), with how their task ended.
/// containerd forgets a task once it is deleted, after which the container looks like one never
/// started; remembering keeps it exited (with its exit code) until it is removed.
#[derive(Debug, Default)]
struct RunMemory(Mutex<HashMap<(String, String), Option<ExitDetails>>>);

/// How a task ended, kept for after containerd deletes it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ExitDetails {
    exit_code: Option<i32>,
    reason: String,
    finished_at: Option<SystemTime>,
}

/// One container read from containerd, before grouping into pods.
#[derive(Debug)]
struct Entry {
    namespace: String,
    pod: PodIdentity,
    record: ContainerRecord,
    /// A CRI container or sandbox without a task: its state is the CRI plugin's to tell.
    ask_cri: bool,
    /// Made by the CRI plugin (which keeps exit state itself).
    cri: bool,
}

impl ContainerdRuntime {
    /// Connects to containerd's socket; reads `namespaces` (`k8s.io` if empty). Namespace
    /// names are checked before connecting.
    pub async fn connect(socket: &Path, options: &RuntimeOptions) -> Result<Self, ConnectError> {
        let mut namespaces = options
            .namespaces
            .iter()
            .map(|n| n.parse())
            .collect::<Result<Vec<Namespace>, _>>()?;
        if namespaces.is_empty() {
            namespaces.push(Namespace::cri());
        }
        let channel = connect_unix(socket, options.call_timeout).await?;
        let caller = Caller {
            endpoint: endpoint_name(socket),
            timeout: options.call_timeout,
            calls: options.calls.clone(),
        };
        Ok(Self {
            cri: CriRuntime::from_channel(
                caller.clone(),
                channel.clone(),
                options.pod_metadata.clone(),
            ),
            caller,
            channel,
            namespaces,
            pod_labels: MetadataKeeper {
                kept: Arc::new(PodMetadata {
                    annotations: Keys::None,
                    ..options.pod_metadata.clone()
                }),
                calls: options.calls.clone(),
            },
            ran: Arc::default(),
        })
    }

    /// containerd's version (`Version`).
    pub async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        let mut client = VersionClient::new(self.channel.clone());
        let response = self.caller.call("Version", client.version(())).await?;
        Ok(RuntimeVersion {
            name: "containerd".to_owned(),
            version: response.version,
        })
    }

    /// Containers.ListStream: a stream rather than List so a node with many containers (whose
    /// full OCI specs come along) does not hit the message size limit.
    async fn containers(
        &self,
        namespace: &Namespace,
        filters: Vec<String>,
    ) -> Result<Vec<Container>, RuntimeError> {
        let mut client =
            ContainersClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE_SIZE);
        let request = namespace.request(ListContainersRequest { filters });
        let listing = async move {
            let mut stream = client.list_stream(request).await?.into_inner();
            let mut containers = Vec::new();
            while let Some(message) = stream.message().await? {
                containers.extend(message.container);
            }
            Ok(tonic::Response::new(containers))
        };
        self.caller.call("Containers.List", listing).await
    }

    async fn tasks(&self, namespace: &Namespace) -> Result<Vec<Process>, RuntimeError> {
        let mut client =
            TasksClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE_SIZE);
        let request = client.list(namespace.request(ListTasksRequest::default()));
        Ok(self.caller.call("Tasks.List", request).await?.tasks)
    }

    /// Tasks.Get; `None` when the container has no task.
    async fn task(&self, namespace: &Namespace, id: &str) -> Result<Option<Process>, RuntimeError> {
        get_process(&self.caller, &self.channel, namespace, id).await
    }

    /// Every container of one namespace, with its task. In the CRI plugin's namespace, the
    /// containers and sandboxes the plugin made take their state from its store instead (one
    /// ListContainers and one ListPodSandbox for them all, in [`Self::ask_cri`]), the others
    /// from their own task: containerd's Tasks.List asks every task's shim for its state, one
    /// after another and each up to 2 s, and beside 64 lifecycles in flight such a listing
    /// outlasted polling's period, so lives of seconds passed unseen between two.
    async fn read_namespace(&self, namespace: &Namespace) -> Result<Vec<Entry>, RuntimeError> {
        if namespace.as_str() == CRI_NAMESPACE {
            let (made_by_cri, others): (Vec<Container>, Vec<Container>) = self
                .containers(namespace, Vec::new())
                .await?
                .into_iter()
                .partition(|c| c.labels.contains_key(KIND_LABEL));
            let mut entries = self.with_tasks(namespace, &others).await?;
            // Task-less, a CRI one asks CRI (`Entry::ask_cri`).
            entries.extend(
                made_by_cri
                    .iter()
                    .map(|c| entry(namespace.as_str(), c, None, &self.pod_labels)),
            );
            return Ok(entries);
        }
        let (containers, tasks) = try_join(
            self.containers(namespace, Vec::new()),
            self.tasks(namespace),
        )
        .await?;
        // containerd 1.6 leaves `container_id` empty: a task's `id` is its container's id.
        let tasks: HashMap<&str, &Process> = tasks.iter().map(|t| (t.id.as_str(), t)).collect();
        Ok(containers
            .iter()
            .map(|c| {
                entry(
                    namespace.as_str(),
                    c,
                    tasks.get(c.id.as_str()).copied(),
                    &self.pod_labels,
                )
            })
            .collect())
    }

    /// Some containers of one namespace, each with its task (Tasks.Get, with exit details).
    async fn with_tasks(
        &self,
        namespace: &Namespace,
        containers: &[Container],
    ) -> Result<Vec<Entry>, RuntimeError> {
        try_join_all(containers.iter().map(|c| async move {
            let task = self.task(namespace, &c.id).await?;
            Ok(entry(
                namespace.as_str(),
                c,
                task.as_ref(),
                &self.pod_labels,
            ))
        }))
        .await
    }

    /// The containers of one pod, in every namespace read.
    async fn read_pod(&self, uid: &PodUid) -> Result<Vec<Entry>, RuntimeError> {
        if let Some((namespace, id)) = uid.0.split_once('/')
            && let Some(namespace) = self.namespaces.iter().find(|n| n.as_str() == namespace)
        {
            // A container that is its own pod.
            let containers: Vec<Container> = self
                .containers(namespace, vec![format!("id=={}", quote(id))])
                .await?
                .into_iter()
                .filter(|c| identity(namespace.as_str(), c).pod.uid == *uid)
                .collect();
            return self.with_tasks(namespace, &containers).await;
        }
        let per_namespace = try_join_all(self.namespaces.iter().map(|namespace| async move {
            // kubelet labels every container: filter server-side. Containers of CRI clients
            // that set no labels are only found by their annotations, client-side.
            let by_label = format!("labels.{}=={}", quote(POD_UID_LABEL), quote(&uid.0));
            let mut containers = self.containers(namespace, vec![by_label]).await?;
            if containers.is_empty() {
                containers = self.containers(namespace, Vec::new()).await?;
            }
            containers.retain(|c| identity(namespace.as_str(), c).pod.uid == *uid);
            self.with_tasks(namespace, &containers).await
        }))
        .await?;
        Ok(per_namespace.into_iter().flatten().collect())
    }

    /// The pod holding a container or sandbox id.
    async fn read_container_pod(&self, id: &ContainerId) -> Result<Vec<Entry>, RuntimeError> {
        let filter = format!("id=={}", quote(&id.0));
        for namespace in &self.namespaces {
            let containers = self.containers(namespace, vec![filter.clone()]).await?;
            if let Some(container) = containers.iter().find(|c| c.id == id.0) {
                let uid = identity(namespace.as_str(), container).pod.uid;
                return self.read_pod(&uid).await;
            }
        }
        Ok(Vec::new())
    }

    /// One container or sandbox by id. One made by the CRI plugin is read through CRI: one
    /// call (its status, with kubelet's labels naming its pod) where containerd's own API takes
    /// two (the container, its task) and a third once its task is deleted (the CRI store then
    /// holds its exit). Any other through containerd's containers and tasks.
    /// Whether it reads the CRI plugin's namespace, whose containers it reads through CRI.
    fn reads_cri(&self) -> bool {
        self.namespaces.iter().any(|n| n.as_str() == CRI_NAMESPACE)
    }

    async fn read_container(
        &self,
        id: &ContainerId,
        committed: Option<&PodRecord>,
    ) -> Result<ContainerRead, RuntimeError> {
        if self.reads_cri() {
            let read = self.cri.read_container(id, committed).await?;
            if let Some(mut found) = read.found {
                if let Some(committed) = committed {
                    keep_image_names(&mut found, |id| {
                        committed.containers.get(id).map(|c| c.image.as_str())
                    });
                }
                return Ok(ContainerRead {
                    id: id.clone(),
                    found: Some(found),
                });
            }
        }
        let filter = format!("id=={}", quote(&id.0));
        for namespace in &self.namespaces {
            let containers = self.containers(namespace, vec![filter.clone()]).await?;
            let Some(container) = containers.iter().find(|c| c.id == id.0) else {
                continue;
            };
            let mut entries = self
                .with_tasks(namespace, std::slice::from_ref(container))
                .await?;
            entries = self.ask_cri(entries, false).await?;
            self.ran.apply(&mut entries, false);
            return Ok(ContainerRead {
                id: id.clone(),
                found: assemble(entries).into_iter().next(),
            });
        }
        Ok(ContainerRead {
            id: id.clone(),
            found: None,
        })
    }

    /// Settles CRI containers and sandboxes whose task is gone or unreadable with the CRI
    /// plugin: one ListContainers
    /// (ListPodSandbox) for a full list, ContainerStatus (PodSandboxStatus) each otherwise.
    /// Those CRI does not know are dropped: removed in between, or a sandbox RunPodSandbox is
    /// still making (its container comes before its task, and the CRI store has it only once
    /// it is ready: read from containerd alone it would be a new sandbox already dead).
    async fn ask_cri(&self, entries: Vec<Entry>, bulk: bool) -> Result<Vec<Entry>, RuntimeError> {
        let asks = |sandbox: bool| {
            entries
                .iter()
                .any(|e| e.ask_cri && e.record.sandbox == sandbox)
        };
        let (containers, sandboxes) = (asks(false), asks(true));
        if !containers && !sandboxes {
            return Ok(entries);
        }
        if bulk {
            let (containers, sandboxes) = try_join(
                states_if(containers, self.cri.containers(None), |c| {
                    (c.id, container_state(c.state))
                }),
                states_if(sandboxes, self.cri.sandboxes(None), |s| {
                    (s.id, sandbox_state(s.state))
                }),
            )
            .await?;
            let states: HashMap<String, ContainerState> =
                containers.into_iter().chain(sandboxes).collect();
            return Ok(entries
                .into_iter()
                .filter_map(|mut e| {
                    if e.ask_cri {
                        e.record.state = *states.get(&e.record.id.0)?;
                        e.record.confirmed_by = Store::Cri;
                    }
                    Some(e)
                })
                .collect());
        }
        let settled = try_join_all(entries.into_iter().map(|mut e| async move {
            if e.ask_cri && e.record.sandbox {
                let Some(status) = self.cri.sandbox_status(&e.record.id.0).await? else {
                    return Ok(None);
                };
                e.record.state = sandbox_state(status.state);
            } else if e.ask_cri {
                let Some(status) = self.cri.container_status(&e.record.id.0).await? else {
                    return Ok(None);
                };
                // containerd's image name is the one the container was made from; CRI's
                // status may give a digest instead.
                let image = std::mem::take(&mut e.record.image);
                apply_status(&mut e.record, &status);
                e.record.image = image;
            }
            Ok::<_, RuntimeError>(Some(e))
        }))
        .await?;
        Ok(settled.into_iter().flatten().collect())
    }
}

/// The states `list` shows, by id, when `wanted` (no call otherwise).
async fn states_if<T>(
    wanted: bool,
    list: impl Future<Output = Result<Vec<T>, RuntimeError>>,
    state: impl Fn(T) -> (String, ContainerState),
) -> Result<Vec<(String, ContainerState)>, RuntimeError> {
    if !wanted {
        return Ok(Vec::new());
    }
    Ok(list.await?.into_iter().map(state).collect())
}

impl RunMemory {
    /// Keeps non-CRI containers whose task was deleted, or can no longer be read, exited. A
    /// full listing also forgets
    /// containers that no longer exist.
    fn apply(&self, entries: &mut [Entry], full: bool) {
        // Plain map updates: a poisoned lock still holds consistent data.
        let mut ran = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if full {
            let present: std::collections::HashSet<(&str, &str)> = entries
                .iter()
                .map(|e| (e.namespace.as_str(), e.record.id.0.as_str()))
                .collect();
            ran.retain(|(ns, id), _| present.contains(&(ns.as_str(), id.as_str())));
        }
        for entry in entries.iter_mut().filter(|e| !e.cri) {
            let key = (entry.namespace.clone(), entry.record.id.0.clone());
            let record = &mut entry.record;
            match record.state {
                ContainerState::Created | ContainerState::Unknown => {
                    let ended = ran.get(&key);
                    let exited = match record.state {
                        // Task-less after it ran: its task was deleted.
                        ContainerState::Created => ended.is_some(),
                        // A task the task service could not read (its shim going away, as
                        // after its deletion) once it was seen exited: it stays exited.
                        _ => matches!(ended, Some(Some(_))),
                    };
                    if exited {
                        record.state = ContainerState::Exited;
                        if let Some(Some(ended)) = ended {
                            record.exit_code = ended.exit_code;
                            record.reason.clone_from(&ended.reason);
                            record.finished_at = ended.finished_at;
                        }
                    } else if record.state == ContainerState::Unknown {
                        ran.entry(key).or_insert(None);
                    }
                }
                ContainerState::Exited => {
                    let details = ExitDetails {
                        exit_code: record.exit_code,
                        reason: record.reason.clone(),
                        finished_at: record.finished_at,
                    };
                    // A list carries no exit details: keep those an inspection saw.
                    let known = ran.get(&key).cloned().flatten();
                    let details = if details.exit_code.is_none() {
                        known
                    } else {
                        Some(details)
                    };
                    ran.insert(key, details);
                }
                ContainerState::Running => {
                    ran.entry(key).or_insert(None);
                }
            }
        }
    }
}

impl Runtime for ContainerdRuntime {
    fn endpoint(&self) -> &str {
        &self.caller.endpoint
    }

    fn calls(&self) -> RuntimeCalls {
        self.caller.calls.clone()
    }

    async fn list_pods(&self, scope: &Scope) -> Result<Vec<PodRecord>, RuntimeError> {
        let entries = match scope {
            Scope::Node => {
                let per_namespace =
                    try_join_all(self.namespaces.iter().map(|n| self.read_namespace(n))).await?;
                per_namespace.into_iter().flatten().collect()
            }
            Scope::Pod(uid) => self.read_pod(uid).await?,
            Scope::Container(id) => self.read_container_pod(id).await?,
        };
        let mut entries = self.ask_cri(entries, *scope == Scope::Node).await?;
        self.ran.apply(&mut entries, *scope == Scope::Node);
        let mut pods = assemble(entries);
        // A list carries states, not exit details, whichever backend (the CRI list has none):
        // exit codes come from inspect_pod.
        for record in pods.iter_mut().flat_map(|p| p.containers.values_mut()) {
            record.exit_code = None;
            record.reason.clear();
            record.started_at = None;
            record.finished_at = None;
        }
        Ok(pods)
    }

    async fn read_containers(
        &self,
        ids: &[ContainerId],
        committed: Option<&PodRecord>,
    ) -> Result<Vec<ContainerRead>, RuntimeError> {
        try_join_all(ids.iter().map(|id| self.read_container(id, committed))).await
    }

    /// A container read by its id is read through CRI when the CRI plugin made it: its task is
    /// asked as the CRI backend asks it, in the CRI plugin's namespace.
    async fn task_record(
        &self,
        container: &ContainerId,
    ) -> Result<Option<TaskRecord>, RuntimeError> {
        if !self.reads_cri() {
            return Ok(None);
        }
        self.cri.task_record(container).await
    }

    async fn task_exit(&self, container: &ContainerId) -> Result<Option<TaskRecord>, RuntimeError> {
        if !self.reads_cri() {
            return Ok(None);
        }
        self.cri.task_exit(container).await
    }

    fn watch_exit(&self, container: &ContainerId) -> Option<ExitWatch> {
        self.reads_cri()
            .then(|| self.cri.watch_exit(container))
            .flatten()
    }

    fn exit_watched(&self, container: &ContainerId) -> bool {
        self.reads_cri() && self.cri.exit_watched(container)
    }

    /// A pod of kubelet's, when only the CRI plugin's namespace is read, as the CRI backend
    /// inspects it: a status call through CRI for each container whose state changed since
    /// `known`. containerd's own API would ask every container's task again: a full relist
    /// beside 64 lifecycles in flight in one pod cost a Tasks.Get per lifecycle that way.
    /// Other pods are read again whole.
    async fn inspect_listed(
        &self,
        listed: PodRecord,
        known: Option<&PodRecord>,
    ) -> Result<Option<PodRecord>, RuntimeError> {
        let only_cri = matches!(self.namespaces.as_slice(), [n] if n.as_str() == CRI_NAMESPACE);
        if !only_cri || is_own_pod(&listed.uid) {
            return self.inspect_pod(&listed.uid, known).await;
        }
        let images: HashMap<ContainerId, String> = listed
            .containers
            .values()
            .map(|c| (c.id.clone(), c.image.clone()))
            .collect();
        let mut inspected = self.cri.inspect_listed(listed, known).await?;
        if let Some(pod) = &mut inspected {
            keep_image_names(pod, |id| images.get(id).map(String::as_str));
        }
        Ok(inspected)
    }

    /// `known` is not needed: containers and tasks come in two calls for the whole pod, and
    /// CRI is asked only about task-less containers and sandboxes.
    async fn inspect_pod(
        &self,
        uid: &PodUid,
        _known: Option<&PodRecord>,
    ) -> Result<Option<PodRecord>, RuntimeError> {
        let mut entries = self.ask_cri(self.read_pod(uid).await?, false).await?;
        self.ran.apply(&mut entries, false);
        Ok(assemble(entries).into_iter().find(|p| &p.uid == uid))
    }
}

/// A pod's identity, before its records are attached.
#[derive(Debug, PartialEq, Eq)]
struct PodIdentity {
    uid: PodUid,
    namespace: String,
    name: String,
    /// Those kept of the pod's labels, on its sandbox's entry.
    labels: BTreeMap<String, String>,
}

/// Who a container is: its pod, its name and whether it is a sandbox.
#[derive(Debug, PartialEq, Eq)]
struct Identity {
    pod: PodIdentity,
    name: String,
    sandbox: bool,
    /// Made by containerd's CRI plugin.
    cri: bool,
}

/// The part of an OCI runtime spec read here.
#[derive(Debug, Default, serde::Deserialize)]
struct SpecAnnotations {
    #[serde(default)]
    annotations: HashMap<String, String>,
}

/// Pod and container identity: kubelet's labels, else the CRI plugin's spec annotations, else
/// the container is its own pod.
fn identity(namespace: &str, container: &Container) -> Identity {
    let kind = container.labels.get(KIND_LABEL).map(String::as_str);
    let sandbox = kind == Some("sandbox");
    let cri = kind.is_some();
    let labels = &container.labels;
    let annotations = if labels.contains_key(POD_UID_LABEL) {
        HashMap::new()
    } else {
        spec_annotations(container)
    };
    let lookup = |label: &str, annotation: &str| {
        labels
            .get(label)
            .or_else(|| annotations.get(annotation))
            .cloned()
    };
    match lookup(POD_UID_LABEL, SANDBOX_UID_ANNOTATION) {
        Some(uid) => Identity {
            pod: PodIdentity {
                uid: PodUid(uid),
                namespace: lookup(POD_NAMESPACE_LABEL, SANDBOX_NAMESPACE_ANNOTATION)
                    .unwrap_or_default(),
                name: lookup(POD_NAME_LABEL, SANDBOX_NAME_ANNOTATION).unwrap_or_default(),
                labels: BTreeMap::new(),
            },
            // Sandboxes have no container name, as in CRI.
            name: if sandbox {
                String::new()
            } else {
                lookup(CONTAINER_NAME_LABEL, CONTAINER_NAME_ANNOTATION).unwrap_or_default()
            },
            sandbox,
            cri,
        },
        None => Identity {
            pod: PodIdentity {
                uid: PodUid(format!("{namespace}/{}", container.id)),
                namespace: namespace.to_owned(),
                name: container.id.clone(),
                labels: BTreeMap::new(),
            },
            name: container.id.clone(),
            sandbox,
            cri,
        },
    }
}

/// containerd's image name, from `name_of`, on each container of `pod` that CRI read: the name
/// the container was made from, where CRI's status may give a digest instead.
fn keep_image_names<'a>(pod: &mut PodRecord, name_of: impl Fn(&ContainerId) -> Option<&'a str>) {
    for record in pod.containers.values_mut() {
        if let Some(name) = name_of(&record.id) {
            name.clone_into(&mut record.image);
        }
    }
}

/// Whether `uid` is a container that is its own pod (`<namespace>/<id>`: kubelet's uids have
/// no slash).
fn is_own_pod(uid: &PodUid) -> bool {
    uid.0.contains('/')
}

/// The spec's annotations; none if the spec is missing or not JSON.
fn spec_annotations(container: &Container) -> HashMap<String, String> {
    container
        .spec
        .as_ref()
        .and_then(|spec| serde_json::from_slice::<SpecAnnotations>(&spec.value).ok())
        .map(|spec| spec.annotations)
        .unwrap_or_default()
}

/// A task's status as a record state; no task means not started yet.
fn task_state(task: Option<&Process>) -> ContainerState {
    let Some(task) = task else {
        return ContainerState::Created;
    };
    match Status::try_from(task.status) {
        Ok(Status::Created) => ContainerState::Created,
        // A paused container still has its processes: kubelet sees it running.
        Ok(Status::Running | Status::Paused | Status::Pausing) => ContainerState::Running,
        Ok(Status::Stopped) => ContainerState::Exited,
        Ok(Status::Unknown) | Err(_) => ContainerState::Unknown,
    }
}

/// One container and its task; a sandbox's entry carries the pod's labels `kept`.
fn entry(
    namespace: &str,
    container: &Container,
    task: Option<&Process>,
    kept: &MetadataKeeper,
) -> Entry {
    let mut identity = identity(namespace, container);
    if identity.sandbox {
        identity.pod.labels = kept.keep(&container.labels, []).labels;
    }
    let state = task_state(task);
    let exited = task.filter(|_| state == ContainerState::Exited);
    let exit_code = exited.and_then(|t| i32::try_from(t.exit_status).ok());
    let record = ContainerRecord {
        id: ContainerId(container.id.clone()),
        name: identity.name,
        attempt: 0,
        image: container.image.clone(),
        state,
        sandbox: identity.sandbox,
        created_at: time_from_timestamp(container.created_at.as_ref()),
        started_at: None,
        finished_at: exited.and_then(|t| time_from_timestamp(t.exited_at.as_ref())),
        exit_code,
        // The task service cannot tell an OOM kill from another SIGKILL: the OOM the
        // runtime recorded makes the reason when the record is merged.
        reason: exit_code
            .map(|code| exit_reason(code, false))
            .unwrap_or_default()
            .to_owned(),
        // Read from the task service itself (CRI's store only where the task is gone).
        confirmed_by: Store::Task,
        oom_killed_by: BTreeSet::new(),
        oom_kill: None,
        host: None,
    };
    Entry {
        namespace: namespace.to_owned(),
        pod: identity.pod,
        record,
        // containerd lists a task whose shim did not answer (shutting down after the task's
        // deletion, or gone) as UNKNOWN: CRI's store still knows what became of it.
        ask_cri: identity.cri && (task.is_none() || state == ContainerState::Unknown),
        cri: identity.cri,
    }
}

fn assemble(entries: Vec<Entry>) -> Vec<PodRecord> {
    let mut pods: BTreeMap<PodUid, PodRecord> = BTreeMap::new();
    for Entry { pod, record, .. } in entries {
        let held = pods.entry(pod.uid.clone()).or_insert_with(|| PodRecord {
            uid: pod.uid,
            namespace: pod.namespace,
            name: pod.name,
            containers: Containers::new(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        });
        if record.sandbox && !pod.labels.is_empty() {
            held.labels = pod.labels;
        }
        held.containers.insert(record.id.clone(), record);
    }
    pods.into_values().collect()
}

/// A containerd filter value: quoted, so ids and uids with any character stay one value.
fn quote(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        if matches!(c, '"' | '\\') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prost_types::{Any, Timestamp};

    use super::*;

    fn process(status: Status, exit_status: u32) -> Process {
        Process {
            id: "c".into(),
            status: status as i32,
            exit_status,
            exited_at: Some(Timestamp {
                seconds: 10,
                nanos: 0,
            }),
            ..Default::default()
        }
    }

    fn container(id: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Container {
        let annotations: HashMap<_, _> = annotations.iter().copied().collect();
        Container {
            id: id.into(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            image: "localhost/busybox:latest".into(),
            spec: Some(Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/Spec".into(),
                value: serde_json::to_vec(&serde_json::json!({
                    "ociVersion": "1.0.2",
                    "annotations": annotations,
                }))
                .unwrap(),
            }),
            created_at: Some(Timestamp {
                seconds: 5,
                nanos: 0,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn task_statuses_map_to_states() {
        let cases = [
            (None, ContainerState::Created),
            (Some(Status::Created), ContainerState::Created),
            (Some(Status::Running), ContainerState::Running),
            (Some(Status::Paused), ContainerState::Running),
            (Some(Status::Pausing), ContainerState::Running),
            (Some(Status::Stopped), ContainerState::Exited),
            (Some(Status::Unknown), ContainerState::Unknown),
        ];
        for (status, expected) in cases {
            let task = status.map(|s| process(s, 0));
            assert_eq!(task_state(task.as_ref()), expected, "{status:?}");
        }
        let bogus = Process {
            status: 99,
            ..Default::default()
        };
        assert_eq!(task_state(Some(&bogus)), ContainerState::Unknown);
    }

    #[test]
    fn kubelet_labels_name_the_pod_and_container() {
        let c = container(
            "c1",
            &[
                (KIND_LABEL, "container"),
                (POD_UID_LABEL, "uid-1"),
                (POD_NAME_LABEL, "web"),
                (POD_NAMESPACE_LABEL, "prod"),
                (CONTAINER_NAME_LABEL, "nginx"),
            ],
            &[],
        );
        let id = identity("k8s.io", &c);
        assert_eq!(
            id.pod,
            PodIdentity {
                uid: PodUid("uid-1".into()),
                namespace: "prod".into(),
                name: "web".into(),
                labels: BTreeMap::new(),
            }
        );
        assert_eq!(id.name, "nginx");
        assert!(id.cri && !id.sandbox);
    }

    #[test]
    fn cri_annotations_name_the_pod_when_labels_do_not() {
        let sandbox = container(
            "s1",
            &[(KIND_LABEL, "sandbox")],
            &[
                (SANDBOX_UID_ANNOTATION, "uid-2"),
                (SANDBOX_NAME_ANNOTATION, "db"),
                (SANDBOX_NAMESPACE_ANNOTATION, "test"),
            ],
        );
        let id = identity("k8s.io", &sandbox);
        assert_eq!(id.pod.uid, PodUid("uid-2".into()));
        assert_eq!(
            (id.pod.namespace.as_str(), id.pod.name.as_str()),
            ("test", "db")
        );
        assert_eq!(id.name, "");
        assert!(id.sandbox && id.cri);

        let c = container(
            "c2",
            &[(KIND_LABEL, "container")],
            &[
                (SANDBOX_UID_ANNOTATION, "uid-2"),
                (CONTAINER_NAME_ANNOTATION, "postgres"),
            ],
        );
        let id = identity("k8s.io", &c);
        assert_eq!(id.pod.uid, PodUid("uid-2".into()));
        assert_eq!(id.name, "postgres");
    }

    #[test]
    fn a_container_without_pod_labels_is_its_own_pod() {
        let mut c = container("web", &[], &[]);
        c.spec = Some(Any {
            type_url: String::new(),
            value: b"not json".to_vec(),
        });
        let id = identity("plegd-native", &c);
        assert_eq!(
            id.pod,
            PodIdentity {
                uid: PodUid("plegd-native/web".into()),
                namespace: "plegd-native".into(),
                name: "web".into(),
                labels: BTreeMap::new(),
            }
        );
        assert_eq!(id.name, "web");
        assert!(!id.cri && !id.sandbox);
    }

    #[test]
    fn stopped_tasks_give_exit_code_reason_and_time() {
        let c = container("c", &[], &[]);
        let killed = entry(
            "ns",
            &c,
            Some(&process(Status::Stopped, 137)),
            &MetadataKeeper::default(),
        );
        assert_eq!(killed.record.state, ContainerState::Exited);
        assert_eq!(killed.record.exit_code, Some(137));
        assert_eq!(killed.record.reason, "Error");
        assert_eq!(
            killed.record.finished_at,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(10))
        );
        assert_eq!(
            killed.record.created_at,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(5))
        );
        let clean = entry(
            "ns",
            &c,
            Some(&process(Status::Stopped, 0)),
            &MetadataKeeper::default(),
        );
        assert_eq!(clean.record.reason, "Completed");
        let running = entry(
            "ns",
            &c,
            Some(&process(Status::Running, 0)),
            &MetadataKeeper::default(),
        );
        assert_eq!(
            (running.record.exit_code, running.record.finished_at),
            (None, None)
        );
        assert!(!running.ask_cri);
    }

    #[test]
    fn taskless_cri_sandboxes_and_containers_ask_cri() {
        for kind in ["sandbox", "container"] {
            let taskless = entry(
                "k8s.io",
                &container("c", &[(KIND_LABEL, kind)], &[]),
                None,
                &MetadataKeeper::default(),
            );
            assert!(taskless.ask_cri, "{kind}");
            assert_eq!(taskless.record.sandbox, kind == "sandbox");
        }
        let native = entry(
            "ns",
            &container("n", &[], &[]),
            None,
            &MetadataKeeper::default(),
        );
        assert_eq!(native.record.state, ContainerState::Created);
        assert!(!native.ask_cri);
        let unreadable = process(Status::Unknown, 0);
        for (kind, asks) in [("sandbox", true), ("container", true), ("", false)] {
            let labels: &[(&str, &str)] = if kind.is_empty() {
                &[]
            } else {
                &[(KIND_LABEL, kind)]
            };
            let entry = entry(
                "k8s.io",
                &container("c", labels, &[]),
                Some(&unreadable),
                &MetadataKeeper::default(),
            );
            assert_eq!(entry.ask_cri, asks, "{kind:?}");
        }
    }

    #[test]
    fn a_native_container_whose_task_was_deleted_stays_exited_until_removed() {
        let memory = RunMemory::default();
        let solo = container("solo", &[], &[]);
        let running = process(Status::Running, 0);
        let stopped = process(Status::Stopped, 137);
        let state_after = |task: Option<&Process>, full: bool| {
            let mut entries = vec![entry("ns", &solo, task, &MetadataKeeper::default())];
            memory.apply(&mut entries, full);
            entries.remove(0).record
        };
        // Never started: created.
        assert_eq!(state_after(None, true).state, ContainerState::Created);
        assert_eq!(
            state_after(Some(&running), true).state,
            ContainerState::Running
        );
        assert_eq!(state_after(Some(&stopped), false).exit_code, Some(137));
        // Task deleted: still exited, with the exit code seen before.
        let record = state_after(None, false);
        assert_eq!(
            (record.state, record.exit_code),
            (ContainerState::Exited, Some(137))
        );
        // Its shim going away: the task service lists it UNKNOWN; still exited.
        let unreadable = process(Status::Unknown, 0);
        let record = state_after(Some(&unreadable), false);
        assert_eq!(
            (record.state, record.exit_code),
            (ContainerState::Exited, Some(137))
        );
        // Removed (absent from a full listing), then recreated with the same id: created.
        memory.apply(&mut [], true);
        assert_eq!(state_after(None, true).state, ContainerState::Created);
        // Unreadable without having been seen exited: unknown, and not taken for exited later.
        assert_eq!(
            state_after(Some(&unreadable), true).state,
            ContainerState::Unknown
        );
        assert_eq!(
            state_after(Some(&unreadable), true).state,
            ContainerState::Unknown
        );
    }

    #[test]
    fn go_zero_time_and_missing_timestamps_are_none() {
        // Go's time.Time{} as a protobuf timestamp.
        let zero = Timestamp {
            seconds: -62_135_596_800,
            nanos: 0,
        };
        assert_eq!(time_from_timestamp(Some(&zero)), None);
        assert_eq!(time_from_timestamp(None), None);
        let t = Timestamp {
            seconds: 1,
            nanos: 500_000_000,
        };
        assert_eq!(
            time_from_timestamp(Some(&t)),
            Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1500))
        );
    }

    #[test]
    fn entries_are_grouped_by_pod() {
        let labels = |uid: &'static str| [(POD_UID_LABEL, uid), (KIND_LABEL, "container")];
        let entries = vec![
            entry(
                "k8s.io",
                &container("a", &labels("p1"), &[]),
                None,
                &MetadataKeeper::default(),
            ),
            entry(
                "k8s.io",
                &container("b", &labels("p1"), &[]),
                None,
                &MetadataKeeper::default(),
            ),
            entry(
                "k8s.io",
                &container("c", &labels("p2"), &[]),
                None,
                &MetadataKeeper::default(),
            ),
        ];
        let pods = assemble(entries);
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0].containers.len(), 2);
    }

    #[test]
    fn filter_values_are_quoted_and_escaped() {
        assert_eq!(quote("abc"), "\"abc\"");
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
