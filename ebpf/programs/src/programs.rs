use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
    },
    macros::{map, tracepoint},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use plegd_common::{
    EVENT_HAS_EXIT_STATUS, EVENTS_RING_BYTES, KernelEvent, KernelEventKind, ProbeConfig,
    WATCHED_CGROUPS, tracepoint_offsets as tp,
};

/// Events for userspace.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

/// Events that found the ring buffer full, per CPU (index 0). Userspace schedules a full
/// relist when it grows.
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// cgroup2 ids of the containers userspace knows: without BTF offsets, process probes ignore
/// every other cgroup.
#[map]
static WATCHED: HashMap<u64, u32> = HashMap::with_max_entries(WATCHED_CGROUPS, 0);

/// Kernel struct offsets from BTF, set by the loader.
#[unsafe(no_mangle)]
static PROBE_CONFIG: ProbeConfig = ProbeConfig {
    task_exit_code: 0,
    task_group_leader: 0,
    task_thread_pid: 0,
    pid_level: 0,
    pid_numbers: 0,
    upid_nr: 0,
    upid_size: 0,
    valid: 0,
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
    // SAFETY: a __data_loc field's low 16 bits are the offset of its data from the context.
    let path = unsafe { (ctx.as_ptr() as *const u8).add((path_loc & 0xffff) as usize) };
    emit(kind, bpf_get_current_pid_tgid() >> 32, id, 0, 0, Some(path))
}

fn try_exec(ctx: &TracePointContext) -> Result<u32, u32> {
    // SAFETY: no preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    if !is_container_init(cgroup)? {
        return Ok(0);
    }
    // SAFETY: offset checked by the loader; __data_loc as above.
    let filename = unsafe {
        let loc = ctx.read_at::<u32>(tp::EXEC_FILENAME).map_err(|_| 1u32)?;
        (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize)
    };
    emit(
        KernelEventKind::Exec,
        bpf_get_current_pid_tgid() >> 32,
        cgroup,
        0,
        0,
        Some(filename),
    )
}

fn try_exit(ctx: &TracePointContext) -> Result<u32, u32> {
    // SAFETY: offset checked by the loader.
    let group_dead = unsafe { ctx.read_at::<u8>(tp::EXIT_GROUP_DEAD).map_err(|_| 1u32)? };
    if group_dead == 0 {
        return Ok(0);
    }
    // SAFETY: no preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    if !is_container_init(cgroup)? {
        return Ok(0);
    }
    let config = probe_config();
    let (status, flags) = if config.valid == 1 {
        // SAFETY: probe reads of the current task at offsets from this kernel's BTF.
        let status = unsafe {
            let task = bpf_get_current_task() as *const u8;
            bpf_probe_read_kernel(task.add(config.task_exit_code as usize) as *const i32)
                .map_err(|_| 1u32)?
        };
        (status, EVENT_HAS_EXIT_STATUS)
    } else {
        (0, 0)
    };
    emit(
        KernelEventKind::Exit,
        bpf_get_current_pid_tgid() >> 32,
        cgroup,
        status,
        flags,
        None,
    )
}

fn probe_config() -> ProbeConfig {
    // SAFETY: PROBE_CONFIG is written once by the loader before attaching; volatile so the
    // compiler does not fold the zero initialiser.
    unsafe { core::ptr::read_volatile(&PROBE_CONFIG) }
}

/// Whether the current task's process is a container's init: pid 1 of a pid namespace other
/// than the host's. Such processes are few, so no userspace state is needed to filter, and
/// the events of a container just created are never missed. Without BTF offsets, fall back
/// to the cgroups userspace watches.
fn is_container_init(cgroup: u64) -> Result<bool, u32> {
    let config = probe_config();
    if config.valid != 1 {
        return Ok(is_watched(cgroup));
    }
    // SAFETY: every read goes through bpf_probe_read_kernel, which fails cleanly on a bad
    // pointer; the offsets come from this kernel's BTF.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        let leader: *const u8 =
            bpf_probe_read_kernel(task.add(config.task_group_leader as usize) as *const *const u8)
                .map_err(|_| 1u32)?;
        let pid: *const u8 =
            bpf_probe_read_kernel(leader.add(config.task_thread_pid as usize) as *const *const u8)
                .map_err(|_| 1u32)?;
        let level: u32 = bpf_probe_read_kernel(pid.add(config.pid_level as usize) as *const u32)
            .map_err(|_| 1u32)?;
        if level == 0 {
            return Ok(false);
        }
        let nr_offset = config.pid_numbers as usize
            + (level as usize & 0x3f) * config.upid_size as usize
            + config.upid_nr as usize;
        let nr: i32 = bpf_probe_read_kernel(pid.add(nr_offset) as *const i32).map_err(|_| 1u32)?;
        Ok(nr == 1)
    }
}

fn try_oom(ctx: &TracePointContext) -> Result<u32, u32> {
    // SAFETY: offset checked by the loader.
    let victim = unsafe { ctx.read_at::<i32>(tp::OOM_PID).map_err(|_| 1u32)? };
    // SAFETY: no preconditions. In a memcg OOM the probe runs in the task that hit the limit,
    // usually a process of the same container; userspace prefers the victim's own cgroup.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    emit(KernelEventKind::Oom, victim as u64, cgroup, 0, 0, None)
}

fn is_watched(cgroup: u64) -> bool {
    // SAFETY: the value is only tested for presence.
    unsafe { WATCHED.get(&cgroup).is_some() }
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
        if let Some(lost) = LOST.get_ptr_mut(0) {
            // SAFETY: a per-CPU slot, touched only by this CPU.
            unsafe { *lost += 1 };
        }
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
