//! A recording fake [`Runtime`] for tests and benchmarks: in-memory pods that tests change
//! between relists, call counters, and injectable delays, hangs and errors.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use crate::pleg::{
    CallCode, ContainerId, ContainerRead, ContainerRecord, ContainerState, Containers, ExitWatch,
    HostIdentity, Observation, ObservationKind, PodLifecycleEvent, PodLifecycleEventType,
    PodRecord, PodUid, Runtime, RuntimeError, Scope, Source, Store, TaskRecord,
};

const ENDPOINT: &str = "fake";

/// The kernel's account of a pod-level OOM kill whose victim was the container's init.
pub fn oom_kill() -> Arc<crate::pleg::OomKill> {
    Arc::new(crate::pleg::OomKill {
        scope: crate::pleg::OomScope::Pod,
        cgroup: Some("/kubepods/besteffort/pod1".into()),
        limit_bytes: Some(48 << 20),
        victim_pid: 42,
        victim_comm: "dd".into(),
        victim_init: true,
    })
}

/// In-memory runtime. Inspection returns the records as set; listing strips what a CRI list
/// call does not carry (exit code, reason, timestamps), as the real backends do.
///
/// Clones share their state: a test keeps one to change the pods while the relister owns
/// another.
#[derive(Clone, Debug, Default)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    pods: BTreeMap<PodUid, PodRecord>,
    list_calls: Vec<Scope>,
    inspect_calls: Vec<PodUid>,
    failing_inspections: BTreeSet<PodUid>,
    /// What the next inspection of a pod returns instead of its records (once).
    stale_inspections: BTreeMap<PodUid, PodRecord>,
    failing_lists: bool,
    delay: Option<Duration>,
    hang: bool,
    /// The task service's records, ahead of the pods' (CRI) records.
    tasks: BTreeMap<ContainerId, TaskRecord>,
    task_calls: Vec<ContainerId>,
    exit_watches: Vec<ContainerId>,
    /// Containers of every `read_containers` call, in call order.
    read_calls: Vec<ContainerId>,
}

/// An exited container, as CRI shows it after its status call: its exit code and reason.
pub fn exited(id: &str, name: &str, exit_code: i32, reason: &str) -> ContainerRecord {
    ContainerRecord {
        exit_code: Some(exit_code),
        reason: reason.to_owned(),
        image: "busybox".to_owned(),
        ..container(id, name, ContainerState::Exited)
    }
}

