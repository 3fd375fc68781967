//! The CRI v1 backend: pod sandboxes and containers as kubelet sees them.
//!
//! A list is `ListPodSandbox` + `ListContainers` (server-side filters for targeted scopes); an
//! inspection adds `PodSandboxStatus`/`ContainerStatus` per record for exit codes, reasons and
//! timestamps. Sandboxes become records with `sandbox = true` (READY -> Running,
//! NOTREADY -> Exited).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::future::{try_join, try_join_all};
use k8s_cri::v1::{
    self as cri, ContainerFilter, ContainerStatusRequest, ListContainersRequest,
    ListPodSandboxRequest, PodSandboxFilter, PodSandboxStatusRequest, VersionRequest,
    runtime_service_client::RuntimeServiceClient,
};
use tonic::transport::Channel;

use crate::{
    base::metrics::RuntimeCalls,
    pleg::{
        ContainerId, ContainerRead, ContainerRecord, ContainerState, Containers, ExitWatch,
        PodRecord, PodUid, Runtime, RuntimeError, Scope, Store, TaskRecord,
    },
    runtime::{
        MetadataKeeper, PodMetadata, RuntimeOptions, RuntimeVersion, known_status,
        labels::{POD_NAME_LABEL, POD_NAMESPACE_LABEL, POD_UID_LABEL},
        tasks::{Namespace, TaskService},
        transport::{Caller, MAX_MESSAGE_SIZE, connect_unix, endpoint_name, found},
    },
};

/// A CRI runtime over a unix socket.
#[derive(Clone, Debug)]
pub struct CriRuntime {
    caller: Caller,
    client: RuntimeServiceClient<Channel>,
    /// containerd's task service on the same socket, in the CRI plugin's namespace (absent on
    /// other runtimes: it says so once and is not asked again).
    tasks: TaskService,
    /// Which of a pod's labels and annotations (its sandbox's) its record keeps.
    pod_metadata: MetadataKeeper,
}

impl CriRuntime {
    /// Connects to the CRI socket; fails (naming it) if nothing listens there.
    pub async fn connect(socket: &Path, options: &RuntimeOptions) -> Result<Self, RuntimeError> {
        let channel = connect_unix(socket, options.call_timeout).await?;
        let caller = Caller {
            endpoint: endpoint_name(socket),
            timeout: options.call_timeout,
            calls: options.calls.clone(),
        };
        Ok(Self::from_channel(
            caller,
            channel,
            options.pod_metadata.clone(),
        ))
    }

