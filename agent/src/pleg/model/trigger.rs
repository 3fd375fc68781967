//! What drives the PLEG: the triggers sources hand it, and the observations they carry.

use std::{sync::Arc, time::SystemTime};

use crate::pleg::model::{
    oom::OomKill,
    record::{ContainerId, PodUid, TaskRecord},
    source::Source,
};

/// What a trigger or a hint is about, and what a relist reads: the node, one pod, or one
/// container (its pod, once a relist has tied it to one). A targeted relist reads a pod or a
/// container; a full relist, the node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// The whole node: every pod.
    Node,
    /// One pod.
    Pod(PodUid),
    /// One container (or sandbox) by its id: the pod holding it, or the container alone while
    /// no relist has seen it.
    Container(ContainerId),
}

impl Scope {
    /// Whether a read of this scope answers a hint about `target`: the node's answers every
    /// target, any other scope its own.
    pub fn covers(&self, target: &Scope) -> bool {
        self == &Self::Node || self == target
    }
}

/// A fact a source saw that runtime records may not carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub source: Source,
    pub kind: ObservationKind,
}

/// What an [`Observation`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObservationKind {
    /// The container's main process exited with this code.
    ExitCode(i32),
    /// The container's main process was killed by this signal.
    Signal(i32),
    /// The kernel's OOM killer chose a process of the container (containerd's `/tasks/oom`,
    /// the kernel's `mark_victim`): not a death by itself (a child may be the victim while the
    /// init lives on), but the reason of the one that follows.
    OomKilled,
    /// The kernel's account of that OOM kill: which limit it came from and whom it chose.
    /// Rides beside the kernel's [`ObservationKind::OomKilled`].
    OomKill(Arc<OomKill>),
    /// A process of the container executed this binary.
    Exec(String),
    /// The container's main process exited, with no status known (a kernel without BTF).
    Exited,
    /// The container's cgroup was removed: its processes are gone and its task deleted.
    CgroupRemoved,
    /// The runtime's task service started the container's init (containerd `/tasks/start`),
    /// whose host pid is `pid` (0: not said): the runtime's own record, not a kernel hint.
    TaskStarted { at: SystemTime, pid: u32 },
    /// The runtime's task service recorded the init's exit (containerd `/tasks/exit`).
    TaskExited { code: i32, at: SystemTime },
    /// The runtime deleted the container (containerd `/containers/delete`, CRI's
    /// `CONTAINER_DELETED_EVENT`). containerd publishes it a moment before its CRI store
    /// forgets the container.
    Deleted,
    /// The runtime holds the container, and says nothing of its init (containerd
    /// `/containers/create` and `/update`, `/tasks/create`, `/paused`, `/resumed`; a container
    /// cgroup made): news only of a container plegd has not read yet. Not shown to consumers.
    Present,
    /// The runtime deleted the container's task (containerd `/tasks/delete`): its init is gone.
    /// Not shown to consumers (the exit that came before it is).
    TaskDeleted,
    /// Who the container is on the host, as the kernel knows it: its cgroup, its init. Rides
    /// on the kernel's other observations; not shown to consumers as an observation (events
    /// and statuses carry it as the container's identity).
    Identity(Identity),
}

/// A container's identity on the host, as the kernel's probes know it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// The cgroup2 id of its cgroup (the inode of the cgroup's directory).
    pub cgroup_id: u64,
    /// Its cgroup's path below the cgroup2 root.
    pub cgroup_path: Arc<str>,
    /// The host pid of its init, when the observation is about the init.
    pub init_pid: Option<u32>,
    /// The pod its cgroup's path names (kubelet's layouts), if it names one.
    pub pod: Option<PodUid>,
}

/// What an observation says of its container's life, in the lifecycle's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Says {
    /// It exists.
    Present,
    /// Its init started.
    Started,
    /// The OOM killer killed one of its processes (the init, or another: only a death says
    /// the init is gone).
    OomKill,
    /// Its init is gone.
    Died,
    /// The container is gone.
    Deleted,
}

