use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
    },
    macros::{map, tracepoint},
    maps::{LruHashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use plegd_common::{
    EVENT_HAS_EXIT_STATUS, EVENTS_RING_BYTES, INIT_CGROUPS, KernelEvent, KernelEventKind,
    LOST_INIT_SLOTS, LOST_RING_FULL, PROBE_EXIT_CODE, PROBE_GROUP_DEAD, ProbeConfig,
    tracepoint_offsets as tp,
};

/// Events for userspace.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

/// What the probes could not record, per CPU: events that found the ring buffer full
/// ([`LOST_RING_FULL`]; userspace schedules a full relist when it grows) and cgroups the init
/// map could not take ([`LOST_INIT_SLOTS`]; logged and counted by userspace).
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

/// Container init tracking: cgroup2 id -> thread-group id of its init, 0 while it has none.
/// A container's init is the process that execs in its cgroup while it has none: runc's init
/// execs the container's command, and every later process is forked by it or execs after it.
/// That holds in every pid namespace mode: its own (pid 1 there), the pod's
/// (shareProcessNamespace) or the host's (hostPID). When the init exits the entry goes back to
/// 0: runc's bootstrap process may re-exec itself inside the cgroup before the real init
/// (racing the cgroup assignment), and its exit must not hide the init that follows. The mkdir
/// probe adds each cgroup at container depth; userspace removes those that are not a
/// container's and seeds the containers that were running before it started. LRU, so a
/// userspace that falls behind cannot fill it for good.
#[map]
static INITS: LruHashMap<u64, u32> = LruHashMap::with_max_entries(INIT_CGROUPS, 0);

/// What the loader found out about the kernel.
#[unsafe(no_mangle)]
static PROBE_CONFIG: ProbeConfig = ProbeConfig {
    task_exit_code: 0,
    exit_group_dead: 0,
    flags: 0,
};

/// The cgroup2 hierarchy's id in cgroup tracepoints (v1 hierarchies count from 1).
const CGROUP2_HIERARCHY: i32 = 0;
/// Below this depth no container cgroup lives (`/k8s.io/<id>` is level 2).
const MIN_CONTAINER_LEVEL: i32 = 2;

#[tracepoint(category = "cgroup", name = "cgroup_mkdir")]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    match try_cgroup_change(&ctx, KernelEventKind::CgroupMkdir) {
        Ok(ret) | Err(ret) => ret,
    }
}

#[tracepoint(category = "cgroup", name = "cgroup_rmdir")]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    match try_cgroup_change(&ctx, KernelEventKind::CgroupRmdir) {
        Ok(ret) | Err(ret) => ret,
    }
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    match try_exec(&ctx) {
        Ok(ret) | Err(ret) => ret,
    }
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    match try_exit(&ctx) {
        Ok(ret) | Err(ret) => ret,
    }
}

#[tracepoint(category = "oom", name = "mark_victim")]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    match try_oom(&ctx) {
        Ok(ret) | Err(ret) => ret,
    }
}

fn try_cgroup_change(ctx: &TracePointContext, kind: KernelEventKind) -> Result<u32, u32> {
    // SAFETY: offsets checked against this kernel's tracepoint format by the loader.
    let (root, level, id, path_loc) = unsafe {
        (
            ctx.read_at::<i32>(tp::CGROUP_ROOT).map_err(|_| 1u32)?,
            ctx.read_at::<i32>(tp::CGROUP_LEVEL).map_err(|_| 1u32)?,
            ctx.read_at::<u64>(tp::CGROUP_ID).map_err(|_| 1u32)?,
            ctx.read_at::<u32>(tp::CGROUP_PATH).map_err(|_| 1u32)?,
        )
    };
    if root != CGROUP2_HIERARCHY || level < MIN_CONTAINER_LEVEL {
        return Ok(0);
    }
    // Before the event: the cgroup's first exec may follow at once.
    match kind {
        // A full map (LRU eviction failing) only costs this cgroup its process hints: the
        // relist still finds its container's changes. Counted, so userspace can say so.
        KernelEventKind::CgroupMkdir => {
            if INITS.insert(&id, &0, BPF_NOEXIST as u64).is_err() && !is_tracked(id) {
                count_lost(LOST_INIT_SLOTS);
            }
        }
        _ => {
            let _ = INITS.remove(&id);
        }
    }
    // SAFETY: a __data_loc field's low 16 bits are the offset of its data from the context.
    let path = unsafe { (ctx.as_ptr() as *const u8).add((path_loc & 0xffff) as usize) };
    emit(kind, current_tgid(), id, 0, 0, Some(path))
}

