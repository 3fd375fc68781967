//! What the PLEG emits and what drives it: types and constants only.
//!
//! # Design assumptions
//!
//! - **The runtime is the source of truth.** Every [`PodLifecycleEvent`] comes from a change of
//!   a container's runtime record: what a reading of the runtime showed (a listing, a status
//!   call), or a record of the runtime's own that a trigger carried (containerd's `/tasks/start`,
//!   `/tasks/exit` and `/containers/delete`: see [`ObservationKind::is_runtime_record`]). A kernel
//!   observation never makes an event. So every source of hints produces the same events,
//!   deduplicated, in per-pod order.
//! - **A relist sees snapshots, not history.** A container that started and died between two
//!   readings yields `ContainerDied` only (never `ContainerStarted`), unless the runtime's own
//!   record of its start came with a trigger; one that was created, ran and was removed between
//!   two readings yields nothing at all. Kubelet has the same blind spot; consumers must treat
//!   events as "look at this pod now", not as a complete log.
//! - **Triggers are hints.** A [`Trigger`] (kernel, containerd or CRI event stream) says *where*
//!   and *when* to look, so a targeted relist can run within milliseconds instead of waiting for
//!   the next period. A trigger may arrive before the runtime reflects the change (the scheduler
//!   retries a few times), or be lost (ring buffer overflow, stream reconnect).
//! - **The safety net is the periodic full relist.** Whatever the hints miss, the next full
//!   relist finds, at most [`DEFAULT_RELIST_PERIOD`] (or the configured period) late. Any sign of
//!   loss schedules a full relist at once.
//! - **Observations the runtime cannot give** (exit signal, OOM kill, exec of a new binary)
//!   ride along as [`Observation`]s on the events of the container they are about, tagged with
//!   their source.
//! - **Events leave complete.** An event carries the state it announces: exit code, reason, and
//!   which of the runtime's records confirmed it. Nothing downstream reads the cache to finish
//!   one.
//! - **Health is relist age.** The PLEG is unhealthy when no full relist has succeeded within
//!   [`DEFAULT_RELIST_THRESHOLD`]; a relist that hangs therefore makes it unhealthy.

use std::time::{Duration, SystemTime};

use crate::pleg::record::{ContainerId, Layer, PodUid, TaskRecord};

/// How often a full relist runs when nothing else asks for one (kubelet's `relistPeriod`).
pub const DEFAULT_RELIST_PERIOD: Duration = Duration::from_secs(1);

/// How old the last successful full relist may be before the PLEG is unhealthy (kubelet's
/// `relistThreshold`).
pub const DEFAULT_RELIST_THRESHOLD: Duration = Duration::from_secs(3 * 60);

/// Queue length of the daemon's own event consumers (stdout, the sync loop) on the event bus;
/// kubelet's `plegChannelCapacity` sizes its one channel the same.
pub const DEFAULT_EVENT_CHANNEL_CAPACITY: usize = 1000;

/// Kind of a lifecycle event (kubelet's `PodLifeCycleEventType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PodLifecycleEventType {
    /// A container (or sandbox) is now running.
    ContainerStarted,
    /// A container (or sandbox) is now exited, or vanished while running.
    ContainerDied,
    /// An exited container (or sandbox) no longer exists.
    ContainerRemoved,
    /// A container's state became unknown (or created). Not sent by default: kubelet considers
    /// it unreliable.
    ContainerChanged,
    /// Something about the pod changed: resync it. The relist never emits it (neither does
    /// kubelet's generic PLEG); it is for layers that only want to poke a consumer.
    PodSync,
}

/// Where a trigger (and so an event) came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TriggerSource {
    /// A kernel tracepoint seen by the eBPF programs.
    Ebpf,
    /// containerd's native event stream.
    Containerd,
    /// CRI `GetContainerEvents`.
    CriEvents,
    /// A relist that nothing specific asked for (the periodic safety net).
    Relist,
}

impl TriggerSource {
    /// The lowercase name, as in the API, metrics and output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ebpf => "ebpf",
            Self::Containerd => "containerd",
            Self::CriEvents => "cri-events",
            Self::Relist => "relist",
        }
    }
}

/// What part of the node a relist reads.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every pod.
    All,
    /// One pod (targeted relist).
    Pod(PodUid),
    /// The pod holding this container (targeted relist from a kernel or stream hint that only
    /// knows the container id).
    Container(ContainerId),
}

/// A fact a source saw that runtime records may not carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub source: TriggerSource,
    pub kind: ObservationKind,
}

