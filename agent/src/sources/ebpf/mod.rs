//! The eBPF source: kernel probes on cgroup and process lifecycle tracepoints, whose events
//! become targeted relist triggers for the container they are about.
//!
//! Programs (ebpf/programs) run on `cgroup/cgroup_mkdir`, `cgroup/cgroup_rmdir`,
//! `sched/sched_process_exec`, `sched/sched_process_exit` and `oom/mark_victim`. They filter in
//! the kernel: cgroup events only for the cgroup2 tree at container depth; exec and exit only
//! for a container's init, tracked per cgroup in a map (the process that execs in a container
//! cgroup that has no init yet), so containers in their own, their pod's or the host's pid
//! namespace are all seen. Exits carry the init's exit status where the kernel's BTF gives
//! `task_struct.exit_code`. Events go through a ring buffer; what could not be reserved is
//! counted per CPU, and any growth of that count schedules a full relist.
//!
//! Each kernel feature is probed on its own ([`features`]): a missing optional tracepoint or
//! field costs that feature, not the source.
//!
//! The runtime stays the source of truth: an event only says which container to relist now.

pub mod btf;
pub mod cgroup_path;
pub mod decode;
pub mod features;
pub mod index;
pub mod inits;

use std::{path::PathBuf, time::Duration};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::TracePoint,
};
use plegd_common::{KernelEvent, LOST_INIT_SLOTS, LOST_RING_FULL};
use tokio::io::{Interest, unix::AsyncFd};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    metrics::Metrics,
    pleg::{event::TriggerSource, generator::TriggerSender},
    sources::{
        ebpf::{
            decode::{Decoder, proc_cgroup2_path, wall_time_of},
            features::KernelFeatures,
            index::{CgroupIndex, CgroupMode},
        },
        status::{SourceRegistry, SourceState},
    },
};

/// The eBPF object built by build.rs from the `plegd-ebpf` crate.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/plegd"));

/// Where tracefs lives.
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// `BPF_NOEXIST`: a map update that leaves an existing entry alone.
const BPF_NOEXIST: u64 = 1;

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
    #[error("tracefs is not available at {TRACEFS} (mount -t tracefs tracefs {TRACEFS})")]
    Tracefs,
    #[error("{0}")]
    Unsupported(String),
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
    features: KernelFeatures,
}

impl Probes {
    /// Probes the kernel, loads the embedded object and attaches every program the kernel
    /// supports; fails only when the source cannot run at all.
    pub fn load() -> Result<Self, LoadError> {
        let cgroup2 = CgroupMode::detect()
            .cgroup2()
            .ok_or(LoadError::NoCgroup2)?
            .to_owned();
        if !std::path::Path::new(TRACEFS).join("events").is_dir() {
            return Err(LoadError::Tracefs);
        }
        let features = KernelFeatures::probe(TRACEFS);
        if let Some(why) = features.fatal() {
            return Err(LoadError::Unsupported(why.to_owned()));
        }
        bump_memlock_rlimit();
        let mut ebpf = EbpfLoader::new()
            .override_global("PROBE_CONFIG", &features.probe_config(), true)
            .load(EBPF_OBJECT)?;
        for spec in features.attachable() {
            let name = spec.name;
            let program: &mut TracePoint = ebpf
                .program_mut(name)
                .ok_or(LoadError::MissingProgram { name })?
                .try_into()
                .map_err(|source| LoadError::Program { name, source })?;
            program
                .load()
                .map_err(|source| LoadError::Program { name, source })?;
            program
                .attach(spec.category, spec.tracepoint)
                .map_err(|source| LoadError::Program { name, source })?;
        }
        Ok(Self {
            ebpf,
            cgroup2,
            features,
        })
    }

    /// Names of the attached programs.
    pub fn program_names(&self) -> Vec<String> {
        self.features
            .attachable()
            .map(|spec| spec.name.to_owned())
            .collect()
    }

    /// What the kernel offers, feature by feature.
    pub fn features(&self) -> &KernelFeatures {
        &self.features
    }

    fn take_map(&mut self, name: &'static str) -> Result<aya::maps::Map, LoadError> {
        self.ebpf
            .take_map(name)
            .ok_or(LoadError::MissingMap { name })
    }
}