fn try_exec(ctx: &TracePointContext) -> Result<u32, u32> {
    // SAFETY: no preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    let tgid = current_tgid() as u32;
    // SAFETY: the value is copied out at once.
    match unsafe { INITS.get(&cgroup) }.copied() {
        // Not a cgroup at container depth, or not a container's.
        None => return Ok(0),
        // The cgroup has no init: this process is it (the container's command starts).
        Some(0) => INITS.insert(&cgroup, &tgid, 0).map_err(|_| 1u32)?,
        // The init execs again (`sh -c 'exec ...'`).
        Some(init) if init == tgid => {}
        // Any other process of the container.
        Some(_) => return Ok(0),
    }
    // SAFETY: offset checked by the loader; __data_loc as above.
    let filename = unsafe {
        let loc = ctx.read_at::<u32>(tp::EXEC_FILENAME).map_err(|_| 1u32)?;
        (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize)
    };
    emit(
        KernelEventKind::Exec,
        tgid as u64,
        cgroup,
        0,
        0,
        Some(filename),
    )
}

fn try_exit(ctx: &TracePointContext) -> Result<u32, u32> {
    let config = probe_config();
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = pid_tgid >> 32;
    let process_gone = if config.flags & PROBE_GROUP_DEAD != 0 {
        // SAFETY: offset found in this kernel's tracepoint format by the loader.
        unsafe {
            ctx.read_at::<u8>(config.exit_group_dead as usize)
                .map_err(|_| 1u32)?
                != 0
        }
    } else {
        // Without group_dead, the main thread's exit stands for the process's: an init is
        // nearly always single-threaded or leaves through exit_group, and the runtime
        // confirms the death before any event.
        pid_tgid & 0xffff_ffff == tgid
    };
    if !process_gone {
        return Ok(0);
    }
    // SAFETY: no preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    // SAFETY: the value is copied out at once.
    if unsafe { INITS.get(&cgroup) }.copied() != Some(tgid as u32) {
        return Ok(0);
    }
    INITS.insert(&cgroup, &0, 0).map_err(|_| 1u32)?;
    let (status, flags) = if config.flags & PROBE_EXIT_CODE != 0 {
        // SAFETY: a probe read of the current task at an offset from this kernel's BTF.
        let status = unsafe {
            let task = bpf_get_current_task() as *const u8;
            bpf_probe_read_kernel(task.add(config.task_exit_code as usize) as *const i32)
                .map_err(|_| 1u32)?
        };
        (status, EVENT_HAS_EXIT_STATUS)
    } else {
        (0, 0)
    };
    emit(KernelEventKind::Exit, tgid, cgroup, status, flags, None)
}

fn probe_config() -> ProbeConfig {
    // SAFETY: PROBE_CONFIG is written once by the loader before attaching; volatile so the
    // compiler does not fold the zero initialiser.
    unsafe { core::ptr::read_volatile(&PROBE_CONFIG) }
}

/// Whether the init map has an entry for `cgroup` (an insert with NOEXIST fails on one).
fn is_tracked(cgroup: u64) -> bool {
    // SAFETY: the value is only tested for presence.
    unsafe { INITS.get(&cgroup).is_some() }
}

fn count_lost(index: u32) {
    if let Some(lost) = LOST.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot, touched only by this CPU.
        unsafe { *lost += 1 };
    }
}

fn current_tgid() -> u64 {
    bpf_get_current_pid_tgid() >> 32
}

fn try_oom(ctx: &TracePointContext) -> Result<u32, u32> {
    // SAFETY: offset checked by the loader.
    let victim = unsafe { ctx.read_at::<i32>(tp::OOM_PID).map_err(|_| 1u32)? };
    // SAFETY: no preconditions. In a memcg OOM the probe runs in the task that hit the limit,
    // usually a process of the same container; userspace prefers the victim's own cgroup.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    emit(KernelEventKind::Oom, victim as u64, cgroup, 0, 0, None)
}

/// Writes one event in place in the ring buffer (the struct is too large for the stack twice).
fn emit(
    kind: KernelEventKind,
    pid: u64,
    cgroup_id: u64,
    exit_status: i32,
    flags: u32,
    path: Option<*const u8>,
) -> Result<u32, u32> {
    let Some(mut entry) = EVENTS.reserve::<KernelEvent>(0) else {
        count_lost(LOST_RING_FULL);
        return Err(1);
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points to a reserved, writable KernelEvent.
    unsafe {
        (*event).kind = kind as u32;
        (*event).pid = pid as u32;
        (*event).cgroup_id = cgroup_id;
        (*event).ktime_ns = bpf_ktime_get_ns();
        (*event).exit_status = exit_status;
        (*event).flags = flags;
        (*event).path[0] = 0;
        if let Some(src) = path
            && bpf_probe_read_kernel_str_bytes(src, &mut (*event).path).is_err()
        {
            (*event).path[0] = 0;
        }
    }
    entry.submit(0);
    Ok(0)
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
