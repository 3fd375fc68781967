use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_cgroup_id, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::RingBuf,
    programs::TracePointContext,
};
use plegd_common::{EVENTS_RING_BYTES, KernelEvent, KernelEventKind};

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    match try_sched_process_exec(&ctx) {
        Ok(ret) | Err(ret) => ret,
    }
}

fn try_sched_process_exec(ctx: &TracePointContext) -> Result<u32, u32> {
    let mut entry = EVENTS.reserve::<KernelEvent>(0).ok_or(1u32)?;
    // SAFETY: the helpers have no preconditions in tracepoint context.
    let (cgroup_id, ktime_ns) = unsafe { (bpf_get_current_cgroup_id(), bpf_ktime_get_ns()) };
    entry.write(KernelEvent {
        kind: KernelEventKind::Exec as u32,
        pid: ctx.tgid(),
        cgroup_id,
        ktime_ns,
    });
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
