//! `#[repr(C)]` types shared between plegd's eBPF programs and the agent.
//!
//! Every struct here crosses the kernel/user boundary as raw bytes (ring buffer records, map
//! values, globals), so each one documents its layout and padding, and flags are `u32`, never
//! `bool`.
#![no_std]

/// What a kernel probe saw. Stored as `u32` in [`KernelEvent::kind`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelEventKind {
    /// A cgroup2 directory was created (`cgroup/cgroup_mkdir`); `path` holds its path.
    CgroupMkdir = 1,
    /// A cgroup2 directory was removed (`cgroup/cgroup_rmdir`); `path` holds its path.
    CgroupRmdir = 2,
    /// A container's init called exec (`sched/sched_process_exec`); `path` holds the file
    /// name. A container's init is the first process to exec in its cgroup, whatever its pid
    /// namespace (see [`INIT_CGROUPS`]).
    Exec = 3,
    /// A container's init exited (`sched/sched_process_exit`, whole thread group where the
    /// kernel says so); `exit_status` is its wait status when `flags` has
    /// [`EVENT_HAS_EXIT_STATUS`].
    Exit = 4,
    /// The OOM killer chose a victim (`oom/mark_victim`): an [`OomEvent`] record, not a
    /// [`KernelEvent`].
    Oom = 5,
}

impl KernelEventKind {
    /// Decodes the raw `kind` field; unknown values (a newer eBPF object) yield `None`.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::CgroupMkdir),
            2 => Some(Self::CgroupRmdir),
            3 => Some(Self::Exec),
            4 => Some(Self::Exit),
            5 => Some(Self::Oom),
            _ => None,
        }
    }
}

/// [`KernelEvent::flags`]: `exit_status` is valid.
pub const EVENT_HAS_EXIT_STATUS: u32 = 1;

/// Bytes of a path or file name carried in an event (longer ones are truncated).
pub const EVENT_PATH_BYTES: usize = 256;

/// One record in the `EVENTS` ring buffer, of every kind but [`KernelEventKind::Oom`] (an
/// [`OomEvent`]; both start with `kind: u32`).
///
/// Layout (288 bytes, no implicit padding): `kind: u32 @0`, `pid: u32 @4`, `cgroup_id: u64
/// @8`, `ktime_ns: u64 @16`, `exit_status: i32 @24`, `flags: u32 @28`, `path: [u8; 256]
/// @32` (NUL-terminated unless full).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelEvent {
    /// A [`KernelEventKind`] as `u32`.
    pub kind: u32,
    /// Thread-group id (userspace "pid") the event is about.
    pub pid: u32,
    /// cgroup2 id (inode of the cgroup2 directory): the cgroup made or removed, or the one of
    /// the task that ran the probe.
    pub cgroup_id: u64,
    /// `bpf_ktime_get_ns()` when the probe ran (CLOCK_MONOTONIC).
    pub ktime_ns: u64,
    /// `task_struct.exit_code`: `code << 8` for an exit, the signal number for a kill.
    pub exit_status: i32,
    /// `EVENT_*` bits.
    pub flags: u32,
    pub path: [u8; EVENT_PATH_BYTES],
}