    /// A client on an existing channel (the containerd backend shares its own).
    pub(crate) fn from_channel(
        caller: Caller,
        channel: Channel,
        pod_metadata: PodMetadata,
    ) -> Self {
        Self {
            tasks: TaskService::new(caller.clone(), channel.clone(), Namespace::cri()),
            pod_metadata: MetadataKeeper {
                kept: Arc::new(pod_metadata),
                calls: caller.calls.clone(),
            },
            caller,
            client: RuntimeServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE_SIZE),
        }
    }

    /// The runtime's name and version (`Version`).
    pub async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        let mut client = self.client.clone();
        let request = client.version(VersionRequest {
            version: String::new(),
        });
        let response = self.caller.call("Version", request).await?;
        Ok(RuntimeVersion {
            name: response.runtime_name,
            version: response.runtime_version,
        })
    }

    pub(crate) async fn sandboxes(
        &self,
        filter: Option<PodSandboxFilter>,
    ) -> Result<Vec<cri::PodSandbox>, RuntimeError> {
        let mut client = self.client.clone();
        let request = client.list_pod_sandbox(ListPodSandboxRequest { filter });
        Ok(self.caller.call("ListPodSandbox", request).await?.items)
    }

    pub(crate) async fn containers(
        &self,
        filter: Option<ContainerFilter>,
    ) -> Result<Vec<cri::Container>, RuntimeError> {
        let mut client = self.client.clone();
        let request = client.list_containers(ListContainersRequest { filter });
        Ok(self
            .caller
            .call("ListContainers", request)
            .await?
            .containers)
    }

    /// `ContainerStatus`; `None` when the container is gone.
    pub(crate) async fn container_status(
        &self,
        id: &str,
    ) -> Result<Option<cri::ContainerStatus>, RuntimeError> {
        let mut client = self.client.clone();
        let request = client.container_status(ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        });
        let response = found(self.caller.call("ContainerStatus", request).await)?;
        Ok(response.and_then(|r| r.status))
    }

    /// `PodSandboxStatus`; `None` when the sandbox is gone.
    pub(crate) async fn sandbox_status(
        &self,
        id: &str,
    ) -> Result<Option<cri::PodSandboxStatus>, RuntimeError> {
        let mut client = self.client.clone();
        let request = client.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose: false,
        });
        let response = found(self.caller.call("PodSandboxStatus", request).await)?;
        Ok(response.and_then(|r| r.status))
    }

    /// The pod's sandboxes (by label, else by metadata), their containers (by sandbox id) and
    /// containers that outlived their sandbox (by label).
    async fn list_pod(&self, uid: &PodUid) -> Result<Vec<PodRecord>, RuntimeError> {
        let by_uid = HashMap::from([(POD_UID_LABEL.to_owned(), uid.0.clone())]);
        let mut sandboxes = self
            .sandboxes(Some(PodSandboxFilter {
                label_selector: by_uid.clone(),
                ..Default::default()
            }))
            .await?;
        // kubelet labels every sandbox; other CRI clients may not, and the metadata uid is
        // what identifies the pod. The sandbox list is small: filter it here.
        if sandboxes.is_empty() {
            sandboxes = self.sandboxes(None).await?;
            sandboxes.retain(|s| s.metadata.as_ref().is_some_and(|m| m.uid == uid.0));
        }
        let in_sandboxes = try_join_all(sandboxes.iter().map(|s| {
            self.containers(Some(ContainerFilter {
                pod_sandbox_id: s.id.clone(),
                ..Default::default()
            }))
        }));
        let labelled = self.containers(Some(ContainerFilter {
            label_selector: by_uid,
            ..Default::default()
        }));
        let (in_sandboxes, labelled) = try_join(in_sandboxes, labelled).await?;
        let containers = in_sandboxes.into_iter().flatten().chain(labelled).collect();
        Ok(assemble(sandboxes, containers, &self.pod_metadata))
    }

    /// The pod holding a container or sandbox id (kernel hints know only the cgroup's id), in
    /// two calls or three: the container (or sandbox) by id, and, for a container without
    /// kubelet's labels, its sandbox.
    async fn find_pod(&self, id: &ContainerId) -> Result<Found, RuntimeError> {
        let (containers, sandboxes) = try_join(
            self.containers(Some(ContainerFilter {
                id: id.0.clone(),
                ..Default::default()
            })),
            self.sandboxes(Some(PodSandboxFilter {
                id: id.0.clone(),
                ..Default::default()
            })),
        )
        .await?;
        // An empty filter id means "everything": keep exact matches only.
        if let Some(sandbox) = sandboxes.iter().find(|s| s.id == id.0) {
            return Ok(Found::Pod(sandbox_pod(sandbox).uid));
        }
        let Some(container) = containers.into_iter().find(|c| c.id == id.0) else {
            return Ok(Found::Nothing);
        };
        if let Some(uid) = container.labels.get(POD_UID_LABEL) {
            return Ok(Found::Pod(PodUid(uid.clone())));
        }
        let parent = self
            .sandboxes(Some(PodSandboxFilter {
                id: container.pod_sandbox_id.clone(),
                ..Default::default()
            }))
            .await?
            .into_iter()
            .find(|s| s.id == container.pod_sandbox_id);
        Ok(match parent {
            Some(sandbox) => Found::Pod(sandbox_pod(&sandbox).uid),
            // The sandbox is gone and no label names the pod.
            None => Found::Orphan(Box::new(container)),
        })
    }

    /// One container or sandbox by id: `sandbox` says which it is when known, else the
    /// container's status is asked first (containers outnumber sandboxes), then the sandbox's.
    /// Its pod is `committed`'s, else the one its record names (kubelet's labels, a sandbox's
    /// metadata), else the one its listing finds (a container without labels).
    pub(crate) async fn read_container(
        &self,
        id: &ContainerId,
        committed: Option<&PodRecord>,
    ) -> Result<ContainerRead, RuntimeError> {
        let sandbox = committed
            .and_then(|pod| pod.containers.get(id))
            .map(|c| c.sandbox);
        let status = match sandbox {
            Some(true) => None,
            _ => self.container_status(&id.0).await?,
        };
        let found = match status {
            Some(status) => {
                let record = status_record(&status);
                match committed {
                    Some(pod) => Some(PodIdentity::of(pod).with(record)),
                    None => self.first_seen_pod(id, &status.labels, record).await?,
                }
            }
            None if sandbox == Some(false) => None,
            None => self.sandbox_status(&id.0).await?.map(|status| {
                let identity = committed.map_or_else(
                    || sandbox_identity(status.metadata.as_ref()),
                    PodIdentity::of,
                );
                let mut pod = identity.with(sandbox_status_record(&status));
                // The pod's labels and annotations are its sandbox's: a container read alone
                // keeps those committed (reconcile), a sandbox brings its own.
                let kept = self.pod_metadata.keep(&status.labels, &status.annotations);
                pod.labels = kept.labels;
                pod.annotations = kept.annotations;
                pod
            }),
        };
        Ok(ContainerRead {
            id: id.clone(),
            found,
        })
    }

    /// The pod of a container read before its pod was committed, with the sandbox's labels and
    /// annotations: a container's status has neither, and its first event would go out
    /// without them (the pod's own listing, read beside it, may commit after it). kubelet's
    /// labels name the pod and one ListPodSandbox brings what is kept (none when nothing is);
    /// a container without them is found by its listing.
    async fn first_seen_pod(
        &self,
        id: &ContainerId,
        labels: &HashMap<String, String>,
        record: ContainerRecord,
    ) -> Result<Option<PodRecord>, RuntimeError> {
        let Some(identity) = labelled_pod(labels) else {
            return Ok(self.listed_pod(id).await?.map(|mut listed| {
                listed.containers = PodIdentity::of(&listed).with(record).containers;
                listed
            }));
        };
        let mut pod = identity.with(record);
        if self.pod_metadata.kept.keeps_any() {
            let sandboxes = self
                .sandboxes(Some(PodSandboxFilter {
                    label_selector: HashMap::from([(POD_UID_LABEL.to_owned(), pod.uid.0.clone())]),
                    ..Default::default()
                }))
                .await?;
            // The ready one, when a restart left others behind.
            if let Some(sandbox) = sandboxes.iter().max_by_key(|s| {
                (
                    s.state == cri::PodSandboxState::SandboxReady as i32,
                    s.created_at,
                )
            }) {
                let kept = self
                    .pod_metadata
                    .keep(&sandbox.labels, &sandbox.annotations);
                pod.labels = kept.labels;
                pod.annotations = kept.annotations;
            }
        }
        Ok(Some(pod))
    }

    /// The pod a listing finds `id` in.
    async fn listed_pod(&self, id: &ContainerId) -> Result<Option<PodRecord>, RuntimeError> {
        Ok(self
            .list_container_pod(id)
            .await?
            .into_iter()
            .find(|pod| pod.containers.contains_key(id)))
    }

    async fn list_container_pod(&self, id: &ContainerId) -> Result<Vec<PodRecord>, RuntimeError> {
        match self.find_pod(id).await? {
            Found::Pod(uid) => self.list_pod(&uid).await,
            Found::Orphan(container) => {
                Ok(assemble(Vec::new(), vec![*container], &self.pod_metadata))
            }
            Found::Nothing => Ok(Vec::new()),
        }
    }
}

