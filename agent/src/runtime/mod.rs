//! The container runtime, seen through a narrow trait: the one place plegd reads state from.
//!
//! Two real backends: CRI v1 (`cri`) and containerd's native API (`containerd`). A relist asks
//! for the pods within a [`Scope`]; every call has a timeout and its errors name the endpoint and
//! the call.
//!
//! Files import one way, lowest first: this file (the trait, its errors and types) and
//! `labels`; `transport` (gRPC over a unix socket, deadlines); `tasks` (containerd's task
//! service and namespaces); the backends `cri` and
//! `containerd` (which asks CRI on the same socket for what containerd forgets); `choice`
//! (which backend, at which endpoint). `testing` holds the fake.

pub(crate) mod choice;
pub(crate) mod containerd;
pub(crate) mod cri;
pub(crate) mod labels;
pub(crate) mod tasks;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub(crate) mod transport;

use std::{fmt, future::Future, time::Duration};

pub use choice::{AnyRuntime, EndpointError, RuntimeKind, RuntimeOptions, UnknownRuntimeKind};
pub use containerd::{ConnectError, ContainerdRuntime};
pub use cri::CriRuntime;
pub use tasks::{CRI_NAMESPACE, InvalidNamespace};

// Scope is the relist's notion; re-exported because every backend answers in its terms.
pub use crate::pleg::event::Scope;
use crate::{
    metrics::RuntimeCalls,
    pleg::record::{ContainerId, ContainerRecord, Layer, PodRecord, PodUid, TaskRecord},
};

/// Default deadline of one runtime call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The runtime's own name and version, for the start-up log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeVersion {
    pub name: String,
    pub version: String,
}

impl fmt::Display for RuntimeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.version)
    }
}

/// A runtime call that failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{endpoint}: connecting: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
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
    #[error("{endpoint}: {call}: {status}")]
    Call {
        endpoint: String,
        call: &'static str,
        #[source]
        status: tonic::Status,
    },
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

/// `listed`'s record in `known` when a status call would only repeat it: the runtime's status
/// of a container (exit code, reason, times) does not change while its state does not. A
/// record the task service confirmed ahead of the CRI store is read again, for CRI's reason.
pub fn known_status<'a>(
    known: Option<&'a PodRecord>,
    listed: &ContainerRecord,
) -> Option<&'a ContainerRecord> {
    known?
        .containers
        .get(&listed.id)
        .filter(|k| k.state == listed.state && k.confirmed_by == Layer::Cri)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pleg::record::ContainerState::{Exited, Running},
        runtime::testing::{container, exited, pod},
    };

    #[test]
    fn a_known_status_is_reused_only_in_the_same_state_as_the_cri_store_confirmed_it() {
        let mut by_task = exited("by-task", "app", 137, "");
        by_task.confirmed_by = Layer::Task;
        let known = pod(
            "p",
            "web",
            [
                container("running", "app", Running),
                exited("exited", "app", 1, "Error"),
                by_task,
            ],
        );
        let cases = [
            ("same state", container("running", "app", Running), true),
            ("exited since", container("running", "app", Exited), false),
            ("still exited", container("exited", "app", Exited), true),
            (
                "confirmed by the task service",
                container("by-task", "app", Exited),
                false,
            ),
            ("not known", container("new", "app", Running), false),
        ];
        for (name, listed, reused) in cases {
            assert_eq!(
                known_status(Some(&known), &listed).is_some(),
                reused,
                "{name}"
            );
        }
        assert!(known_status(None, &container("running", "app", Running)).is_none());
    }
}