/// What the loader found out about the running kernel, set as the `PROBE_CONFIG` global at
/// load time. Each optional feature is described on its own, so a kernel that lacks one loses
/// only that one.
///
/// The raw tracepoint programs (`*_raw`) read the tracepoint's arguments, the kernel's own
/// structs, where the classic ones read the tracefs record: the offsets of the members they
/// read come from the kernel's BTF, and the loader attaches a raw program only when it found
/// every offset it reads.
///
/// Layout (80 bytes, every field a `u32`, no padding): `task_exit_code @0`, `exit_group_dead
/// @4`, `flags @8`, `cgroup_root @12`, `root_hierarchy_id @16`, `cgroup_level @20`,
/// `cgroup_kn @24`, `kn_id @28`, `bprm_filename @32`, `task_pid @36`, `task_tgid @40`,
/// `task_comm @44`, `task_cgroups @48`, `css_set_dfl_cgrp @52`, `css_set_memcg @56`,
/// `css_parent @60`, `css_cgroup @64`, `memcg_usage @68`, `memcg_max @72`,
/// `memcg_oom_events @76`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Offset of `task_struct.exit_code` (from the kernel's BTF), valid with
    /// [`PROBE_EXIT_CODE`].
    pub task_exit_code: u32,
    /// Offset of `bool group_dead` in `sched/sched_process_exit` records (from tracefs), valid
    /// with [`PROBE_GROUP_DEAD`]. Kernels before about 6.16 lack the field: the exit probe then
    /// takes the exit of a process's main thread as the process's exit.
    pub exit_group_dead: u32,
    /// `PROBE_*` bits.
    pub flags: u32,
    /// `struct cgroup`: `root` (a `struct cgroup_root *`).
    pub cgroup_root: u32,
    /// `struct cgroup_root`: `int hierarchy_id`.
    pub root_hierarchy_id: u32,
    /// `struct cgroup`: `int level`.
    pub cgroup_level: u32,
    /// `struct cgroup`: `kn` (a `struct kernfs_node *`).
    pub cgroup_kn: u32,
    /// `struct kernfs_node`: `u64 id`, the cgroup's id.
    pub kn_id: u32,
    /// `struct linux_binprm`: `filename` (a `const char *`).
    pub bprm_filename: u32,
    /// `struct task_struct`: `pid_t pid`, valid with [`PROBE_OOM_TASK`].
    pub task_pid: u32,
    /// `struct task_struct`: `pid_t tgid`; the rest down to `memcg_oom_events` are valid with
    /// [`PROBE_OOM_MEMCG`].
    pub task_tgid: u32,
    /// `struct task_struct`: `char comm[16]`.
    pub task_comm: u32,
    /// `struct task_struct`: `cgroups` (a `struct css_set *`).
    pub task_cgroups: u32,
    /// `struct css_set`: `dfl_cgrp` (a `struct cgroup *`, the task's cgroup2 cgroup).
    pub css_set_dfl_cgrp: u32,
    /// `struct css_set`: `subsys[memory_cgrp_id]` (the task's memory cgroup's
    /// `struct cgroup_subsys_state *`, which is the first member of its `struct mem_cgroup`).
    pub css_set_memcg: u32,
    /// `struct cgroup_subsys_state`: `parent` (NULL for the root).
    pub css_parent: u32,
    /// `struct cgroup_subsys_state`: `cgroup` (the cgroup in the memory controller's
    /// hierarchy: cgroup2, or cgroup v1's memory hierarchy).
    pub css_cgroup: u32,
    /// `struct mem_cgroup`: `memory.usage` (pages charged, an `atomic_long_t`).
    pub memcg_usage: u32,
    /// `struct mem_cgroup`: `memory.max` (the limit, in pages).
    pub memcg_max: u32,
    /// `struct mem_cgroup`: `memory_events_local[MEMCG_OOM]` (how often this cgroup's own
    /// limit started the OOM killer: cgroup v2's `memory.events.local` `oom`).
    pub memcg_oom_events: u32,
}

/// [`ProbeConfig::flags`]: `task_exit_code` is set; exits carry their wait status.
pub const PROBE_EXIT_CODE: u32 = 1;
/// [`ProbeConfig::flags`]: `exit_group_dead` is set.
pub const PROBE_GROUP_DEAD: u32 = 2;
/// [`ProbeConfig::flags`]: `oom/mark_victim`'s first argument is the victim's
/// `struct task_struct *` (and `task_pid` is set), not its pid (kernels since 6.9, and the
/// stable releases the change went back to).
pub const PROBE_OOM_TASK: u32 = 4;
/// [`ProbeConfig::flags`]: the memory cgroup offsets are set: an OOM event carries the
/// memory cgroup chains of its victim and of the task that ran out of memory.
pub const PROBE_OOM_MEMCG: u32 = 8;

/// Memory cgroup levels an [`OomEvent`] carries per chain, from the bottom (the root's is
/// never carried: it has no limit). Kubernetes' containers sit at level 4
/// (`kubepods/<qos>/pod<uid>/<id>`, or the systemd driver's slices).
pub const OOM_LEVELS: usize = 8;

/// One memory cgroup of an OOM's chain, as the kernel's `struct mem_cgroup` says at the kill.
///
/// Layout (32 bytes, no padding): `id: u64 @0`, `usage: u64 @8`, `max: u64 @16`,
/// `oom_events: u64 @24`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemcgLevel {
    /// The cgroup's id in the memory controller's hierarchy (the inode of its directory).
    pub id: u64,
    /// Pages charged to it and its descendants.
    pub usage: u64,
    /// Its limit, in pages (the kernel's `PAGE_COUNTER_MAX` when it has none).
    pub max: u64,
    /// How often its own limit started the OOM killer (`memory_events_local[MEMCG_OOM]`).
    pub oom_events: u64,
}

/// [`OomEvent::flags`]: `cgroup_id`, `comm` and `victim` are the victim's own (the
/// tracepoint gave its task); without it they are the running task's, `comm` is empty.
pub const OOM_VICTIM_TASK: u32 = 1;
/// [`OomEvent::flags`]: the victim is its container's init (the `INITS` map's entry for its
/// cgroup2 id).
pub const OOM_VICTIM_INIT: u32 = 2;
/// [`OomEvent::flags`]: `victim` holds the victim's memory cgroup chain.
pub const OOM_VICTIM_CHAIN: u32 = 4;
/// [`OomEvent::flags`]: `charger` holds the memory cgroup chain of the task the probe ran in
/// (in a memory cgroup's OOM, the one whose charge failed).
pub const OOM_CHARGER_CHAIN: u32 = 8;
/// [`OomEvent::flags`]: the victim's chain reached the root within [`OOM_LEVELS`].
pub const OOM_VICTIM_WHOLE: u32 = 16;
/// [`OomEvent::flags`]: the charger's chain reached the root within [`OOM_LEVELS`].
pub const OOM_CHARGER_WHOLE: u32 = 32;

