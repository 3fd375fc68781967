use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
    },
    macros::{map, raw_tracepoint, tracepoint},
    maps::{LruHashMap, PerCpuArray, RingBuf},
    programs::{RawTracePointContext, TracePointContext},
};
use plegd_common::{
    EVENT_HAS_EXIT_STATUS, EVENTS_RING_BYTES, INIT_CGROUPS, KernelEvent, KernelEventKind,
    LOST_INIT_SLOTS, LOST_RING_FULL, MemcgLevel, OOM_CHARGER_CHAIN, OOM_CHARGER_WHOLE, OOM_LEVELS,
    OOM_VICTIM_CHAIN, OOM_VICTIM_INIT, OOM_VICTIM_TASK, OOM_VICTIM_WHOLE, OomEvent,
    PROBE_EXIT_CODE, PROBE_GROUP_DEAD, PROBE_OOM_MEMCG, PROBE_OOM_TASK, ProbeConfig,
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
    cgroup_root: 0,
    root_hierarchy_id: 0,
    cgroup_level: 0,
    cgroup_kn: 0,
    kn_id: 0,
    bprm_filename: 0,
    task_pid: 0,
    task_tgid: 0,
    task_comm: 0,
    task_cgroups: 0,
    css_set_dfl_cgrp: 0,
    css_set_memcg: 0,
    css_parent: 0,
    css_cgroup: 0,
    memcg_usage: 0,
    memcg_max: 0,
    memcg_oom_events: 0,
};

/// The cgroup2 hierarchy's id in cgroup tracepoints (v1 hierarchies count from 1).
const CGROUP2_HIERARCHY: i32 = 0;
/// Below this depth no container cgroup lives (`/k8s.io/<id>` is level 2).
const MIN_CONTAINER_LEVEL: i32 = 2;

// Each probe comes twice: as a classic tracepoint (the tracefs record, attached through
// perf_event_open, which a kernel with perf_event_paranoid 3 and CONFIG_SECURITY_PERF_EVENTS_
// RESTRICT, Debian's, grants only to CAP_SYS_ADMIN) and as a raw tracepoint (the tracepoint's
// arguments, attached with BPF_RAW_TRACEPOINT_OPEN: CAP_BPF and CAP_PERFMON suffice). The
// loader attaches one of the two per probe; both read into the same logic.

#[tracepoint(category = "cgroup", name = "cgroup_mkdir")]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    result(read_cgroup_record(&ctx).and_then(|c| cgroup_change(c, KernelEventKind::CgroupMkdir)))
}

#[tracepoint(category = "cgroup", name = "cgroup_rmdir")]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    result(read_cgroup_record(&ctx).and_then(|c| cgroup_change(c, KernelEventKind::CgroupRmdir)))
}

#[raw_tracepoint(tracepoint = "cgroup_mkdir")]
pub fn cgroup_mkdir_raw(ctx: RawTracePointContext) -> u32 {
    result(read_cgroup_args(&ctx).and_then(|c| cgroup_change(c, KernelEventKind::CgroupMkdir)))
}

#[raw_tracepoint(tracepoint = "cgroup_rmdir")]
pub fn cgroup_rmdir_raw(ctx: RawTracePointContext) -> u32 {
    result(read_cgroup_args(&ctx).and_then(|c| cgroup_change(c, KernelEventKind::CgroupRmdir)))
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    result(exec(|| {
        // SAFETY: offset checked by the loader; a __data_loc field's low 16 bits are the
        // offset of its data from the context.
        unsafe {
            ctx.read_at::<u32>(tp::EXEC_FILENAME)
                .map(|loc| (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize))
                .map_err(|_| 1)
        }
    }))
}

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_process_exec_raw(ctx: RawTracePointContext) -> u32 {
    result(exec(|| {
        let bprm = ctx.arg::<u64>(2) as *const u8;
        // SAFETY: a probe read at an offset from this kernel's BTF.
        unsafe {
            bpf_probe_read_kernel(bprm.add(probe_config().bprm_filename as usize) as *const u64)
        }
        .map(|filename| filename as *const u8)
        .map_err(|_| 1)
    }))
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let config = probe_config();
    let group_dead = if config.flags & PROBE_GROUP_DEAD != 0 {
        // SAFETY: offset found in this kernel's tracepoint format by the loader.
        match unsafe { ctx.read_at::<u8>(config.exit_group_dead as usize) } {
            Ok(dead) => Some(dead != 0),
            Err(_) => return 1,
        }
    } else {
        None
    };
    result(exit(group_dead))
}

