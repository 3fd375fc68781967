//! The PLEG (kubelet's Pod Lifecycle Event Generator) as plegd runs it: it relists a container
//! runtime where and when a source says to look, and when its period comes; it diffs what it
//! read against what it last committed, and emits one event per change of a container's
//! record.
//!
//! # The contract
//!
//! [`Pleg::start`] starts it on a [`Runtime`] with [`Options`], a [`SyncHandler`] of one's own
//! (`()`: none), and the [`SavedRun`] to continue, if any. What it returns is all a caller
//! uses:
//!
//! - [`Pleg`], cheap to clone; its accessors:
//!   - [`triggers`](Pleg::triggers): where sources hand their [`Trigger`]s;
//!   - [`relist`](Pleg::relist): a full relist now;
//!   - [`events`](Pleg::events): every [`PodLifecycleEvent`], numbered and resumable, and
//!     [`first_sequence`](Pleg::first_sequence), the first of this start;
//!   - [`syncs`](Pleg::syncs): each pod's whole status whenever it changes;
//!   - [`notices`](Pleg::notices): kernel observations ahead of the runtime's word;
//!   - [`cache`](Pleg::cache): the pod status cache;
//!   - [`healthy`](Pleg::healthy): kubelet's health check, and [`health`](Pleg::health), to
//!     wait on its changes;
//!   - [`tuning`](Pleg::tuning): the relist period and kernel grace, changed while it runs;
//!   - [`turns`](Pleg::turns): the generator loop's pulse, for a watchdog.
//! - [`Running`], which owns its tasks: [`Running::stop`] ends them in order and hands back
//!   the [`SavedRun`] for the next start; dropping it aborts them.
//!
//! # Design assumptions
//!
//! - **The runtime is the source of truth.** Every event comes from a change of a container's
//!   runtime record: what a reading of the runtime showed (a listing, a status call), or a
//!   record of the runtime's own that a trigger carried (containerd's `/tasks/start`,
//!   `/tasks/exit` and `/containers/delete`, or the answer to the `Tasks.Wait` held open from
//!   the start of a container the kernel saw, where containerd's events come: the same task
//!   record, ahead of the shim's event queue). A kernel observation never makes an event. So
//!   every source produces the same events, deduplicated, in per-pod order.
//! - **A relist sees snapshots; the runtime's records fill in its history.** Where containerd's
//!   event stream reaches plegd, its records of a start, an exit and a deletion are each a
//!   reading in themselves: a container that started and died between two readings yields
//!   both events, and one whose whole life passed before any read of it (a busy node) is
//!   told from those records alone, confirmed by the task service, in the pod its cgroup
//!   names. Their records can come after a read: one a faster source asked for (CRI's
//!   `CONTAINER_CREATED`), or a full relist that ran before they reached plegd (plegd frozen
//!   or descheduled while containers came and went). A read that finds a container already
//!   exited that plegd never told started tells its start from the runtime's record of it
//!   (CRI's `started_at`), except in a run's first full relist (its baseline) for a container
//!   no hint asked about that started before the baseline's listing: one that died before
//!   plegd started has died, nothing more. A read that shows a container running while the
//!   task service's record says it exited tells that start.
//!   Without them (polling, eBPF only), a container that started and died between two
//!   readings yields `ContainerDied` only, and one created, run and removed between two
//!   readings yields nothing at all: kubelet has the same blind spot, an event means "look
//!   at this pod now", not a full log.
//! - **Triggers are hints.** A trigger says *where* and *when* to look. It may come before the
//!   runtime reflects the change (the scheduler reads again a few times), or be lost (a ring
//!   buffer overflow, a stream reconnect).
//! - **The safety net is the periodic full relist.** What the hints miss, the next full relist
//!   finds, at most a period late; any sign of loss asks for one at once.
//! - **Observations the runtime cannot give** (exit signal, OOM kill, exec) ride on the events
//!   of the container they are about, tagged with their source.
//! - **Health is relist age.** The PLEG is unhealthy when no full relist succeeded within
//!   [`DEFAULT_RELIST_THRESHOLD`]; a relist that hangs makes it unhealthy.
//!
//! # Inside, lowest first
//!
//! - `model`: the types (records, events, triggers) and the [`Runtime`] port.
//! - `decide`: the pure core: diff, merge, committed records, hints, reconcile, provenance,
//!   the scheduler.
//! - `shared`: what consumers read: the pod cache and health.
//! - `driver`: the I/O: the relist, the generator loop, the trigger channel, the sinks, and
//!   `run`, which wires them at [`Pleg::start`].
//! - `sync_loop`: kubelet's sync loop, level-triggered, over the events and the cache.
//!
//! Tests and benchmarks that drive one relist or the trigger channel alone reach them through
//! `testing` (with the crate's `testing` feature).

mod decide;
mod driver;
mod model;
mod shared;
mod sync_loop;

pub use self::{
    decide::scheduler::{DEFAULT_KERNEL_GRACE, DEFAULT_RELIST_PERIOD},
    driver::{
        generator::{LONGEST_WAIT, Tuning},
        relist::{DEFAULT_INSPECT_CONCURRENCY, RelistConfig},
        run::{Options, Pleg, Running, SavedRun},
        sink::NOTICE_QUEUE,
        triggers::TriggerSender,
    },
    model::{
        event::{Notice, NoticeKind, PodLifecycleEvent, PodLifecycleEventType},
        oom::{OomKill, OomScope},
        record::{
            ContainerId, ContainerRecord, ContainerState, Containers, HostIdentity, OomWitness,
            PodRecord, PodRecords, PodUid, Store, TaskRecord, UnknownStore, exit_reason,
        },
        runtime::{CallCode, ContainerRead, ExitWatch, Runtime, RuntimeError},
        source::Source,
        trigger::{Identity, Observation, ObservationKind, Scope, Trigger},
    },
    shared::{
        cache::{CachedPod, PodCache},
        health::{DEFAULT_RELIST_THRESHOLD, Health, HealthError},
    },
    sync_loop::{
        DEFAULT_EVENT_CHANNEL_CAPACITY, DEFAULT_RESYNC_INTERVAL, PodSync, SyncConfig, SyncFeed,
        SyncFilter, SyncHandler, SyncReason, SyncSubscription,
    },
};

/// The relist and the trigger channel on their own, without the generator loop.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    pub use super::{
        decide::hints::Hints,
        driver::{
            relist::Relister,
            sink::EventSink,
            triggers::{TriggerReceiver, trigger_channel},
        },
    };
}