/// Where a container id was found.
enum Found {
    /// In this pod.
    Pod(PodUid),
    /// A container whose sandbox is gone and whose labels name no pod: a pod of its own.
    Orphan(Box<cri::Container>),
    Nothing,
}

impl Runtime for CriRuntime {
    fn endpoint(&self) -> &str {
        &self.caller.endpoint
    }

    fn calls(&self) -> RuntimeCalls {
        self.caller.calls.clone()
    }

    async fn list_pods(&self, scope: &Scope) -> Result<Vec<PodRecord>, RuntimeError> {
        match scope {
            Scope::Node => {
                let (sandboxes, containers) =
                    try_join(self.sandboxes(None), self.containers(None)).await?;
                Ok(assemble(sandboxes, containers, &self.pod_metadata))
            }
            Scope::Pod(uid) => self.list_pod(uid).await,
            Scope::Container(id) => self.list_container_pod(id).await,
        }
    }

    async fn read_containers(
        &self,
        ids: &[ContainerId],
        committed: Option<&PodRecord>,
    ) -> Result<Vec<ContainerRead>, RuntimeError> {
        try_join_all(ids.iter().map(|id| self.read_container(id, committed))).await
    }

    async fn task_record(
        &self,
        container: &ContainerId,
    ) -> Result<Option<TaskRecord>, RuntimeError> {
        self.tasks.record(container).await
    }