/// Runs the source until `shutdown`: reads kernel events, keeps the init map and the index
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
    let mut inits: BpfHashMap<MapData, u64, u32> =
        BpfHashMap::try_from(probes.take_map("INITS")?).map_err(map_err("INITS"))?;
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
    seed_inits(&mut inits, &decoder.index, &metrics);
    let programs = probes.program_names();
    registry.set(
        TriggerSource::Ebpf,
        SourceState::Connected,
        format!(
            "{} programs attached ({}), {} container cgroups",
            programs.len(),
            programs.join(", "),
            decoder.index.len()
        ),
    );
    info!(
        cgroups = decoder.index.len(),
        programs = ?programs,
        "eBPF probes attached"
    );

    let mut refresh = tokio::time::interval(INDEX_REFRESH);
    let mut loss_check = tokio::time::interval(LOSS_CHECK);
    let mut lost_seen = total_lost(&lost, LOST_RING_FULL);
    let mut untracked_seen = total_lost(&lost, LOST_INIT_SLOTS);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            guard = ring.readable_mut() => {
                let mut guard = guard.map_err(LoadError::Poll)?;
                while let Some(item) = guard.get_inner_mut().next() {
                    let Some(event) = read_event(&item) else { continue };
                    let decoded = decoder.decode(&event, wall_time_of(event.ktime_ns), proc_cgroup2_path);
                    if let Some(id) = decoded.untrack {
                        // Already gone from the map (LRU) is as good as removed.
                        let _ = inits.remove(&id);
                    }
                    if let Some(trigger) = decoded.trigger {
                        registry.delivered(TriggerSource::Ebpf, trigger.observed_at);
                        triggers.send(trigger);
                    }
                }
                guard.clear_ready();
            }
            _ = loss_check.tick() => {
                let now = total_lost(&lost, LOST_RING_FULL);
                if now > lost_seen {
                    warn!(lost = now - lost_seen, "kernel events lost (ring buffer full): full relist");
                    metrics.ringbuf_drops(now - lost_seen);
                    triggers.request_full_relist();
                    lost_seen = now;
                }
                let now = total_lost(&lost, LOST_INIT_SLOTS);
                if now > untracked_seen {
                    warn!(
                        cgroups = now - untracked_seen,
                        "the init map is full: these cgroups get no process hints (the relist still finds their changes)"
                    );
                    metrics.untracked_cgroups(now - untracked_seen);
                    untracked_seen = now;
                }
            }
            _ = refresh.tick() => {
                decoder.index = CgroupIndex::scan(&probes.cgroup2, &namespaces);
                seed_inits(&mut inits, &decoder.index, &metrics);
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

/// Gives the probes the init of every indexed container they do not track yet: containers
/// that ran before the probes attached, or whose entry the map evicted. Entries the probes
/// made themselves are left as they are.
fn seed_inits(inits: &mut BpfHashMap<MapData, u64, u32>, index: &CgroupIndex, metrics: &Metrics) {
    let tracked: std::collections::HashSet<u64> = inits.keys().flatten().collect();
    let mut failed = 0;
    for (id, dir) in index.dirs() {
        if tracked.contains(&id) {
            continue;
        }
        let init = inits::find_init(&dir);
        // NOEXIST: an exec the probes saw since the scan wins over what /proc said.
        match inits.insert(id, init, BPF_NOEXIST) {
            Ok(()) => {}
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(nix::errno::Errno::EEXIST as i32) => {}
            Err(error) => {
                debug!(%error, cgroup = id, "seeding the init map");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        warn!(
            failed,
            "could not seed the init map for some containers: they get no process hints (the relist still finds their changes)"
        );
        metrics.untracked_cgroups(failed);
    }
}

/// The sum over CPUs of the `LOST` counter at `index`.
fn total_lost(lost: &PerCpuArray<MapData, u64>, index: u32) -> u64 {
    lost.get(&index, 0)
        .map(|values| values.iter().sum())
        .unwrap_or(0)
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK. Newer ones account to the memory
/// cgroup, and raising the limit needs CAP_SYS_RESOURCE, so failure is not an error.
fn bump_memlock_rlimit() {
    use nix::sys::resource::{RLIM_INFINITY, Resource, setrlimit};
    if let Err(error) = setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY) {
        debug!(%error, "could not raise RLIMIT_MEMLOCK (not needed on kernels >= 5.11)");
    }
}
