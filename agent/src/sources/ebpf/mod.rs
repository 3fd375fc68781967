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
//! counted per CPU, and any growth of that count schedules a full relist and a scan of the
//! cgroup tree: the kernel follows the init of a cgroup whose creation was lost, and only the
//! scan (or the cgroup's removal) tells userspace whose events those are.
//!
//! Each kernel feature is probed on its own ([`features`]): a missing optional tracepoint or
//! field costs that feature, not the source. Each probe attaches as a raw tracepoint where the
//! kernel's BTF allows (through `bpf(2)`: CAP_BPF and CAP_PERFMON are enough), else as a
//! classic tracepoint (through `perf_event_open(2)`, which Debian's kernels, at their default
//! `perf_event_paranoid` of 3, refuse without CAP_SYS_ADMIN); one that attaches in neither
//! way costs its own feature only.
//!
//! The runtime stays the source of truth: an event only says which container to relist now.

pub mod btf;
pub(crate) mod cgroup_path;
pub(crate) mod decode;
pub mod features;
pub(crate) mod index;
pub(crate) mod inits;
pub(crate) mod oom;
mod text;

use std::{collections::HashSet, os::fd::AsFd as _, path::PathBuf, sync::Arc, time::Duration};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, IterableMap as _, MapData, MapError, PerCpuArray, RingBuf},
    programs::{RawTracePoint, TracePoint},
};
use nix::errno::Errno;
use plegd_common::{KernelEvent, KernelEventKind, LOST_INIT_SLOTS, LOST_RING_FULL, OomEvent};
use tokio::{
    io::{Interest, unix::AsyncFd},
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    base::metrics::Metrics,
    pleg::{ContainerId, ObservationKind, PodCache, PodUid, Scope, Source, Trigger, TriggerSender},
    sources::{
        ebpf::{
            decode::{Decoder, VictimProc, wall_time_of},
            features::{Attach, KernelFeatures, Probe, ProgramSpec},
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
/// Default size of the kernel events' ring buffer, in bytes (`--ebpf-ring-bytes`).
pub const DEFAULT_RING_BYTES: u32 = plegd_common::EVENTS_RING_BYTES;

/// How often the per-CPU lost-event counters are read.
const LOSS_CHECK: Duration = Duration::from_secs(1);

/// Why the kernel probes cannot run; polling mode still works.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("no cgroup2 hierarchy is mounted (cgroup v1 only): the probes need cgroup2 ids")]
    NoCgroup2,
    #[error("{0}")]
    Unsupported(String),
    #[error("loading the eBPF object (missing privilege, old kernel or verifier rejection): {0}")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF probe {name}: {why}")]
    Attach { name: &'static str, why: String },
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
    /// Each probe, in [`features::PROGRAMS`] order: how it attached, or why it did not.
    attached: Vec<(&'static ProgramSpec, Result<Attach, String>)>,
}

impl Probes {
    /// Probes the kernel, loads the embedded object and attaches every program the kernel
    /// supports; fails only when the source cannot run at all.
    ///
    /// Reading BTF and the verifier's work take a while (tens to hundreds of milliseconds).
    /// Called on a worker of a multi-threaded tokio runtime (the daemon's), the worker hands its
    /// other tasks to a new one while this runs; elsewhere (`plegd check`, a current-thread
    /// runtime, which has no other worker to hand them to) it just runs.
    ///
    /// `ring_bytes` sizes the ring buffer of kernel events (a power of two, a multiple of the
    /// page size: the kernel refuses other sizes).
    pub fn load(ring_bytes: u32) -> Result<Self, LoadError> {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime)
                if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread =>
            {
                tokio::task::block_in_place(|| Self::load_here(ring_bytes))
            }
            _ => Self::load_here(ring_bytes),
        }
    }

    fn load_here(ring_bytes: u32) -> Result<Self, LoadError> {
        let cgroup2 = CgroupMode::detect()
            .cgroup2()
            .ok_or(LoadError::NoCgroup2)?
            .to_owned();
        let features = KernelFeatures::probe(TRACEFS);
        if let Some(why) = features.fatal() {
            return Err(LoadError::Unsupported(why));
        }
        bump_memlock_rlimit();
        let mut ebpf = EbpfLoader::new()
            .override_global("PROBE_CONFIG", &features.probe_config(), true)
            .map_max_entries("EVENTS", ring_bytes)
            .load(EBPF_OBJECT)?;
        let mut attached = Vec::new();
        for probe in &features.probes {
            let name = probe.spec.name;
            match attach(&mut ebpf, probe) {
                Ok(how) => attached.push((probe.spec, Ok(how))),
                Err(why) if probe.spec.without.is_some() => {
                    warn!(probe = name, %why, "an eBPF probe did not attach; going on without it");
                    attached.push((probe.spec, Err(why)));
                }
                Err(why) => return Err(LoadError::Attach { name, why }),
            }
        }
        crate::base::heap::release_freed();
        Ok(Self {
            ebpf,
            cgroup2,
            features,
            attached,
        })
    }

    /// Names of the attached programs.
    pub fn program_names(&self) -> Vec<String> {
        self.attached
            .iter()
            .filter_map(|(spec, how)| Some(how.as_ref().ok()?.program(spec).to_owned()))
            .collect()
    }

    /// One line per probe: (subject, attached, how or why not), for `plegd check` and the logs.
    pub fn describe_attachment(&self) -> Vec<(String, bool, String)> {
        self.attached
            .iter()
            .map(|(spec, how)| {
                let subject = format!("probe {} attached", spec.name);
                match how {
                    Ok(how) => (subject, true, how.describe(spec)),
                    Err(why) => (
                        subject,
                        false,
                        format!("{why}: {}", spec.without.unwrap_or_default()),
                    ),
                }
            })
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

/// Loads and attaches `probe` the first way that works: its raw tracepoint program, else its
/// classic one. Why neither did, if so.
fn attach(ebpf: &mut Ebpf, probe: &Probe) -> Result<Attach, String> {
    let mut failures = match &probe.raw {
        Ok(_) => Vec::new(),
        Err(why) => vec![format!("no raw tracepoint: {why}")],
    };
    if let features::Support::No(why) = &probe.classic {
        failures.push(format!("no tracepoint: {why}"));
    }
    for how in probe.choices() {
        let name = how.program(probe.spec);
        let program = ebpf
            .program_mut(name)
            .ok_or_else(|| format!("program {name} missing from the object"));
        let attached = program.and_then(|program| match how {
            Attach::Raw(_) => {
                let raw: &mut RawTracePoint = program.try_into().map_err(chain)?;
                raw.load().map_err(chain)?;
                raw.attach(probe.spec.tracepoint).map(drop).map_err(chain)
            }
            Attach::Classic => {
                let classic: &mut TracePoint = program.try_into().map_err(chain)?;
                classic.load().map_err(chain)?;
                classic
                    .attach(probe.spec.category, probe.spec.tracepoint)
                    .map(drop)
                    .map_err(chain)
            }
        });
        match attached {
            Ok(()) => return Ok(how),
            Err(why) => {
                debug!(probe = probe.spec.name, program = name, %why, "attach failed");
                failures.push(format!("{}: {why}", how.describe(probe.spec)));
            }
        }
    }
    Err(failures.join("; "))
}

/// An error with its sources (aya's attach errors keep the errno in theirs).
fn chain(error: aya::programs::ProgramError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Runs the source until `shutdown`: reads kernel events, keeps the init map and the index
/// current, and hands triggers to the generator. `cache` names the pod of an OOM kill's
/// container, for its count.
pub async fn run(
    mut probes: Probes,
    namespaces: Vec<String>,
    triggers: TriggerSender,
    registry: SourceRegistry,
    metrics: Metrics,
    cache: Arc<PodCache>,
    shutdown: CancellationToken,
) -> Result<(), LoadError> {
    let map_err = |name| move |source| LoadError::Map { name, source };
    let ring = RingBuf::try_from(probes.take_map("EVENTS")?).map_err(map_err("EVENTS"))?;
    let inits: BpfHashMap<MapData, u64, u32> =
        BpfHashMap::try_from(probes.take_map("INITS")?).map_err(map_err("INITS"))?;
    let lost: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(probes.take_map("LOST")?).map_err(map_err("LOST"))?;
    // SAFETY: the ring buffer owns its map's file descriptor and keeps it open, unchanged,
    // for as long as the AsyncFd owns the ring buffer.
    let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| LoadError::Poll(e.into()))?;
    let kernel = Maps { ring, inits, lost };
    let host = ProcHost {
        cgroup2: probes.cgroup2.clone(),
        namespaces: namespaces.clone(),
    };
    let programs = probes.program_names();
    let source = EbpfSource {
        namespaces,
        triggers,
        registry,
        metrics,
        cache,
        refresh: INDEX_REFRESH,
    };
    source.drive(kernel, host, programs, shutdown).await
}

/// One record of the ring buffer (an OOM kill's is twice the size of the others, and rare).
#[derive(Clone, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "the common record inline: boxing it would allocate once per kernel event"
)]
enum Record {
    Event(KernelEvent),
    Oom(Box<OomEvent>),
}

/// The kernel side of a running source: the ring buffer and the maps.
trait Kernel {
    /// Waits for records in the ring buffer and appends them to `events`. Cancel safe: it
    /// takes records only once they are ready, without waiting in between.
    async fn read(&mut self, events: &mut Vec<Record>) -> Result<(), LoadError>;
    /// Appends the records the ring buffer holds now, without waiting.
    fn read_now(&mut self, events: &mut Vec<Record>);
    /// A read of the cgroup ids the init map tracks, to run on the blocking pool (the map
    /// holds up to [`plegd_common::INIT_CGROUPS`] entries, one syscall each).
    fn tracked(&self) -> Box<dyn FnOnce() -> HashSet<u64> + Send>;
    /// Gives the probes `init` for cgroup `id`, unless they track it already.
    fn seed(&mut self, id: u64, init: u32) -> Result<(), MapError>;
    /// Stops tracking cgroup `id` (already gone is fine).
    fn untrack(&mut self, id: u64) -> Result<(), MapError>;
    /// The sum over CPUs of the `LOST` counter at `index`.
    fn lost(&self, index: u32) -> u64;
}

/// The blocking reads of the host besides the ring buffer. They run on tokio's blocking pool:
/// a cgroup tree walk and the /proc reads of a node with many containers take long enough to
/// fill the ring if its reader waited for them.
trait Host: Send + Sync + 'static {
    /// Indexes the container cgroups and finds the inits of those not in `tracked`.
    fn scan(&self, tracked: &HashSet<u64>) -> Scan;
    /// What /proc says of an OOM victim, while the process is still there to ask.
    fn victim(&self, pid: u32) -> VictimProc;
}

/// What a [`Host::scan`] found.
#[derive(Debug, Default)]
struct Scan {
    index: CgroupIndex,
    /// Cgroup id and init pid (`0`: none yet) of the containers the probes did not track.
    inits: Vec<(u64, u32)>,
}

/// The real host: the cgroup2 tree and /proc.
struct ProcHost {
    cgroup2: PathBuf,
    namespaces: Vec<String>,
}

impl Host for ProcHost {
    fn scan(&self, tracked: &HashSet<u64>) -> Scan {
        let index = CgroupIndex::scan(&self.cgroup2, &self.namespaces);
        let inits = index
            .dirs()
            .filter(|(id, _)| !tracked.contains(id))
            .map(|(id, dir)| (id, inits::find_init(&dir)))
            .collect();
        Scan { index, inits }
    }

    fn victim(&self, pid: u32) -> VictimProc {
        VictimProc::read(pid)
    }
}

/// The real kernel: the maps of the loaded object.
struct Maps {
    ring: AsyncFd<RingBuf<MapData>>,
    inits: BpfHashMap<MapData, u64, u32>,
    lost: PerCpuArray<MapData, u64>,
}

impl Kernel for Maps {
    async fn read(&mut self, events: &mut Vec<Record>) -> Result<(), LoadError> {
        let mut guard = self.ring.readable_mut().await.map_err(LoadError::Poll)?;
        take_ring(guard.get_inner_mut(), events);
        guard.clear_ready();
        Ok(())
    }

    fn read_now(&mut self, events: &mut Vec<Record>) {
        take_ring(self.ring.get_mut(), events);
    }

    fn tracked(&self) -> Box<dyn FnOnce() -> HashSet<u64> + Send> {
        // A second handle on the same map, owned by the closure.
        let fd = self.inits.map().fd().as_fd().try_clone_to_owned();
        Box::new(move || {
            let read = || -> Result<HashSet<u64>, MapError> {
                let data = MapData::from_fd(fd.map_err(|io_error| {
                    MapError::SyscallError(aya::sys::SyscallError {
                        call: "dup",
                        io_error,
                    })
                })?)?;
                let map: BpfHashMap<MapData, u64, u32> =
                    BpfHashMap::try_from(aya::maps::Map::LruHashMap(data))?;
                Ok(map.keys().flatten().collect())
            };
            read().unwrap_or_else(|error| {
                // Seeding with NOEXIST leaves tracked cgroups alone: this only costs /proc reads.
                debug!(%error, "reading the init map's keys: seeding every container");
                HashSet::new()
            })
        })
    }

    fn seed(&mut self, id: u64, init: u32) -> Result<(), MapError> {
        // NOEXIST: an exec the probes saw since the scan wins over what /proc said.
        match self.inits.insert(id, init, BPF_NOEXIST) {
            Err(MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(Errno::EEXIST as i32) =>
            {
                Ok(())
            }
            result => result,
        }
    }

    fn untrack(&mut self, id: u64) -> Result<(), MapError> {
        // Already gone from the map (LRU, or the probes' rmdir) is as good as removed.
        match self.inits.remove(&id) {
            Err(MapError::KeyNotFound) => Ok(()),
            Err(MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(Errno::ENOENT as i32) =>
            {
                Ok(())
            }
            result => result,
        }
    }

    fn lost(&self, index: u32) -> u64 {
        self.lost
            .get(&index, 0)
            .map(|values| values.iter().sum())
            .unwrap_or(0)
    }
}

/// Appends every record `ring` holds.
fn take_ring(ring: &mut RingBuf<MapData>, events: &mut Vec<Record>) {
    while let Some(item) = ring.next() {
        events.extend(read_record(&item));
    }
}

/// Where the source's triggers and reports go.
struct EbpfSource {
    namespaces: Vec<String>,
    triggers: TriggerSender,
    registry: SourceRegistry,
    metrics: Metrics,
    /// The pods as last read: whose container an OOM kill was in, for its count.
    cache: Arc<PodCache>,
    /// How often the index is rebuilt ([`INDEX_REFRESH`]).
    refresh: Duration,
}

impl EbpfSource {
    /// The source's loop. Blocking reads of the host run on the blocking pool while the ring
    /// keeps being read: the periodic scan (its result applied when it completes, with the
    /// changes events made meanwhile replayed on it) and each OOM victim's /proc read.
    async fn drive(
        self,
        mut kernel: impl Kernel,
        host: impl Host,
        programs: Vec<String>,
        shutdown: CancellationToken,
    ) -> Result<(), LoadError> {
        let host = Arc::new(host);
        let scan = first_scan(&host, &kernel).await;
        let mut decoder = Decoder::new(CgroupIndex::default(), self.namespaces.clone());
        let mut map_errors = MapErrors::default();
        decoder.index.start_journal();
        self.apply(scan, &mut decoder, &mut kernel);
        self.attached(&programs, decoder.index.len());

        let mut refresh =
            tokio::time::interval_at(tokio::time::Instant::now() + self.refresh, self.refresh);
        // A scan that outlasts the period is not followed by a burst of them.
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut loss_check = tokio::time::interval(LOSS_CHECK);
        let mut losses = Losses::read(&kernel);
        let mut scans: JoinSet<Scan> = JoinSet::new();
        // Events were lost while a scan ran: it may have walked past the cgroups they made.
        let mut rescan = false;
        let mut victims: JoinSet<(Box<OomEvent>, VictimProc)> = JoinSet::new();
        let mut events = Vec::new();
        // The generator asks this source to catch up when the runtime told an OOM kill's death
        // before the ring was read up to the kill: only while the OOM probe records kills.
        let mut catch_ups = programs
            .iter()
            .any(|program| program.starts_with("mark_victim"))
            .then(|| self.triggers.answer_catch_ups());
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                read = kernel.read(&mut events) => {
                    read?;
                    self.take(&mut events, &mut decoder, &mut kernel, &mut map_errors, &host, &mut victims);
                }
                Some(victim) = victims.join_next() => self.victim(victim, &mut decoder),
                Some(ask) = async { Some(catch_ups.as_mut()?.asked().await) } => {
                    kernel.read_now(&mut events);
                    self.take(&mut events, &mut decoder, &mut kernel, &mut map_errors, &host, &mut victims);
                    // The kills whose victim's /proc is being read: their accounts too.
                    while let Some(victim) = victims.join_next().await {
                        self.victim(victim, &mut decoder);
                    }
                    if let Some(catch_ups) = &catch_ups {
                        catch_ups.caught_up(ask);
                    }
                }
                _ = refresh.tick(), if scans.is_empty() => {
                    start_scan(&mut decoder, &host, &kernel, &mut scans);
                }
                Some(scan) = scans.join_next() => {
                    self.scanned(scan, &mut decoder, &mut kernel);
                    if std::mem::take(&mut rescan) {
                        start_scan(&mut decoder, &host, &kernel, &mut scans);
                    }
                }
                // A lost creation leaves a container the index does not know: the scan finds
                // it, and names what its init did meanwhile.
                _ = loss_check.tick() => if self.check(&kernel, &mut losses) {
                    if scans.is_empty() {
                        start_scan(&mut decoder, &host, &kernel, &mut scans);
                    } else {
                        rescan = true;
                    }
                },
            }
        }
        Ok(())
    }

    /// Decodes what the ring held (`events`, emptied) and acts on it; an OOM kill whose victim
    /// the decoder does not know has its /proc read on the blocking pool (`victims`).
    fn take(
        &self,
        events: &mut Vec<Record>,
        decoder: &mut Decoder,
        kernel: &mut impl Kernel,
        map_errors: &mut MapErrors,
        host: &Arc<impl Host>,
        victims: &mut JoinSet<(Box<OomEvent>, VictimProc)>,
    ) {
        for record in events.drain(..) {
            match record {
                // Known without /proc: decoded now, in the ring's order, so the kill rides
                // with the death that follows it.
                Record::Oom(event) if decoder.knows_victim(&event) => {
                    self.oom(&event, &VictimProc::default(), decoder);
                }
                Record::Oom(event) => {
                    let host = Arc::clone(host);
                    victims.spawn_blocking(move || {
                        let victim = host.victim(event.pid);
                        (event, victim)
                    });
                }
                Record::Event(event) => self.decode(decoder, &event, kernel, map_errors),
            }
        }
    }

    /// An OOM victim's /proc, read.
    fn victim(
        &self,
        read: Result<(Box<OomEvent>, VictimProc), tokio::task::JoinError>,
        decoder: &mut Decoder,
    ) {
        match read {
            Ok((event, victim)) => self.oom(&event, &victim, decoder),
            Err(error) => warn!(%error, "reading an OOM victim's cgroup"),
        }
    }

    /// Counts and sends an OOM kill.
    fn oom(&self, event: &OomEvent, victim: &VictimProc, decoder: &mut Decoder) {
        let decoded = decoder.oom(event, wall_time_of(event.ktime_ns), victim);
        for trigger in decoded.triggers {
            self.count_oom(&trigger, decoded.pod.as_deref());
            self.send(trigger);
        }
    }

    /// Says the probes are attached, to health and in the log.
    fn attached(&self, programs: &[String], cgroups: usize) {
        self.registry.set(
            Source::Ebpf,
            SourceState::Connected,
            format!(
                "{} programs attached ({}), {cgroups} container cgroups",
                programs.len(),
                programs.join(", "),
            ),
        );
        info!(cgroups, programs = ?programs, "eBPF probes attached");
    }

    /// Applies a scan that completed, and replays on it what events changed meanwhile.
    fn scanned(
        &self,
        scan: Result<Scan, tokio::task::JoinError>,
        decoder: &mut Decoder,
        kernel: &mut impl Kernel,
    ) {
        match scan {
            Ok(scan) => {
                self.apply(scan, decoder, kernel);
                debug!(cgroups = decoder.index.len(), "cgroup index refreshed");
                for trigger in decoder.replay() {
                    self.send(trigger);
                }
            }
            // The index stays as events keep it; the journal stops at the next scan.
            Err(error) => warn!(%error, "the cgroup scan failed: the next refresh retries"),
        }
    }

    /// Reads what the probes could not record since `seen`; when the ring was full, asks for a
    /// full relist and says so (`true`).
    fn check(&self, kernel: &impl Kernel, seen: &mut Losses) -> bool {
        let now = Losses::read(kernel);
        if now.init_slots > seen.init_slots {
            let cgroups = now.init_slots - seen.init_slots;
            warn!(
                cgroups,
                "the init map is full: these cgroups get no process hints (the relist still finds their changes)"
            );
            self.metrics.untracked_cgroups(cgroups);
        }
        let ring_full = now.ring_full > seen.ring_full;
        if ring_full {
            let lost = now.ring_full - seen.ring_full;
            warn!(
                lost,
                "kernel events lost (ring buffer full): full relist and cgroup scan"
            );
            self.metrics.ringbuf_drops(lost);
            self.triggers.request_full_relist();
        }
        *seen = now;
        ring_full
    }

    /// Decodes one event and acts on it.
    fn decode(
        &self,
        decoder: &mut Decoder,
        event: &KernelEvent,
        kernel: &mut impl Kernel,
        map_errors: &mut MapErrors,
    ) {
        let decoded = decoder.decode(event, wall_time_of(event.ktime_ns));
        if let Some(id) = decoded.untrack {
            let result = kernel.untrack(id);
            map_errors.untrack(result, id, &self.metrics);
        }
        for trigger in decoded.triggers {
            self.send(trigger);
        }
    }

    /// Counts the OOM kill `trigger` tells of, by scope: on the node, and in its pod (`pod`,
    /// from its cgroup path, else the one the cache holds the container in) when the cache
    /// knows the pod's name.
    fn count_oom(&self, trigger: &Trigger, pod: Option<&str>) {
        let Scope::Container(container) = &trigger.scope else {
            return;
        };
        for observation in &trigger.observations {
            let ObservationKind::OomKill(kill) = &observation.kind else {
                continue;
            };
            let scope = kill.scope.name();
            self.metrics.oom_kill(scope);
            match pod_named(&self.cache, pod, container) {
                Some((namespace, pod)) => self.metrics.pod_oom_kill(&namespace, &pod, scope),
                None => debug!(%container, scope, "an OOM kill in a container no relist has read"),
            }
            info!(
                %container,
                scope,
                cgroup = kill.cgroup.as_deref().unwrap_or("-"),
                victim = kill.victim_pid,
                comm = %kill.victim_comm,
                init = kill.victim_init,
                "OOM kill"
            );
        }
    }

    fn send(&self, trigger: Trigger) {
        self.registry.delivered(Source::Ebpf, trigger.observed_at);
        self.triggers.send(trigger);
    }

    /// Takes a finished scan as the index and gives the probes the inits it found (only of
    /// cgroups still indexed: one removed while the scan ran would hold a slot for nothing).
    fn apply(&self, scan: Scan, decoder: &mut Decoder, kernel: &mut impl Kernel) {
        decoder.index.replace(scan.index);
        let mut failed = 0;
        for (id, init) in scan.inits {
            if !decoder.index.contains(id) {
                continue;
            }
            if let Err(error) = kernel.seed(id, init) {
                debug!(%error, cgroup = id, "seeding the init map");
                failed += 1;
            }
        }
        if failed > 0 {
            warn!(
                failed,
                "could not seed the init map for some containers: they get no process hints (the relist still finds their changes)"
            );
            self.metrics.untracked_cgroups(failed);
            self.metrics.init_map_errors("seed", failed);
        }
    }
}

/// Failed updates of the init map from userspace, said once per incident: a map that keeps
/// failing (full, or the kernel refusing) would otherwise log on every event.
#[derive(Debug, Default)]
struct MapErrors {
    untrack_failing: bool,
}

impl MapErrors {
    /// Counts a failed untrack; warns when failures start and says when they stop.
    fn untrack(&mut self, result: Result<(), MapError>, id: u64, metrics: &Metrics) {
        match result {
            Ok(()) if self.untrack_failing => {
                info!("the init map takes removals again");
                self.untrack_failing = false;
            }
            Ok(()) => {}
            Err(error) => {
                metrics.init_map_errors("untrack", 1);
                if !self.untrack_failing {
                    warn!(
                        %error,
                        cgroup = id,
                        "could not remove a non-container cgroup from the init map: it holds a slot until evicted (counted in plegd_init_map_errors_total; said once until removals work again)"
                    );
                    self.untrack_failing = true;
                }
            }
        }
    }
}

/// The probes' counts of what they could not record.
#[derive(Clone, Copy, Debug)]
struct Losses {
    /// Events that found the ring buffer full.
    ring_full: u64,
    /// Cgroups the init map had no room for.
    init_slots: u64,
}

impl Losses {
    fn read(kernel: &impl Kernel) -> Self {
        Self {
            ring_full: kernel.lost(LOST_RING_FULL),
            init_slots: kernel.lost(LOST_INIT_SLOTS),
        }
    }
}

/// Starts a scan of the cgroup tree on the blocking pool, the index journalling the changes
/// events make meanwhile.
/// The first scan, waited for: events about containers that ran before the probes attached
/// mean something only with the index, and the ring holds them meanwhile.
async fn first_scan(host: &Arc<impl Host>, kernel: &impl Kernel) -> Scan {
    let (host, tracked) = (host.clone(), kernel.tracked());
    tokio::task::spawn_blocking(move || host.scan(&tracked()))
        .await
        .unwrap_or_else(|error| {
            warn!(%error, "the first cgroup scan failed: the next refresh retries");
            Scan::default()
        })
}

fn start_scan(
    decoder: &mut Decoder,
    host: &Arc<impl Host>,
    kernel: &impl Kernel,
    scans: &mut JoinSet<Scan>,
) {
    decoder.index.start_journal();
    let (host, tracked) = (host.clone(), kernel.tracked());
    scans.spawn_blocking(move || host.scan(&tracked()));
}

/// The namespace and name of pod `uid` (its sandbox is read before its containers start),
/// else of the pod holding `container`, as the cache last read them.
fn pod_named(
    cache: &PodCache,
    uid: Option<&str>,
    container: &ContainerId,
) -> Option<(String, String)> {
    let uid = uid.map(|uid| PodUid(uid.to_owned()));
    let pod = uid
        .as_ref()
        .and_then(|uid| cache.get(uid).record)
        .or_else(|| cache.holding(None, container))?;
    Some((pod.namespace.clone(), pod.name.clone()))
}

/// Ring buffer records, back to back, through [`read_record`] and one [`decode::Decoder`]
/// (an OOM victim's /proc read from the bytes after its record, instead of from /proc): the
/// fuzz target's entry point, not an API. Returns the triggers made.
#[doc(hidden)]
pub fn fuzz_decode(records: &[u8], namespaces: &[String]) -> Vec<crate::pleg::Trigger> {
    let mut decoder = decode::Decoder::new(index::CgroupIndex::default(), namespaces.to_vec());
    let mut triggers = Vec::new();
    let mut rest = records;
    while let Some(record) = read_record(rest) {
        let at = std::time::SystemTime::UNIX_EPOCH;
        let (decoded, size) = match record {
            Record::Event(event) => (
                decoder.decode(&event, at),
                std::mem::size_of::<KernelEvent>(),
            ),
            Record::Oom(event) => {
                let size = std::mem::size_of::<OomEvent>();
                let proc = String::from_utf8_lossy(&rest[size..rest.len().min(size + 512)]);
                let victim = VictimProc::parse(Some(&proc), Some("fuzz"));
                (decoder.oom(&event, at, &victim), size)
            }
        };
        triggers.extend(decoded.triggers);
        rest = &rest[size..];
    }
    triggers
}

/// [`cgroup_path::parse`] for the fuzz target, not an API.
#[doc(hidden)]
pub fn fuzz_cgroup_path(path: &str, namespaces: &[String]) -> Option<cgroup_path::CgroupOwner> {
    cgroup_path::parse(path, namespaces)
}

/// Reads one ring buffer record, by its kind; one too short for it (a mismatched object) is
/// skipped.
fn read_record(bytes: &[u8]) -> Option<Record> {
    let kind = u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?);
    if kind == KernelEventKind::Oom as u32 {
        if bytes.len() < std::mem::size_of::<OomEvent>() {
            return None;
        }
        // SAFETY: OomEvent is plain old data, the buffer is long enough, and read_unaligned
        // tolerates any alignment.
        return Some(Record::Oom(Box::new(unsafe {
            std::ptr::read_unaligned(bytes.as_ptr().cast::<OomEvent>())
        })));
    }
    if bytes.len() < std::mem::size_of::<KernelEvent>() {
        return None;
    }
    // SAFETY: KernelEvent is plain old data, the buffer is long enough, and read_unaligned
    // tolerates any alignment.
    Some(Record::Event(unsafe {
        std::ptr::read_unaligned(bytes.as_ptr().cast::<KernelEvent>())
    }))
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK. Newer ones account to the memory
/// cgroup, and raising the limit needs CAP_SYS_RESOURCE, so failure is not an error.
fn bump_memlock_rlimit() {
    use nix::sys::resource::{RLIM_INFINITY, Resource, setrlimit};
    if let Err(error) = setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY) {
        debug!(%error, "could not raise RLIMIT_MEMLOCK (not needed on kernels >= 5.11)");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
        mpsc as std_mpsc,
    };

    use tokio::sync::mpsc;

    use super::{
        decode::{oom_event, test_event},
        *,
    };
    use crate::pleg::{
        ContainerId, Scope, Trigger,
        testing::{TriggerReceiver, trigger_channel},
    };

    const NAMESPACE: &str = "plegd-native";
    const WAIT: Duration = Duration::from_secs(10);

    /// Kernel events from a channel; seeded inits recorded; events lost to a full ring as the
    /// test sets them.
    struct FakeKernel {
        events: mpsc::UnboundedReceiver<Record>,
        seeds: Arc<Mutex<Vec<(u64, u32)>>>,
        ring_full: Arc<AtomicU64>,
    }

    impl Kernel for FakeKernel {
        async fn read(&mut self, events: &mut Vec<Record>) -> Result<(), LoadError> {
            match self.events.recv().await {
                Some(event) => events.push(event),
                None => std::future::pending().await,
            }
            Ok(())
        }

        fn read_now(&mut self, events: &mut Vec<Record>) {
            while let Ok(event) = self.events.try_recv() {
                events.push(event);
            }
        }

        fn tracked(&self) -> Box<dyn FnOnce() -> HashSet<u64> + Send> {
            Box::new(HashSet::new)
        }

        fn seed(&mut self, id: u64, init: u32) -> Result<(), MapError> {
            self.seeds.lock().unwrap().push((id, init));
            Ok(())
        }

        fn untrack(&mut self, _id: u64) -> Result<(), MapError> {
            Ok(())
        }

        fn lost(&self, index: u32) -> u64 {
            match index {
                LOST_RING_FULL => self.ring_full.load(Ordering::Relaxed),
                _ => 0,
            }
        }
    }

    /// The first scan finds nothing; every later one says it started, then blocks until the
    /// test hands it its result.
    struct GatedHost {
        scans: Mutex<u32>,
        started: mpsc::UnboundedSender<()>,
        results: Mutex<std_mpsc::Receiver<Scan>>,
    }

    impl Host for GatedHost {
        fn scan(&self, _tracked: &HashSet<u64>) -> Scan {
            let mut scans = self.scans.lock().unwrap();
            *scans += 1;
            if *scans == 1 {
                return Scan::default();
            }
            drop(scans);
            self.started.send(()).unwrap();
            self.results.lock().unwrap().recv().unwrap_or_default()
        }

        /// A /proc slow to read: an OOM kill's trigger comes well after its record.
        fn victim(&self, _pid: u32) -> VictimProc {
            std::thread::sleep(Duration::from_millis(50));
            VictimProc::default()
        }
    }

    async fn next_container(triggers: &mut TriggerReceiver) -> String {
        let trigger: Trigger = tokio::time::timeout(WAIT, triggers.recv())
            .await
            .expect("a trigger while the scan is blocked: the ring is still read")
            .unwrap();
        match trigger.scope {
            Scope::Container(ContainerId(id)) => id,
            scope => panic!("unexpected scope {scope:?}"),
        }
    }

    /// A source's loop on a [`FakeKernel`] and a [`GatedHost`], and the test's ends of them.
    struct Rig {
        events: mpsc::UnboundedSender<Record>,
        /// Each scan after the first says here that it started...
        started: mpsc::UnboundedReceiver<()>,
        /// ...and waits for its result from here.
        results: std_mpsc::Sender<Scan>,
        seeds: Arc<Mutex<Vec<(u64, u32)>>>,
        ring_full: Arc<AtomicU64>,
        triggers: TriggerReceiver,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<Result<(), LoadError>>,
    }

    impl Rig {
        /// Starts the loop, the index refreshed every `refresh`.
        fn start(refresh: Duration) -> Self {
            Self::with_programs(refresh, Vec::new())
        }

        /// Starts the loop as if the probes `programs` were attached.
        fn with_programs(refresh: Duration, programs: Vec<String>) -> Self {
            let (events_tx, events) = mpsc::unbounded_channel();
            let (started_tx, started) = mpsc::unbounded_channel();
            let (results_tx, results) = std_mpsc::channel();
            let (seeds, ring_full) = (Arc::default(), Arc::new(AtomicU64::new(0)));
            let kernel = FakeKernel {
                events,
                seeds: Arc::clone(&seeds),
                ring_full: Arc::clone(&ring_full),
            };
            let host = GatedHost {
                scans: Mutex::new(0),
                started: started_tx,
                results: Mutex::new(results),
            };
            let (triggers_tx, triggers) = trigger_channel();
            let source = EbpfSource {
                namespaces: vec![NAMESPACE.to_owned()],
                triggers: triggers_tx,
                registry: SourceRegistry::new(),
                metrics: Metrics::new(),
                cache: Arc::new(PodCache::new()),
                refresh,
            };
            let shutdown = CancellationToken::new();
            let task = tokio::spawn(source.drive(kernel, host, programs, shutdown.clone()));
            Self {
                events: events_tx,
                started,
                results: results_tx,
                seeds,
                ring_full,
                triggers,
                shutdown,
                task,
            }
        }

        async fn scan_started(&mut self, what: &str) {
            tokio::time::timeout(WAIT, self.started.recv())
                .await
                .expect(what)
                .unwrap();
        }

        async fn stop(self) {
            self.shutdown.cancel();
            // A later scan may be blocked on the test's channel: let it go.
            drop(self.results);
            self.task.await.unwrap().unwrap();
        }
    }

    /// Multi-threaded: with the scan on the loop's own task (the bug this guards against),
    /// the loop would wait in the scan and the timeout would fire on the other worker.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_ring_is_read_while_a_scan_runs_and_its_result_is_applied_after() {
        let mut rig = Rig::start(Duration::from_millis(10));
        rig.scan_started("a refresh scan starts").await;
        // The scan is blocked: a cgroup made now is still decoded.
        let new = format!("{NAMESPACE}/new");
        rig.events
            .send(Record::Event(test_event(
                KernelEventKind::CgroupMkdir,
                2,
                &new,
            )))
            .unwrap();
        assert_eq!(next_container(&mut rig.triggers).await, "new");

        // The scan ends: its containers are indexed and their inits seeded; the cgroup made
        // while it ran (which it did not see) stays indexed.
        let mut index = CgroupIndex::default();
        index.insert(3, &format!("{NAMESPACE}/old"), &[NAMESPACE.to_owned()]);
        rig.results
            .send(Scan {
                index,
                inits: vec![(3, 4242)],
            })
            .unwrap();
        tokio::time::timeout(WAIT, async {
            while !rig.seeds.lock().unwrap().contains(&(3, 4242)) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the scan's inits are seeded");
        for cgroup in [3, 2] {
            rig.events
                .send(Record::Event(test_event(
                    KernelEventKind::Exec,
                    cgroup,
                    "/bin/sh",
                )))
                .unwrap();
        }
        assert_eq!(next_container(&mut rig.triggers).await, "old");
        assert_eq!(next_container(&mut rig.triggers).await, "new");
        rig.stop().await;
    }

    /// A cgroup made while the ring was full is unknown to the index, though the probes follow
    /// its init: the loss check scans, and what the init did meanwhile comes out named. Losses
    /// while that scan runs (it may have walked past what they made) scan again after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lost_events_rescan_the_cgroups_and_name_what_waited() {
        // Only losses scan in this test.
        let mut rig = Rig::start(Duration::from_secs(3600));
        // The loop runs (it read the loss counts before it).
        rig.events
            .send(Record::Event(test_event(
                KernelEventKind::CgroupMkdir,
                2,
                &format!("{NAMESPACE}/known"),
            )))
            .unwrap();
        assert_eq!(next_container(&mut rig.triggers).await, "known");
        // The init of a cgroup whose creation the ring lost execs; then the loss is counted.
        rig.events
            .send(Record::Event(test_event(
                KernelEventKind::Exec,
                5,
                "/bin/sh",
            )))
            .unwrap();
        rig.ring_full.store(3, Ordering::Relaxed);
        rig.scan_started("the loss check scans").await;
        tokio::time::timeout(WAIT, rig.triggers.full_relist_requested())
            .await
            .expect("a loss asks for a full relist");
        // More losses while the scan runs.
        rig.ring_full.store(4, Ordering::Relaxed);
        tokio::time::timeout(WAIT, rig.triggers.full_relist_requested())
            .await
            .expect("each loss asks for a full relist");
        let mut index = CgroupIndex::default();
        index.insert(5, &format!("{NAMESPACE}/lost"), &[NAMESPACE.to_owned()]);
        rig.results
            .send(Scan {
                index,
                inits: Vec::new(),
            })
            .unwrap();
        let trigger = tokio::time::timeout(WAIT, rig.triggers.recv())
            .await
            .expect("the held exec, named by the scan")
            .unwrap();
        assert_eq!(trigger.scope, Scope::Container(ContainerId("lost".into())));
        assert_eq!(
            trigger.observations[0].kind,
            crate::pleg::ObservationKind::Exec("/bin/sh".into())
        );
        rig.scan_started("losses during the scan scan again").await;
        rig.stop().await;
    }

    /// An OOM kill whose victim is no init the decoder knows: its /proc is read.
    fn oom_record(cgroup_id: u64) -> Record {
        Record::Oom(Box::new(OomEvent {
            pid: 4242,
            ..oom_event(cgroup_id, false)
        }))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_ask_to_catch_up_is_answered_once_what_the_ring_held_is_handed_over() {
        let mut rig = Rig::with_programs(Duration::from_secs(3600), vec!["mark_victim_raw".into()]);
        let made = test_event(KernelEventKind::CgroupMkdir, 2, &format!("{NAMESPACE}/c"));
        rig.events.send(Record::Event(made)).unwrap();
        // The loop runs: it answers asks.
        assert_eq!(next_container(&mut rig.triggers).await, "c");

        // The kill is in the ring when the ask comes; its victim's /proc takes a while.
        rig.events.send(oom_record(2)).unwrap();
        let ask = rig
            .triggers
            .ask_catch_up()
            .expect("the source answers asks");
        tokio::time::timeout(WAIT, rig.triggers.catch_up_answered(ask))
            .await
            .expect("the ask is answered");
        let trigger = rig
            .triggers
            .try_recv()
            .expect("the kill's trigger is in before the answer");
        assert!(
            trigger
                .observations
                .iter()
                .any(|o| matches!(o.kind, ObservationKind::OomKill(_))),
            "{trigger:?}"
        );
        rig.stop().await;

        // Without the OOM probe, nothing answers: no death waits for it.
        let rig = Rig::start(Duration::from_secs(3600));
        assert_eq!(rig.triggers.ask_catch_up(), None);
        rig.stop().await;
    }
}
