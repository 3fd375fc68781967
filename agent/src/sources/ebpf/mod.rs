//! The eBPF source: kernel probes on cgroup and process lifecycle tracepoints, whose events
//! become targeted relist triggers for the container they are about.
//!
//! Programs (ebpf/programs) run on `cgroup/cgroup_mkdir`, `cgroup/cgroup_rmdir`,
//! `sched/sched_process_exec`, `sched/sched_process_exit` and `oom/mark_victim`. They filter in
//! the kernel: cgroup events only for the cgroup2 tree at container depth; exec and exit only
//! for a container's init (pid 1 of a pid namespace, found through task_struct offsets read
//! from the kernel's BTF; exits carry the init's exit status). Without BTF, process events are
//! filtered by a map of watched cgroups that userspace fills with the container cgroups it
//! knows. Events go through a ring buffer; what could not be reserved is counted per CPU, and
//! any growth of that count schedules a full relist. Containers sharing the host's pid
//! namespace have no init of their own: their deaths are found by the relist.
//!
//! The runtime stays the source of truth: an event only says which container to relist now.

pub mod btf;
pub mod cgroup_path;
pub mod decode;
pub mod index;

use std::{path::PathBuf, time::Duration};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::TracePoint,
};
use plegd_common::{KernelEvent, ProbeConfig, tracepoint_offsets as tp};
use tokio::io::{Interest, unix::AsyncFd};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    api::Metrics,
    pleg::{event::TriggerSource, generator::TriggerSender},
    sources::{
        ebpf::{
            btf::KernelOffsets,
            decode::{Decoder, proc_cgroup2_path, wall_time_of},
            index::{CgroupIndex, CgroupMode},
        },
        status::{SourceRegistry, SourceState},
    },
};

/// The eBPF object built by build.rs from the `plegd-ebpf` crate.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/plegd"));

/// Where tracefs lives.
const TRACEFS: &str = "/sys/kernel/tracing";

/// The programs and their tracepoints `(program, category, tracepoint)`.
pub const TRACEPOINTS: &[(&str, &str, &str)] = &[
    ("cgroup_mkdir", "cgroup", "cgroup_mkdir"),
    ("cgroup_rmdir", "cgroup", "cgroup_rmdir"),
    ("sched_process_exec", "sched", "sched_process_exec"),
    ("sched_process_exit", "sched", "sched_process_exit"),
    ("mark_victim", "oom", "mark_victim"),
];

/// Tracepoint fields the programs read at fixed offsets: `(category/name, field, offset)`.
const FIELDS: &[(&str, &str, usize)] = &[
    ("cgroup/cgroup_mkdir", "root", tp::CGROUP_ROOT),
    ("cgroup/cgroup_mkdir", "level", tp::CGROUP_LEVEL),
    ("cgroup/cgroup_mkdir", "id", tp::CGROUP_ID),
    ("cgroup/cgroup_mkdir", "path", tp::CGROUP_PATH),
    ("cgroup/cgroup_rmdir", "root", tp::CGROUP_ROOT),
    ("cgroup/cgroup_rmdir", "level", tp::CGROUP_LEVEL),
    ("cgroup/cgroup_rmdir", "id", tp::CGROUP_ID),
    ("cgroup/cgroup_rmdir", "path", tp::CGROUP_PATH),
    ("sched/sched_process_exec", "filename", tp::EXEC_FILENAME),
    (
        "sched/sched_process_exit",
        "group_dead",
        tp::EXIT_GROUP_DEAD,
    ),
    ("oom/mark_victim", "pid", tp::OOM_PID),
];

/// How often the cgroup index is rebuilt from the cgroup2 tree (mkdir/rmdir events keep it
/// current in between; the rebuild heals anything missed).
const INDEX_REFRESH: Duration = Duration::from_secs(30);
/// How often the per-CPU lost-event counters are read.
const LOSS_CHECK: Duration = Duration::from_secs(1);