    async fn task_exit(&self, container: &ContainerId) -> Result<Option<TaskRecord>, RuntimeError> {
        self.tasks.exit(container).await
    }

    fn watch_exit(&self, container: &ContainerId) -> Option<ExitWatch> {
        self.tasks.watch_exit(container)
    }

    fn exit_watched(&self, container: &ContainerId) -> bool {
        self.tasks.exit_watched(container)
    }

    async fn inspect_pod(
        &self,
        uid: &PodUid,
        known: Option<&PodRecord>,
    ) -> Result<Option<PodRecord>, RuntimeError> {
        let listed = self
            .list_pod(uid)
            .await?
            .into_iter()
            .find(|p| &p.uid == uid);
        match listed {
            Some(pod) => self.inspect_listed(pod, known).await,
            None => Ok(None),
        }
    }

    async fn inspect_listed(
        &self,
        mut pod: PodRecord,
        known: Option<&PodRecord>,
    ) -> Result<Option<PodRecord>, RuntimeError> {
        let inspected = try_join_all(pod.containers.values().map(|listed| async move {
            if let Some(known) = known_status(known, listed) {
                Ok(Some(known.clone()))
            } else if listed.sandbox {
                Ok::<_, RuntimeError>(self.sandbox_status(&listed.id.0).await?.map(|status| {
                    ContainerRecord {
                        state: sandbox_state(status.state),
                        created_at: time_from_nanos(status.created_at),
                        // The containerd backend's listing is the task service's.
                        confirmed_by: Store::Cri,
                        ..listed.clone()
                    }
                }))
            } else {
                let status = self.container_status(&listed.id.0).await?;
                Ok(status.map(|status| {
                    let mut record = listed.clone();
                    apply_status(&mut record, &status);
                    record
                }))
            }
        }))
        .await?;
        // Records that vanished between the list and their status call are skipped: the next
        // relist sees them gone.
        pod.containers = inspected
            .into_iter()
            .flatten()
            .map(|record| (record.id.clone(), record))
            .collect();
        Ok((!pod.containers.is_empty()).then_some(pod))
    }
}

/// CRI container state as a record state; values this build does not know are `Unknown`.
pub(crate) fn container_state(state: i32) -> ContainerState {
    match cri::ContainerState::try_from(state) {
        Ok(cri::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => ContainerState::Exited,
        Ok(cri::ContainerState::ContainerUnknown) | Err(_) => ContainerState::Unknown,
    }
}

/// Sandbox state as a record state: a ready sandbox is a running container of its pod.
pub(crate) fn sandbox_state(state: i32) -> ContainerState {
    match cri::PodSandboxState::try_from(state) {
        Ok(cri::PodSandboxState::SandboxReady) => ContainerState::Running,
        Ok(cri::PodSandboxState::SandboxNotready) => ContainerState::Exited,
        Err(_) => ContainerState::Unknown,
    }
}

/// CRI timestamps are nanoseconds since the epoch; 0 means "not yet" (never started, not
/// finished).
pub(crate) fn time_from_nanos(nanos: i64) -> Option<SystemTime> {
    let nanos = u64::try_from(nanos).ok().filter(|&n| n > 0)?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_nanos(nanos))
}

/// Completes a listed record with a `ContainerStatus`.
pub(crate) fn apply_status(record: &mut ContainerRecord, status: &cri::ContainerStatus) {
    record.state = container_state(status.state);
    record.created_at = time_from_nanos(status.created_at);
    record.started_at = time_from_nanos(status.started_at);
    record.finished_at = time_from_nanos(status.finished_at);
    // CRI reports 0 for containers that have not exited: only an exited one has an exit code.
    record.exit_code = (record.state == ContainerState::Exited).then_some(status.exit_code);
    record.reason.clone_from(&status.reason);
    record.confirmed_by = Store::Cri;
    if let Some(image) = status.image.as_ref().filter(|i| !i.image.is_empty()) {
        record.image.clone_from(&image.image);
    }
}

