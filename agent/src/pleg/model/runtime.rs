//! The port the PLEG reads the runtime through: the one trait every backend implements (CRI,
//! containerd's own API, the fake), owned here, by the side that uses it.

use std::{future::Future, pin::Pin, time::Duration};

use crate::{
    base::metrics::RuntimeCalls,
    pleg::model::{
        record::{ContainerId, PodRecord, PodUid, TaskRecord},
        trigger::Scope,
    },
};

/// A watched exit's answer to come ([`Runtime::watch_exit`]): the task service's record of the
/// init's exit, `None` when it had no task or the wait failed.
pub type ExitWatch = Pin<Box<dyn Future<Output = Option<TaskRecord>> + Send>>;

/// A runtime call that failed. The cause is kept whole for its text and its own causes (a
/// transport's or a gRPC status's error, which only the adapter that made the call knows the
/// type of); what callers act on is said in plegd's terms ([`CallCode`]).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{endpoint}: connecting: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The endpoint's path exists but no runtime can listen on it.
    #[error("{endpoint} is {what}, not a unix socket")]
    NotASocket {
        endpoint: String,
        what: &'static str,
    },
    #[error("{endpoint}: {call} timed out after {timeout:?}")]
    Timeout {
        endpoint: String,
        call: &'static str,
        timeout: Duration,
    },
    /// The runtime answered the call with an error.
    #[error("{endpoint}: {call}: {source}")]
    Call {
        endpoint: String,
        call: &'static str,
        code: CallCode,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What a runtime's error answer means to its callers: the cases they act on, and the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallCode {
    /// What the call named does not exist (it went between a listing and a status call).
    NotFound,
    /// The runtime does not offer the call (a socket without containerd's task service).
    Unsupported,
    /// Any other error: the call may succeed later.
    Other,
}

/// Reads pod and container state from a container runtime.
pub trait Runtime: Send + Sync + 'static {
    /// A human-readable name of the endpoint, for logs and errors.
    fn endpoint(&self) -> &str;

    /// Where this runtime's calls are counted (a fake counts none).
    fn calls(&self) -> RuntimeCalls {
        RuntimeCalls::default()
    }

    /// Lists the pods within `scope` with their sandboxes and containers, from the runtime's
    /// cheap list calls: ids, names, states, no exit codes. A targeted scope whose pod does not
    /// exist yields an empty list, not an error.
    fn list_pods(
        &self,
        scope: &Scope,
    ) -> impl Future<Output = Result<Vec<PodRecord>, RuntimeError>> + Send;

    /// Inspects one pod (kubelet's GetPodStatus): the same records completed by the status
    /// calls (exit codes, reasons, timestamps). `None` when the pod no longer exists.
    ///
    /// `known` is the pod's last inspection: a container it holds as the CRI store confirmed
    /// it, in the state the listing still shows, is taken from it without a status call
    /// ([`known_status`]). A pod under churn gains containers, and reading every one's status
    /// on each change made a targeted relist cost tens of milliseconds on a busy node.
    fn inspect_pod(
        &self,
        pod: &PodUid,
        known: Option<&PodRecord>,
    ) -> impl Future<Output = Result<Option<PodRecord>, RuntimeError>> + Send;

    /// [`Runtime::inspect_pod`] of a pod as a listing of the node just showed it
    /// (`list_pods(&Scope::Node)`), which need not be listed again: a full relist inspects
    /// every pod at a start, and listing each one again (three filtered list calls on CRI,
    /// each a scan of every container of the node) would make a dense node slow to be ready.
    /// The default lists it again.
    fn inspect_listed(
        &self,
        listed: PodRecord,
        known: Option<&PodRecord>,
    ) -> impl Future<Output = Result<Option<PodRecord>, RuntimeError>> + Send {
        async move { self.inspect_pod(&listed.uid, known).await }
    }

    /// Reads containers or sandboxes by id, each on its own (kubelet's `ContainerStatus`,
    /// `PodSandboxStatus`): its complete record and the pod holding it, or nothing when the
    /// runtime no longer has it. A hint names the containers it is about, and reading just
    /// those costs a call each, where a pod's inspection lists the pod (three calls on CRI)
    /// and decodes every container of it.
    ///
    /// `committed` is the pod they were last committed in, if any: it says which ids are
    /// sandboxes. The default reads their pod whole ([`Runtime::inspect_pod`]), found with a
    /// listing when `committed` is `None`.
    fn read_containers(
        &self,
        ids: &[ContainerId],
        committed: Option<&PodRecord>,
    ) -> impl Future<Output = Result<Vec<ContainerRead>, RuntimeError>> + Send {
        async move {
            let uid = match committed {
                Some(pod) => Some(pod.uid.clone()),
                None => {
                    let id = ids.first().map(|id| Scope::Container(id.clone()));
                    let listed = match id {
                        Some(scope) => self.list_pods(&scope).await?,
                        None => Vec::new(),
                    };
                    listed.into_iter().next().map(|pod| pod.uid)
                }
            };
            let pod = match uid {
                Some(uid) => self.inspect_pod(&uid, committed).await?,
                None => None,
            };
            Ok(ids
                .iter()
                .map(|id| ContainerRead::in_pod(id, pod.as_ref()))
                .collect())
        }
    }

    /// What the runtime's task service (containerd's) recorded of `container`'s init, ahead of
    /// its CRI store. `None` where the runtime keeps no such record apart (CRI-O), or where
    /// the backend's own records already are the task service's.
    fn task_record(
        &self,
        container: &ContainerId,
    ) -> impl Future<Output = Result<Option<TaskRecord>, RuntimeError>> + Send {
        let _ = container;
        async { Ok(None) }
    }

    /// The exit the runtime's task service records of `container`'s init, waited for: it
    /// answers as the init is reaped (containerd's `Tasks.Wait`), where a status call then
    /// waits out the runtime's cleanup (the shim holds the task through it). `None` where
    /// [`Runtime::task_record`] is, or when the task is gone already.
    fn task_exit(
        &self,
        container: &ContainerId,
    ) -> impl Future<Output = Result<Option<TaskRecord>, RuntimeError>> + Send {
        let _ = container;
        async { Ok(None) }
    }

    /// Starts waiting for `container`'s exit ahead of it, where the task service can
    /// (containerd's `Tasks.Wait`, held open): a later [`Runtime::task_exit`] is then answered
    /// as the init is reaped, not behind the runtime's cleanup of it. Returns the answer to
    /// come when it began a watch; `None` where there is no task service, when the container's
    /// exit is watched already, or past the backend's bound.
    fn watch_exit(&self, container: &ContainerId) -> Option<ExitWatch> {
        let _ = container;
        None
    }

    /// Whether `container`'s exit is watched now ([`Runtime::watch_exit`]): asking for it
    /// costs no call.
    fn exit_watched(&self, container: &ContainerId) -> bool {
        let _ = container;
        false
    }
}

/// One container or sandbox read by its id ([`Runtime::read_containers`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRead {
    pub id: ContainerId,
    /// Its pod (identity and this one record), or `None`: the runtime does not have it.
    pub found: Option<PodRecord>,
}

impl ContainerRead {
    /// `id` as `pod` (a whole inspection, `None`: gone) holds it.
    pub fn in_pod(id: &ContainerId, pod: Option<&PodRecord>) -> Self {
        let found = pod.and_then(|pod| {
            let record = pod.containers.get(id)?;
            let mut found = pod.identity();
            found.containers.insert(id.clone(), record.clone());
            Some(found)
        });
        Self {
            id: id.clone(),
            found,
        }
    }
}