/// An OOM kill (`oom/mark_victim`), a record of its own in the `EVENTS` ring buffer: who was
/// chosen, and the memory cgroups above the victim and above the task that ran out of
/// memory, read at the kill, so userspace can tell which limit the kill came from.
///
/// Layout (576 bytes, no implicit padding): `kind: u32 @0` ([`KernelEventKind::Oom`]), `pid:
/// u32 @4`, `cgroup_id: u64 @8`, `ktime_ns: u64 @16`, `flags: u32 @24`, `victim_depth: u32
/// @28`, `charger_depth: u32 @32`, `victim_level: u32 @36`, `charger_level: u32 @40`,
/// `_pad: u32 @44`, `comm: [u8; 16] @48`, `victim: [MemcgLevel; 8] @64`, `charger:
/// [MemcgLevel; 8] @320`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomEvent {
    /// [`KernelEventKind::Oom`] as `u32`.
    pub kind: u32,
    /// The victim's thread-group id.
    pub pid: u32,
    /// cgroup2 id of the victim (with [`OOM_VICTIM_TASK`]), else of the running task.
    pub cgroup_id: u64,
    /// `bpf_ktime_get_ns()` when the probe ran (CLOCK_MONOTONIC).
    pub ktime_ns: u64,
    /// `OOM_*` bits.
    pub flags: u32,
    /// Entries of `victim` filled, from the victim's own memory cgroup up.
    pub victim_depth: u32,
    /// Entries of `charger` filled, from the running task's memory cgroup up.
    pub charger_depth: u32,
    /// The level of the victim's memory cgroup in its hierarchy (the root is 0).
    pub victim_level: u32,
    /// The level of the running task's memory cgroup.
    pub charger_level: u32,
    pub _pad: u32,
    /// The victim's `comm` (NUL-terminated unless full), with [`OOM_VICTIM_TASK`].
    pub comm: [u8; 16],
    pub victim: [MemcgLevel; OOM_LEVELS],
    pub charger: [MemcgLevel; OOM_LEVELS],
}

/// Tracepoint field offsets the programs read (from the tracefs `format` files of this
/// kernel); the loader checks them before attaching.
pub mod tracepoint_offsets {
    /// `cgroup/cgroup_mkdir|rmdir`: `int root`.
    pub const CGROUP_ROOT: usize = 8;
    /// `cgroup/cgroup_mkdir|rmdir`: `int level`.
    pub const CGROUP_LEVEL: usize = 12;
    /// `cgroup/cgroup_mkdir|rmdir`: `u64 id`.
    pub const CGROUP_ID: usize = 16;
    /// `cgroup/cgroup_mkdir|rmdir`: `__data_loc char[] path`.
    pub const CGROUP_PATH: usize = 24;
    /// `sched/sched_process_exec`: `__data_loc char[] filename`.
    pub const EXEC_FILENAME: usize = 8;
    /// `oom/mark_victim`: `int pid`.
    pub const OOM_PID: usize = 8;
}

#[cfg(feature = "user")]
// SAFETY: repr(C), Copy, no padding, and every bit pattern is a valid value.
unsafe impl aya::Pod for KernelEvent {}

#[cfg(feature = "user")]
// SAFETY: repr(C), Copy, no padding, and every bit pattern is a valid value.
unsafe impl aya::Pod for ProbeConfig {}

#[cfg(feature = "user")]
// SAFETY: repr(C), Copy, no padding, and every bit pattern is a valid value.
unsafe impl aya::Pod for OomEvent {}

/// Index in the per-CPU `LOST` counters: events that found the ring buffer full.
pub const LOST_RING_FULL: u32 = 0;
/// Index in the per-CPU `LOST` counters: cgroups the `INITS` map could not take (their
/// containers get no process hints; the relist still finds their changes).
pub const LOST_INIT_SLOTS: u32 = 1;

/// Size in bytes of the `EVENTS` ring buffer (a power of two, a multiple of the page size).
pub const EVENTS_RING_BYTES: u32 = 1 << 20;

/// Entries of the `INITS` map: cgroup2 id -> thread-group id of the cgroup's init (0 while
/// none has exec'd yet). The mkdir probe adds every cgroup at container depth, userspace drops
/// those that are not containers' and seeds the containers that existed before it started.
pub const INIT_CGROUPS: u32 = 65_536;

// The layouts documented above, checked.
const _: () = assert!(core::mem::size_of::<KernelEvent>() == 288);
const _: () = assert!(core::mem::size_of::<ProbeConfig>() == 80);
const _: () = assert!(core::mem::size_of::<MemcgLevel>() == 32);
const _: () = assert!(core::mem::size_of::<OomEvent>() == 576);