/// What an [`Observation`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObservationKind {
    /// The container's main process exited with this code.
    ExitCode(i32),
    /// The container's main process was killed by this signal.
    Signal(i32),
    /// The kernel's OOM killer chose a process of the container.
    OomKilled,
    /// A process of the container executed this binary.
    Exec(String),
    /// The container's main process exited, with no status known (a kernel without BTF).
    Exited,
    /// The container's cgroup was removed: its processes are gone and its task deleted.
    CgroupRemoved,
    /// The runtime's task service started the container's init (containerd `/tasks/start`):
    /// the runtime's own record, not a kernel hint.
    TaskStarted { at: SystemTime },
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
}

/// What an observation says of its container's life, in the lifecycle's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Says {
    /// It exists.
    Present,
    /// Its init started.
    Started,
    /// Its init is gone.
    Died,
    /// The container is gone.
    Deleted,
}

impl ObservationKind {
    /// The runtime's task record this observation is, if it is one (and not a kernel hint).
    pub fn task_record(&self) -> Option<TaskRecord> {
        match *self {
            Self::TaskStarted { at } => Some(TaskRecord::Started { at: Some(at) }),
            Self::TaskExited { code, at } => Some(TaskRecord::Exited { code, at }),
            _ => None,
        }
    }

    /// Whether it is the runtime's own record of a change (not a kernel hint): as good as a
    /// reading of the runtime, when confirming at the task layer.
    pub fn is_runtime_record(&self) -> bool {
        matches!(
            self,
            Self::TaskStarted { .. } | Self::TaskExited { .. } | Self::Deleted
        )
    }

    /// What it says of the container's life.
    pub fn says(&self) -> Says {
        match self {
            Self::Present => Says::Present,
            Self::Exec(_) | Self::TaskStarted { .. } => Says::Started,
            Self::ExitCode(_)
            | Self::Signal(_)
            | Self::Exited
            | Self::CgroupRemoved
            | Self::OomKilled
            | Self::TaskExited { .. }
            | Self::TaskDeleted => Says::Died,
            Self::Deleted => Says::Deleted,
        }
    }

    /// Whether consumers see it on events (the others only tell plegd where to look).
    pub fn is_shown(&self) -> bool {
        !matches!(self, Self::Present | Self::TaskDeleted)
    }
}

/// A hint that part of the node may have changed: relist `scope` soon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trigger {
    pub scope: Scope,
    pub source: TriggerSource,
    /// When the source saw the change (wall clock, so it can be shown to users).
    pub observed_at: SystemTime,
    /// Facts about the container of a [`Scope::Container`] trigger. Observations of pod or
    /// node wide triggers cannot be tied to a container and are dropped by the scheduler.
    pub observations: Vec<Observation>,
}

impl Trigger {
    /// Whether it says only that its container exists: news only where a created container
    /// is (`ContainerChanged`). One with no observation says something changed, which only a
    /// reading answers.
    pub fn only_presence(&self) -> bool {
        !self.observations.is_empty()
            && self
                .observations
                .iter()
                .all(|o| o.kind.says() == Says::Present)
    }
}

/// One lifecycle event, as kubelet's PLEG would emit it plus plegd's provenance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    /// Increases by one per sent event, across all pods, for the life of the relister.
    pub sequence: u64,
    pub pod: PodUid,
    pub pod_namespace: String,
    pub pod_name: String,
    /// The container (or sandbox) the event is about; `None` for [`PodLifecycleEventType::PodSync`].
    pub container_id: Option<ContainerId>,
    /// Empty for sandboxes and for `PodSync`.
    pub container_name: String,
    pub event_type: PodLifecycleEventType,
    /// When the change was first seen: by the earliest trigger, else by the relist's list call.
    pub observed_at: SystemTime,
    pub emitted_at: SystemTime,
    /// Sources of the triggers that led to the event; `[Relist]` when none did.
    pub sources: Vec<TriggerSource>,
    /// What the triggers saw about this container.
    pub observations: Vec<Observation>,
    /// The runtime's exit code of the container, once exited (as of the record announced; for
    /// `ContainerRemoved`, its last one).
    pub exit_code: Option<i32>,
    /// The runtime's reason for the state ("Error", "OOMKilled", "Completed"); empty when the
    /// record has none (yet).
    pub reason: String,
    /// Which of the runtime's records confirmed the state announced; `None` for `PodSync` and
    /// for a container removed unseen.
    pub confirmed_by: Option<Layer>,
}