/// A container's record from its `ContainerStatus` alone.
fn status_record(status: &cri::ContainerStatus) -> ContainerRecord {
    let metadata = status.metadata.clone().unwrap_or_default();
    let mut record = ContainerRecord {
        id: ContainerId(status.id.clone()),
        name: metadata.name,
        attempt: metadata.attempt,
        image: String::new(),
        state: ContainerState::Unknown,
        sandbox: false,
        created_at: None,
        started_at: None,
        finished_at: None,
        exit_code: None,
        reason: String::new(),
        confirmed_by: Store::Cri,
        oom_killed_by: BTreeSet::new(),
        oom_kill: None,
        host: None,
    };
    apply_status(&mut record, status);
    record
}

/// A sandbox's record from its `PodSandboxStatus` alone.
fn sandbox_status_record(status: &cri::PodSandboxStatus) -> ContainerRecord {
    sandbox_of(
        &status.id,
        status.metadata.as_ref(),
        status.state,
        status.created_at,
    )
}

/// A pod's identity, before its records are attached.
#[derive(Debug, PartialEq, Eq)]
struct PodIdentity {
    uid: PodUid,
    namespace: String,
    name: String,
}

impl PodIdentity {
    fn of(pod: &PodRecord) -> Self {
        Self {
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
        }
    }

    /// The pod holding `record` alone.
    fn with(self, record: ContainerRecord) -> PodRecord {
        let mut pod = self.with_none();
        pod.containers.insert(record.id.clone(), record);
        pod
    }

