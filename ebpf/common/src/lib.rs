//! `#[repr(C)]` types shared between plegd's eBPF programs and the agent.
//!
//! Every struct here crosses the kernel/user boundary as raw bytes (ring buffer records, map
//! keys and values), so each one documents its layout and padding, and flags are `u32`, never
//! `bool`.
#![no_std]

/// What a kernel probe saw. Stored as `u32` in [`KernelEvent::kind`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelEventKind {
    /// A process called exec (`sched/sched_process_exec`).
    Exec = 1,
}

impl KernelEventKind {
    /// Decodes the raw `kind` field; unknown values (a newer eBPF object) yield `None`.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::Exec),
            _ => None,
        }
    }
}

/// One record in the `EVENTS` ring buffer.
///
/// Layout (24 bytes, no implicit padding):
/// `kind: u32 @0`, `pid: u32 @4`, `cgroup_id: u64 @8`, `ktime_ns: u64 @16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelEvent {
    /// A [`KernelEventKind`] as `u32`.
    pub kind: u32,
    /// Thread-group id (userspace "pid") of the task that triggered the probe.
    pub pid: u32,
    /// cgroup2 id of the task (inode number of its cgroup2 directory).
    pub cgroup_id: u64,
    /// `bpf_ktime_get_ns()` when the probe ran (CLOCK_MONOTONIC).
    pub ktime_ns: u64,
}

#[cfg(feature = "user")]
// SAFETY: KernelEvent is repr(C), Copy, and every bit pattern is a valid value.
unsafe impl aya::Pod for KernelEvent {}

/// Size in bytes of the `EVENTS` ring buffer (a power of two, a multiple of the page size).
pub const EVENTS_RING_BYTES: u32 = 256 * 1024;