/// Why the kernel probes cannot run; polling mode still works.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("no cgroup2 hierarchy is mounted (cgroup v1 only): the probes need cgroup2 ids")]
    NoCgroup2,
    #[error("tracefs is not available at {TRACEFS} (mount -t tracefs tracefs {TRACEFS}): {0}")]
    Tracefs(#[source] std::io::Error),
    #[error(
        "tracepoint {tracepoint}: field {field} is not at offset {expected} on this kernel ({found})"
    )]
    TracepointLayout {
        tracepoint: &'static str,
        field: &'static str,
        expected: usize,
        found: String,
    },
    #[error("loading the eBPF object (missing privilege, old kernel or verifier rejection): {0}")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF program {name} missing from the object")]
    MissingProgram { name: &'static str },
    #[error("eBPF program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("eBPF map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("eBPF map {name} missing from the object")]
    MissingMap { name: &'static str },
    #[error("polling the ring buffer: {0}")]
    Poll(#[source] std::io::Error),
}

/// Loaded and attached probes; detached when dropped.
pub struct Probes {
    ebpf: Ebpf,
    cgroup2: PathBuf,
    /// Whether exits carry exit statuses (BTF offsets found).
    exit_details: bool,
}

impl Probes {
    /// Checks the kernel, loads the embedded object and attaches every program.
    pub fn load() -> Result<Self, LoadError> {
        let cgroup2 = CgroupMode::detect()
            .cgroup2()
            .ok_or(LoadError::NoCgroup2)?
            .to_owned();
        check_tracepoint_layout()?;
        let config = match KernelOffsets::from_running_kernel() {
            Ok(offsets) => offsets.probe_config(),
            Err(error) => {
                warn!(%error, "kernel BTF unreadable: exits will carry no exit status");
                ProbeConfig::default()
            }
        };
        bump_memlock_rlimit();
        let mut ebpf = EbpfLoader::new()
            .override_global("PROBE_CONFIG", &config, true)
            .load(EBPF_OBJECT)?;
        for &(name, category, tracepoint) in TRACEPOINTS {
            let program: &mut TracePoint = ebpf
                .program_mut(name)
                .ok_or(LoadError::MissingProgram { name })?
                .try_into()
                .map_err(|source| LoadError::Program { name, source })?;
            program
                .load()
                .map_err(|source| LoadError::Program { name, source })?;
            program
                .attach(category, tracepoint)
                .map_err(|source| LoadError::Program { name, source })?;
        }
        Ok(Self {
            ebpf,
            cgroup2,
            exit_details: config.valid == 1,
        })
    }

    /// Names of the attached programs.
    pub fn program_names(&self) -> Vec<String> {
        self.ebpf
            .programs()
            .map(|(name, _)| name.to_owned())
            .collect()
    }

    /// Whether exit events carry the exit status.
    pub fn exit_details(&self) -> bool {
        self.exit_details
    }

    fn take_map(&mut self, name: &'static str) -> Result<aya::maps::Map, LoadError> {
        self.ebpf
            .take_map(name)
            .ok_or(LoadError::MissingMap { name })
    }
}

/// Runs the source until `shutdown`: reads kernel events, keeps the watch list and the index
/// current, and hands triggers to the generator.
pub async fn run(
    mut probes: Probes,
    namespaces: Vec<String>,
    triggers: TriggerSender,
    registry: SourceRegistry,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> Result<(), LoadError> {
    let map_err = |name| move |source| LoadError::Map { name, source };
    let ring = RingBuf::try_from(probes.take_map("EVENTS")?).map_err(map_err("EVENTS"))?;
    let mut watched: BpfHashMap<MapData, u64, u32> =
        BpfHashMap::try_from(probes.take_map("WATCHED")?).map_err(map_err("WATCHED"))?;
    let lost: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(probes.take_map("LOST")?).map_err(map_err("LOST"))?;
    // SAFETY: the ring buffer owns its map's file descriptor and keeps it open, unchanged,
    // for as long as the AsyncFd owns the ring buffer.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| LoadError::Poll(e.into()))?;

    let mut decoder = Decoder::new(
        CgroupIndex::scan(&probes.cgroup2, &namespaces),
        namespaces.clone(),
    );
    sync_watched(&mut watched, &decoder.index);
    registry.set(
        TriggerSource::Ebpf,
        SourceState::Connected,
        format!(
            "{} programs attached, {} container cgroups watched",
            TRACEPOINTS.len(),
            decoder.index.len()
        ),
    );
    info!(
        cgroups = decoder.index.len(),
        exit_details = probes.exit_details,
        "eBPF probes attached"
    );

    let mut refresh = tokio::time::interval(INDEX_REFRESH);
    let mut loss_check = tokio::time::interval(LOSS_CHECK);
    let mut lost_seen = total_lost(&lost);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            guard = ring.readable_mut() => {
                let mut guard = guard.map_err(LoadError::Poll)?;
                while let Some(item) = guard.get_inner_mut().next() {
                    let Some(event) = read_event(&item) else { continue };
                    let decoded = decoder.decode(&event, wall_time_of(event.ktime_ns), proc_cgroup2_path);
                    if let Some(id) = decoded.watch {
                        let _ = watched.insert(id, 1, 0);
                    }
                    if let Some(id) = decoded.unwatch {
                        let _ = watched.remove(&id);
                    }
                    if let Some(trigger) = decoded.trigger {
                        registry.delivered(TriggerSource::Ebpf, trigger.observed_at);
                        triggers.send(trigger);
                    }
                }
                guard.clear_ready();
            }
            _ = loss_check.tick() => {
                let now = total_lost(&lost);
                if now > lost_seen {
                    warn!(lost = now - lost_seen, "kernel events lost (ring buffer full): full relist");
                    metrics.ringbuf_drops(now - lost_seen);
                    triggers.request_full_relist();
                    lost_seen = now;
                }
            }
            _ = refresh.tick() => {
                decoder.index = CgroupIndex::scan(&probes.cgroup2, &namespaces);
                sync_watched(&mut watched, &decoder.index);
                debug!(cgroups = decoder.index.len(), "cgroup index refreshed");
            }
        }
    }
    Ok(())
}

/// Reads one ring buffer record; a record of another size (a mismatched object) is skipped.
fn read_event(bytes: &[u8]) -> Option<KernelEvent> {
    if bytes.len() < std::mem::size_of::<KernelEvent>() {
        return None;
    }
    // SAFETY: KernelEvent is plain old data, the buffer is long enough, and read_unaligned
    // tolerates any alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<KernelEvent>()) })
}

/// Makes the watch map hold exactly the index's cgroups.
fn sync_watched(watched: &mut BpfHashMap<MapData, u64, u32>, index: &CgroupIndex) {
    let wanted: std::collections::HashSet<u64> = index.ids().collect();
    let stale: Vec<u64> = watched
        .keys()
        .flatten()
        .filter(|id| !wanted.contains(id))
        .collect();
    for id in stale {
        let _ = watched.remove(&id);
    }
    for id in wanted {
        let _ = watched.insert(id, 1, 0);
    }
}

fn total_lost(lost: &PerCpuArray<MapData, u64>) -> u64 {
    lost.get(&0, 0)
        .map(|values| values.iter().sum())
        .unwrap_or(0)
}

/// Checks that the tracepoint fields the programs read sit where they expect.
fn check_tracepoint_layout() -> Result<(), LoadError> {
    for &(tracepoint, field, expected) in FIELDS {
        let path = format!("{TRACEFS}/events/{tracepoint}/format");
        let format = std::fs::read_to_string(&path).map_err(LoadError::Tracefs)?;
        let found = field_offset(&format, field);
        if found != Some(expected) {
            return Err(LoadError::TracepointLayout {
                tracepoint,
                field,
                expected,
                found: found.map_or_else(|| "missing".to_owned(), |o| format!("at {o}")),
            });
        }
    }
    Ok(())
}

/// The offset of `field` in a tracefs `format` file.
fn field_offset(format: &str, field: &str) -> Option<usize> {
    format.lines().find_map(|line| {
        let declaration = line.trim().strip_prefix("field:")?;
        let (declaration, rest) = declaration.split_once(';')?;
        let name = declaration.rsplit(' ').next()?.split('[').next()?;
        if name != field {
            return None;
        }
        rest.trim()
            .strip_prefix("offset:")?
            .split(';')
            .next()?
            .parse()
            .ok()
    })
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK. Newer ones account to the memory
/// cgroup, and raising the limit needs CAP_SYS_RESOURCE, so failure is not an error.
fn bump_memlock_rlimit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid, initialised rlimit struct.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) };
    if ret != 0 {
        debug!(
            error = %std::io::Error::last_os_error(),
            "could not raise RLIMIT_MEMLOCK (not needed on kernels >= 5.11)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_offsets_are_read_from_format_files() {
        let format = "name: cgroup_mkdir\nID: 1\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int root;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:__data_loc char[] path;\toffset:24;\tsize:4;\tsigned:0;\n\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n";
        assert_eq!(field_offset(format, "root"), Some(8));
        assert_eq!(field_offset(format, "path"), Some(24));
        assert_eq!(field_offset(format, "comm"), Some(8));
        assert_eq!(field_offset(format, "level"), None);
    }

    #[test]
    fn this_kernel_has_the_expected_tracepoint_layout() {
        check_tracepoint_layout()
            .expect("tracefs mounted (cargo xtask setup) and layout as expected");
    }
}