    /// The pod, holding no record yet.
    fn with_none(self) -> PodRecord {
        PodRecord {
            uid: self.uid,
            namespace: self.namespace,
            name: self.name,
            containers: Containers::new(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }
}

fn sandbox_pod(sandbox: &cri::PodSandbox) -> PodIdentity {
    sandbox_identity(sandbox.metadata.as_ref())
}

fn sandbox_identity(metadata: Option<&cri::PodSandboxMetadata>) -> PodIdentity {
    let metadata = metadata.cloned().unwrap_or_default();
    PodIdentity {
        uid: PodUid(metadata.uid),
        namespace: metadata.namespace,
        name: metadata.name,
    }
}

/// The pod kubelet's labels on a container name.
fn labelled_pod(labels: &HashMap<String, String>) -> Option<PodIdentity> {
    let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
    labels.get(POD_UID_LABEL).map(|uid| PodIdentity {
        uid: PodUid(uid.clone()),
        namespace: label(POD_NAMESPACE_LABEL),
        name: label(POD_NAME_LABEL),
    })
}

/// The pod of a container: its sandbox's, else kubelet's labels, else (a container made by a
/// CRI client that sets no labels, whose sandbox is gone) a pod named after the sandbox id.
fn container_pod(
    container: &cri::Container,
    sandboxes: &HashMap<&str, &cri::PodSandbox>,
) -> PodIdentity {
    if let Some(sandbox) = sandboxes.get(container.pod_sandbox_id.as_str()) {
        return sandbox_pod(sandbox);
    }
    labelled_pod(&container.labels).unwrap_or_else(|| PodIdentity {
        uid: PodUid(container.pod_sandbox_id.clone()),
        namespace: String::new(),
        name: String::new(),
    })
}

fn sandbox_record(sandbox: &cri::PodSandbox) -> ContainerRecord {
    sandbox_of(
        &sandbox.id,
        sandbox.metadata.as_ref(),
        sandbox.state,
        sandbox.created_at,
    )
}

/// A sandbox's record, as a listing or a status call gives it.
fn sandbox_of(
    id: &str,
    metadata: Option<&cri::PodSandboxMetadata>,
    state: i32,
    created_at: i64,
) -> ContainerRecord {
    ContainerRecord {
        id: ContainerId(id.to_owned()),
        name: String::new(),
        attempt: metadata.map_or(0, |m| m.attempt),
        image: String::new(),
        state: sandbox_state(state),
        sandbox: true,
        created_at: time_from_nanos(created_at),
        started_at: None,
        finished_at: None,
        exit_code: None,
        reason: String::new(),
        confirmed_by: Store::Cri,
        oom_killed_by: BTreeSet::new(),
        oom_kill: None,
        host: None,
    }
}

fn container_record(container: &cri::Container) -> ContainerRecord {
    let metadata = container.metadata.clone().unwrap_or_default();
    ContainerRecord {
        id: ContainerId(container.id.clone()),
        name: metadata.name,
        attempt: metadata.attempt,
        image: container
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default(),
        state: container_state(container.state),
        sandbox: false,
        created_at: time_from_nanos(container.created_at),
        started_at: None,
        finished_at: None,
        exit_code: None,
        reason: String::new(),
        confirmed_by: Store::Cri,
        oom_killed_by: BTreeSet::new(),
        oom_kill: None,
        host: None,
    }
}

/// Groups listed sandboxes and containers into pods (containers listed twice, e.g. by sandbox
/// id and by label, count once); each pod keeps what `kept` says of its sandbox's labels and
/// annotations.
fn assemble(
    sandboxes: Vec<cri::PodSandbox>,
    containers: Vec<cri::Container>,
    kept: &MetadataKeeper,
) -> Vec<PodRecord> {
    let by_id: HashMap<&str, &cri::PodSandbox> =
        sandboxes.iter().map(|s| (s.id.as_str(), s)).collect();
    let mut pods: BTreeMap<PodUid, PodRecord> = BTreeMap::new();
    let mut add = |identity: PodIdentity, record: ContainerRecord| {
        pods.entry(identity.uid.clone())
            .or_insert_with(|| identity.with_none())
            .containers
            .insert(record.id.clone(), record)
    };
    for sandbox in &sandboxes {
        add(sandbox_pod(sandbox), sandbox_record(sandbox));
    }
    for container in &containers {
        add(
            container_pod(container, &by_id),
            container_record(container),
        );
    }
    if kept.kept.keeps_any() {
        for sandbox in &sandboxes {
            if let Some(pod) = pods.get_mut(&sandbox_pod(sandbox).uid) {
                let metadata = kept.keep(&sandbox.labels, &sandbox.annotations);
                pod.labels = metadata.labels;
                pod.annotations = metadata.annotations;
            }
        }
    }
    pods.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str, uid: &str, state: cri::PodSandboxState) -> cri::PodSandbox {
        cri::PodSandbox {
            id: id.into(),
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("{uid}-name"),
                uid: uid.into(),
                namespace: "default".into(),
                attempt: 1,
            }),
            state: state as i32,
            created_at: 1_000_000_000,
            ..Default::default()
        }
    }

    fn container(id: &str, sandbox: &str, state: cri::ContainerState) -> cri::Container {
        cri::Container {
            id: id.into(),
            pod_sandbox_id: sandbox.into(),
            metadata: Some(cri::ContainerMetadata {
                name: format!("{id}-name"),
                attempt: 2,
            }),
            image: Some(cri::ImageSpec {
                image: "busybox".into(),
                ..Default::default()
            }),
            state: state as i32,
            ..Default::default()
        }
    }

    #[test]
    fn container_states_map_one_to_one_and_unknown_values_are_unknown() {
        use cri::ContainerState as C;
        let cases = [
            (C::ContainerCreated as i32, ContainerState::Created),
            (C::ContainerRunning as i32, ContainerState::Running),
            (C::ContainerExited as i32, ContainerState::Exited),
            (C::ContainerUnknown as i32, ContainerState::Unknown),
            (42, ContainerState::Unknown),
        ];
        for (cri_state, expected) in cases {
            assert_eq!(container_state(cri_state), expected, "{cri_state}");
        }
    }

    #[test]
    fn ready_sandboxes_run_and_not_ready_ones_have_exited() {
        use cri::PodSandboxState as S;
        assert_eq!(
            sandbox_state(S::SandboxReady as i32),
            ContainerState::Running
        );
        assert_eq!(
            sandbox_state(S::SandboxNotready as i32),
            ContainerState::Exited
        );
        assert_eq!(sandbox_state(-1), ContainerState::Unknown);
    }

    #[test]
    fn nanosecond_timestamps_convert_and_zero_means_none() {
        assert_eq!(time_from_nanos(0), None);
        assert_eq!(time_from_nanos(-5), None);
        assert_eq!(
            time_from_nanos(1_500_000_000),
            Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1500))
        );
    }

    #[test]
    fn sandboxes_and_containers_are_grouped_by_pod() {
        use cri::{ContainerState as C, PodSandboxState as S};
        let pods = assemble(
            vec![
                sandbox("s1", "uid-1", S::SandboxReady),
                sandbox("s2", "uid-2", S::SandboxNotready),
            ],
            vec![
                container("c1", "s1", C::ContainerRunning),
                container("c2", "s1", C::ContainerExited),
                container("c3", "s2", C::ContainerCreated),
            ],
            &MetadataKeeper::default(),
        );
        assert_eq!(pods.len(), 2);
        let first = &pods[0];
        assert_eq!(
            (
                first.uid.0.as_str(),
                first.namespace.as_str(),
                first.name.as_str()
            ),
            ("uid-1", "default", "uid-1-name")
        );
        let states: Vec<_> = first
            .containers
            .values()
            .map(|c| (c.id.0.as_str(), c.sandbox, c.state))
            .collect();
        assert_eq!(
            states,
            [
                ("c1", false, ContainerState::Running),
                ("c2", false, ContainerState::Exited),
                ("s1", true, ContainerState::Running),
            ]
        );
        let s1 = &first.containers[&ContainerId("s1".into())];
        assert_eq!((s1.name.as_str(), s1.attempt), ("", 1));
        assert_eq!(s1.created_at, time_from_nanos(1_000_000_000));
        let c1 = &first.containers[&ContainerId("c1".into())];
        assert_eq!(
            (c1.name.as_str(), c1.attempt, c1.image.as_str()),
            ("c1-name", 2, "busybox")
        );
        assert_eq!(
            pods[1].containers[&ContainerId("s2".into())].state,
            ContainerState::Exited
        );
    }

    #[test]
    fn a_container_without_its_sandbox_takes_its_pod_from_labels() {
        let mut orphan = container("c1", "gone", cri::ContainerState::ContainerExited);
        orphan.labels = HashMap::from([
            (POD_UID_LABEL.into(), "uid-9".into()),
            (POD_NAME_LABEL.into(), "web".into()),
            (POD_NAMESPACE_LABEL.into(), "prod".into()),
        ]);
        let pods = assemble(Vec::new(), vec![orphan], &MetadataKeeper::default());
        assert_eq!(pods.len(), 1);
        assert_eq!(
            (
                pods[0].uid.0.as_str(),
                pods[0].namespace.as_str(),
                pods[0].name.as_str()
            ),
            ("uid-9", "prod", "web")
        );
    }

    #[test]
    fn a_container_without_sandbox_or_labels_is_its_sandbox_ids_pod() {
        let pods = assemble(
            Vec::new(),
            vec![container(
                "c1",
                "gone",
                cri::ContainerState::ContainerExited,
            )],
            &MetadataKeeper::default(),
        );
        assert_eq!(pods[0].uid, PodUid("gone".into()));
        assert!(pods[0].containers.contains_key(&ContainerId("c1".into())));
    }

    #[test]
    fn a_container_listed_twice_counts_once() {
        let c = container("c1", "s1", cri::ContainerState::ContainerRunning);
        let pods = assemble(
            vec![sandbox("s1", "uid-1", cri::PodSandboxState::SandboxReady)],
            vec![c.clone(), c],
            &MetadataKeeper::default(),
        );
        assert_eq!(pods[0].containers.len(), 2);
    }

    #[test]
    fn status_adds_exit_code_reason_and_times_only_for_exited_containers() {
        let mut record = container_record(&container(
            "c1",
            "s1",
            cri::ContainerState::ContainerRunning,
        ));
        let status = cri::ContainerStatus {
            id: "c1".into(),
            state: cri::ContainerState::ContainerExited as i32,
            created_at: 1_000_000_000,
            started_at: 2_000_000_000,
            finished_at: 3_000_000_000,
            exit_code: 137,
            reason: "OOMKilled".into(),
            image: Some(cri::ImageSpec {
                image: "localhost/busybox:latest".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        apply_status(&mut record, &status);
        assert_eq!(record.state, ContainerState::Exited);
        assert_eq!(record.exit_code, Some(137));
        assert_eq!(record.reason, "OOMKilled");
        assert_eq!(record.image, "localhost/busybox:latest");
        assert_eq!(record.started_at, time_from_nanos(2_000_000_000));
        assert_eq!(record.finished_at, time_from_nanos(3_000_000_000));

        let running = cri::ContainerStatus {
            state: cri::ContainerState::ContainerRunning as i32,
            started_at: 2_000_000_000,
            ..Default::default()
        };
        apply_status(&mut record, &running);
        assert_eq!(record.exit_code, None);
        assert_eq!(record.finished_at, None);
    }
}