/// `sched_process_exit(struct task_struct *p)`, kernels before ~6.16.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit_raw(_ctx: RawTracePointContext) -> u32 {
    result(exit(None))
}

/// `sched_process_exit(struct task_struct *p, bool group_dead)`, kernels since ~6.16. A
/// program of its own: a raw tracepoint program that reads past the tracepoint's arguments
/// does not attach.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit_raw_group(ctx: RawTracePointContext) -> u32 {
    result(exit(Some(ctx.arg::<u64>(1) & 0xff != 0)))
}

#[tracepoint(category = "oom", name = "mark_victim")]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    // SAFETY: offset checked by the loader.
    result(
        unsafe { ctx.read_at::<i32>(tp::OOM_PID) }
            .map_err(|_| 1)
            .and_then(|pid| oom(Victim::Pid(pid as u32))),
    )
}

/// `mark_victim(int pid)`, or since 6.9 (and the stable releases it went back to)
/// `mark_victim(struct task_struct *task, uid_t uid)`.
#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn mark_victim_raw(ctx: RawTracePointContext) -> u32 {
    let arg = ctx.arg::<u64>(0);
    let victim = if probe_config().flags & PROBE_OOM_TASK != 0 {
        Victim::Task(arg as *const u8)
    } else {
        Victim::Pid(arg as u32)
    };
    result(oom(victim))
}

fn result(ret: Result<u32, u32>) -> u32 {
    match ret {
        Ok(ret) | Err(ret) => ret,
    }
}

/// What a cgroup tracepoint says: the hierarchy, the level, the cgroup's id, its path.
struct CgroupChange {
    root: i32,
    level: i32,
    id: u64,
    path: *const u8,
}

fn read_cgroup_record(ctx: &TracePointContext) -> Result<CgroupChange, u32> {
    // SAFETY: offsets checked against this kernel's tracepoint format by the loader; a
    // __data_loc field's low 16 bits are the offset of its data from the context.
    unsafe {
        let path_loc = ctx.read_at::<u32>(tp::CGROUP_PATH).map_err(|_| 1u32)?;
        Ok(CgroupChange {
            root: ctx.read_at::<i32>(tp::CGROUP_ROOT).map_err(|_| 1u32)?,
            level: ctx.read_at::<i32>(tp::CGROUP_LEVEL).map_err(|_| 1u32)?,
            id: ctx.read_at::<u64>(tp::CGROUP_ID).map_err(|_| 1u32)?,
            path: (ctx.as_ptr() as *const u8).add((path_loc & 0xffff) as usize),
        })
    }
}

/// `cgroup_mkdir|rmdir(struct cgroup *cgrp, const char *path)`: the record's fields read
/// where the kernel's `TP_fast_assign` reads them (`cgrp->root->hierarchy_id`, `cgrp->level`,
/// `cgroup_id(cgrp)`: `cgrp->kn->id`).
fn read_cgroup_args(ctx: &RawTracePointContext) -> Result<CgroupChange, u32> {
    let config = probe_config();
    let cgroup = ctx.arg::<u64>(0) as *const u8;
    let at = |base: *const u8, offset: u32| {
        // SAFETY: pointer arithmetic only; every read below is a probe read.
        unsafe { base.add(offset as usize) }
    };
    // SAFETY: probe reads at offsets from this kernel's BTF.
    unsafe {
        let root = bpf_probe_read_kernel(at(cgroup, config.cgroup_root) as *const u64)
            .map_err(|_| 1u32)? as *const u8;
        let kn = bpf_probe_read_kernel(at(cgroup, config.cgroup_kn) as *const u64)
            .map_err(|_| 1u32)? as *const u8;
        Ok(CgroupChange {
            root: bpf_probe_read_kernel(at(root, config.root_hierarchy_id) as *const i32)
                .map_err(|_| 1u32)?,
            level: bpf_probe_read_kernel(at(cgroup, config.cgroup_level) as *const i32)
                .map_err(|_| 1u32)?,
            id: bpf_probe_read_kernel(at(kn, config.kn_id) as *const u64).map_err(|_| 1u32)?,
            path: ctx.arg::<u64>(1) as *const u8,
        })
    }
}

