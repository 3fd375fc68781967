//! containerd's task service: the shim's record of each container's init process, which knows
//! of a start or an exit some 30 ms before containerd's CRI store does. The containerd backend
//! reads its containers' state here; the CRI backend asks it about one container when a kernel
//! hint is ahead of the CRI store (see the relist's merge of a container's records). Also containerd's namespaces,
//! which every call to it names.

use std::{
    collections::HashMap,
    str::FromStr,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use containerd_client::{
    services::v1::{GetRequest, WaitRequest, WaitResponse, tasks_client::TasksClient},
    types::v1::{Process, Status},
};
use tokio::sync::watch;
use tonic::{Request, metadata::AsciiMetadataValue, transport::Channel};
use tracing::{debug, info};

use crate::{
    pleg::{CallCode, ContainerId, ExitWatch, RuntimeError, TaskRecord},
    runtime::transport::{Caller, found},
};

/// The namespace containerd's CRI plugin keeps Kubernetes containers in.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// containerd's identifier limit (namespaces, container ids).
const MAX_NAMESPACE_LEN: usize = 76;

/// The most exits waited for ahead at once ([`TaskService::watch_exit`]): each holds a call
/// open to containerd, and a goroutine there and in the shim. Past it, an exit is waited for
/// when asked, as before any was watched.
pub const MAX_WATCHED_EXITS: usize = 512;

/// How long a watched exit's answer is kept once it came, for the read that asks for it (a
/// kernel hint's, on a node busy enough to delay it).
const WATCHED_EXIT_KEPT: Duration = Duration::from_secs(5);

/// The exits waited for ahead, each container's answer to come: `None` until the shim
/// answers, then its record (`None` in it: the task was gone).
type Watches = HashMap<ContainerId, watch::Receiver<Option<Option<TaskRecord>>>>;

/// [`Watches`], shared by the service's clones and the watches' tasks.
type WatchedExits = Arc<Mutex<Watches>>;

/// A containerd namespace name, checked once (containerd's identifier rules) so every request
/// can carry it as the `containerd-namespace` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Namespace {
    name: String,
    header: AsciiMetadataValue,
}

/// A namespace containerd would reject.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid containerd namespace {0:?}: expected letters and digits separated by single '.', '_' or '-', at most 76 characters"
)]
pub struct InvalidNamespace(String);

impl Namespace {
    /// `k8s.io`, where containerd's CRI plugin keeps Kubernetes containers.
    pub(crate) fn cri() -> Self {
        Self {
            name: CRI_NAMESPACE.to_owned(),
            header: AsciiMetadataValue::from_static(CRI_NAMESPACE),
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.name
    }

    pub(crate) fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request
            .metadata_mut()
            .insert("containerd-namespace", self.header.clone());
        request
    }
}

impl FromStr for Namespace {
    type Err = InvalidNamespace;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let separator = |c: char| matches!(c, '.' | '_' | '-');
        let valid = !s.is_empty()
            && s.len() <= MAX_NAMESPACE_LEN
            && s.split(separator)
                .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric()));
        let header = s.parse().ok().filter(|_| valid);
        header
            .map(|header| Self {
                name: s.to_owned(),
                header,
            })
            .ok_or_else(|| InvalidNamespace(s.to_owned()))
    }
}

/// containerd's task service on an existing channel, in one namespace.
#[derive(Clone, Debug)]
pub(crate) struct TaskService {
    caller: Caller,
    channel: Channel,
    namespace: Namespace,
    /// Set once the socket says it has no task service (a runtime other than containerd).
    absent: Arc<AtomicBool>,
    watched: WatchedExits,
}

impl TaskService {
    pub(crate) fn new(caller: Caller, channel: Channel, namespace: Namespace) -> Self {
        Self {
            caller,
            channel,
            namespace,
            absent: Arc::default(),
            watched: Arc::default(),
        }
    }