/// A pod `uid` of namespace `ns` named `name`, holding `containers`.
pub fn pod(
    uid: &str,
    name: &str,
    containers: impl IntoIterator<Item = ContainerRecord>,
) -> PodRecord {
    PodRecord {
        uid: PodUid(uid.to_owned()),
        namespace: "ns".to_owned(),
        name: name.to_owned(),
        containers: containers.into_iter().map(|c| (c.id.clone(), c)).collect(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
    }
}

/// A container record with the given state; exited containers get exit code 0.
pub fn container(id: &str, name: &str, state: ContainerState) -> ContainerRecord {
    ContainerRecord {
        id: ContainerId(id.to_owned()),
        name: name.to_owned(),
        attempt: 0,
        image: "localhost/busybox:latest".to_owned(),
        state,
        sandbox: false,
        created_at: None,
        started_at: None,
        finished_at: None,
        exit_code: (state == ContainerState::Exited).then_some(0),
        reason: String::new(),
        confirmed_by: Store::Cri,
        oom_killed_by: BTreeSet::new(),
        oom_kill: None,
        host: None,
    }
}

/// A `ContainerDied` of exit 137 event of sequence `sequence` about container `c1` ("app") of
/// pod `pod` (uid and name, and its label `app`) in namespace `ns`, that eBPF (signal 9) and
/// containerd saw, at 1,800,000,000.123456789 s after the epoch, with every field set; change
/// what a test looks at.
pub fn event(sequence: u64, pod: &str) -> PodLifecycleEvent {
    let at = std::time::UNIX_EPOCH + Duration::from_nanos(1_800_000_000_123_456_789);
    PodLifecycleEvent {
        sequence,
        pod: PodUid(pod.to_owned()),
        pod_namespace: "ns".to_owned(),
        pod_name: pod.to_owned(),
        container_id: ContainerId("c1".to_owned()),
        container_name: "app".to_owned(),
        event_type: PodLifecycleEventType::ContainerDied,
        observed_at: at,
        emitted_at: at,
        sources: vec![Source::Ebpf, Source::Containerd],
        observations: vec![Observation {
            source: Source::Ebpf,
            kind: ObservationKind::Signal(9),
        }],
        exit_code: Some(137),
        reason: "Error".to_owned(),
        confirmed_by: Some(Store::Task),
        signal: Some(9),
        image: "localhost/busybox:latest".to_owned(),
        attempt: 0,
        host: Some(Arc::new(HostIdentity {
            cgroup_id: Some(4242),
            cgroup_path: Some("/k8s.io/c1".to_owned()),
            init_pid: Some(4243),
        })),
        pod_labels: BTreeMap::from([("app".to_owned(), pod.to_owned())]),
        pod_annotations: BTreeMap::new(),
    }
}

impl FakeRuntime {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an empty pod (or empties an existing one).
    pub fn add_pod(&self, uid: &str, namespace: &str, name: &str) {
        let pod = PodRecord {
            uid: PodUid(uid.to_owned()),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            containers: Containers::new(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        };
        self.lock().pods.insert(pod.uid.clone(), pod);
    }

    /// Adds or replaces a container of an existing pod; ignored if the pod does not exist.
    pub fn set_container(&self, pod: &str, record: ContainerRecord) {
        if let Some(pod) = self.lock().pods.get_mut(&PodUid(pod.to_owned())) {
            pod.containers.insert(record.id.clone(), record);
        }
    }

    /// Changes a container's state (and exit code); ignored if it does not exist.
    pub fn set_state(&self, pod: &str, id: &str, state: ContainerState, exit_code: Option<i32>) {
        let mut guard = self.lock();
        let record = guard
            .pods
            .get_mut(&PodUid(pod.to_owned()))
            .and_then(|pod| pod.containers.get_mut(&ContainerId(id.to_owned())));
        if let Some(record) = record {
            record.state = state;
            record.exit_code = exit_code;
        }
    }

    pub fn remove_container(&self, pod: &str, id: &str) {
        if let Some(pod) = self.lock().pods.get_mut(&PodUid(pod.to_owned())) {
            pod.containers.remove(&ContainerId(id.to_owned()));
        }
    }

    pub fn remove_pod(&self, uid: &str) {
        self.lock().pods.remove(&PodUid(uid.to_owned()));
    }

    /// Makes `inspect_pod` of this pod, and reads of its containers, fail (or succeed again).
    pub fn fail_inspection(&self, uid: &str, fail: bool) {
        let uid = PodUid(uid.to_owned());
        let mut state = self.lock();
        if fail {
            state.failing_inspections.insert(uid);
        } else {
            state.failing_inspections.remove(&uid);
        }
    }

    /// What the task service says of a container from now on (`None`: it has no record).
    pub fn set_task(&self, id: &str, record: Option<TaskRecord>) {
        let id = ContainerId(id.to_owned());
        let mut state = self.lock();
        match record {
            Some(record) => state.tasks.insert(id, record),
            None => state.tasks.remove(&id),
        };
    }

    /// Containers of every `task_record` and `task_exit` call so far.
    pub fn task_calls(&self) -> Vec<ContainerId> {
        self.lock().task_calls.clone()
    }

    /// The task's exit, once [`Self::set_task`] sets one (or removes it).
    async fn exit_of(&self, container: &ContainerId) -> Option<TaskRecord> {
        loop {
            match self.lock().tasks.get(container).copied() {
                Some(TaskRecord::Started { .. }) => {}
                exited => return exited,
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Containers of every `watch_exit` call so far, in call order.
    pub fn exit_watches(&self) -> Vec<ContainerId> {
        self.lock().exit_watches.clone()
    }

    /// Makes `list_pods` fail (or succeed again).
    pub fn fail_lists(&self, fail: bool) {
        self.lock().failing_lists = fail;
    }

    /// Delays every call by `delay` (tokio time).
    pub fn set_delay(&self, delay: Option<Duration>) {
        self.lock().delay = delay;
    }

    /// Makes every call from now on never return.
    pub fn set_hang(&self, hang: bool) {
        self.lock().hang = hang;
    }

    /// Scopes of every `list_pods` call so far.
    pub fn list_calls(&self) -> Vec<Scope> {
        self.lock().list_calls.clone()
    }

    /// Pods of every `inspect_pod` call so far, in call order.
    pub fn inspect_calls(&self) -> Vec<PodUid> {
        self.lock().inspect_calls.clone()
    }

    /// Containers of every `read_containers` call so far, in call order.
    pub fn read_calls(&self) -> Vec<ContainerId> {
        self.lock().read_calls.clone()
    }

    /// Forgets the calls recorded so far: a benchmark making thousands of relists would
    /// otherwise keep every call it made, and measure its own growing heap.
    pub fn forget_calls(&self) {
        let mut state = self.lock();
        state.list_calls = Vec::new();
        state.inspect_calls = Vec::new();
        state.task_calls = Vec::new();
        state.read_calls = Vec::new();
    }

    /// Makes the next inspection of `uid` (or read of its containers) return `record`, as a runtime whose status call
    /// lags its list call does (containerd's task deleted before the CRI store is updated).
    pub fn lag_next_inspection(&self, uid: &str, record: PodRecord) {
        self.lock()
            .stale_inspections
            .insert(PodUid(uid.to_owned()), record);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Test state, written in single statements: a poisoned lock is still consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies the injected delay or hang, without holding the lock across the wait.
    async fn wait(&self) {
        let (delay, hang) = {
            let state = self.lock();
            (state.delay, state.hang)
        };
        if hang {
            std::future::pending::<()>().await;
        }
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
    }
}

fn injected(call: &'static str) -> RuntimeError {
    RuntimeError::Call {
        endpoint: ENDPOINT.to_owned(),
        call,
        code: CallCode::Other,
        source: "injected failure".into(),
    }
}

/// What a list call returns: no exit codes, reasons or timestamps.
fn listed(pod: &PodRecord) -> PodRecord {
    let mut pod = pod.clone();
    for c in pod.containers.values_mut() {
        c.exit_code = None;
        c.reason.clear();
        c.started_at = None;
        c.finished_at = None;
    }
    pod
}

impl Runtime for FakeRuntime {
    fn endpoint(&self) -> &str {
        ENDPOINT
    }

    async fn list_pods(&self, scope: &Scope) -> Result<Vec<PodRecord>, RuntimeError> {
        self.lock().list_calls.push(scope.clone());
        self.wait().await;
        let state = self.lock();
        if state.failing_lists {
            return Err(injected("list_pods"));
        }
        let pods = state.pods.values();
        Ok(match scope {
            Scope::Node => pods.map(listed).collect(),
            Scope::Pod(uid) => pods.filter(|p| &p.uid == uid).map(listed).collect(),
            Scope::Container(id) => pods
                .filter(|p| p.containers.contains_key(id))
                .map(listed)
                .collect(),
        })
    }

    /// Reads the whole pod whatever `known` holds: the fake's reads cost nothing.
    async fn inspect_pod(
        &self,
        uid: &PodUid,
        _known: Option<&PodRecord>,
    ) -> Result<Option<PodRecord>, RuntimeError> {
        self.lock().inspect_calls.push(uid.clone());
        self.wait().await;
        let state = self.lock();
        if state.failing_inspections.contains(uid) {
            return Err(injected("inspect_pod"));
        }
        let mut state = state;
        if let Some(stale) = state.stale_inspections.remove(uid) {
            return Ok(Some(stale));
        }
        Ok(state.pods.get(uid).cloned())
    }

    /// Reads each container from the pod holding it, as set (or as queued by
    /// [`FakeRuntime::lag_next_inspection`]).
    async fn read_containers(
        &self,
        ids: &[ContainerId],
        _committed: Option<&PodRecord>,
    ) -> Result<Vec<ContainerRead>, RuntimeError> {
        self.lock().read_calls.extend(ids.iter().cloned());
        self.wait().await;
        let mut state = self.lock();
        let mut reads = Vec::new();
        for id in ids {
            let holder = state.pods.values().find(|p| p.containers.contains_key(id));
            let Some(uid) = holder.map(|p| p.uid.clone()) else {
                reads.push(ContainerRead::in_pod(id, None));
                continue;
            };
            if state.failing_inspections.contains(&uid) {
                return Err(injected("read_containers"));
            }
            let pod = match state.stale_inspections.remove(&uid) {
                Some(stale) => stale,
                None => state.pods[&uid].clone(),
            };
            reads.push(ContainerRead::in_pod(id, Some(&pod)));
        }
        Ok(reads)
    }

    async fn task_record(
        &self,
        container: &ContainerId,
    ) -> Result<Option<TaskRecord>, RuntimeError> {
        self.lock().task_calls.push(container.clone());
        self.wait().await;
        Ok(self.lock().tasks.get(container).copied())
    }

    /// Waits, as containerd's `Tasks.Wait` does, until the task set is an exit (or gone).
    async fn task_exit(&self, container: &ContainerId) -> Result<Option<TaskRecord>, RuntimeError> {
        self.lock().task_calls.push(container.clone());
        self.wait().await;
        Ok(self.exit_of(container).await)
    }

    /// Watched once per container, as the task service does; answered as [`Self::set_task`]
    /// sets an exit.
    fn watch_exit(&self, container: &ContainerId) -> Option<ExitWatch> {
        let mut state = self.lock();
        let watched = state.exit_watches.contains(container);
        state.exit_watches.push(container.clone());
        if watched {
            return None;
        }
        let (runtime, id) = (self.clone(), container.clone());
        Some(Box::pin(async move { runtime.exit_of(&id).await }))
    }

    fn exit_watched(&self, container: &ContainerId) -> bool {
        self.lock().exit_watches.contains(container)
    }
}