fn cgroup_change(change: CgroupChange, kind: KernelEventKind) -> Result<u32, u32> {
    let CgroupChange {
        root,
        level,
        id,
        path,
    } = change;
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
    emit(kind, current_tgid(), id, 0, 0, Some(path))
}

/// A process execs (the probe runs in it); `filename` reads the file's name, only for a
/// container's init: every exec on the node comes here.
fn exec(filename: impl FnOnce() -> Result<*const u8, u32>) -> Result<u32, u32> {
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
    emit(
        KernelEventKind::Exec,
        tgid as u64,
        cgroup,
        0,
        0,
        Some(filename()?),
    )
}

/// A thread exits (the probe runs in it); `group_dead`: whether it is its process's last,
/// where the kernel says.
fn exit(group_dead: Option<bool>) -> Result<u32, u32> {
    let config = probe_config();
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = pid_tgid >> 32;
    // Without group_dead, the main thread's exit stands for the process's: an init is nearly
    // always single-threaded or leaves through exit_group, and the runtime confirms the death
    // before any event.
    let process_gone = group_dead.unwrap_or(pid_tgid & 0xffff_ffff == tgid);
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

/// Who the OOM killer chose, as the tracepoint says.
enum Victim {
    /// Its task (kernels since 6.9, and the stable releases the change went back to).
    Task(*const u8),
    /// Only its pid.
    Pid(u32),
}

/// The OOM killer chose `victim`. The probe runs in the task that ran out of memory: in a
/// memory cgroup's OOM, the one whose charge failed, inside the cgroup whose limit was hit.
/// The record carries both memory cgroup chains as the kernel has them now; userspace tells
/// from them which limit it was (`sources::ebpf::oom`).
fn oom(victim: Victim) -> Result<u32, u32> {
    let config = probe_config();
    let Some(mut entry) = EVENTS.reserve::<OomEvent>(0) else {
        count_lost(LOST_RING_FULL);
        return Err(1);
    };
    let event = entry.as_mut_ptr();
    let memcg = config.flags & PROBE_OOM_MEMCG != 0;
    // SAFETY: `event` points to a reserved, writable OomEvent; every kernel read is a probe
    // read at an offset from this kernel's BTF.
    unsafe {
        (*event).kind = KernelEventKind::Oom as u32;
        (*event).ktime_ns = bpf_ktime_get_ns();
        (*event).flags = 0;
        (*event).victim_depth = 0;
        (*event).charger_depth = 0;
        (*event).victim_level = 0;
        (*event).charger_level = 0;
        (*event)._pad = 0;
        (*event).comm = [0; 16];
        // The current task's cgroup: in a memory cgroup's OOM, usually the victim's container.
        (*event).cgroup_id = bpf_get_current_cgroup_id();
        match victim {
            Victim::Task(task) => {
                (*event).pid = if memcg {
                    read_u32(task, config.task_tgid)
                } else {
                    read_u32(task, config.task_pid)
                }
                .unwrap_or(0);
                if memcg {
                    (*event).flags |= OOM_VICTIM_TASK;
                    if let Ok(comm) = bpf_probe_read_kernel(
                        task.add(config.task_comm as usize) as *const [u8; 16]
                    ) {
                        (*event).comm = comm;
                    }
                    if let Ok(id) = cgroup2_id(task, &config) {
                        (*event).cgroup_id = id;
                    }
                    let (depth, level) = (&mut (*event).victim_depth, &mut (*event).victim_level);
                    if let Ok(whole) =
                        memcg_chain(task, &config, &mut (*event).victim, depth, level)
                    {
                        (*event).flags |= OOM_VICTIM_CHAIN;
                        if whole != 0 {
                            (*event).flags |= OOM_VICTIM_WHOLE;
                        }
                    }
                }
            }
            Victim::Pid(pid) => (*event).pid = pid,
        }
        if memcg {
            let current = bpf_get_current_task() as *const u8;
            let (depth, level) = (&mut (*event).charger_depth, &mut (*event).charger_level);
            if let Ok(whole) = memcg_chain(current, &config, &mut (*event).charger, depth, level) {
                (*event).flags |= OOM_CHARGER_CHAIN;
                if whole != 0 {
                    (*event).flags |= OOM_CHARGER_WHOLE;
                }
            }
        }
        let cgroup = (*event).cgroup_id;
        if INITS.get(&cgroup).copied() == Some((*event).pid) && (*event).pid != 0 {
            (*event).flags |= OOM_VICTIM_INIT;
        }
    }
    entry.submit(0);
    Ok(0)
}

/// A `u32` at `offset` from `base`.
///
/// # Safety
/// A probe read: any address is safe, a wrong one only fails.
unsafe fn read_u32(base: *const u8, offset: u32) -> Result<u32, u32> {
    // SAFETY: a probe read.
    unsafe { bpf_probe_read_kernel(base.add(offset as usize) as *const u32) }.map_err(|_| 1)
}

/// A pointer or `u64` at `offset` from `base`.
///
/// # Safety
/// A probe read: any address is safe, a wrong one only fails.
unsafe fn read_u64(base: *const u8, offset: u32) -> Result<u64, u32> {
    // SAFETY: a probe read.
    unsafe { bpf_probe_read_kernel(base.add(offset as usize) as *const u64) }.map_err(|_| 1)
}

/// `task->cgroups->dfl_cgrp->kn->id`: the task's cgroup2 id.
///
/// # Safety
/// Probe reads only.
unsafe fn cgroup2_id(task: *const u8, config: &ProbeConfig) -> Result<u64, u32> {
    // SAFETY: probe reads at offsets from this kernel's BTF.
    unsafe {
        let cgroups = read_u64(task, config.task_cgroups)? as *const u8;
        let cgroup = read_u64(cgroups, config.css_set_dfl_cgrp)? as *const u8;
        let kn = read_u64(cgroup, config.cgroup_kn)? as *const u8;
        read_u64(kn, config.kn_id)
    }
}

/// Fills `chain` with `task`'s memory cgroup and its ancestors below the root, lowest first,
/// `depth` with how many and `level` with the level of the lowest; `Ok(1)` when the walk
/// reached the root. (Plain `u32`s: the object's BTF cannot describe a Rust tuple in a
/// `Result`, and the kernel then refuses it.)
///
/// # Safety
/// Probe reads only; `chain`, `depth` and `level` are written in place.
// Inlined: a BPF call takes at most five arguments in registers.
#[inline(always)]
unsafe fn memcg_chain(
    task: *const u8,
    config: &ProbeConfig,
    chain: &mut [MemcgLevel; OOM_LEVELS],
    depth: &mut u32,
    level: &mut u32,
) -> Result<u32, u32> {
    // SAFETY: probe reads at offsets from this kernel's BTF.
    unsafe {
        let cgroups = read_u64(task, config.task_cgroups)? as *const u8;
        // The css is the first member of its struct mem_cgroup.
        let mut memcg = read_u64(cgroups, config.css_set_memcg)? as *const u8;
        for slot in chain.iter_mut() {
            if memcg.is_null() {
                return Ok(1);
            }
            let parent = read_u64(memcg, config.css_parent)? as *const u8;
            if parent.is_null() {
                // The root: no limit of its own.
                return Ok(1);
            }
            let cgroup = read_u64(memcg, config.css_cgroup)? as *const u8;
            if *depth == 0 {
                *level = read_u32(cgroup, config.cgroup_level)?;
            }
            let kn = read_u64(cgroup, config.cgroup_kn)? as *const u8;
            slot.id = read_u64(kn, config.kn_id)?;
            slot.usage = read_u64(memcg, config.memcg_usage)?;
            slot.max = read_u64(memcg, config.memcg_max)?;
            slot.oom_events = read_u64(memcg, config.memcg_oom_events)?;
            *depth += 1;
            memcg = parent;
        }
        // Full: whole if what is left is the root.
        Ok(u32::from(
            memcg.is_null() || read_u64(memcg, config.css_parent)? == 0,
        ))
    }
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