    /// What the task service recorded of `container`'s init: started (running, paused) or
    /// exited with its status and time. `None` when it has no task, or when the socket has no
    /// task service at all (then it is not asked again).
    pub(crate) async fn record(
        &self,
        container: &ContainerId,
    ) -> Result<Option<TaskRecord>, RuntimeError> {
        if self.absent.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let process = get_process(&self.caller, &self.channel, &self.namespace, &container.0);
        Ok(self
            .unless_absent(process.await)?
            .as_ref()
            .and_then(task_record))
    }

    /// A call's result, where a socket with no task service at all answers no record, and is
    /// not asked again.
    fn unless_absent<T>(
        &self,
        result: Result<Option<T>, RuntimeError>,
    ) -> Result<Option<T>, RuntimeError> {
        match result {
            Err(RuntimeError::Call {
                code: CallCode::Unsupported,
                ..
            }) => {
                info!(
                    endpoint = %self.caller.endpoint,
                    "the runtime has no task service: starts and exits are confirmed by CRI"
                );
                self.absent.store(true, Ordering::Relaxed);
                Ok(None)
            }
            result => result,
        }
    }
}

impl TaskService {
    /// The exit of `container`'s init, waited for (`Tasks.Wait`): see
    /// [`crate::pleg::Runtime::task_exit`]. `None` when it has no task (or no task service).
    /// A watched exit ([`Self::watch_exit`]) is answered by its watch.
    pub(crate) async fn exit(
        &self,
        container: &ContainerId,
    ) -> Result<Option<TaskRecord>, RuntimeError> {
        if self.absent.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let watched = lock(&self.watched).get(container).cloned();
        if let Some(mut answer) = watched {
            // Its call failed when the watch ends with no answer: asked anew below.
            if let Ok(record) = answer.wait_for(Option::is_some).await {
                return Ok(record.flatten());
            }
        }
        let request = self.wait_request(container);
        found(self.caller.call("Tasks.Wait", request).await)
            .map(|response| response.map(exit_record))
    }

    /// Starts waiting for `container`'s exit now, held open until the shim answers it, so that
    /// [`Self::exit`] is answered as the shim reaps the init. A `Wait` asked only once the
    /// kernel saw the exit reaches the shim while it kills what is left of the container
    /// (`runc kill --all`, under the lock `Wait` takes first): it is answered after the
    /// runtime's cleanup when containerd's own `Delete` gets there first, 30 to 120 ms after
    /// `/tasks/exit` on a busy node. One already waiting is woken with containerd's own.
    /// Returns the answer to come when it began a watch.
    pub(crate) fn watch_exit(&self, container: &ContainerId) -> Option<ExitWatch> {
        if self.absent.load(Ordering::Relaxed) {
            return None;
        }
        let (answer, watch) = watch::channel(None);
        {
            let mut watched = lock(&self.watched);
            if watched.len() >= MAX_WATCHED_EXITS || watched.contains_key(container) {
                return None;
            }
            watched.insert(container.clone(), watch.clone());
        }
        let mut answered = watch.clone();
        let service = self.clone();
        let id = container.clone();
        let call = self
            .caller
            .open_call("Tasks.Wait", self.wait_request(container));
        tokio::spawn(async move {
            match service.unless_absent(found(call.await)) {
                Ok(response) => {
                    answer.send_replace(Some(response.map(exit_record)));
                    tokio::time::sleep(WATCHED_EXIT_KEPT).await;
                }
                Err(error) => debug!(container = %id, %error, "watching the exit failed"),
            }
            let mut watched = lock(&service.watched);
            if watched.get(&id).is_some_and(|w| w.same_channel(&watch)) {
                watched.remove(&id);
            }
        });
        Some(Box::pin(async move {
            let answer = answered.wait_for(Option::is_some).await.ok()?;
            answer.flatten()
        }))
    }

    /// Whether `container`'s exit is watched now.
    pub(crate) fn exit_watched(&self, container: &ContainerId) -> bool {
        lock(&self.watched).contains_key(container)
    }