impl ObservationKind {
    /// The runtime's task record this observation is, if it is one (and not a kernel hint).
    pub fn task_record(&self) -> Option<TaskRecord> {
        match *self {
            Self::TaskStarted { at, .. } => Some(TaskRecord::Started { at: Some(at) }),
            Self::TaskExited { code, at } => Some(TaskRecord::Exited { code, at }),
            _ => None,
        }
    }

    /// Whether it is the runtime's own record of a change (not a kernel hint): as good as a
    /// reading of the runtime, when confirming by the task store.
    pub fn is_runtime_record(&self) -> bool {
        matches!(
            self,
            Self::TaskStarted { .. } | Self::TaskExited { .. } | Self::Deleted
        )
    }

    /// What it says of the container's life.
    pub fn says(&self) -> Says {
        match self {
            Self::Present | Self::Identity(_) => Says::Present,
            Self::Exec(_) | Self::TaskStarted { .. } => Says::Started,
            Self::OomKilled | Self::OomKill(_) => Says::OomKill,
            Self::ExitCode(_)
            | Self::Signal(_)
            | Self::Exited
            | Self::CgroupRemoved
            | Self::TaskExited { .. }
            | Self::TaskDeleted => Says::Died,
            Self::Deleted => Says::Deleted,
        }
    }

    /// Whether consumers see it on events (the others only tell plegd where to look, or who
    /// the container is).
    pub fn is_shown(&self) -> bool {
        !matches!(self, Self::Present | Self::TaskDeleted | Self::Identity(_))
    }
}

/// A hint that part of the node may have changed: relist `scope` soon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trigger {
    pub scope: Scope,
    pub source: Source,
    /// When the source saw the change (wall clock, so it can be shown to users).
    pub observed_at: SystemTime,
    /// Facts about the container of a [`Scope::Container`] trigger. Observations of pod or
    /// node wide triggers cannot be tied to a container and are dropped by the scheduler.
    pub observations: Vec<Observation>,
}

impl Trigger {
    /// A trigger of `source` about container `id`, every observation `source`'s.
    pub fn about(
        id: ContainerId,
        source: Source,
        observed_at: SystemTime,
        kinds: impl IntoIterator<Item = ObservationKind>,
    ) -> Self {
        Self {
            scope: Scope::Container(id),
            source,
            observed_at,
            observations: kinds
                .into_iter()
                .map(|kind| Observation { source, kind })
                .collect(),
        }
    }

    /// Whether it says only that its container exists (who it is, at most): news only where a
    /// created container is (`ContainerChanged`). One with no observation says something
    /// changed, which only a reading answers.
    pub fn only_presence(&self) -> bool {
        !self.observations.is_empty()
            && self
                .observations
                .iter()
                .all(|o| o.kind.says() == Says::Present)
    }
}

/// `source:fact`, as the output prints it (`ebpf:signal=9`, `containerd:exit_code=137`).
impl std::fmt::Display for Observation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = self.source.name();
        match &self.kind {
            ObservationKind::ExitCode(code) | ObservationKind::TaskExited { code, .. } => {
                write!(f, "{source}:exit_code={code}")
            }
            ObservationKind::Signal(signal) => write!(f, "{source}:signal={signal}"),
            ObservationKind::OomKilled => write!(f, "{source}:oom_killed"),
            ObservationKind::OomKill(kill) => write!(f, "{source}:oom_scope={kill}"),
            ObservationKind::Exec(path) => write!(f, "{source}:exec={path}"),
            ObservationKind::Exited => write!(f, "{source}:exited"),
            ObservationKind::CgroupRemoved => write!(f, "{source}:cgroup_removed"),
            ObservationKind::TaskStarted { .. } => write!(f, "{source}:task_started"),
            ObservationKind::Deleted => write!(f, "{source}:deleted"),
            ObservationKind::Present => write!(f, "{source}:present"),
            ObservationKind::TaskDeleted => write!(f, "{source}:task_deleted"),
            ObservationKind::Identity(identity) => {
                write!(f, "{source}:cgroup={}", identity.cgroup_id)
            }
        }
    }
}