    fn wait_request(
        &self,
        container: &ContainerId,
    ) -> impl Future<Output = Result<tonic::Response<WaitResponse>, tonic::Status>> + use<> {
        let mut client = TasksClient::new(self.channel.clone());
        let request = self.namespace.request(WaitRequest {
            container_id: container.0.clone(),
            exec_id: String::new(),
        });
        async move { client.wait(request).await }
    }
}

/// The exit a `Wait` answered.
fn exit_record(exit: WaitResponse) -> TaskRecord {
    TaskRecord::Exited {
        code: i32::try_from(exit.exit_status).unwrap_or(i32::MAX),
        at: time_from_timestamp(exit.exited_at.as_ref()).unwrap_or_else(SystemTime::now),
    }
}

/// The watched exits' map: each change to it is one statement, so a poisoned lock still
/// holds a consistent map.
fn lock(watched: &WatchedExits) -> MutexGuard<'_, Watches> {
    watched.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Tasks.Get of a container's init in `namespace`; `None` when it has no task.
pub(crate) async fn get_process(
    caller: &Caller,
    channel: &Channel,
    namespace: &Namespace,
    id: &str,
) -> Result<Option<Process>, RuntimeError> {
    let mut client = TasksClient::new(channel.clone());
    let request = client.get(namespace.request(GetRequest {
        container_id: id.to_owned(),
        exec_id: String::new(),
    }));
    let response = found(caller.call("Tasks.Get", request).await)?;
    Ok(response.and_then(|r| r.process))
}

/// A task's process as a task record; `None` while it is created, or in an unknown state.
pub(crate) fn task_record(process: &Process) -> Option<TaskRecord> {
    match Status::try_from(process.status) {
        Ok(Status::Running | Status::Paused | Status::Pausing) => {
            Some(TaskRecord::Started { at: None })
        }
        Ok(Status::Stopped) => Some(TaskRecord::Exited {
            code: i32::try_from(process.exit_status).unwrap_or(i32::MAX),
            at: time_from_timestamp(process.exited_at.as_ref()).unwrap_or_else(SystemTime::now),
        }),
        Ok(Status::Created | Status::Unknown) | Err(_) => None,
    }
}

/// A protobuf timestamp; containerd sends Go's zero time for "never", which lies before the
/// epoch.
pub(crate) fn time_from_timestamp(
    timestamp: Option<&prost_types::Timestamp>,
) -> Option<SystemTime> {
    SystemTime::try_from(*timestamp?)
        .ok()
        .filter(|&t| t > SystemTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn namespaces_follow_containerd_identifier_rules() {
        for good in ["k8s.io", "plegd-native", "a", "moby_1"] {
            assert_eq!(good.parse::<Namespace>().unwrap().as_str(), good);
        }
        for bad in ["", "-a", "a..b", "a/b", "é", "a b", &"x".repeat(77)] {
            assert!(bad.parse::<Namespace>().is_err(), "{bad:?}");
        }
        assert_eq!(Namespace::cri().as_str(), "k8s.io");
    }

    #[test]
    fn a_tasks_process_is_a_start_or_an_exit_record() {
        let exited_at = prost_types::Timestamp {
            seconds: 7,
            nanos: 0,
        };
        let process = |status: Status, exit_status: u32| Process {
            status: status as i32,
            exit_status,
            exited_at: Some(exited_at),
            ..Process::default()
        };
        assert_eq!(
            task_record(&process(Status::Stopped, 137)),
            Some(TaskRecord::Exited {
                code: 137,
                at: SystemTime::UNIX_EPOCH + Duration::from_secs(7)
            })
        );
        assert_eq!(
            task_record(&process(Status::Running, 0)),
            Some(TaskRecord::Started { at: None })
        );
        assert_eq!(
            task_record(&process(Status::Paused, 0)),
            Some(TaskRecord::Started { at: None })
        );
        assert_eq!(task_record(&process(Status::Created, 0)), None);
    }
}
